"""Reward models: a learned scorer for a task (`rewards.reward_models.<task>`), in place of a verifier.

Two kinds (`RewardModelConfig.kind`, docs/rewards.md):

* `classifier`: an `AutoModelForSequenceClassification` with one logit (a Bradley-Terry reward
  model, as RLHF trains them: Ouyang et al. 2022, arXiv 2203.02155, §3.5). Its input is the
  (prompt, response) pair rendered by the reward model's own tokenizer's chat template (prompt as
  the user turn, response as the assistant turn), or "prompt\\nresponse" when it has none; inputs
  over `max_length` tokens keep their end (the response), counted in `truncated`. The score is
  `sigmoid(logit / temperature)` in [0, 1] (`sigmoid_score`); with `normalize: group` the reward
  is instead the logit's z-score within its group (`group_zscores`), the raw value normalised per
  group, and the sigmoid only decides what counts as a pass.
* `judge`: any causal LM asked `template` with `{prompt}` and `{response}` filled in (and
  `{rubric}`, the row's `rubric` column, when the template has it: DeepSeek-V3.2's generative
  reward model judges by a per-prompt rubric; a row without one fails its samples, counted, the
  detail naming the row), generating
  greedily (`max_new_tokens`); its verdict is parsed by `parse_verdict` (a yes/no, or a number out
  of `score_max`). A verdict that does not parse is a failure (status "error", counted in
  `malformed`), never a silent zero. `engine` picks what generates (the engines of
  `generation.engine`, built by `scalerl.rollout.factory`): `hf`, Hugging Face `generate` on
  `device` (left-padded batches); `embedded`, the project's continuous-batching engine on `device`
  (`scalerl.rollout.embedded`); `vllm`, an in-process vLLM engine (`scalerl.rollout.vllm_engine`,
  float32 weights, float32 LM head, on vLLM's platform device; vLLM is imported only then). All
  three decode greedily (temperature 0: the argmax token) from the same token ids (the template
  rendered and tokenized here, inputs over `max_length` keeping their end) and stop at the
  tokenizer's eos, so in float32 their verdicts differ only where two logits tie to rounding.

Both run batched (`batch_size` sequences per call, one group at a time; the engines' slot count),
one call at a time per model (a lock: the scoring pool's threads share it). Every token through a
model is counted (`tokens`) and, when the router has a compute meter, charged to the run's FLOPs:
2N per token of input and of generated verdict up to and including eos, whichever engine generated
it (the dense forward estimate of scalerl.telemetry.compute).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl.config import ConfigError, RewardModelConfig
from scalerl.data.records import PromptRecord

#: The default verdict patterns. yes/no: the first standalone yes or no (case-insensitive); score:
#: the first number, integer or decimal, optionally signed.
YES_NO_PATTERN = r"\b(yes|no)\b"
SCORE_PATTERN = r"(-?\d+(?:\.\d+)?)"


@dataclass(frozen=True)
class ModelScore:
    """One response's judgement: `score` in [0, 1] (status "ok"), the model's `raw` value (the
    classifier's logit; the judge's parsed verdict) and why it failed (`status` "error")."""

    score: float
    raw: float
    status: str = "ok"
    detail: str = ""


# -- pure functions -------------------------------------------------------------------------------

def sigmoid_score(logit: float, temperature: float = 1.0) -> float:
    """`1 / (1 + exp(-logit / temperature))`: a Bradley-Terry logit as the probability that the
    response beats a reference one at logit 0 (Bradley & Terry 1952; Ouyang et al. 2022, §3.5)."""
    z = logit / temperature
    if z >= 0:  # the two branches keep exp() from overflowing for large |z|
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def group_zscores(values: Sequence[float], eps: float = 1e-6) -> list[float]:
    """`(v_i - mean) / (std + eps)` over the group (population std), the GRPO normalisation (Shao
    et al. 2024, arXiv 2402.03300, eq. 3) applied to raw reward-model logits. A group of one, or of
    equal values, gives zeros."""
    n = len(values)
    if n == 0:
        return []
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / n)
    return [(v - mean) / (std + eps) for v in values]


def parse_verdict(text: str, verdict: str, pattern: str | None = None,
                  score_max: float = 10.0) -> tuple[float, float] | None:
    """(score in [0, 1], raw verdict) from a judge's output, or None when it has no valid verdict.

    `verdict="yes_no"`: the first match of `pattern` (default `YES_NO_PATTERN`; group 1, or the whole
    match) is "yes" -> 1 or "no" -> 0, case-insensitive; anything else matched is malformed.
    `verdict="score"`: the first match (default `SCORE_PATTERN`) as a number `s`, score `s /
    score_max`; outside [0, score_max] (or not a number) is malformed, not clipped.
    """
    regex = re.compile(pattern or (YES_NO_PATTERN if verdict == "yes_no" else SCORE_PATTERN), re.IGNORECASE)
    match = regex.search(text)
    if match is None:
        return None
    token = (match.group(1) if regex.groups else match.group(0)).strip()
    if verdict == "yes_no":
        word = token.lower()
        if word == "yes":
            return 1.0, 1.0
        if word == "no":
            return 0.0, 0.0
        return None
    try:
        value = float(token)
    except ValueError:
        return None
    if not (math.isfinite(value) and 0.0 <= value <= score_max):
        return None
    return value / score_max, value


_SLOTS = re.compile(r"\{(prompt|response|rubric)\}")


def render_template(template: str, prompt: str, response: str, rubric: str | None = None) -> str:
    """`template` with `{prompt}`, `{response}` and `{rubric}` replaced in one pass over the
    template; plain replacement, not `str.format`, so braces elsewhere (a `\\boxed{}` in the
    response, JSON in the instructions) stay as they are, and a slot name inside a filled-in value
    (a prompt that contains "{response}") is not filled in again. ValueError when the template has
    `{rubric}` and `rubric` is None."""
    values = {"prompt": prompt, "response": response, "rubric": rubric}

    def fill(match: re.Match[str]) -> str:
        value = values[match.group(1)]
        if value is None:
            raise ValueError("the template asks for {rubric} and there is none")
        return value

    return _SLOTS.sub(fill, template)


def record_rubric(record: PromptRecord) -> str | None:
    """The row's `rubric` column (a non-empty string), else None."""
    value = record.metadata.get("rubric")
    return value if isinstance(value, str) and value.strip() else None


