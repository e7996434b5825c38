"""`scalerl serve`: an OpenAI-compatible endpoint over a checkpoint or model, for evaluation and debugging.

    scalerl serve runs/demo --port 8000                   # the run's latest checkpoint
    scalerl serve runs/demo/checkpoints/step_000200 --port 8000 --record calls.jsonl
    scalerl serve Qwen/Qwen3-0.6B --engine vllm --port 8000

Serves `POST /v1/chat/completions` (the tokenizer's chat template), `POST /v1/completions`,
`GET /v1/models` and `GET /health` on HOST:PORT (`--port 0`: a free port, printed) with the engine
`generation.engine` names (the run's, `--engine`, or the embedded default), exactly as an agent
environment reaches the policy during training (docs/agentic.md). Every response's
`system_fingerprint` is `scalerl-policy-<version>`; `return_token_ids: true` adds the prompt and
completion token ids; `--record PATH` appends every call's ids, log-probs and versions as JSON lines.
Not supported (a 400 naming the field): streaming, `logit_bias`, forced tool choice, non-text parts.
Ctrl-C or SIGTERM stops it (exit 0).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from scalerl.assembly.evaluate import resolve_source
from scalerl.cli.argtypes import positive_int


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in [0, 65535], got {text}")
    return value


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="an OpenAI-compatible endpoint over a checkpoint or model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL_OR_CHECKPOINT",
                   help="run directory, checkpoint directory, saved model directory or hub name")
    p.add_argument("--port", type=_port, default=8000, help="port (0: a free one; default 8000)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--engine", choices=("embedded", "vllm"),
                   help="generation engine (config key generation.engine; default: the run's, or embedded)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda if available)")
    p.add_argument("--max-tokens", type=positive_int, default=256,
                   help="max_tokens of a request that names none (default 256)")
    p.add_argument("--served-model-name", metavar="NAME", help="the model id /v1/models lists")
    p.add_argument("--record", metavar="PATH", help="append every call's token ids, log-probs and versions")
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from scalerl.inputs import check_device

    check_device(args.device)
    source = resolve_source(args.model, warn=lambda m: print(f"serve: warning: {m}", file=sys.stderr))
    if args.engine is not None:
        source.config.generation.engine = args.engine
    from scalerl.rollout.factory import check_engine_available  # torch: imported only when running

    check_engine_available(source.config.generation.engine)
    from scalerl.assembly.serve import start_serving

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    serving = start_serving(source, host=args.host, port=args.port, device=args.device,
                            max_tokens=args.max_tokens, model_name=args.served_model_name, record=args.record)
    try:
        print(f"serve: {source.model} as {serving.model_name!r} at {serving.url} "
              f"(engine {source.config.generation.engine})", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        serving.close()
    print("serve: stopped", flush=True)
    return 0


__all__ = ["register", "run_serve"]
