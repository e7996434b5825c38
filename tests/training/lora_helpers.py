"""A dense verifier for the LoRA end-to-end runs (`rewards.verifiers.math=lora_helpers:digit_share`)."""


def digit_share(completion: str, record: object) -> float:
    """The share of digits among the completion's characters: a reward with spread in every group
    that a barely warm-started tiny model can climb in a few steps."""
    return sum(ch.isdigit() for ch in completion) / len(completion) if completion else 0.0
