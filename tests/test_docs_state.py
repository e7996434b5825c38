"""The docs describe the product as it is now: the generated configuration reference is current,
and no page narrates how the work went (git keeps the history)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scalerl.cli import config_reference

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])

# Phrases that tell the story of the work instead of the state of the product.
HISTORY = re.compile(
    r"\b(at|until|since|before|after|in|from|on) (this|that|an earlier|the previous|the last|a later|"
    r"the next|each|every) stop\b|\b(an earlier|earlier|the previous|previous|a later|later) stop'?s?\b|"
    r"\bthis stop\b|(?-i:Correction)\b|\bwas found\b|\bwe found\b|\bused to (fail|be|give)\b|"
    r"\bin the order it was found\b|\bon the way\b|\bno longer\b.{0,40}\b(fixed|now)\b|\bnow fixed\b",
    re.IGNORECASE,
)


def test_the_configuration_reference_is_current() -> None:
    page = ROOT / "docs" / "config.md"
    assert page.read_text() == config_reference.render(), (
        "docs/config.md is stale: python -m scalerl.cli.config_reference > docs/config.md")


def test_the_configuration_reference_lists_every_key_with_its_default() -> None:
    text = config_reference.render()
    for key in ("`algorithm.loss_type`", "`optim.lr`", "`generation.n`", "`model.lora.r`",
                "`rewards.sandbox.wall_s`"):
        assert key in text
    assert "| `optim.lr` | `float` | `0.0001` |" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_narrates_history(page: Path) -> None:
    hits = [f"{page.name}:{i}: {line.strip()[:120]}"
            for i, line in enumerate(page.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not hits, "history phrasing in the docs (state what is true now):\n" + "\n".join(hits)


def test_the_history_pattern_catches_what_it_is_for() -> None:
    for text in ("at this stop", "an earlier stop's fresh clone", "Correction (this stop)",
                 "Until this stop `seed` moved", "It found a bug, now fixed",
                 "the run a previous stop printed"):
        assert HISTORY.search(text), text
    for text in ("the run stops", "a stop request", "stop_when_known", "stops at the first evaluation"):
        assert not HISTORY.search(text), text


def test_every_key_has_a_meaning_and_no_meaning_is_stale() -> None:
    from tests.test_docs_keymaps import key_exists

    blank = [line.split("|")[1].strip() for line in config_reference.render().splitlines()
             if line.startswith("| `") and line.rstrip().endswith("|  |")]
    assert not blank, f"keys without a meaning (add a description, a comment or a MEANINGS entry): {blank}"
    stale = [k for k in config_reference.MEANINGS if not key_exists(k)]
    assert not stale, f"MEANINGS names keys that are not in RunConfig: {stale}"
