"""Held-out evaluation: mean@k pass rate on held-out prompts (and optional extra sets)."""

from typing import TYPE_CHECKING

from scalerl._lazy import lazy_exports

# Imported on first use (scalerl/_lazy.py): the command line (`scalerl.cli`) imports this package
# without paying for torch.
_EXPORTS = {
    "Evaluator": "scalerl.evaluation.evaluator",
    "GenerateFn": "scalerl.evaluation.evaluator",
    "evaluate": "scalerl.evaluation.evaluator",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from scalerl.evaluation.evaluator import Evaluator, GenerateFn, evaluate

__all__ = [
    "Evaluator",
    "GenerateFn",
    "evaluate",
]
