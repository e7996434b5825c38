"""LoRA against full fine-tuning at one model shape: trainable-parameter share, peak memory of a
training step, step time and the FLOPs the meter charges per trained token.

    python benchmarks/bench_lora.py                  # Qwen2.5-0.5B layer shape, 2 layers, CPU float32
    python benchmarks/bench_lora.py --quick          # a tiny shape, seconds
    python benchmarks/bench_lora.py --ranks 8 32 --layers 4 --json out.json

The model is random-init Qwen2 with Qwen2.5-0.5B's layer shape (hidden 896, 14 heads of 64, 2 KV
heads, MLP 4864, vocabulary 151,936, tied embeddings) but `--layers` layers, built from a config:
nothing is downloaded. Each setting (full, then LoRA at each `--ranks`, alpha = 2r, every linear
layer of the decoder) runs in a FRESH subprocess: the policy is built (and wrapped), then
`--steps` `Trainer.step`s on one group of `--samples` responses of `--length` tokens after a
64-token prompt (AdamW states are allocated in the first). Reported: the process's RSS high-water
mark (`getrusage(RUSAGE_SELF).ru_maxrss`) and its growth over the RSS once the model was built (the
step's own cost: gradients, optimizer states, activations), the median step time, and
`ComputeMeter.train_flops_per_token` (6N for full fine-tuning, 4N + 2 N_adapter for LoRA:
`scalerl.telemetry.compute.train_flops_per_token`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"hidden_size": 896, "num_heads": 14, "num_kv_heads": 2, "intermediate_size": 4864, "vocab": 151936}
QUICK = {"hidden_size": 64, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 128, "vocab": 512}


def _rss_mb() -> float:
    """The process's RSS high-water mark in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(shape: dict[str, int], layers: int, rank: int, samples: int, length: int,
            steps: int) -> dict[str, Any]:
    """One setting, in this process (run it in a fresh one)."""
    import torch

    from scalerl.assembly.local import policy_meter
    from scalerl.config import AlgorithmConfig, LoraConfig, OptimConfig
    from scalerl.data.records import PromptRecord
    from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer
    from scalerl.rollout.protocol import Completion
    from scalerl.training.batch import ScoredGroup
    from scalerl.training.policy import Policy, apply_lora
    from scalerl.training.trainer import Trainer

    torch.manual_seed(0)
    spec = TinyModelSpec(hidden_size=shape["hidden_size"], num_layers=layers, num_heads=shape["num_heads"],
                         num_kv_heads=shape["num_kv_heads"], intermediate_size=shape["intermediate_size"],
                         max_position_embeddings=4096)
    model = build_tiny_model(spec, vocab_size=shape["vocab"])
    policy = Policy(model=model, tokenizer=build_tiny_tokenizer(pad_to=shape["vocab"]))
    if rank > 0:
        policy = apply_lora(policy, LoraConfig(r=rank, alpha=2.0 * rank))
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in policy.model.parameters())
    meter = policy_meter(policy)
    trainer = Trainer(policy, AlgorithmConfig(), OptimConfig(lr=1e-5, warmup_steps=0))
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(8, shape["vocab"], (64,), generator=g).tolist()
    completions = [
        Completion(request_id="q", sample_index=i, prompt_ids=prompt,
                   token_ids=torch.randint(8, shape["vocab"], (length,), generator=g).tolist(),
                   logprobs=[-5.0] * length, versions=[0] * length, loss_mask=[True] * length,
                   finish_reason="length", start_version=0)
        for i in range(samples)
    ]
    group = ScoredGroup(PromptRecord(id="q", task="toy", prompt="x"), completions,
                        rewards=[float(i % 2) for i in range(samples)])
    loaded = _current_rss_mb()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.step([group])
        times.append(time.perf_counter() - start)
    peak = _rss_mb()
    return {"setting": "full" if rank == 0 else f"lora_r{rank}", "rank": rank, "params": total,
            "trainable": trainable, "trainable_share": trainable / total, "rss_after_build_mb": loaded,
            "peak_rss_mb": peak, "step_growth_mb": peak - loaded, "step_s_median": statistics.median(times),
            "train_flops_per_token": meter.train_flops_per_token, "flop_params": meter.n_params}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny shape (seconds)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: measure one rank here
    args = p.parse_args(argv)
    shape = QUICK if args.quick else SHAPE
    if args.one is not None:
        print(json.dumps(measure(shape, args.layers, args.one, args.samples, args.length, args.steps)))
        return 0
    rows = []
    for rank in [0, *args.ranks]:
        cmd = [sys.executable, __file__, "--one", str(rank), "--layers", str(args.layers), "--samples",
               str(args.samples), "--length", str(args.length), "--steps", str(args.steps)]
        cmd += ["--quick"] if args.quick else []
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    full = rows[0]
    print(f"shape: hidden {shape['hidden_size']}, {args.layers} layers, vocab {shape['vocab']}; "
          f"{args.samples} x (64 + {args.length}) tokens per step, {args.steps} steps, CPU float32")
    print(f"{'setting':<10} {'trainable':>12} {'share':>8} {'peak MiB':>9} {'step MiB':>9} {'step s':>7} "
          f"{'FLOPs/tok':>10} {'vs full':>7}")
    for r in rows:
        print(f"{r['setting']:<10} {r['trainable']:>12,} {r['trainable_share']:>8.2%} "
              f"{r['peak_rss_mb']:>9.0f} "
              f"{r['step_growth_mb']:>9.0f} {r['step_s_median']:>7.3f} {r['train_flops_per_token']:>10.3g} "
              f"{r['train_flops_per_token'] / full['train_flops_per_token']:>7.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
