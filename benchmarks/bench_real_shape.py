"""The trainer at a real model shape (issue 23): (1) peak memory of one step against response length,
chunked vs full-logit LM head; (2) tokens/s on a long-tailed batch, packed token-budget
micro-batches vs the padded micro-batch vs TRL's GRPOTrainer loss computation, side by side.

    python benchmarks/bench_real_shape.py            # Qwen2.5-0.5B layer shape, 2 layers, CPU float32
    python benchmarks/bench_real_shape.py --quick    # a tiny shape, seconds (tests/benchmarks runs it)
    python benchmarks/bench_real_shape.py --lengths 256 1024 4096 --max-gb 12 --part memory
    python benchmarks/bench_real_shape.py --part throughput --layers 4
    python benchmarks/bench_real_shape.py --part head-grad --samples 64 --longest 128 --reps 2

The model is random-init Qwen2 with Qwen2.5-0.5B's layer shape (hidden 896, 14 heads of 64, 2 KV
heads, MLP 4864, vocabulary 151,936, tied embeddings as that model has them) but `--layers` layers
(2), saved to a temporary folder with the tiny char tokenizer padded to the vocabulary: nothing is
downloaded. Each setting is ONE `Trainer.step` (4 samples of a 64-token prompt and an L-token
response, one group, one micro-batch, AdamW states allocated in that step) in a FRESH subprocess,
and the number reported is that process's peak: on CPU its RSS high-water mark
(`getrusage(RUSAGE_SELF).ru_maxrss`: model, optimizer, activations, logits, everything the process
held at its worst moment), on CUDA `torch.cuda.max_memory_allocated`. Peaks, not averages.

Settings: `chunked` (`optim.logit_chunk_tokens` null: the default, 883 tokens at vocabulary
151,936; `--chunk` to set it) and `full` (`logit_chunk_tokens` above the micro-batch's response
tokens and `forward.CLOSED_FORM` off: every response token's float32 logits at once through plain
autograd, the trainer before chunking). A full-logit
setting whose peak, extrapolated linearly from its two shorter lengths, would pass `--max-gb` is
skipped and printed as such (the
extrapolation is printed, never used as a measurement). Growth per 1k response tokens is the slope
between the two longest measured lengths of each path; the ratio printed is chunked / full (target:
<= 0.2, i.e. the chunked step grows by at most 1/5 of what the full-logit step grows; the decoder's
own activations are inside both numbers).

Throughput (`--part throughput`, one process, the sides alternating A, B, C, A, B, C after one
untimed warm-up run each; medians): `--samples` responses of `longest * 0.55^k` tokens (at least 16;
mean/max 0.28 at 8 samples) after 64-token prompts, in two groups; one forward and backward of the
whole batch (`Trainer.compute_gradients`, grpo + token aggregation) as (a) one padded micro-batch,
(b) packed with a token budget of the whole batch, and (c) TRL's `GRPOTrainer._compute_loss` (its own
forward over right-padded completions with full logits, loss_type dapo, the same token-level loss)
plus backward. tokens/s counts real tokens (prompt + response) for all three.

Head gradient (`--part head-grad`, one process, alternating after one untimed step each; medians):
one `Trainer.step` (GRPO, one micro-batch, clip, AdamW) of `--samples` samples (`tailed_groups`: two
groups, 64-token prompts; exponential response lengths of mean ~`--longest`/1.4, capped at
`--longest`) with the FP32 head's closed-form gradient and fused AdamW (`now`, the trainer as it
is) against autograd through each chunk's recomputation and AdamW's per-tensor loop (`before`),
each side training its own copy.

`--device cuda --dtype bfloat16` is the GPU form (benchmarks/gpu/real_shape_gpu.py runs it at the
0.5B and 1.5B shapes and adds tokens/s and MFU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool


QWEN25_05B = Shape(896, 24, 14, 2, 4864, 151_936, True)
QWEN25_15B = Shape(1536, 28, 12, 2, 8960, 151_936, True)
QUICK = Shape(64, 2, 4, 2, 128, 8192, True)
SHAPES = {"0.5b": QWEN25_05B, "1.5b": QWEN25_15B, "quick": QUICK}
PROMPT_TOKENS = 64
SAMPLES = 4


def save_model(shape: Shape, path: Path, seed: int = 0, init_std: float | None = None,
               stop_prob: float | None = None) -> int:
    """A random-init Qwen2 of `shape` and a tokenizer covering its vocabulary; returns its size.

    `init_std` replaces the config's `initializer_range` (0.02), the std of every weight matrix and
    embedding: larger values give peaked next-token distributions (a small top-p support) instead
    of near-flat ones. `stop_prob` makes the model stop: see `set_stop_prob`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from scalerl.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer(pad_to=shape.vocab)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=32768, rope_theta=1_000_000.0, tie_word_embeddings=shape.tied,
        pad_token_id=0, eos_token_id=1, bos_token_id=None,
        **({} if init_std is None else {"initializer_range": init_std}),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    if stop_prob is not None:
        set_stop_prob(model, stop_prob, seed)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


