"""The distillation teacher (`algorithm.distill.teacher`): a frozen causal LM in the trainer's process.

It scores the student's sampled tokens (a forward pass per batch, no gradient), which the trainer
turns into the reverse-KL advantage of `scalerl.algorithms.distill`. The teacher must read the
student's token ids as the same text: its vocabulary (the tokenizer saved with it, when there is
one) must be the student's, else a `ConfigError` naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from scalerl.config import ConfigError, ModelConfig
from scalerl.models.loading import load_pretrained_tokenizer
from scalerl.training.policy import Policy, load_model

KEY = "algorithm.distill.teacher"


def load_teacher(path: str, policy: Policy) -> torch.nn.Module:
    """The teacher at `path`, float32, dropout off, frozen, in eval mode on the policy's device."""
    if path == "warm_start":
        raise ConfigError(f"{KEY}: 'warm_start' is resolved by the run's assembly (scalerl train); "
                          "a trainer built by hand needs a model path")
    try:
        model = load_model(ModelConfig(name_or_path=path), policy.device)
    except (OSError, ValueError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"{KEY}: cannot load a causal LM from {path!r}: {first}") from None
    rows = int(model.get_input_embeddings().weight.shape[0])
    student_rows = int(policy.model.get_input_embeddings().weight.shape[0])
    if rows != student_rows:
        raise ConfigError(f"{KEY}: {path} has {rows} token embeddings, the student {student_rows}; "
                          "the teacher must share the student's tokenizer")
    saved = ("tokenizer.json", "tokenizer_config.json")
    if Path(path).is_dir() and any((Path(path) / f).is_file() for f in saved):
        check_same_vocab(load_pretrained_tokenizer(path), policy.tokenizer, path)
    model.eval()
    model.requires_grad_(False)
    return model


def check_same_vocab(teacher_tokenizer: Any, student_tokenizer: Any, path: str) -> None:
    """A `ConfigError` unless the two tokenizers map every token to the same id."""
    if teacher_tokenizer.get_vocab() != student_tokenizer.get_vocab():
        raise ConfigError(f"{KEY}: the tokenizer saved with {path} differs from the student's; the "
                          "teacher must read the student's token ids as the same text")
