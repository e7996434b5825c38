r"""SFT warm-start examples for agentic runs: tool-use traces beside direct ones.

A tool-use trace is the trajectory a good policy would produce, laid out exactly as the rollout lays
it out (`TrajectoryEngine`): the model's call, the environment segment the chat format renders for
the tool's answer (loss-masked: context, not target), then the model's answer:

    <tool_call>{"name": "calculator", "arguments": {"expression": "482+551"}}</tool_call>
    <|end|><|user|><tool_response>1033</tool_response><|assistant|>     (masked)
    \boxed{1033}<|end|>

A record with `metadata["tool_call"]` (the built-in `tool_math` task: a calculator expression) or
`metadata["tool_trace"]` (`tool_code`: a tool call, its output, then the gold solution as the answer)
gets the tool trace with probability `agentic.sft_tool_fraction`, else its direct trace
(`metadata["solution"]`); records without one get the direct trace. The choice is seeded, so the
examples (and the cache key of the warm start) are a function of the config. A warm start that
only sometimes calls the tool leaves RL the choice to learn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from scalerl.agentic.chat import ChatFormat
from scalerl.agentic.toolcalls import ToolCall, format_tool_call
from scalerl.agentic.tools import evaluate_arithmetic
from scalerl.config import AgenticConfig
from scalerl.data.records import PromptRecord
from scalerl.training.sft import SFTExample


def tool_trace(record: PromptRecord, chat: ChatFormat, answer_text: str | None = None) -> SFTExample:
    """The tool trace of `record`: its `metadata["tool_trace"]` (name, arguments, result; the answer
    is the gold solution), else the calculator on its `metadata["tool_call"]` expression (the answer
    boxes the result)."""
    trace = record.metadata.get("tool_trace")
    if isinstance(trace, dict):
        call_obj = ToolCall(str(trace["name"]), dict(trace["arguments"]))
        result = str(trace["result"])
        default_answer = str(record.metadata["solution"])
    else:
        expr = record.metadata["tool_call"]
        call_obj = ToolCall("calculator", {"expression": expr})
        result = str(evaluate_arithmetic(expr))
        default_answer = f"\\boxed{{{result}}}"
    tok = chat.tokenizer
    call = tok.encode(format_tool_call(call_obj), add_special_tokens=False)
    env = chat.segment_ids([{"role": "tool", "name": call_obj.name, "content": result}])
    answer = tok.encode(answer_text if answer_text is not None else default_answer, add_special_tokens=False)
    answer = [*answer, int(tok.eos_token_id)]
    prompt = chat.render_ids(record.chat())
    mask = (True,) * len(call) + (False,) * len(env) + (True,) * len(answer)
    return SFTExample(tuple(prompt), (*call, *env, *answer), mask)


def direct_trace(record: PromptRecord, chat: ChatFormat) -> SFTExample:
    tok = chat.tokenizer
    response = [*tok.encode(record.metadata["solution"], add_special_tokens=False), int(tok.eos_token_id)]
    return SFTExample(tuple(chat.render_ids(record.chat())), tuple(response))


def agentic_examples(
    agentic: AgenticConfig, seed: int, tokenizer: Any, records: Sequence[PromptRecord], max_length: int
) -> list[SFTExample]:
    """The warm start's examples (module docstring); over-long examples are an error naming the record.
    `seed` (the run's) draws which records get a tool trace (`agentic.sft_tool_fraction` of them)."""
    chat = ChatFormat(tokenizer)
    rng = np.random.default_rng([seed, 0x534654])
    fraction = agentic.sft_tool_fraction
    out = []
    for record in records:
        if not isinstance(record.metadata.get("solution"), str):
            continue
        has_tool = "tool_call" in record.metadata or "tool_trace" in record.metadata
        use_tool = has_tool and rng.random() < fraction
        ex = tool_trace(record, chat) if use_tool else direct_trace(record, chat)
        total = len(ex.prompt_ids) + len(ex.response_ids)
        if total > max_length:
            where = record.source or record.id
            raise ValueError(f"{where}: example has {total} tokens > sft max_length={max_length}")
        out.append(ex)
    if not out:
        raise ValueError('sft: no record has a metadata["solution"] gold response')
    return out
