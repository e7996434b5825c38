"""openenv-core environments (Meta / Hugging Face OpenEnv) through the endpoint.

An OpenEnv environment is a server (`openenv.core.env_server.http_server.create_fastapi_app` over an
`Environment`) that a client drives over a WebSocket: `reset(**kwargs)`, `step(action)` -> an
observation, a reward and `done`. `openenv-core` 0.3's `GenericEnvClient(base_url=...)` talks to any
such server on localhost (or anywhere); a container (`from_docker_image`) or a Hub download
(`from_env`) is only one way to start one. So scalerl connects to a running server:

    agentic.environment: "openenv:http://127.0.0.1:8001"
    agentic.environment_args: {reset: {...}}      # keyword arguments of every reset

Each episode plays the environment as the user, as verifiers' OpenEnv taskset does (its 0.4.0
release reads a client attribute openenv-core 0.3 no longer has, hence this adapter): the
observation and the action's JSON schema (`GET /schema`) go to the model as a user message, the
reply is parsed into an action (`parse_action`), stepped, and the next observation comes back as
the next user message, until `done` or `agentic.max_turns` replies. The reward is the sum of the
step rewards (it must lie in [0, 1]); every model call goes through the endpoint, so the episode is
one trajectory of recorded ids. A reply that is not an action ends the episode (the environment
cannot advance on it): counted as `agent_ActionError`, end `env_error`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from scalerl.config import ConfigError
from scalerl.data.records import PromptRecord

INSTALL_HINT = "pip install 'scalerl[envs]'"


class ActionError(ValueError):
    """A model reply that is not an action of the environment's schema."""


def parse_action(message: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The reply as an action dict: a JSON object (optionally in a ``` fence), or, for a schema with
    exactly one required field, the reply as that field's value (a JSON scalar or the raw text).
    Source: verifiers 0.4.0 `tasksets/openenv/taskset.py::parse_action` (same rules)."""
    text = message.strip()
    if text.startswith("```") and text.endswith("```"):
        text = "\n".join(text.splitlines()[1:-1]).strip()
    try:
        value: Any = json.loads(text)
    except json.JSONDecodeError:
        value = text
    if isinstance(value, dict):
        return value
    required = list(schema.get("required", []))
    if len(required) != 1:
        raise ActionError(f"reply {message[:80]!r} is not a JSON object and the action has "
                          f"{len(required)} required fields")
    return {required[0]: value}


def check_openenv(base_url: str) -> None:
    try:
        import openenv  # noqa: F401
    except ImportError as err:
        raise ConfigError(f"agentic.environment: 'openenv:...' needs openenv-core>=0.3: {INSTALL_HINT}") \
            from err
    if not base_url.startswith(("http://", "https://", "ws://", "wss://")):
        raise ConfigError(f"agentic.environment: 'openenv:{base_url}' needs the server's URL "
                          "(openenv:http://HOST:PORT)")


class OpenEnvEpisodes:
    """`run(client, record)`: one episode of the OpenEnv server at `base_url` (module docstring)."""

    def __init__(self, base_url: str, *, max_turns: int, reset: Mapping[str, Any] | None = None) -> None:
        check_openenv(base_url)
        self.base_url = base_url.rstrip("/")
        self.http_url = self.base_url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
        self.max_turns = max_turns
        self.reset = dict(reset or {})
        self._schema: dict[str, Any] | None = None

    async def schema(self) -> dict[str, Any]:
        if self._schema is None:
            import httpx

            async with httpx.AsyncClient(timeout=30) as http:
                r = await http.get(f"{self.http_url}/schema")
                r.raise_for_status()
            self._schema = dict(r.json()["action"])
        return self._schema

    @staticmethod
    def payload(observation: Any, schema: Mapping[str, Any]) -> str:
        return json.dumps({"observation": observation, "action_schema": schema}, ensure_ascii=False)

    async def run(self, client: Any, record: PromptRecord) -> float:
        from openenv import GenericEnvClient

        schema = await self.schema()
        total = 0.0
        async with GenericEnvClient(base_url=self.base_url) as env:
            result = await env.reset(**self.reset)
            first = self.payload(result.observation, schema)
            messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
            for _ in range(self.max_turns):
                reply = await client.chat.completions.create(model="policy", messages=messages)
                text = reply.choices[0].message.content or ""
                messages.append({"role": "assistant", "content": text})
                result = await env.step(parse_action(text, schema))
                total += float(result.reward or 0.0)
                if result.done:
                    break
                messages.append({"role": "user", "content": self.payload(result.observation, schema)})
        return total
