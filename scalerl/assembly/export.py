"""`scalerl export`: a checkpoint's weights as a plain Hugging Face model directory.

A LoRA checkpoint (`adapter/`, peft's format) is loaded onto its run's base model and merged
(`W + (alpha / r) B A`, `scalerl.models.lora`); a full checkpoint is written as it is. The result
loads with `AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)`.
A model card (`README.md`: base model, data, recipe and the keys changed from it, the final
held-out pass rate, the fitted A with its interval and flag; `scalerl.assembly.model_card`) is
written beside the weights. It is written into a temporary sibling and renamed into place, so DIR
is either complete or absent; an existing non-empty DIR is refused (exit 2), never overwritten.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from scalerl.assembly.evaluate import resolve_source, source_policy
from scalerl.assembly.model_card import model_card
from scalerl.inputs import InputError


def check_export_dir(out: str | Path) -> Path:
    """`out` may be written: absent, or an empty directory (an existing file or a non-empty
    directory is refused, naming it)."""
    p = Path(out).expanduser()
    if p.exists() and (not p.is_dir() or any(p.iterdir())):
        raise InputError(f"--out {out}: exists and is not an empty directory; choose another --out "
                         "(export never overwrites)")
    return p


def export_checkpoint(spec: str, out: str | Path, warn: Callable[[str], None] | None = None, *,
                      trust_unverified: bool = False) -> tuple[Path, bool]:
    """Write the model of `spec` (a run directory, a checkpoint or a model) to `out`; returns the
    directory and whether a LoRA adapter was merged. A checkpoint is verified against its manifest
    first; one without a manifest is refused unless `trust_unverified`."""
    from scalerl.training.checkpoint import STATE_FILE, require_verified

    target = check_export_dir(out)
    source = resolve_source(spec, warn=warn)
    if (Path(source.model) / STATE_FILE).is_file():  # a checkpoint, not a saved model
        require_verified(source.model, trust_unverified=trust_unverified, warn=warn)
    policy = source_policy(source, device="cpu")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-export-{target.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        policy.save_pretrained(tmp)  # merged for a LoRA policy
        card = model_card(source.model, source.run_dir, source.config, bool(policy.lora))
        (tmp / "README.md").write_text(card, encoding="utf-8")
        if target.exists():
            target.rmdir()  # empty (checked above)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target, bool(policy.lora)


__all__ = ["check_export_dir", "export_checkpoint"]
