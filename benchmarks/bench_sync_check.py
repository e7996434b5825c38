"""The weight-sync checks' cost (`scalerl.rollout.fingerprint`, `scalerl.rollout.probe`) against a
training step.

Three measurements on this machine:

1. `scalerl train` on the tiny default (TinyModelSpec(): hidden 128, 4 layers, tied head, the
   default generation and batch: 8 prompts x 8 samples, 160 new tokens; the embedded engine,
   sync mode) for `--steps` steps: the verification's time per sync (`weight_verify_s_total /
   weight_verify_checks`, both sides' fingerprints and the comparison) and the probe's
   (`weight_verify_probe_s_total / weight_verify_probe_checks`: the trainer and the engine scoring
   the probe, and the comparison) against the mean step time (`step_wall_s`, the step's wall time,
   generation included), side by side from the run's own metrics rows, with their ratios.
2. The fingerprints alone (sender + engine side) for the tiny default and a ~20M-parameter model of
   the same family, median of `--repeats`, against a `full_state_dict`-sized copy (what every sync
   costs anyway: the trainer's CPU copy of the weights).
3. The probe at a real shape (`--real-shape 0.5b`: Qwen2.5-0.5B's layer shape with `--layers` 2
   layers and vocabulary 151,936, random init, `benchmarks/bench_real_shape.py`'s model): the
   trainer's and the embedded engine's probe scoring (median of `--probe-repeats`) in one process
   beside one `Trainer.step` of 4 samples of a 64-token prompt and a `--length`-token response
   (median of `--step-repeats`; the trainer side of a step only, no generation: a conservative
   denominator), with the ratio; and the probe's float32 gap (engine against trainer) and the gap a
   bf16-autocast trainer shows against float32 (what the bf16 tolerance must cover).

    python benchmarks/bench_sync_check.py              # all three parts
    python benchmarks/bench_sync_check.py --steps 2 --skip-train --real-shape quick
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
    probes = last["weight_verify_probe_checks"]
    per_probe = last["weight_verify_probe_s_total"] / probes if probes else float("nan")
    step_s = statistics.mean(r["step_wall_s"] for r in steps_rows)
    print(f"scalerl train, tiny default, {len(steps_rows)} steps, mean step {step_s:.2f} s: "
          f"fingerprints {int(checks)} syncs of {int(last['weight_verify_tensors'])} tensors, "
          f"{per_check * 1e3:.2f} ms each = {100 * per_check / step_s:.3f}% of a step; "
          f"probe {int(probes)} syncs, {per_probe * 1e3:.2f} ms each = {100 * per_probe / step_s:.3f}% of a "
          f"step (last gap {last['weight_verify_probe_gap']:.2g} nats)")


def probe_real_shape(shape_name: str, layers: int, length: int, probe_repeats: int,
                     step_repeats: int) -> None:
    import sys
    from dataclasses import replace

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_real_shape import PROMPT_TOKENS, SAMPLES, SHAPES, save_model, step_groups

    from scalerl.config import AlgorithmConfig, ModelConfig, OptimConfig
    from scalerl.rollout.probe import max_gap, probe_sequences
    from scalerl.training.policy import load_policy
    from scalerl.training.trainer import Trainer

    shape = replace(SHAPES[shape_name], layers=layers)
    with tempfile.TemporaryDirectory() as tmp:
        params = save_model(shape, Path(tmp))
        torch.manual_seed(0)
        policy = load_policy(ModelConfig(name_or_path=tmp), device="cpu")
    optim = OptimConfig(micro_batch_size=SAMPLES, warmup_steps=0)
    trainer = Trainer(policy, AlgorithmConfig(), optim, temperature=1.0, max_new_tokens=length)
    engine = EmbeddedEngine(policy.generation_copy(), max_batch_size=4, fp32_lm_head=True)
    probe = probe_sequences(shape.vocab, 0)
    trainer_s = median_s(lambda: trainer.probe_logprobs(probe), probe_repeats)
    engine_s = median_s(lambda: engine.probe_logprobs(probe), probe_repeats)
    gap = max_gap(trainer.probe_logprobs(probe), engine.probe_logprobs(probe))
    policy.dtype = "bfloat16"  # the same weights under bf16 autocast
    bf16_gap = max_gap(trainer.probe_logprobs(probe), engine.probe_logprobs(probe))
    policy.dtype = "float32"
    groups = step_groups(shape.vocab, length)
    trainer.step(groups)  # warm-up (optimizer states allocated)
    step_s = median_s(lambda: trainer.step(groups), step_repeats)
    probe_s = trainer_s + engine_s
    print(f"probe at the {shape_name} shape ({layers} layers, vocabulary {shape.vocab:,}, "
          f"{params / 1e6:.1f}M params): trainer {trainer_s * 1e3:.1f} ms + engine {engine_s * 1e3:.1f} ms "
          f"= {probe_s * 1e3:.1f} ms against a trainer step of {SAMPLES} x ({PROMPT_TOKENS} + {length}) "
          f"tokens {step_s:.4f} s: {100 * probe_s / step_s:.2f}% of a step; gap float32 {gap:.2g} nats, "
          f"bf16 autocast vs float32 {bf16_gap:.2g} nats")


def char_share(completion: str, record: object) -> float:
    """A dense reward (share of digits), so that every group has a signal and every step syncs."""
    return sum(ch.isdigit() for ch in completion) / len(completion) if completion else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--real-shape", choices=["0.5b", "quick", "none"], default="0.5b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--probe-repeats", type=int, default=5)
    parser.add_argument("--step-repeats", type=int, default=2)
    args = parser.parse_args()
    fingerprints_alone(args.repeats)
    if not args.skip_train:
        train_share(args.steps)
    if args.real_shape != "none":
        probe_real_shape(args.real_shape, args.layers, args.length, args.probe_repeats, args.step_repeats)


if __name__ == "__main__":
    main()
