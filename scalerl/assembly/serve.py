"""What `scalerl serve` runs: a checkpoint or model in the configured engine behind the endpoint.

`start_serving(source, host, port, ...)` loads the model of an `EvalSource` (`resolve_source`: a run
directory's latest checkpoint, a checkpoint, a model directory or a hub name) into the engine
`generation.engine` names, wraps it in an `Endpoint` (`scalerl.serving`), steps it from a driver
thread and serves it on `host:port` under `limits` (`scalerl.serving.limits.ServeLimits`), with
the model's context (its `max_position_embeddings`, or vLLM's `max_model_len`) as the bound on a
request's prompt + max_tokens. `record` (a new file, or an existing one with `overwrite`) gets one
JSON line per call: the session as a salted hash (a bearer token names a session when no API key
is set: it is never written), the exact prompt and completion ids, behaviour log-probs, policy
versions, the call it continues. `check_record_path` is the input check run before the model loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl.assembly.evaluate import EvalSource
from scalerl.data.tokenize import bind_chat_template_kwargs
from scalerl.inputs import InputError, MissingInputError
from scalerl.ownership import check_output_file
from scalerl.serving.limits import ServeLimits


@dataclass
class Serving:
    url: str
    port: int
    model_name: str
    endpoint: Any
    closers: list[Any] = field(default_factory=list)

    def close(self) -> None:
        for close in reversed(self.closers):
            close()
        self.closers.clear()

    @property
    def failure(self) -> BaseException | None:
        """The error that ended the engine (the process should end), or None."""
        return None if self.endpoint is None else self.endpoint.broken


def check_record_path(record: str, overwrite: bool) -> Path:
    """`--record PATH`: a file in an existing, writable folder, new unless `overwrite`
    (`scalerl.ownership.check_output_file`); an InputError (exit 2) otherwise."""
    path = check_output_file(record, "--record", overwrite=overwrite)
    if not path.parent.is_dir():
        raise MissingInputError(f"--record {record}: the folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise InputError(f"--record {record}: the folder {path.parent} is not writable")
    return path


def session_label(key: str, salt: bytes) -> str:
    """What the record names a session by: a salted SHA-256 prefix (the key may be a bearer token;
    the salt is new per process, so the label cannot be looked up in a table of tokens)."""
    return "s-" + hashlib.sha256(salt + key.encode()).hexdigest()[:16]


def model_context(model: Any, max_model_len: int | None) -> int | None:
    """Tokens a sequence may hold: the model's `max_position_embeddings`, capped by the engine's
    `max_model_len` where it has one."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    limits = [int(x) for x in (getattr(config, "max_position_embeddings", None), max_model_len) if x]
    return min(limits) if limits else None


def start_serving(source: EvalSource, *, host: str = "127.0.0.1", port: int = 0, device: str | None = None,
                  max_tokens: int = 256, model_name: str | None = None, record: str | None = None,
                  overwrite: bool = False, limits: ServeLimits | None = None) -> Serving:
    from scalerl.assembly.sections import engine_spec
    from scalerl.rollout.factory import build_engine, close_engine
    from scalerl.serving.endpoint import Endpoint
    from scalerl.serving.http import EngineDriver, start_server
    from scalerl.training.policy import load_policy

    limits = limits or ServeLimits()
    record_path = None if record is None else check_record_path(record, overwrite)
    cfg = source.config.model_copy(deep=True)
    cfg.model.name_or_path = source.model
    cfg.model.tokenizer = None
    try:
        policy = load_policy(cfg.model, device)
    except OSError as err:
        raise MissingInputError(f"{source.model}: cannot load a model from it ({err})") from None
    tokenizer = bind_chat_template_kwargs(policy.tokenizer, cfg.data.chat_template_kwargs)
    spec = engine_spec(cfg, model_path=source.model, eos_token_ids=(int(tokenizer.eos_token_id),),
                       pad_token_id=policy.pad_token_id)
    engine = build_engine(spec, model=policy.model if spec.kind == "embedded" else None)
    name = model_name or Path(source.model).name or source.model
    serving = Serving("", 0, name, None, [lambda: close_engine(engine)])
    try:
        on_call = None
        if record_path is not None:
            out = record_path.open("w" if overwrite else "x", encoding="utf-8")
            serving.closers.append(out.close)
            lock = threading.Lock()
            salt = secrets.token_bytes(16)

            def on_call(key: str, call: Any) -> None:
                line = {"session": session_label(key, salt), "kind": call.kind, "prompt_ids": call.prompt_ids,
                        "completion_ids": call.completion_ids,
                        "logprobs": call.trace.logprobs[-call.completion_len:] if call.completion_len else [],
                        "versions": call.trace.versions[-call.completion_len:] if call.completion_len else [],
                        "finish_reason": call.finish_reason, "parent": call.parent}
                with lock:
                    out.write(json.dumps(line) + "\n")
                    out.flush()

        endpoint = Endpoint(engine, tokenizer, model_name=name,
                            max_tokens_default=min(max_tokens, limits.max_tokens),
                            on_call=on_call, max_sessions=limits.max_sessions, limits=limits,
                            max_context=model_context(policy.model, spec.max_model_len),
                            max_calls_per_session=limits.max_calls_per_session)
        driver = EngineDriver(endpoint)
        serving.closers.append(driver.close)
        server = start_server(endpoint, host, port, limits=limits)
        serving.closers.append(server.close)
    except BaseException:
        serving.close()
        raise
    serving.url, serving.port, serving.endpoint = server.url, server.port, endpoint
    return serving
