"""An OpenAI-compatible endpoint over the run's engines, and the environments that run through it.

`endpoint.Endpoint` (requests -> engine -> recorded calls -> OpenAI responses), `trace` (the calls
of a session as a token-level trajectory, stitched from recorded ids), `http` (the Starlette app,
uvicorn in a thread), `guard` (what the network may send: Host, key, size, time, concurrency),
`validate` (every request field checked), `limits` (`ServeLimits`, the bounds both read),
`agent` (the `agent:` environment kind: an async `(client, record) -> reward`
program whose calls become the trajectory). docs/agentic.md, "The OpenAI-compatible endpoint".
Nothing is imported here: the modules pull in torch and the web stack.
"""