STOP_DIRECTION_NORM = 2.0


def set_stop_prob(model: Any, target: float, seed: int = 0, tol: float = 0.05) -> float:
    """Give a random-init model (tied embeddings) a per-token stop probability of about `target`.

    A random-init model's next-token distribution is near flat over 151,936 tokens, so EOS (id 1)
    comes once in ~150k tokens: every sample runs to the length cap, unlike an RL batch, whose
    response lengths spread out with a long tail. Here every embedding row gets a shared direction
    `u` (norm `STOP_DIRECTION_NORM`), so every final hidden state leans along `u`, and the EOS row
    gets a further `alpha u`: its logit rises by about `alpha h.u` at every position, the others'
    by the same `h.u` (cancelled by the softmax). `alpha` is found by the secant method on
    logit(mean P(EOS)) over random text (256 positions, seed `seed`) until |ln(P / target)| <=
    `tol`. Per position P(EOS) still varies with the context, so lengths are a mixture of
    geometric laws: mean about 1 / target, a long tail up to the cap. Returns the achieved mean."""
    import torch

    if not 0 < target < 1:
        raise ValueError(f"stop_prob must be in (0, 1), got {target}")
    emb = model.get_input_embeddings().weight
    if model.get_output_embeddings().weight is not emb:
        raise ValueError("set_stop_prob needs tied embeddings (the shape's `tied`)")
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(emb.shape[1], generator=g)
    u = STOP_DIRECTION_NORM * u / u.norm()
    text = torch.randint(8, emb.shape[0], (4, 64), generator=g)
    eos = int(model.config.eos_token_id)
    with torch.no_grad():
        emb.add_(u)
        base = emb[eos].clone()

        def mean_p(alpha: float) -> float:
            emb[eos] = base + alpha * u
            return float(model(text).logits.softmax(-1)[..., eos].mean())

        def logit(p: float) -> float:
            p = min(max(p, 1e-12), 1 - 1e-12)
            return math.log(p / (1 - p))

        goal = logit(target)
        a0, a1 = 0.0, 4.0
        f0, p = logit(mean_p(a0)) - goal, mean_p(a1)
        for _ in range(30):
            if abs(math.log(max(p, 1e-12) / target)) <= tol:
                return p
            f1 = logit(p) - goal
            if f1 == f0:
                break
            a0, a1, f0 = a1, a1 - f1 * (a1 - a0) / (f1 - f0), f1
            p = mean_p(a1)
    raise RuntimeError(f"set_stop_prob: no alpha gives mean P(EOS) {target} (last {p:.3g} at {a1:.3g})")


