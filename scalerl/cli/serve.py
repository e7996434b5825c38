"""`scalerl serve`: an OpenAI-compatible endpoint over a checkpoint or model, for evaluation and debugging.

    scalerl serve runs/demo --port 8000                   # the run's latest checkpoint
    scalerl serve runs/demo/checkpoints/step_000200 --port 8000 --record calls.jsonl
    scalerl serve Qwen/Qwen3-0.6B --engine vllm --port 8000

Serves `POST /v1/chat/completions` (the tokenizer's chat template), `POST /v1/completions`,
`GET /v1/models` and `GET /health` on HOST:PORT (`--port 0`: a free port, printed) with the engine
`generation.engine` names (the run's, `--engine`, or the embedded default), exactly as an agent
environment reaches the policy during training (docs/agentic.md). Every response's
`system_fingerprint` is `scalerl-policy-<version>`; `return_token_ids: true` adds the prompt and
completion token ids; `--record PATH` writes every call's ids, log-probs and versions as JSON lines
to a new file (`--overwrite` replaces one; sessions are salted hashes, no credential is written).

Streaming is buffered: `stream: true` gets the finished response sent as server-sent events.
Every request is bounded: body size (413), prompt + max_tokens within the model's context (400
naming both), n / max_tokens / logprobs caps, every field type-checked and unknown fields refused
(400 naming the field; not supported: `logit_bias`, penalties, forced tool choice, non-text parts),
`--max-concurrent` generations in flight (429), headers and body due within `--read-timeout`
(408 / closed), idle connections closed after `--keep-alive`, a client that disconnects has its
generation cancelled. Only Host names of this machine are served (421; `--allow-host` adds one),
only `application/json` (415); `--api-key` or SCALERL_API_KEY requires `Authorization: Bearer KEY`
on /v1/ (401). If the engine fails, /health answers 503 and the command ends with exit 1 and the
traceback. Ctrl-C or SIGTERM stops it (exit 0).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from scalerl.assembly.evaluate import resolve_source
from scalerl.cli.argtypes import positive_int
from scalerl.serving.limits import LOCAL_HOSTS, ServeLimits


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in [0, 65535], got {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def limits_from_args(args: argparse.Namespace) -> ServeLimits:
    """The `ServeLimits` the options name (the API key from `--api-key`, else SCALERL_API_KEY)."""
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_VAR)
    return ServeLimits(max_body_bytes=args.max_body_bytes, max_n=args.max_n, max_tokens=args.max_tokens_limit,
                       max_logprobs=args.max_logprobs, max_concurrent=args.max_concurrent,
                       max_connections=args.max_connections, read_timeout_s=args.read_timeout,
                       keep_alive_s=args.keep_alive, max_sessions=args.max_sessions,
                       api_key=key or None, allowed_hosts=tuple(args.allow_host or ()))


API_KEY_VAR = "SCALERL_API_KEY"


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
                   help="max_tokens of a request that names none (default 256; cut to the context left)")
    p.add_argument("--served-model-name", metavar="NAME", help="the model id /v1/models lists")
    p.add_argument("--record", metavar="PATH",
                   help="write every call's token ids, log-probs and versions to this new file")
    p.add_argument("--overwrite", action="store_true", help="let --record replace an existing file")
    d = ServeLimits()  # the defaults live in one place
    g = p.add_argument_group("security and limits")
    g.add_argument("--api-key", metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on /v1/ (default: ${API_KEY_VAR}, which "
                        "other users cannot read from the process list; neither: open)")
    g.add_argument("--allow-host", metavar="NAME", action="append",
                   help="also serve requests whose Host header is NAME (repeatable; default: localhost "
                        "names and the --host address; a wildcard --host such as 0.0.0.0 adds none)")
    g.add_argument("--max-body-bytes", type=positive_int, default=d.max_body_bytes,
                   help=f"largest request body, bytes (default {d.max_body_bytes}; larger: 413)")
    g.add_argument("--max-tokens-limit", type=positive_int, default=d.max_tokens,
                   help=f"largest max_tokens a request may ask (default {d.max_tokens})")
    g.add_argument("--max-n", type=positive_int, default=d.max_n,
                   help=f"largest n (choices) a request may ask (default {d.max_n})")
    g.add_argument("--max-logprobs", type=int, default=d.max_logprobs,
                   help=f"largest logprobs / top_logprobs a request may ask (default {d.max_logprobs})")
    g.add_argument("--max-concurrent", type=positive_int, default=d.max_concurrent,
                   help=f"generation requests in flight; more get 429 (default {d.max_concurrent})")
    g.add_argument("--max-connections", type=positive_int, default=d.max_connections,
                   help=f"open connections; more get 503 (default {d.max_connections})")
    g.add_argument("--read-timeout", type=_positive_float, default=d.read_timeout_s, metavar="S",
                   help=f"seconds a request's headers and body may take (default {d.read_timeout_s:g})")
    g.add_argument("--keep-alive", type=_positive_float, default=d.keep_alive_s, metavar="S",
                   help=f"seconds an idle connection stays open (default {d.keep_alive_s:g})")
    g.add_argument("--max-sessions", type=positive_int, default=d.max_sessions,
                   help=f"sessions kept for stitching, least recently used dropped first "
                        f"(default {d.max_sessions})")
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from scalerl.inputs import InputError, check_device

    check_device(args.device)
    if args.max_logprobs < 0:
        raise InputError(f"--max-logprobs: expected an integer >= 0, got {args.max_logprobs}")
    limits = limits_from_args(args)
    if args.host not in LOCAL_HOSTS and not limits.api_key:
        print(f"serve: warning: listening on {args.host} without an API key: anyone who reaches it can "
              f"generate (set {API_KEY_VAR})", file=sys.stderr)
    if args.record is not None:  # before the model loads: a bad path is the user's, found at once
        from scalerl.assembly.serve import check_record_path

        check_record_path(args.record, args.overwrite)
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
                            max_tokens=args.max_tokens, model_name=args.served_model_name, record=args.record,
                            overwrite=args.overwrite, limits=limits)
    try:
        auth = "API key required" if limits.api_key else "no API key"
        print(f"serve: {source.model} as {serving.model_name!r} at {serving.url} "
              f"(engine {source.config.generation.engine}, {auth})", flush=True)
        while not stop.wait(0.5):
            if serving.failure is not None:
                # Never a server that answers 503 forever: the engine's error ends the command
                # (exit 1, its traceback printed by the CLI).
                raise RuntimeError("serve: the engine failed; stopping") from serving.failure
    finally:
        serving.close()
    print("serve: stopped", flush=True)
    return 0


__all__ = ["register", "run_serve"]
