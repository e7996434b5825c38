"""The trainer at real model shapes on one CUDA GPU, bf16: peak memory, tokens/s and MFU of one
`Trainer.step`, chunked vs full-logit LM head; tokens/s and MFU of packed token-budget micro-batches vs
the padded micro-batch vs TRL's GRPOTrainer loss on a long-tailed batch (benchmarks/bench_real_shape.py's
two measurements).

    python benchmarks/gpu/real_shape_gpu.py                     # 0.5B and 1.5B shapes, all layers
    python benchmarks/gpu/real_shape_gpu.py --sizes 0.5b --lengths 1024 4096
    python benchmarks/gpu/real_shape_gpu.py --quick --device cpu  # every code path, on CPU, seconds

Models: random-init Qwen2 with Qwen2.5-0.5B's configuration (hidden 896, 24 layers, 14 heads, 2 KV
heads, MLP 4864, vocabulary 151,936, tied) and Qwen2.5-1.5B's (hidden 1536, 28 layers, 12 heads, 2
KV heads, MLP 8960, vocabulary 151,936, tied); nothing is downloaded. `model.dtype=bfloat16`: bf16
autocast over float32 master weights, the LM head in float32 (`model.fp32_lm_head`). Each setting is
one step of 4 samples x (64 prompt + L response) tokens in one micro-batch, in a fresh process;
peak = `torch.cuda.max_memory_allocated` over the step (model, gradients and AdamW states
included). Full-logit settings predicted above `--max-gb` (linear in L from the two shorter
lengths) are skipped and printed as such.

MFU = 6 N T / (step time x peak FLOP/s), N the parameter count (the tied embedding counted once),
T the step's tokens; attention's own FLOPs and the chunked path's recomputation of the head are not
counted as useful work. `--peak-tflops` is the GPU's dense bf16 peak (989 for an H100/H200 SXM).
Next to MFU each row prints the same achieved FLOP/s as a ratio to the dense bf16 matmul peak
MEASURED on this device (`torch.matmul` of `--peak-size`-square bf16 matrices, best of 5), and the
device's measured copy bandwidth (a 1 GiB float32 copy, bytes read + written / time) is printed for
the generation side's bytes/s ratio (benchmarks/bench_step_vs_trl.py defines both measurements; this
script times no generation).

Throughput (`--samples` responses of `--longest * 0.55^k` tokens, mean/max 0.28 at 8, in one process,
the sides alternating): tokens/s counts real tokens; the packed path uses the model's attention
implementation with restarting position ids (sdpa's block-diagonal mask, or flash_attention_2's varlen
kernel where flash-attn is installed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_real_shape as brs
import bench_step_vs_trl as bst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=("0.5b", "1.5b"), default=["0.5b", "1.5b"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--chunk", type=int, default=None, help="optim.logit_chunk_tokens (default null)")
    parser.add_argument("--max-gb", type=float, default=120.0)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--peak-size", type=int, default=8192, help="matrix side of the measured matmul peak")
    parser.add_argument("--quick", action="store_true", help="the tiny shape (a smoke run of every path)")
    parser.add_argument("--samples", type=int, default=16, help="throughput: samples in the batch")
    parser.add_argument("--longest", type=int, default=4096, help="throughput: the longest response")
    parser.add_argument("--no-trl", dest="trl", action="store_false", help="throughput: skip TRL")
    args = parser.parse_args(argv)
    measured = bst.matmul_peak(min(args.peak_size, 512) if args.quick else args.peak_size,
                               device=args.device, dtype="bfloat16")
    bandwidth = bst.copy_bandwidth(32 if args.quick else 1024, device=args.device)
    print(f"measured on {args.device}: dense bf16 matmul peak {measured / 1e12:.2f} TFLOP/s "
          f"({measured / (args.peak_tflops * 1e12):.3f} of --peak-tflops); copy bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s", flush=True)
    runs = [("quick", None)] if args.quick else [(size, 0) for size in args.sizes]
    # Packed micro-batches through flash_attn_varlen where flash-attn is installed (sdpa's mask otherwise).
    flash = importlib.util.find_spec("flash_attn") is not None and args.device.startswith("cuda")
    print(f"attention for packed micro-batches: {'flash_attention_2' if flash else 'sdpa'}", flush=True)
    with tempfile.TemporaryDirectory(prefix="scalerl_real_shape_gpu_") as tmp:
        for size, layers in runs:
            out_json = Path(tmp) / f"{size}.json"
            common = ["--device", args.device, "--dtype", "bfloat16", "--max-gb", str(args.max_gb),
                      "--json", str(out_json), *(["--chunk", str(args.chunk)] if args.chunk else [])]
            tput = ["--samples", str(args.samples), "--longest", str(args.longest),
                    *([] if args.trl else ["--no-trl"]), *(["--attn", "flash_attention_2"] if flash else [])]
            if size == "quick":
                brs.main(["--quick", *common])
            else:
                brs.main(["--size", size, "--layers", str(layers), "--lengths", *map(str, args.lengths),
                          *tput, *common])
            out = json.loads(out_json.read_text())
            for side, rate in out["throughput"]["tokens_per_s"].items():
                flops = 6 * out["params"] * rate
                print(f"{size} throughput {side:7s} {rate:9.0f} tokens/s  "
                      f"MFU {100 * flops / (args.peak_tflops * 1e12):5.1f}%  "
                      f"{flops / measured:.3f} of measured peak", flush=True)
            for path, rows in out["results"].items():
                for r in rows:
                    tokens_per_s = r["tokens"] / r["step_s"]
                    flops = 6 * out["params"] * tokens_per_s
                    print(f"{size} {path:8s} L={r['length']:5d}  peak {r['peak_gb']:7.2f} GB  "
                          f"{tokens_per_s:9.0f} tokens/s  MFU {100 * flops / (args.peak_tflops * 1e12):5.1f}%"
                          f"  {flops / measured:.3f} of measured peak", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