def prompt_text(record: PromptRecord) -> str:
    """The record's question as text: `prompt`, or the chat turns' contents, one per line."""
    if record.prompt is not None:
        return record.prompt
    return "\n".join(f"{t['role']}: {t['content']}" for t in record.messages or [])


# -- the models -----------------------------------------------------------------------------------

ComputeHook = Callable[[int, int], None]  # (tokens, n_params): charge 2 * n_params * tokens FLOPs


def matmul_params(model: Any) -> int:
    """N of the 2N-per-token estimate: every parameter but the input-embedding table (a lookup),
    the output head counted even when tied to it (scalerl.telemetry.compute.flop_params's rule)."""
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skip = id(embed.weight) if embed is not None else None
    total = sum(p.numel() for p in model.parameters() if id(p) != skip)
    if head is not None and id(head.weight) == skip:
        total += head.weight.numel()
    return total


class RewardModel:
    """The reward model of one task (module docstring). Loaded by `load()` (the router's
    `check_tasks`, before training), so a bad path fails the run at start with exit 2."""

    def __init__(self, task: str, config: RewardModelConfig) -> None:
        self.task = task
        self.config = config
        self.key = f"rewards.reward_models.{task}"
        self.template: str | None = config.template
        self._model: Any = None
        self._tokenizer: Any = None
        self._engine: Any = None  # the judge's generation engine (engine: embedded | vllm)
        self.n_params = 0
        self.compute_hook: ComputeHook | None = None
        self._lock = threading.Lock()
        self.calls = 0
        self.samples = 0
        self.tokens = 0
        self.truncated = 0
        self.malformed = 0

    @property
    def loaded(self) -> bool:
        return self._tokenizer is not None

    def load(self) -> None:
        """Load the model, tokenizer and template; a `ConfigError` naming the key when they cannot be."""
        if self.loaded:
            return
        import torch
        from transformers import (
            AutoModelForCausalLM,
            AutoModelForSequenceClassification,
            AutoTokenizer,
        )

        cfg = self.config
        if cfg.template_path is not None:
            try:
                self.template = Path(cfg.template_path).read_text(encoding="utf-8")
            except OSError as err:
                raise ConfigError(f"{self.key}.template_path: cannot read {cfg.template_path!r}: "
                                  f"{err.strerror or err}") from None
            for slot in ("{prompt}", "{response}"):
                if slot not in self.template:
                    raise ConfigError(f"{self.key}.template_path: {cfg.template_path} has no {slot}")
        try:
            device = torch.device(cfg.device)
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError) as err:
            raise ConfigError(f"{self.key}.device: {cfg.device!r} is not usable here: {err}") from None
        cls = AutoModelForSequenceClassification if cfg.kind == "classifier" else AutoModelForCausalLM
        try:
            tokenizer = AutoTokenizer.from_pretrained(cfg.path)
            if cfg.engine == "vllm":
                # vLLM loads the weights itself; here only the parameter count (FLOPs) is needed,
                # so the model is built on the meta device (no weights read, no memory).
                from transformers import AutoConfig

                with torch.device("meta"):
                    model = cls.from_config(AutoConfig.from_pretrained(cfg.path), dtype=torch.float32)
            else:
                model = cls.from_pretrained(cfg.path, dtype=torch.float32)
        except (OSError, ValueError) as err:
            raise ConfigError(f"{self.key}.path: cannot load a {cfg.kind} from {cfg.path!r}: "
                              f"{str(err).splitlines()[0]}") from None
        if cfg.kind == "classifier" and int(model.config.num_labels) != 1:
            raise ConfigError(f"{self.key}.path: {cfg.path} has {model.config.num_labels} labels; a "
                              "reward classifier has one logit (num_labels=1)")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ConfigError(f"{self.key}.path: the tokenizer at {cfg.path} has no pad or eos token "
                              "(batching needs one)")
        tokenizer.pad_token_id = pad
        # The classifier reads the last non-pad token: pad on the right keeps every real token's
        # position, so a padded batch scores what one-by-one scoring does. generate() needs left padding.
        tokenizer.padding_side = "right" if cfg.kind == "classifier" else "left"
        tokenizer.truncation_side = "left"
        if model.config.pad_token_id is None:
            model.config.pad_token_id = pad
        self.n_params = matmul_params(model)
        if cfg.engine == "vllm":
            self._engine = self._build_engine(model, tokenizer)
            model = None  # the meta-device copy served its purpose (n_params)
        else:
            model.to(device).eval()
            if cfg.engine == "embedded":
                self._engine = self._build_engine(model, tokenizer)
        self._model, self._tokenizer, self._device = model, tokenizer, device

    def _build_engine(self, model: Any, tokenizer: Any) -> Any:
        """The judge's `embedded` or `vllm` engine through the run's engine factory: greedy requests
        only, `batch_size` slots, float32 with the float32 LM head (the arithmetic of the float32
        `hf` path), stopping at the tokenizer's eos. Failures to build are the user's setting."""
        from scalerl.rollout.factory import EngineSpec, EngineUnavailableError, build_engine

        cfg = self.config
        eos = () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)
        length = None
        if cfg.engine == "vllm":
            limit = getattr(model.config, "max_position_embeddings", None)
            length = cfg.max_length + cfg.max_new_tokens
            if limit is not None and length > int(limit):
                raise ConfigError(f"{self.key}.max_length: {cfg.max_length} + max_new_tokens "
                                  f"{cfg.max_new_tokens} = {length} exceeds {cfg.path}'s "
                                  f"max_position_embeddings {limit} (vLLM's max_model_len)")
        spec = EngineSpec(kind=cfg.engine, model_path=cfg.path, fp32_lm_head=True, seed=0,
                          max_batch_size=cfg.batch_size, eos_token_ids=eos,
                          pad_token_id=tokenizer.pad_token_id, dtype="float32", max_model_len=length)
        try:
            return build_engine(spec, model=model if cfg.engine == "embedded" else None)
        except (EngineUnavailableError, ValueError, FileNotFoundError) as err:
            # UnsupportedModelError (an attention head size vLLM lacks) is a ValueError too.
            raise ConfigError(f"{self.key}.engine: {cfg.engine} cannot serve {cfg.path!r}: "
                              f"{str(err).splitlines()[0]}") from None

    def close(self) -> None:
        """Release the judge's engine (vLLM's engine core); idempotent."""
        engine, self._engine = self._engine, None
        if engine is not None:
            from scalerl.rollout.factory import close_engine

            close_engine(engine)

    # -- scoring ----------------------------------------------------------------------------------

    def score_group(self, record: PromptRecord, responses: Sequence[str]) -> list[ModelScore]:
        """One `ModelScore` per response, in order (batched `batch_size` at a time)."""
        if not self.loaded:
            self.load()
        out: list[ModelScore] = []
        size = self.config.batch_size
        with self._lock:
            for start in range(0, len(responses), size):
                chunk = list(responses[start:start + size])
                if self.config.kind == "classifier":
                    out.extend(self._classify(record, chunk))
                else:
                    out.extend(self._judge(record, chunk))
            self.calls += 1
            self.samples += len(responses)
        return out

    def _charge(self, tokens: int) -> None:
        self.tokens += tokens
        if self.compute_hook is not None:
            self.compute_hook(tokens, self.n_params)

    def _encode(self, texts: list[str]) -> Any:
        tok = self._tokenizer
        lengths = [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
        self.truncated += sum(n > self.config.max_length for n in lengths)
        enc = tok(texts, add_special_tokens=False, padding=True, truncation=True,
                  max_length=self.config.max_length, return_tensors="pt")
        return {k: v.to(self._device) for k, v in enc.items()}

    def classifier_input(self, record: PromptRecord, response: str) -> str:
        """The text the classifier reads (module docstring)."""
        tok = self._tokenizer
        if getattr(tok, "chat_template", None):
            turns = [*record.chat(), {"role": "assistant", "content": response}]
            return str(tok.apply_chat_template(turns, tokenize=False))
        return f"{prompt_text(record)}\n{response}"

    def _classify(self, record: PromptRecord, responses: list[str]) -> list[ModelScore]:
        import torch

        enc = self._encode([self.classifier_input(record, r) for r in responses])
        with torch.no_grad():
            logits = self._model(**enc).logits.float().reshape(-1)
        self._charge(int(enc["attention_mask"].sum()))
        out = []
        for value in logits.tolist():
            if not math.isfinite(value):
                out.append(ModelScore(0.0, value, "error", f"{self.key}: non-finite logit {value!r}"))
            else:
                out.append(ModelScore(sigmoid_score(value, self.config.temperature), value))
        return out

    def judge_prompt(self, record: PromptRecord, response: str) -> str:
        """The judge's input: the template filled in, as the user turn of the judge tokenizer's chat
        template with the assistant turn opened (plain text when it has no chat template)."""
        assert self.template is not None
        rubric = record_rubric(record)
        if rubric is None and "{rubric}" in self.template:
            raise ValueError(f"{self.key}: the judge template has {{rubric}} and row {record.id!r} "
                             f"({record.source}) has no 'rubric' column (a non-empty string)")
        text = render_template(self.template, prompt_text(record), response, rubric)
        tok = self._tokenizer
        if getattr(tok, "chat_template", None):
            return str(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                               add_generation_prompt=True))
        return text

    def judge_texts(self, prompts: list[str]) -> list[str]:
        """The judge's decoded output for each full prompt (`judge_prompt`), generated greedily by
        the configured engine; every input and generated token is charged (module docstring)."""
        if not self.loaded:
            self.load()
        if self._engine is not None:
            return self._engine_texts(prompts)
        return self._hf_texts(prompts)

    def _engine_texts(self, prompts: list[str]) -> list[str]:
        from scalerl.rollout.protocol import GenerationRequest, SamplingParams

        cfg, tok = self.config, self._tokenizer
        ids = tok(prompts, add_special_tokens=False)["input_ids"]
        self.truncated += sum(len(row) > cfg.max_length for row in ids)
        ids = [list(row[-cfg.max_length:]) for row in ids]  # keep the end, as truncation_side="left"
        eos = () if tok.eos_token_id is None else (int(tok.eos_token_id),)
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=cfg.max_new_tokens, stop_token_ids=eos)
        requests = [GenerationRequest(request_id=f"{self.key}:{self.calls}:{i}", prompt_ids=row,
                                      params=params) for i, row in enumerate(ids)]
        done = self._engine.generate(requests)
        # A completion's tokens end at (and include) its stop token: the hf path's count.
        self._charge(sum(len(row) for row in ids) + sum(c.num_tokens for c in done))
        return [str(tok.decode(c.token_ids, skip_special_tokens=True)) for c in done]

    def _hf_texts(self, prompts: list[str]) -> list[str]:
        import torch

        cfg = self.config
        enc = self._encode(prompts)
        tok = self._tokenizer
        with torch.no_grad():
            seqs = self._model.generate(
                **enc, do_sample=False, max_new_tokens=cfg.max_new_tokens, pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id, temperature=None, top_p=None, top_k=None,
            )
        new = seqs[:, enc["input_ids"].shape[1]:]
        generated = 0
        texts = []
        for row in new.tolist():
            # Tokens after the first eos are padding of a finished row: not generated work.
            if tok.eos_token_id is not None and tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id) + 1]
            generated += len(row)
            texts.append(str(tok.decode(row, skip_special_tokens=True)))
        self._charge(int(enc["attention_mask"].sum()) + generated)
        return texts

    def _judge(self, record: PromptRecord, responses: list[str]) -> list[ModelScore]:
        cfg = self.config
        texts = self.judge_texts([self.judge_prompt(record, r) for r in responses])
        out = []
        for text in texts:
            parsed = parse_verdict(text, cfg.verdict, cfg.verdict_regex, cfg.score_max)
            if parsed is None:
                self.malformed += 1
                out.append(ModelScore(0.0, math.nan, "error",
                                      f"{self.key}: malformed verdict {text[:120]!r}"))
            else:
                out.append(ModelScore(parsed[0], parsed[1]))
        return out

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"calls": self.calls, "samples": self.samples, "tokens": self.tokens,
                    "truncated": self.truncated, "malformed": self.malformed}
