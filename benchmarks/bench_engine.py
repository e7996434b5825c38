"""Embedded engine vs Hugging Face `generate()`: generated tokens per second and slot occupancy.

Both sides run in this process, one after the other, on the same tiny model (the embedded default,
random weights), the same prompts, the same sampling (temperature 1, no top-k/top-p), the same batch
size and the same `max_new_tokens`. Completion lengths vary because a few token ids act as stop
tokens (a near-uniform random model hits one with probability ~ k / vocab per step): that variation
is what continuous batching exploits, since a static `generate()` batch keeps decoding until its
longest row finishes. Throughput counts only real tokens (up to and including the stop token).

    python benchmarks/bench_engine.py            # default sizes
    python benchmarks/bench_engine.py --quick    # CI smoke (seconds)
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer
from scalerl.rollout import EmbeddedEngine, GenerationRequest, SamplingParams


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


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes for a CI smoke run")
    parser.add_argument("--num-prompts", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--num-stop-tokens", type=int, default=3, help="ids that end a completion")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per side; fastest counts")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_prompts, args.batch_size, args.max_new_tokens, args.repeats = 32, 8, 64, 1
    torch.set_num_threads(args.threads)

    vocab = len(build_tiny_tokenizer())
    model = build_tiny_model(TinyModelSpec(), vocab_size=vocab, seed=args.seed).eval()
    prompts = make_prompts(args.num_prompts, vocab, 8, 32, args.seed)
    stop_ids = list(range(vocab - args.num_stop_tokens, vocab))

    # Warm both paths up (first calls allocate and dispatch lazily).
    run_hf_generate(model, prompts[:2], 2, 4, stop_ids, args.seed)
    run_engine(model, prompts[:2], 2, 4, stop_ids, args.seed)

    # Alternate the two sides and keep each one's fastest run, so that load from other processes
    # during one run does not decide the ratio (each side's runs are identical: same seeds).
    hf_runs, eng_runs = [], []
    sizes = (args.batch_size, args.max_new_tokens, stop_ids, args.seed)
    for _ in range(args.repeats):
        hf_runs.append(run_hf_generate(model, prompts, *sizes))
        eng_runs.append(run_engine(model, prompts, *sizes))
    hf = min(hf_runs, key=lambda r: r.seconds)
    eng = min(eng_runs, key=lambda r: r.seconds)
    ratio = eng.tokens_per_second / hf.tokens_per_second
    print(
        f"model: tiny Qwen2 (hidden {TinyModelSpec().hidden_size}, {TinyModelSpec().num_layers} layers), "
        f"{args.num_prompts} prompts, batch {args.batch_size}, max_new_tokens {args.max_new_tokens}, "
        f"{args.num_stop_tokens} stop ids, {args.threads} thread(s), best of {args.repeats}"
    )
    for name, run, what in (("HF generate():", hf, "useful-row"), ("EmbeddedEngine:", eng, "slot")):
        print(
            f"{name:16s} {run.tokens:6d} tokens  {run.seconds:7.2f} s  {run.tokens_per_second:8.1f} tok/s  "
            f"{what} occupancy {run.occupancy:.2f}"
        )
    print(f"throughput ratio (engine / generate): {ratio:.2f}x  (target >= 1.5x)")
    return {"ratio": ratio, "engine_occupancy": eng.occupancy, "hf_occupancy": hf.occupancy}


if __name__ == "__main__":
    main()
