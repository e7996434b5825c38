"""Prompt data: records, loaders with field mapping, tokenization checks, the held-out split, the
`PromptPool` curriculum, and the built-in synthetic tasks. See docs/data.md."""

from scalerl.data.loaders import FILE_SUFFIXES, FORMATS, LoadResult, load_prompts, write_jsonl
from scalerl.data.pool import PoolExhaustedError, PromptPool
from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError, RejectLog
from scalerl.data.split import (
    HeldOutSplit,
    load_heldout_ids,
    save_heldout_ids,
    split_by_ids,
    split_heldout,
)
from scalerl.data.synthetic import (
    SYNTHETIC_TASKS,
    make_code_task,
    make_math_task,
    make_synthetic,
    write_synthetic_jsonl,
)
from scalerl.data.tokenize import (
    THINK_SYSTEM_PROMPT,
    EncodedPrompts,
    encode_prompt,
    encode_prompts,
    resolve_system_prompt,
)

__all__ = [
    "FILE_SUFFIXES",
    "FORMATS",
    "SYNTHETIC_TASKS",
    "THINK_SYSTEM_PROMPT",
    "DataError",
    "EncodedPrompts",
    "HeldOutSplit",
    "LoadResult",
    "PoolExhaustedError",
    "PromptPool",
    "PromptRecord",
    "RejectLog",
    "encode_prompt",
    "encode_prompts",
    "load_heldout_ids",
    "load_prompts",
    "make_code_task",
    "make_math_task",
    "make_synthetic",
    "resolve_system_prompt",
    "save_heldout_ids",
    "split_by_ids",
    "split_heldout",
    "write_jsonl",
    "write_synthetic_jsonl",
]
