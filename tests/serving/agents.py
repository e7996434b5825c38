"""Agent programs the agent-environment tests load by path (`agent:tests.serving.agents:NAME`)."""

from __future__ import annotations

from scalerl.data.records import PromptRecord


async def ask_twice(client, record: PromptRecord) -> float:
    """Two chat turns: the question, then a follow-up; reward 1 when the last reply holds the answer."""
    messages = [{"role": "user", "content": record.prompt or record.chat()[-1]["content"]}]
    first = await client.chat.completions.create(model="policy", messages=messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Final answer?"}]
    second = await client.chat.completions.create(model="policy", messages=messages)
    return 1.0 if (record.answer or "") in (second.choices[0].message.content or "") else 0.0


async def verifier_decides(client, record: PromptRecord) -> None:
    """One call; None: the task's verifier judges the reply."""
    await client.chat.completions.create(model="policy", messages=record.chat())


async def raises(client, record: PromptRecord) -> float:
    await client.chat.completions.create(model="policy", messages=record.chat())
    raise RuntimeError("agent bug")


async def no_call(client, record: PromptRecord) -> float:
    return 0.5


async def not_a_reward(client, record: PromptRecord) -> str:
    await client.chat.completions.create(model="policy", messages=record.chat())
    return "yes"


async def until_refused(client, record: PromptRecord) -> float:
    """Keeps asking until the episode's token budget refuses the call (the error propagates)."""
    messages = record.chat()
    while True:
        r = await client.chat.completions.create(model="policy", messages=messages)
        messages = [*messages, {"role": "assistant", "content": r.choices[0].message.content},
                    {"role": "user", "content": "more"}]


def not_async(client, record):
    return 1.0
