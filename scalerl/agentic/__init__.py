"""Agentic RL: multi-turn trajectories over any engine, environments, tools (docs/agentic.md).

`setup.build_agentic(agentic_section, tokenizer, engine, router, decode)` is what the composition
root calls when `agentic.environment` is set. Nothing is imported here: the modules pull in torch.
"""