def step_groups(vocab: int, length: int, seed: int = 0) -> list[Any]:
    """One group of `SAMPLES` samples: a `PROMPT_TOKENS` prompt, `length` random response tokens,
    behaviour log-probs near a flat distribution's, rewards 1, 0, 1, 0."""
    import torch

    from scalerl.data.records import PromptRecord
    from scalerl.rollout.protocol import Completion
    from scalerl.training.batch import ScoredGroup

    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(8, vocab, (PROMPT_TOKENS,), generator=g).tolist()
    flat = -math.log(vocab)
    completions = [
        Completion(
            request_id="p0", sample_index=k, prompt_ids=prompt,
            token_ids=torch.randint(8, vocab, (length,), generator=g).tolist(),
            logprobs=(flat + 0.1 * torch.randn(length, generator=g)).tolist(),
            versions=[0] * length, loss_mask=[True] * length, finish_reason="length", start_version=0,
        )
        for k in range(SAMPLES)
    ]
    rewards = [float(k % 2 == 0) for k in range(SAMPLES)]
    return [ScoredGroup(PromptRecord(id="p0", task="bench", prompt="x"), completions, rewards)]


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One trainer step in this (fresh) process; its peak memory, time and token count."""
    import torch

    from scalerl.config import AlgorithmConfig, ModelConfig, OptimConfig
    from scalerl.training.policy import load_policy
    from scalerl.training.trainer import Trainer

    torch.manual_seed(0)
    if spec.get("reference"):
        import scalerl.training.forward as fwd

        fwd.CLOSED_FORM = False  # `full`: every position's logits at once through plain autograd
    device = spec["device"]
    policy = load_policy(ModelConfig(name_or_path=spec["model"], dtype=spec["dtype"]), device=device)
    groups = step_groups(spec["vocab"], spec["length"])
    optim = OptimConfig(micro_batch_size=SAMPLES, logit_chunk_tokens=spec["chunk"], warmup_steps=0)
    trainer = Trainer(policy, AlgorithmConfig(), optim, temperature=1.0, max_new_tokens=spec["length"])
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    metrics = trainer.step(groups)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    tokens = SAMPLES * (PROMPT_TOKENS + spec["length"])
    return {"peak_gb": peak, "step_s": elapsed, "tokens": tokens, "loss": metrics["loss"],
            "skipped": metrics["skipped_nonfinite"]}


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"setting {spec}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def slope_per_1k(points: list[tuple[int, float]]) -> float:
    """GB per 1,000 response tokens between the two longest measured lengths."""
    (l1, p1), (l2, p2) = sorted(points)[-2:]
    return (p2 - p1) / ((l2 - l1) / 1000.0)


def extrapolate(points: list[tuple[int, float]], length: int) -> float:
    (l1, p1), (l2, p2) = sorted(points)[-2:]
    return p2 + (p2 - p1) / (l2 - l1) * (length - l2)


def measure(args: argparse.Namespace, model_dir: Path, params: int) -> dict[str, Any]:
    shape = SHAPES[args.size] if not args.quick else QUICK
    chunk = args.chunk if not args.quick else 16
    full = 10**9  # more tokens than any micro-batch: one chunk (plain autograd: see `child`)
    results: dict[str, list[dict[str, Any]]] = {"chunked": [], "full": []}
    skipped: list[str] = []
    for path in args.paths:
        points: list[tuple[int, float]] = []
        for length in sorted(args.lengths):
            if len(points) >= 2 and extrapolate(points, length) > args.max_gb:
                skipped.append(f"{path} L={length}: skipped, predicted {extrapolate(points, length):.1f} GB "
                               f"> --max-gb {args.max_gb:g}")
                continue
            spec = {"model": str(model_dir), "vocab": shape.vocab, "length": length, "device": args.device,
                    "dtype": args.dtype, "chunk": chunk if path == "chunked" else full,
                    "reference": path == "full"}
            row = run_child(spec, timeout=args.timeout) | {"length": length}
            points.append((length, row["peak_gb"]))
            results[path].append(row)
            print(f"{path:8s} L={length:5d}  peak {row['peak_gb']:7.2f} GB  step {row['step_s']:8.3f} s  "
                  f"{row['tokens'] / row['step_s']:8.0f} tokens/s", flush=True)
    return {"shape": asdict(shape), "params": params, "chunk": chunk, "results": results, "skipped": skipped}


def report(out: dict[str, Any]) -> None:
    for line in out["skipped"]:
        print(line)
    rows = out["results"]
    growth = {}
    for path in ("chunked", "full"):
        pts = [(r["length"], r["peak_gb"]) for r in rows[path]]
        if len(pts) >= 2:
            growth[path] = slope_per_1k(pts)
            print(f"growth {path}: {growth[path]:.3f} GB per 1k response tokens ({SAMPLES} samples)")
    if "chunked" in growth and "full" in growth:
        ratio = growth["chunked"] / growth["full"] if growth["full"] > 0 else math.inf
        print(f"ratio growth chunked/full: {ratio:.3f} (target <= 0.2)")
    by_len = {path: {r["length"]: r for r in rows[path]} for path in rows}
    for length in sorted(set(by_len["chunked"]) & set(by_len["full"])):
        c, f = by_len["chunked"][length], by_len["full"][length]
        print(f"ratio peak chunked/full at L={length}: {c['peak_gb'] / f['peak_gb']:.3f}; "
              f"step time chunked/full: {c['step_s'] / f['step_s']:.3f}")
    lengths = sorted(by_len["chunked"])
    if len(lengths) >= 2:
        lo, hi = lengths[0], lengths[-1]
        print(f"chunked growth L={lo} -> L={hi}: "
              f"{by_len['chunked'][hi]['peak_gb'] - by_len['chunked'][lo]['peak_gb']:.3f} GB")


def tailed_lengths(n: int, longest: int) -> list[int]:
    """`n` response lengths with a long tail: `longest * 0.55^k`, at least 16 (mean/max 0.28 at
    n=8: one long sample and many short ones, the shape of reasoning RL's length distribution)."""
    return [max(16, round(longest * 0.55**k)) for k in range(n)]


def tailed_groups(vocab: int, lengths: list[int], seed: int = 0) -> list[Any]:
    """Two groups over `lengths` (halves), `PROMPT_TOKENS`-token prompts, random tokens; rewards alternate."""
    import torch

    from scalerl.data.records import PromptRecord
    from scalerl.rollout.protocol import Completion
    from scalerl.training.batch import ScoredGroup

    g = torch.Generator().manual_seed(seed)
    flat = -math.log(vocab)
    groups = []
    half = len(lengths) // 2
    for gi, part in enumerate((lengths[:half], lengths[half:])):
        prompt = torch.randint(8, vocab, (PROMPT_TOKENS,), generator=g).tolist()
        comps = [
            Completion(
                request_id=f"p{gi}", sample_index=k, prompt_ids=prompt,
                token_ids=torch.randint(8, vocab, (n,), generator=g).tolist(),
                logprobs=(flat + 0.1 * torch.randn(n, generator=g)).tolist(),
                versions=[0] * n, loss_mask=[True] * n, finish_reason="length", start_version=0,
            )
            for k, n in enumerate(part)
        ]
        groups.append(ScoredGroup(PromptRecord(id=f"p{gi}", task="bench", prompt="x"), comps,
                                  [float(k % 2 == 0) for k in range(len(part))]))
    return groups


def trl_side(model_dir: Path, groups: list[Any], workdir: str, device: str = "cpu",
             dtype: str = "float32") -> Any:
    """A real `trl.GRPOTrainer` on the same model folder, and a function running its loss computation
    (`_compute_loss`: its own model forward over right-padded completions, full logits, then the
    DAPO token-level loss, the counterpart of scalerl's grpo + token aggregation) and backward on
    `groups`; gradient checkpointing off as on scalerl's side (TRL's default is on). None if TRL is
    not installed."""
    try:
        import trl  # noqa: F401
    except ImportError:
        return None
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    comps = [c for g in groups for c in g.completions]
    n, width = len(comps), max(c.num_tokens for c in comps)
    trainer = GRPOTrainer(
        model=str(model_dir), processing_class=AutoTokenizer.from_pretrained(model_dir),
        reward_funcs=lambda prompts, completions, **_: [0.0] * len(completions),
        args=GRPOConfig(output_dir=os.path.join(workdir, "trl"), per_device_train_batch_size=n,
                        num_generations=n // len(groups), max_completion_length=width, beta=0.0,
                        loss_type="dapo", report_to="none", use_cpu=device == "cpu",
                        bf16=dtype == "bfloat16", seed=0,
                        # TRL's default recomputes every activation in backward: a handicap here.
                        gradient_checkpointing=False),
        train_dataset=Dataset.from_dict({"prompt": ["x"] * n}),
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    completion = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, c in enumerate(comps):
        completion[i, : c.num_tokens] = torch.tensor(c.token_ids)
        mask[i, : c.num_tokens] = 1
    inputs = {
        "prompt_ids": torch.tensor([c.prompt_ids for c in comps]),
        "prompt_mask": torch.ones((n, PROMPT_TOKENS), dtype=torch.long),
        "completion_ids": completion, "completion_mask": mask,
        "advantages": torch.tensor([1.0 if k % 2 == 0 else -1.0 for k in range(n)]),
    }
    inputs = {k: v.to(trainer.model.device) for k, v in inputs.items()}
    inputs |= {"old_per_token_logps": None, "ref_per_token_logps": None,
               "num_items_in_batch": inputs["completion_mask"].sum()}

    def run() -> float:
        trainer.model.zero_grad(set_to_none=True)
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        return float(loss.detach())

    return run


def throughput(args: argparse.Namespace, model_dir: Path, shape: Shape) -> dict[str, Any]:
    """Tokens/s of one step's forward and backward on a long-tailed batch, side by side in this process:
    packed token-budget micro-batches, the padded micro-batch of the same samples, and TRL's loss
    computation on the same batch. Runs alternate (A, B, C, A, B, C, ...); medians reported."""
    import statistics

    import torch

    from scalerl.config import AlgorithmConfig, ModelConfig, OptimConfig
    from scalerl.training.policy import load_policy
    from scalerl.training.trainer import Trainer

    torch.manual_seed(0)
    lengths = tailed_lengths(args.samples, args.longest)
    groups = tailed_groups(shape.vocab, lengths)
    tokens = sum(PROMPT_TOKENS + n for n in lengths)
    print(f"throughput batch: {len(lengths)} samples, responses {lengths} (mean/max "
          f"{statistics.mean(lengths) / max(lengths):.2f}), {tokens} real tokens", flush=True)
    policy = load_policy(ModelConfig(name_or_path=str(model_dir), dtype=args.dtype,
                                     attn_implementation=args.attn), device=args.device)
    algo = AlgorithmConfig(loss_type="grpo", aggregation="token")
    sides: dict[str, Any] = {}
    for name, optim in {
        "padded": OptimConfig(micro_batch_size=len(lengths), warmup_steps=0),
        "packed": OptimConfig(micro_batch_tokens=tokens, warmup_steps=0),
    }.items():
        trainer = Trainer(policy, algo, optim, max_new_tokens=max(lengths))
        sides[name] = lambda t=trainer: t.compute_gradients(groups)["loss"]
    with tempfile.TemporaryDirectory(prefix="scalerl_trl_") as work:
        trl_run = trl_side(model_dir, groups, work, args.device, args.dtype) if args.trl else None
        if trl_run is not None:
            sides["trl"] = trl_run
        times: dict[str, list[float]] = {k: [] for k in sides}
        losses: dict[str, float] = {}
        sync = torch.cuda.synchronize if str(args.device).startswith("cuda") else (lambda: None)
        for run in sides.values():  # warm-up, not timed
            run()
        for _ in range(args.reps):
            for name, run in sides.items():
                sync()
                start = time.perf_counter()
                losses[name] = float(run())
                sync()
                times[name].append(time.perf_counter() - start)
    rates = {k: tokens / statistics.median(v) for k, v in times.items()}
    for k, r in rates.items():
        print(f"{k:7s} {r:8.0f} tokens/s (median of {args.reps}; steps {[round(t, 2) for t in times[k]]} s)")
    print(f"ratio tokens/s packed/padded: {rates['packed'] / rates['padded']:.2f} (target >= 1.5)")
    if "trl" in rates:
        print(f"ratio tokens/s packed/trl: {rates['packed'] / rates['trl']:.2f} (target >= 1.5)")
    else:
        print("trl: not measured (not installed, or --no-trl)")
    return {"lengths": lengths, "tokens": tokens, "times_s": times, "tokens_per_s": rates, "loss": losses}


@contextlib.contextmanager
def autograd_head() -> Any:
    """The head's backward as it was before `training.head_grad` (`forward.CLOSED_FORM` off): plain
    autograd within one chunk, autograd through each chunk's recomputation beyond."""
    import scalerl.training.forward as fwd

    fwd.CLOSED_FORM = False
    try:
        yield
    finally:
        fwd.CLOSED_FORM = True


def head_grad(args: argparse.Namespace, model_dir: Path, shape: Shape) -> dict[str, Any]:
    """`Trainer.step` (forward, backward, clip, AdamW) on one batch, side by side in this process:
    `now` (the FP32 head's closed-form gradient, `training.head_grad`, and fused AdamW) against
    `before` (autograd through each chunk's recomputation, and AdamW's per-tensor loop). Each side
    trains its own copy of the model on the same batch; runs alternate after one untimed step each;
    medians reported."""
    import copy
    import random
    import statistics

    from scalerl.config import AlgorithmConfig, ModelConfig, OptimConfig
    from scalerl.training.policy import load_policy
    from scalerl.training.trainer import Trainer

    rng = random.Random(0)
    # Geometric-like lengths, mean ~`longest`/1.4, capped: an RL batch's spread (the step bench's).
    lengths = [min(args.longest, max(1, int(rng.expovariate(1.4 / args.longest))))
               for _ in range(args.samples)]
    groups = tailed_groups(shape.vocab, lengths)  # two groups, 64-token prompts
    print(f"head-grad batch: {len(lengths)} samples, {sum(lengths)} response tokens "
          f"(longest {max(lengths)}), {PROMPT_TOKENS}-token prompts; chunk {args.chunk or 'default'}",
          flush=True)
    base = load_policy(ModelConfig(name_or_path=str(model_dir)), device=args.device)
    algo = AlgorithmConfig(loss_type="grpo", aggregation="sample", adv_norm="group")
    optim = OptimConfig(lr=1e-6, micro_batch_size=len(lengths), warmup_steps=0,
                        logit_chunk_tokens=args.chunk)
    now = Trainer(copy.deepcopy(base), algo, optim, max_new_tokens=args.longest)
    before = Trainer(base, algo, optim, max_new_tokens=args.longest)
    for group in before.optimizer.param_groups:
        group["fused"] = None  # AdamW's per-tensor loop

    def run_before() -> dict[str, float]:
        with autograd_head():
            return before.step(groups)

    sides = {"now": lambda: now.step(groups), "before": run_before}
    times: dict[str, list[float]] = {k: [] for k in sides}
    losses: dict[str, float] = {}
    for run in sides.values():  # warm-up, not timed
        run()
    for _ in range(args.reps):
        for name, run in sides.items():
            start = time.perf_counter()
            losses[name] = float(run()["loss"])
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k in sides:
        print(f"{k:7s} step {med[k]:8.2f} s (median of {args.reps}; {[round(t, 2) for t in times[k]]}), "
              f"loss {losses[k]:.6f}")
    print(f"ratio step time before/now: {med['before'] / med['now']:.2f}")
    return {"lengths": lengths, "times_s": times, "median_s": med, "loss": losses}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shape and lengths (seconds)")
    parser.add_argument("--size", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (the shape's own if 0)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--chunk", type=int, default=None,
                        help="optim.logit_chunk_tokens of the chunked path (default: the config's, null)")
    parser.add_argument("--max-gb", type=float, default=12.0, help="skip settings predicted above this peak")
    parser.add_argument("--paths", nargs="+", choices=("chunked", "full"), default=["chunked", "full"],
                        help="which heads to measure (a lone full-logit length has no prediction to skip on)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per setting")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--part", choices=("memory", "throughput", "head-grad", "all"), default="all",
                        help="memory: peak per response length (fresh processes); throughput: packed vs "
                             "padded vs TRL tokens/s in one process; head-grad: Trainer.step with the "
                             "head's closed-form gradient and fused AdamW against before, in one process")
    parser.add_argument("--samples", type=int, default=8, help="throughput: samples in the batch")
    parser.add_argument("--longest", type=int, default=512, help="throughput: the longest response")
    parser.add_argument("--reps", type=int, default=3, help="throughput: timed runs per side")
    parser.add_argument("--no-trl", dest="trl", action="store_false", help="throughput: skip TRL")
    parser.add_argument("--attn", choices=("eager", "sdpa", "flash_attention_2"), default=None,
                        help="throughput: model.attn_implementation of scalerl's sides (null: transformers')")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.quick:
        args.lengths = [32, 256]
    shape = QUICK if args.quick else SHAPES[args.size]
    if args.layers:
        shape = Shape(**{**asdict(shape), "layers": args.layers})
    SHAPES[args.size if not args.quick else "quick"] = shape
    with tempfile.TemporaryDirectory(prefix="scalerl_real_shape_") as tmp:
        params = save_model(shape, Path(tmp))
        print(f"model: {shape} ({params / 1e6:.1f}M parameters), {SAMPLES} samples x ({PROMPT_TOKENS} "
              f"prompt + L response) tokens, one micro-batch, device {args.device}, {args.dtype}", flush=True)
        out: dict[str, Any] = {"shape": asdict(shape), "params": params}
        if args.part in ("memory", "all"):
            out |= measure(args, Path(tmp), params)
            report(out)
        if args.part in ("throughput", "all"):
            if args.quick:
                args.samples, args.longest, args.reps = 4, 64, 1
            out["throughput"] = throughput(args, Path(tmp), shape)
        if args.part in ("head-grad", "all"):
            if args.quick:
                args.samples, args.longest, args.reps, args.chunk = 16, 32, 1, 16
            out["head_grad"] = head_grad(args, Path(tmp), shape)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
