"""Prompt data: records, loaders with field mapping, tokenization checks, the held-out split, the
`PromptPool` curriculum, and the built-in synthetic tasks. See docs/data.md."""

from typing import TYPE_CHECKING

from scalerl._lazy import lazy_exports

# Imported on first use (scalerl/_lazy.py): the command line (`scalerl.cli`) imports this package
# without paying for torch.
_EXPORTS = {
    "DataError": "scalerl.data.rejects",
    "EncodedPrompts": "scalerl.data.tokenize",
    "FILE_SUFFIXES": "scalerl.data.loaders",
    "FORMATS": "scalerl.data.loaders",
    "HeldOutSplit": "scalerl.data.split",
    "LoadResult": "scalerl.data.loaders",
    "PoolExhaustedError": "scalerl.data.pool",
    "PromptPool": "scalerl.data.pool",
    "PromptRecord": "scalerl.data.records",
    "RejectLog": "scalerl.data.rejects",
    "SYNTHETIC_TASKS": "scalerl.data.synthetic",
    "TEMPLATES": "scalerl.data.tokenize",
    "THINK_SYSTEM_PROMPT": "scalerl.data.tokenize",
    "encode_prompt": "scalerl.data.tokenize",
    "encode_prompts": "scalerl.data.tokenize",
    "load_heldout_ids": "scalerl.data.split",
    "load_prompts": "scalerl.data.loaders",
    "make_code_task": "scalerl.data.synthetic",
    "make_math_task": "scalerl.data.synthetic",
    "make_synthetic": "scalerl.data.synthetic",
    "render_prompt": "scalerl.data.tokenize",
    "resolve_system_prompt": "scalerl.data.tokenize",
    "save_heldout_ids": "scalerl.data.split",
    "split_by_ids": "scalerl.data.split",
    "split_heldout": "scalerl.data.split",
    "write_jsonl": "scalerl.data.loaders",
    "write_synthetic_jsonl": "scalerl.data.synthetic",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
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
        TEMPLATES,
        THINK_SYSTEM_PROMPT,
        EncodedPrompts,
        encode_prompt,
        encode_prompts,
        render_prompt,
        resolve_system_prompt,
    )

__all__ = [
    "FILE_SUFFIXES",
    "FORMATS",
    "SYNTHETIC_TASKS",
    "TEMPLATES",
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
    "render_prompt",
    "resolve_system_prompt",
    "save_heldout_ids",
    "split_by_ids",
    "split_heldout",
    "write_jsonl",
    "write_synthetic_jsonl",
]
