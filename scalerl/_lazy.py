"""Lazy package exports (PEP 562): `from scalerl.training import Trainer` imports torch only then.

A package `__init__` that imports its submodules eagerly makes every `import scalerl.pkg.cli` pay
for torch and transformers (5-7 s of CPU), which the command line must not do just to build its
parser or print `--help`. `lazy_exports` gives a package `__getattr__` / `__dir__` that import the
submodule defining a name on first access.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for `package`; `exports` maps a public name to its submodule."""

    def getattr_(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def dir_() -> list[str]:
        return sorted(exports)

    return getattr_, dir_
