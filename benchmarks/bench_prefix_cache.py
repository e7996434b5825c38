"""vLLM multi-turn rollouts with and without prefix caching: prefill tokens, time, and the ratio.

An agentic episode resubmits its whole context every turn (vLLM cannot append to a finished
request). With `prefix_caching` on, each turn carries its episode's `cache_key` and reads the full
KV blocks its episode already computed; with it off, every turn prefills the whole context again.
Both sides run in this process, one after the other, alternating, on the same random-weight model
(the tiny default or a ~20M-parameter Qwen2 of its vocabulary), the same episodes (greedy turns of
`--turn-tokens` tokens, each followed by `--obs-tokens` observation tokens), so their tokens are
identical and only the prefill work differs. vLLM allows one in-process engine at a time, so each
repeat builds and closes one engine per side; only the turns are timed.

    python benchmarks/bench_prefix_cache.py                 # 20M model, 32 episodes x 4 turns
    python benchmarks/bench_prefix_cache.py --quick         # CI smoke (seconds): the tiny model
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer
from scalerl.rollout import GenerationRequest, SamplingParams
from scalerl.rollout.protocol import Engine

MODELS: dict[str, TinyModelSpec] = {
    "tiny": TinyModelSpec(),
    "20m": TinyModelSpec(hidden_size=512, num_layers=6, num_heads=8, num_kv_heads=4, intermediate_size=1536),
}


def random_ids(g: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=g).tolist()  # clear of the special ids


def episodes(
    engine: Engine, args: argparse.Namespace, vocab: int, cached: bool
) -> tuple[float, list[list[int]]]:
    """Run every episode's turns; (seconds, final contexts)."""
    g = torch.Generator().manual_seed(args.seed)
    contexts = [random_ids(g, args.prompt_tokens, vocab) for _ in range(args.episodes)]
    params = SamplingParams(temperature=0.0, max_new_tokens=args.turn_tokens)
    seconds = 0.0
    for turn in range(args.turns):
        requests = [GenerationRequest(f"e{i}/t{turn}", ctx, params, cache_key=f"e{i}" if cached else None)
                    for i, ctx in enumerate(contexts)]
        start = time.perf_counter()
        out = engine.generate(requests)
        seconds += time.perf_counter() - start
        by_id = {c.request_id: c for c in out}
        contexts = [[*ctx, *by_id[f"e{i}/t{turn}"].token_ids, *random_ids(g, args.obs_tokens, vocab)]
                    for i, ctx in enumerate(contexts)]
    return seconds, contexts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="20m")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--turn-tokens", type=int, default=32)
    p.add_argument("--obs-tokens", type=int, default=32)
    p.add_argument("--block-size", type=int, default=32, help="KV block (the CPU backend: a multiple of 32)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny model, 8 episodes x 3 turns, one repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.episodes, args.turns, args.prompt_tokens, args.repeats = "tiny", 8, 3, 96, 1

    from scalerl.rollout.factory import EngineUnavailableError, check_engine_available

    try:
        check_engine_available("vllm")
    except EngineUnavailableError as err:
        print(f"bench_prefix_cache: {err}", file=sys.stderr)
        return 2
    from scalerl.rollout.vllm_engine import VLLMEngine

    tok = build_tiny_tokenizer()
    model = build_tiny_model(MODELS[args.model], vocab_size=len(tok), seed=args.seed)
    max_len = args.prompt_tokens + args.turns * (args.turn_tokens + args.obs_tokens) + 8
    seconds = {True: 0.0, False: 0.0}
    figures: dict[bool, tuple[int, int]] = {}
    finals: dict[bool, list[list[int]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        for _ in range(args.repeats):
            for cached in (True, False):
                engine = VLLMEngine(folder, fp32_lm_head=True, seed=args.seed,
                                    max_batch_size=args.episodes, max_model_len=max_len, eos_token_ids=(),
                                    prefix_caching=cached, block_size=args.block_size)
                try:
                    # Untimed: the first steps of a fresh engine pay its one-off set-up.
                    warm = SamplingParams(temperature=0.0, max_new_tokens=4)
                    prompt = [3 + i % 100 for i in range(args.prompt_tokens)]
                    engine.generate([GenerationRequest("warm", prompt, warm)])
                    s, finals[cached] = episodes(engine, args, len(tok), cached)
                    figures[cached] = (engine.stats.prompt_tokens, engine.stats.cached_prompt_tokens)
                finally:
                    engine.close()
                seconds[cached] += s
    same = finals[True] == finals[False]
    print(f"model {args.model}, {args.episodes} episodes x {args.turns} turns (prompt {args.prompt_tokens}, "
          f"turns {args.turn_tokens} + observations {args.obs_tokens} tokens), block {args.block_size}, "
          f"{args.repeats} repeat(s)")
    print(f"{'side':<16} {'prompt tokens':>14} {'from cache':>11} {'seconds':>9}")
    for cached, name in ((False, "no prefix cache"), (True, "prefix cache")):
        prompt, hit = figures[cached]
        print(f"{name:<16} {prompt:>14} {hit:>11} {seconds[cached] / args.repeats:>9.2f}")
    print(f"speed-up (no cache / cache): x{seconds[False] / seconds[True]:.2f}; "
          f"prefill tokens saved {figures[True][1] / figures[True][0]:.0%}; same tokens: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
