"""The weight-sync check's cost (`scalerl.rollout.fingerprint`) against a training step.

Two measurements on this machine:

1. `scalerl train` on the tiny default (TinyModelSpec(): hidden 128, 4 layers, tied head, the
   default generation and batch: 8 prompts x 8 samples, 160 new tokens; the embedded engine,
   sync mode) for `--steps` steps: the verification's time per sync (`weight_verify_s_total /
   weight_verify_checks`, both sides' fingerprints and the comparison) against the mean step time
   (`step_time_s`), from the run's own metrics rows.
2. The fingerprints alone (sender + engine side) for the tiny default and a ~20M-parameter model of
   the same family, median of `--repeats`, against a `full_state_dict`-sized copy (what every sync
   costs anyway: the trainer's CPU copy of the weights).

    python benchmarks/bench_sync_check.py              # both parts
    python benchmarks/bench_sync_check.py --steps 2 --skip-train
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer
from scalerl.rollout import EmbeddedEngine
from scalerl.rollout.fingerprint import state_fingerprints, verify

SIZES = {
    "tiny": TinyModelSpec(),
    "20m": TinyModelSpec(hidden_size=512, num_layers=6, num_heads=8, num_kv_heads=4, intermediate_size=1536),
}


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fingerprints_alone(repeats: int) -> None:
    tok = build_tiny_tokenizer()
    for name, spec in SIZES.items():
        model = build_tiny_model(spec, vocab_size=len(tok), seed=0)
        engine = EmbeddedEngine(copy.deepcopy(model).eval(), max_batch_size=4)
        print(measure(name, model, engine, repeats))


def measure(name: str, model: torch.nn.Module, engine: EmbeddedEngine, repeats: int) -> str:
    state = {k: v.detach() for k, v in model.state_dict().items()}
    params = sum(p.numel() for p in model.parameters())
    send = median_s(lambda: state_fingerprints(state, torch.float32), repeats)
    held = median_s(engine.weight_fingerprints, repeats)
    expected, got = state_fingerprints(state, torch.float32), engine.weight_fingerprints()
    cmp = median_s(lambda: verify(expected, got, engine="engine", version=0), repeats)
    copy_s = median_s(lambda: {k: v.to("cpu", copy=True) for k, v in state.items()}, repeats)
    return (f"{name}: {params / 1e6:.2f}M params, {len(state)} tensors: sender {send * 1e3:.2f} ms, "
            f"engine {held * 1e3:.2f} ms, compare {cmp * 1e3:.3f} ms; the weights' CPU copy "
            f"{copy_s * 1e3:.2f} ms")


def train_share(steps: int) -> None:
    from scalerl.cli import main

    tok = build_tiny_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_tiny_model(TinyModelSpec(), vocab_size=len(tok), seed=0).save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        run = Path(tmp) / "run"
        # The default config; a dense reward so that every step updates (and so syncs) the weights.
        code = main(["train", "--model", str(model_dir), "--output-dir", str(run), "--max-steps", str(steps),
                     "--off-policy", "sync", "logging.progress=false", "eval.every=1000",
                     "rewards.verifiers.math=benchmarks.bench_sync_check:char_share",
                     "rewards.partial_credit=true"])
        if code != 0:
            raise SystemExit(f"train exited {code}")
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steps_rows = [r for r in rows if r["kind"] == "step"]
    last = steps_rows[-1]
    checks = last["weight_verify_checks"]
    per_check = last["weight_verify_s_total"] / checks if checks else float("nan")
    step_s = statistics.mean(r["step_time_s"] for r in steps_rows)
    print(f"scalerl train, tiny default, {len(steps_rows)} steps: {int(checks)} verified syncs of "
          f"{int(last['weight_verify_tensors'])} tensors, {per_check * 1e3:.2f} ms each; mean step "
          f"{step_s:.2f} s; share {100 * per_check / step_s:.3f}% of a step")


def char_share(completion: str, record: object) -> float:
    """A dense reward (share of digits), so that every group has a signal and every step syncs."""
    return sum(ch.isdigit() for ch in completion) / len(completion) if completion else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--skip-train", action="store_true")
    args = parser.parse_args()
    fingerprints_alone(args.repeats)
    if not args.skip_train:
        train_share(args.steps)


if __name__ == "__main__":
    main()
