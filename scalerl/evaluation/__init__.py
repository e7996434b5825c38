"""Held-out evaluation: mean@k pass rate on held-out prompts (and optional extra sets)."""

from scalerl.evaluation.evaluator import Evaluator, GenerateFn, evaluate

__all__ = ["Evaluator", "GenerateFn", "evaluate"]
