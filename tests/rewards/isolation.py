"""Skips for missing sandbox isolation, which become failures where isolation is required.

On a machine without namespaces the code sandbox fails closed (`isolation: auto` runs nothing), so
every test that runs model-written code would error; there it is skipped, with the reason. With
`SCALERL_REQUIRE_ISOLATION=1` (set by `.ci/run`: CI runs as root where namespaces exist) each such
skip is a failure instead, so a green suite proves the jail was there and tested.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_VAR = "SCALERL_REQUIRE_ISOLATION"


def isolation_required() -> bool:
    return os.environ.get(REQUIRE_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def no_isolation(reason: str) -> NoReturn:
    """Skip the test for `reason` (what isolation is missing), or fail it under `REQUIRE_VAR`."""
    if isolation_required():
        pytest.fail(f"{REQUIRE_VAR} is set, and {reason}", pytrace=False)
    pytest.skip(reason)


def is_missing_isolation(exc: BaseException) -> bool:
    """Whether `exc` is the sandbox refusing to run because its isolation is unavailable here."""
    from scalerl.rewards.sandbox import SandboxUnavailableError

    return isinstance(exc, SandboxUnavailableError) and exc.key == "isolation"
