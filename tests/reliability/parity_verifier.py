"""A verifier with signal for a barely trained tiny model: reward 1 for an even-length completion.

The synthetic math task gives a 2-step warm start no correct answer, so every group would have
zero variance and no step would update the weights (a kill/resume test comparing final weights
would then pass trivially). The parity of the completion's length is a deterministic function of
the sampled text, about half the samples score 1, and the weights change at every step.
"""


def parity(completion: str, record: object) -> float:
    return float(len(completion) % 2 == 0)
