"""Shared test configuration: GPU tests are skipped without CUDA; torch uses few threads; tests stopped by
the code sandbox's missing isolation are skipped (failed under SCALERL_REQUIRE_ISOLATION=1)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _isolation_or_skip() -> Iterator[None]:
    """A test (or fixture) stopped by the sandbox's missing isolation is skipped, or fails where
    SCALERL_REQUIRE_ISOLATION is set (tests/rewards/isolation.py)."""
    try:
        return (yield)
    except Exception as exc:
        from tests.rewards.isolation import is_missing_isolation, no_isolation

        if is_missing_isolation(exc):
            no_isolation(f"the code sandbox cannot isolate here: {exc}")
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _isolation_or_skip())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _isolation_or_skip())
