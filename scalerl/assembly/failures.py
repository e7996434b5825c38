"""Which exceptions are the user's (bad input, exit 2) and which are ours (exit 1, traceback).

The classes are named, not imported: this module is read by the command line before anything
heavy is imported, and it names classes of every layer, so it sits at the top, in the root.
"""

from __future__ import annotations

import sys

#: The exceptions that mean bad input (config, paths, data, options): (module, class). A command
#: reports them in one line with exit status 2; anything else is a failure of scalerl or of a
#: library (exit 1, with its traceback). By name, so that nothing is imported to classify an error
#: (an exception of a module that was never imported cannot have been raised).
INPUT_ERRORS: tuple[tuple[str, str], ...] = (
    ("scalerl.inputs", "InputError"),  # OwnershipError, MissingInputError
    ("scalerl.config", "ConfigError"),
    ("scalerl.config", "CrossKeyError"),
    ("scalerl.data.rejects", "DataError"),
    ("scalerl.rollout.factory", "EngineUnavailableError"),
    ("scalerl.rollout.vllm_engine", "UnsupportedModelError"),
    ("scalerl.training.checkpoint", "CorruptCheckpointError"),
    ("scalerl.scaling.validation", "CurveError"),
)


def input_error_types() -> tuple[type[BaseException], ...]:
    """The classes of `INPUT_ERRORS` among the modules imported so far."""
    found = []
    for module, name in INPUT_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def is_input_error(err: BaseException) -> bool:
    """True when `err` is bad input (one of `INPUT_ERRORS`), not a failure of ours."""
    return isinstance(err, input_error_types())
