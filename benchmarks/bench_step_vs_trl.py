"""One whole GRPO step, scalerl vs TRL's `GRPOTrainer`, at Qwen2.5-0.5B's layer shape (issue 41).

    python benchmarks/bench_step_vs_trl.py --threads 1                 # 8 prompts x 8 samples, 512 tokens
    python benchmarks/bench_step_vs_trl.py --threads 1 --prompts 4 --n 4 --max-new-tokens 64
    python benchmarks/bench_step_vs_trl.py --quick                     # a tiny shape, seconds (tests run it)

The model is random-init Qwen2 with Qwen2.5-0.5B's layer shape (hidden 896, 14 heads of 64, 2 KV
heads, MLP 4864, vocabulary 151,936, tied embeddings) and `--layers` layers (2), saved once to a
temporary folder with the tiny char tokenizer padded to the vocabulary (benchmarks/bench_real_shape.py's
`save_model`); both sides load that folder, float32, on the CPU. Nothing is downloaded.

One step = `--prompts` prompts (`--prompt-tokens` tokens each) x `--n` samples of at most
`--max-new-tokens` tokens at temperature `--temperature` (no top-p/top-k), scored by the same cheap
deterministic reward (the fraction of even token ids in the completion), then one optimizer step of
GRPO (clipped ratio 0.2/0.2, per-sample aggregation, group-normalised advantages, no KL, grad clip 1.0,
AdamW) over every sample in one micro-batch.

  scalerl: `EmbeddedEngine.generate` (continuous batching, every sample in one batch), decode + reward
           into `ScoredGroup`s, `Trainer.step` (forward with log-probs, loss, backward, clip, AdamW),
           then `engine.update_weights` with the new weights (the sync pipeline's step, driven directly).
  TRL:     `GRPOTrainer.training_step` on the dataloader's batch (its `_generate_and_score_completions`:
           `model.generate` over the left-padded batch, decode, reward, advantages; then `compute_loss`
           with its own forward and backward), then clip, `optimizer.step`, `zero_grad`.

The sides alternate (scalerl, TRL, scalerl, TRL, ...) in this process after one untimed step each;
medians of `--reps` timed steps. samples/s = samples per step / step time; tokens/s = generated
tokens / step time. Where the time goes, per side: generation, scoring (decode + reward), log-probs
(a no-grad forward: neither side runs one here, both take pi_old from the sampler / the same
forward, as `num_iterations=1` and sync GRPO allow), forward+backward of the loss, optimizer (clip +
AdamW + zero_grad), weight sync (scalerl: copying the new weights into the engine's model; TRL
generates with the training model itself), other (the rest of the step).

Fairness notes. Same model folder, prompts (scalerl is given the token ids TRL's `_tokenize_prompts`
makes), max_new_tokens, temperature, group size, reward, loss, optimizer, threads. TRL generates
with `model.generate` on a padded static batch, its gradient checkpointing off (its default on would
recompute activations), bf16 off, vLLM off. scalerl keeps a second copy of the weights in its engine
and pays a weight copy per step; TRL does not. TRL logs metrics (entropy, clip ratios) inside its
step; scalerl computes its step metrics. With random init the next-token distribution is near flat,
so samples rarely stop early: both sides generate about `prompts * n * max_new_tokens` tokens (the
counts are printed). `--stop-prob P` gives the model a per-token stop probability of about P
(`bench_real_shape.set_stop_prob`; the same model folder for both sides), so response lengths
spread out with a long tail, mean ~1/P, as in an RL batch: then TRL's padded `model.generate` keeps
every row in the batch until the longest sample stops and its loss forward runs on the padded
batch, while scalerl's engine retires a finished sample and its trainer packs the real tokens. The
two sides sample with their own random streams, so their lengths differ step to step (the counts
and the longest sample are printed per step).

How close to the machine's limit: the dense-matmul peak is measured here (`torch.matmul` of
`--peak-size`-square float32 matrices, the same threads, best of 5) and the memory bandwidth (a copy
of a 256 MiB float32 tensor: bytes read + written / time, best of 5), each before and after the
steps, the higher reading used. The trainer's achieved FLOP/s is
6 N T / (forward+backward + optimizer time), N the parameters (the tied embedding once), T the step's
real tokens (prompt + response): the usual 6NT count, attention's own FLOPs not counted. Generation's
achieved bytes/s is 4 N x decode steps / generation time: every decode step reads every weight once
(float32); decode steps = the longest completion's length. Both are printed as ratios to the peaks.

The machine may be shared with other jobs: `--threads 1` keeps the OpenMP pool from waiting on a
descheduled thread (see benchmarks/bench_vs_trl.py's threads note); the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_real_shape as brs

PHASES = ("generation", "scoring", "log-probs", "forward+backward", "optimizer", "weight sync", "other")
GRAD_CLIP = 1.0
LR = 1e-6


def even_fraction(ids: list[int]) -> float:
    """The reward of both sides: the fraction of even token ids (0 for an empty completion)."""
    return sum(1 for i in ids if i % 2 == 0) / len(ids) if ids else 0.0


def matmul_peak(size: int, reps: int = 5, device: str = "cpu", dtype: str = "float32") -> float:
    """Dense matmul FLOP/s at the current thread count (CPU) or on `device`: 2 size^3 / best time."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    a = torch.randn(size, size, device=device, dtype=getattr(torch, dtype))
    b = torch.randn(size, size, device=device, dtype=getattr(torch, dtype))
    torch.matmul(a, b)
    best = math.inf
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def copy_bandwidth(mib: int = 256, reps: int = 5, device: str = "cpu") -> float:
    """Memory bandwidth, bytes/s: a `mib` MiB float32 copy reads and writes its bytes once each."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    src = torch.randn(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = math.inf
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best


class Timer:
    """Accumulates seconds per phase for the current step."""

    def __init__(self) -> None:
        self.t: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.t[phase] += time.perf_counter() - start
        return timed

    def reset(self) -> None:
        self.t = dict.fromkeys(PHASES, 0.0)


def prompt_texts(prompts: int, tokens: int, seed: int = 0) -> list[str]:
    """`prompts` texts of `tokens` characters (one token each in the char tokenizer), lowercase letters."""
    import random

    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(tokens)) for _ in range(prompts)]


class ScalerlSide:
    """The sync step: engine generation, scoring, `Trainer.step`, weight update to the engine."""

    def __init__(self, model_dir: Path, prompt_ids: list[list[int]], args: argparse.Namespace) -> None:
        import torch

        from scalerl.config import AlgorithmConfig, ModelConfig, OptimConfig
        from scalerl.rollout import EmbeddedEngine
        from scalerl.rollout.protocol import GenerationRequest, SamplingParams
        from scalerl.training.policy import load_model, load_policy
        from scalerl.training.trainer import Trainer

        torch.manual_seed(0)
        cfg = ModelConfig(name_or_path=str(model_dir))
        self.policy = load_policy(cfg, device="cpu")
        samples = len(prompt_ids) * args.n
        algo = AlgorithmConfig(loss_type="grpo", aggregation="sample", adv_norm="group", kl_coef=0.0)
        optim = OptimConfig(lr=LR, micro_batch_size=samples, warmup_steps=0, grad_clip=GRAD_CLIP)
        self.trainer = Trainer(self.policy, algo, optim, temperature=args.temperature,
                               max_new_tokens=args.max_new_tokens)
        tok = self.policy.tokenizer
        self.engine = EmbeddedEngine(load_model(cfg, torch.device("cpu")), max_batch_size=samples, seed=0,
                                     eos_token_ids=(int(tok.eos_token_id),),
                                     pad_token_id=int(tok.pad_token_id))
        params = SamplingParams(n=args.n, temperature=args.temperature, max_new_tokens=args.max_new_tokens)
        self.requests = [GenerationRequest(f"p{i}", ids, params) for i, ids in enumerate(prompt_ids)]
        self.tok = tok
        self.timer = Timer()
        # `Trainer.step` = prepare + forward/backward (`_accumulate`) + clip/AdamW (`_apply`): time the
        # last part apart (an instance attribute, read by `step` at call time).
        self.trainer._apply = self.timer.wrap("optimizer", self.trainer._apply)  # type: ignore[method-assign]
        self.version = 0
        self.last: dict[str, float] = {}

    def step(self) -> dict[str, float]:
        from scalerl.data.records import PromptRecord
        from scalerl.training.batch import ScoredGroup

        t = self.timer
        t.reset()
        start = time.perf_counter()
        completions = t.wrap("generation", self.engine.generate)(self.requests)

        def score() -> list[Any]:
            groups = []
            for req in self.requests:
                comps = [c for c in completions if c.request_id == req.request_id]
                texts = [self.tok.decode(c.token_ids, skip_special_tokens=True) for c in comps]
                rewards = [even_fraction(c.token_ids) for c, _ in zip(comps, texts, strict=True)]
                groups.append(ScoredGroup(PromptRecord(id=req.request_id, task="bench", prompt="x"),
                                          comps, rewards))
            return groups

        groups = t.wrap("scoring", score)()
        metrics = t.wrap("forward+backward", self.trainer.step)(groups)
        self.version += 1
        t.wrap("weight sync", self.engine.update_weights)(self.trainer.weights_for_engine(), self.version)
        total = time.perf_counter() - start
        t.t["forward+backward"] -= t.t["optimizer"]  # the wrapper around `step` timed both
        t.t["other"] = total - sum(t.t.values())
        tokens = sum(c.num_tokens for c in completions)
        return {"total": total, "samples": float(len(completions)), "gen_tokens": float(tokens),
                "real_tokens": float(sum(len(c.prompt_ids) + c.num_tokens for c in completions)),
                "decode_steps": float(max(c.num_tokens for c in completions)),
                "skipped": metrics["skipped_nonfinite"] + metrics["skipped_no_signal"], **t.t}


class TRLSide:
    """`GRPOTrainer.training_step` + clip + optimizer step, on the same prompts."""

    def __init__(self, model_dir: Path, texts: list[str], args: argparse.Namespace, workdir: str) -> None:
        import torch
        from datasets import Dataset
        from transformers import AutoTokenizer
        from trl import GRPOConfig, GRPOTrainer

        from scalerl.config import ModelConfig
        from scalerl.training.policy import load_model

        torch.manual_seed(0)
        self.timer = Timer()
        self.counts = {"gen_tokens": 0, "samples": 0, "longest": 0}
        samples = len(texts) * args.n

        def reward(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]],
                   **_: Any) -> list[float]:
            self.counts["samples"] += len(completion_ids)
            self.counts["gen_tokens"] += sum(len(ids) for ids in completion_ids)
            self.counts["longest"] = max(self.counts["longest"], *(len(ids) for ids in completion_ids))
            return [even_fraction(list(ids)) for ids in completion_ids]

        model = load_model(ModelConfig(name_or_path=str(model_dir)), torch.device("cpu"))
        self.trainer = GRPOTrainer(
            model=model, processing_class=AutoTokenizer.from_pretrained(model_dir), reward_funcs=reward,
            args=GRPOConfig(
                output_dir=os.path.join(workdir, "trl"), per_device_train_batch_size=samples,
                gradient_accumulation_steps=1, num_generations=args.n, num_iterations=1,
                max_completion_length=args.max_new_tokens, temperature=args.temperature, top_p=1.0,
                top_k=0, beta=0.0, loss_type="grpo", scale_rewards="group", epsilon=0.2,
                epsilon_high=0.2, learning_rate=LR, max_grad_norm=GRAD_CLIP, warmup_steps=0,
                lr_scheduler_type="constant", use_vllm=False, use_cpu=True, bf16=False,
                gradient_checkpointing=False, disable_dropout=True, report_to=[], save_strategy="no",
                logging_steps=10**9, seed=0, max_steps=10**6, cast_lm_head_to_fp32=False,
            ),
            train_dataset=Dataset.from_dict({"prompt": texts}),
        )
        tr = self.trainer
        tr.create_optimizer()
        tr.current_gradient_accumulation_steps = 1  # set by `train()`, which this loop replaces
        tr._generate = self.timer.wrap("generation", tr._generate)
        tr._calculate_rewards = self.timer.wrap("scoring", tr._calculate_rewards)
        tr._generate_and_score_completions = self.timer.wrap("prep", tr._generate_and_score_completions)
        # Each prompt `n` times in a row: what TRL's RepeatSampler hands one step.
        self.batch = [{"prompt": p} for p in texts for _ in range(args.n)]
        self.prompt_ids = [list(map(int, ids)) for ids in tr._tokenize_prompts(texts)[0]]

    def step(self) -> dict[str, float]:
        import torch

        tr, t = self.trainer, self.timer
        t.reset()
        t.t["prep"] = 0.0
        self.counts.update(gen_tokens=0, samples=0, longest=0)
        tr.model.train()
        start = time.perf_counter()
        tr.training_step(tr.model, self.batch, None)
        after_loss = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(tr.model.parameters(), GRAD_CLIP)
        tr.optimizer.step()
        tr.model.zero_grad(set_to_none=True)
        end = time.perf_counter()
        phases = dict(t.t)
        prep = phases.pop("prep")
        phases["forward+backward"] = after_loss - start - prep
        phases["optimizer"] = end - after_loss
        phases["other"] = prep - phases["generation"] - phases["scoring"]
        total = end - start
        n = self.counts["samples"]
        prompt_tokens = sum(len(self.prompt_ids[i // (n // len(self.prompt_ids))]) for i in range(n))
        return {"total": total, "samples": float(n), "gen_tokens": float(self.counts["gen_tokens"]),
                "real_tokens": float(self.counts["gen_tokens"] + prompt_tokens),
                "decode_steps": float(self.counts["longest"]), "skipped": 0.0, **phases}


def quiet() -> None:
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    for name in ("transformers", "trl", "accelerate", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)


def median_row(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny shape and batch (seconds)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8, help="samples per prompt (group size)")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--stop-prob", type=float, metavar="P",
                        help="give the random-init model a per-token stop probability of about P "
                             "(bench_real_shape.set_stop_prob): long-tailed response lengths, mean "
                             "~1/P, as in an RL batch; default: none (every sample runs to the cap)")
    parser.add_argument("--reps", type=int, default=2, help="timed steps per side (after one untimed)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides")
    parser.add_argument("--peak-size", type=int, default=2048, help="matrix side of the matmul peak")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.n, args.prompt_tokens, args.max_new_tokens, args.reps = 2, 2, 8, 8, 1
        args.peak_size = min(args.peak_size, 512)
    try:
        import trl
    except ImportError:
        print("TRL is not installed (pip install trl); nothing compared.", file=sys.stderr)
        return 2
    import torch
    import transformers

    quiet()
    torch.set_num_threads(args.threads)
    shape = brs.QUICK if args.quick else brs.QWEN25_05B
    shape = brs.Shape(**{**asdict(shape), "layers": args.layers})
    peak = matmul_peak(args.peak_size)
    bandwidth = copy_bandwidth(32 if args.quick else 256)
    texts = prompt_texts(args.prompts, args.prompt_tokens)
    with tempfile.TemporaryDirectory(prefix="scalerl_step_vs_trl_") as tmp:
        model_dir = Path(tmp) / "model"
        params = brs.save_model(shape, model_dir, stop_prob=args.stop_prob)
        trl_side = TRLSide(model_dir, texts, args, tmp)
        scalerl_side = ScalerlSide(model_dir, trl_side.prompt_ids, args)
        print(f"TRL {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}; "
              f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
        print(f"model: {shape} ({params / 1e6:.1f}M parameters), float32; step: {args.prompts} prompts x "
              f"{args.n} samples, {args.prompt_tokens}-token prompts, max {args.max_new_tokens} new tokens, "
              f"T={args.temperature}, stop prob {args.stop_prob or 'none'}", flush=True)
        sides = {"scalerl": scalerl_side, "TRL": trl_side}
        rows: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
        for side in sides.values():  # warm-up, not timed
            side.step()
        for _ in range(args.reps):
            for name, side in sides.items():
                rows[name].append(side.step())
                r = rows[name][-1]
                print(f"  {name:8s} step {r['total']:8.2f} s, {r['gen_tokens']:.0f} tokens generated in "
                      f"{r['samples']:.0f} samples (longest {r['decode_steps']:.0f})", flush=True)
        load_after = os.getloadavg()[0]
    # The peaks again after the steps, the higher reading kept: on a shared machine a reading taken
    # while neighbours are busy is low, and a low peak would overstate the achieved fractions.
    peaks = (peak, matmul_peak(args.peak_size))
    bandwidths = (bandwidth, copy_bandwidth(32 if args.quick else 256))
    peak, bandwidth = max(peaks), max(bandwidths)
    med = {k: median_row(v) for k, v in rows.items()}
    out: dict[str, Any] = {"params": params, "shape": asdict(shape),
                           "args": {k: str(v) for k, v in vars(args).items()},
                           "matmul_peak_flops": peak, "copy_bandwidth_bytes_per_s": bandwidth,
                           "matmul_peak_readings": peaks, "copy_bandwidth_readings": bandwidths, "sides": {}}
    print(f"\nmachine: dense float32 matmul peak {peak / 1e9:.1f} GFLOP/s ({args.peak_size}^2, "
          f"{args.threads} threads; before/after {peaks[0] / 1e9:.1f}/{peaks[1] / 1e9:.1f}); copy bandwidth "
          f"{bandwidth / 1e9:.2f} GB/s (before/after {bandwidths[0] / 1e9:.2f}/{bandwidths[1] / 1e9:.2f}); "
          f"load after {load_after:.1f}")
    print(f"{'side':<8} {'step s':>8} {'samples/s':>10} {'tokens/s':>10} {'gen tok':>8} " +
          " ".join(f"{p:>16}" for p in PHASES))
    for name, m in med.items():
        sps, tps = m["samples"] / m["total"], m["gen_tokens"] / m["total"]
        trainer_s = m["forward+backward"] + m["optimizer"]
        flops = 6 * params * m["real_tokens"] / trainer_s
        bytes_s = 4 * params * m["decode_steps"] / m["generation"]
        out["sides"][name] = {**m, "samples_per_s": sps, "tokens_per_s": tps, "train_flops": flops,
                              "gen_weight_bytes_per_s": bytes_s, "steps": rows[name]}
        print(f"{name:<8} {m['total']:>8.2f} {sps:>10.3f} {tps:>10.1f} {m['gen_tokens']:>8.0f} " +
              " ".join(f"{m[p]:>8.2f}s {100 * m[p] / m['total']:>5.1f}%" for p in PHASES))
    for name in med:
        s = out["sides"][name]
        print(f"{name} roofline: trainer {s['train_flops'] / 1e9:.2f} GFLOP/s = "
              f"{s['train_flops'] / peak:.3f} of matmul peak; "
              f"generation {s['gen_weight_bytes_per_s'] / 1e9:.2f} GB/s of weights = "
              f"{s['gen_weight_bytes_per_s'] / bandwidth:.3f} of copy bandwidth")
    a, b = out["sides"]["scalerl"], out["sides"]["TRL"]
    out["ratio_samples_per_s"] = a["samples_per_s"] / b["samples_per_s"]
    out["ratio_tokens_per_s"] = a["tokens_per_s"] / b["tokens_per_s"]
    print(f"ratio scalerl/TRL: samples/s {out['ratio_samples_per_s']:.2f}, tokens/s "
          f"{out['ratio_tokens_per_s']:.2f} (target >= 2)")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
