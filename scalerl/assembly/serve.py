"""What `scalerl serve` runs: a checkpoint or model in the configured engine behind the endpoint.

`start_serving(source, host, port, ...)` loads the model of an `EvalSource` (`resolve_source`: a run
directory's latest checkpoint, a checkpoint, a model directory or a hub name) into the engine
`generation.engine` names, wraps it in an `Endpoint` (`scalerl.serving`), steps it from a driver
thread and serves it on `host:port`, keeping the `max_sessions` most recent sessions for stitching.
`record` (a path) appends one JSON line per call: the session,
the exact prompt and completion ids, behaviour log-probs, policy versions, the call it continues.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl.assembly.evaluate import EvalSource
from scalerl.data.tokenize import bind_chat_template_kwargs
from scalerl.inputs import MissingInputError


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


def start_serving(source: EvalSource, *, host: str = "127.0.0.1", port: int = 0, device: str | None = None,
                  max_tokens: int = 256, model_name: str | None = None, record: str | None = None,
                  max_sessions: int = 1024) -> Serving:
    from scalerl.assembly.sections import engine_spec
    from scalerl.rollout.factory import build_engine, close_engine
    from scalerl.serving.endpoint import Endpoint
    from scalerl.serving.http import EngineDriver, start_server
    from scalerl.training.policy import load_policy

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
        if record is not None:
            out = Path(record).open("a", encoding="utf-8")  # noqa: SIM115 - closed by Serving.close
            serving.closers.append(out.close)
            lock = threading.Lock()

            def on_call(key: str, call: Any) -> None:
                line = {"session": key, "kind": call.kind, "prompt_ids": call.prompt_ids,
                        "completion_ids": call.completion_ids,
                        "logprobs": call.trace.logprobs[-call.completion_len:] if call.completion_len else [],
                        "versions": call.trace.versions[-call.completion_len:] if call.completion_len else [],
                        "finish_reason": call.finish_reason, "parent": call.parent}
                with lock:
                    out.write(json.dumps(line) + "\n")
                    out.flush()

        endpoint = Endpoint(engine, tokenizer, model_name=name, max_tokens_default=max_tokens,
                            on_call=on_call, max_sessions=max_sessions)
        driver = EngineDriver(endpoint)
        serving.closers.append(driver.close)
        server = start_server(endpoint, host, port)
        serving.closers.append(server.close)
    except BaseException:
        serving.close()
        raise
    serving.url, serving.port, serving.endpoint = server.url, server.port, endpoint
    return serving
