"""docs/from-trl.md and docs/from-verl.md map a peer's keys to scalerl's: every scalerl key they
name must exist in the schema, so a renamed or removed key makes this test fail."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from scalerl.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDERS = {"NAME", "TASK"}


def _section_type(annotation: typing.Any) -> type[BaseModel] | None:
    """The Section behind an annotation: the class itself, or the value type of a dict of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _section_type(arg)
        if found is not None:
            return found
    return None


def key_exists(path: str) -> bool:
    cls: type[BaseModel] | None = RunConfig
    parts = path.split(".")
    i = 0
    while i < len(parts):
        if cls is None:
            return False
        hints = typing.get_type_hints(cls)
        name = parts[i]
        if name not in cls.model_fields:
            return False
        annotation = hints[name]
        origin = typing.get_origin(annotation)
        i += 1
        if origin is dict or (origin is typing.Union and any(typing.get_origin(a) is dict
                                                              for a in typing.get_args(annotation))):
            if i < len(parts) and parts[i] in PLACEHOLDERS:
                i += 1  # a dict keyed by the user's name: the next segment is theirs
            cls = _section_type(annotation)
            if i == len(parts):
                return True
            continue
        cls = _section_type(annotation)
        if i < len(parts) and cls is None:
            return False
    return True


def _mapped_keys(page: str) -> list[str]:
    keys = []
    for line in (ROOT / "docs" / page).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[1].startswith("`"):
            continue
        keys.extend(re.findall(r"`([a-z_][a-z_0-9.A-Z]*)`", cells[1]))
    return keys


@pytest.mark.parametrize("page", ["from-trl.md", "from-verl.md"])
def test_every_mapped_scalerl_key_exists(page: str) -> None:
    keys = _mapped_keys(page)
    assert len(keys) >= 30, f"{page}: the key map lost its rows ({len(keys)} keys found)"
    missing = [k for k in keys if not key_exists(k)]
    assert not missing, f"{page} names keys that are not in RunConfig: {missing}"


def test_the_key_resolver_refuses_what_does_not_exist() -> None:
    # The check above is only as good as this resolver: it must say no.
    assert key_exists("optim.lr") and key_exists("eval.extra_sets.NAME.path")
    assert key_exists("rewards.reward_models.TASK.path") and key_exists("max_steps")
    for bad in ("optim.learning_rate", "generation.num_generations", "eval.extra_sets.NAME.nope",
                "optim.lr.x", "algorithm.tis.cap_high"):
        assert not key_exists(bad), bad
