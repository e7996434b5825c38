"""The compute meter: device-hours, FLOPs, tokens and samples, cumulative over a run (and resumes).

Device-hours (the x axis of ScaleRL's compute-scaling fits) are *allocation* hours: the devices the
run holds times the wall-clock time the meter is running, idle time included, because an
off-policy scheme that keeps devices idle (PPO-off-policy waiting on generation) must pay for it.
Callers bracket the training loop with `running()` and leave evaluation outside it. Per-role
*busy* hours (`busy("generator")`, `busy("trainer")`) are kept alongside to report utilisation.

FLOPs follow the usual dense-transformer estimate (Kaplan et al. 2020): 2N per token for a forward
pass (generation, prefill, log-prob passes) and 6N per token for a training forward + backward.
N counts the parameters that take part in a matmul per token: every parameter except the
input-embedding table (a lookup, no FLOPs), with the LM head counted whether or not it is tied to
that table (the d x V projection is real work, and for small models with large vocabularies a
large share of it). The attention context term (2 n_layer n_ctx d per token) is left out, as in 6N.

A model trained only in part (LoRA: a frozen base and a trainable adapter) costs
`train_flops_per_token(N, N_trainable)` = 4N + 2 N_trainable (see there): the forward and the
backward for the activations still run through the whole frozen base, only the frozen weights'
gradients are skipped. The engines run the merged weights (`generation_params`: the base alone).

In a mixture-of-experts model a token runs through `k` of the `E` routed experts of each MoE block,
so N counts those experts' weights `k / E` times (the active parameters, as MoE papers report
compute); the router and a shared expert run for every token and count whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from scalerl.models.moe import active_expert_fraction

FORWARD_FLOPS_PER_PARAM = 2
TRAIN_FLOPS_PER_PARAM = 6


def train_flops_per_token(n_params: int, trainable_params: int | None = None) -> float:
    """FLOPs per token of a training forward + backward: `2N + 2N + 2 N_trainable`.

    The usual split of 6N (Kaplan et al. 2020, arXiv 2001.08361, Sec. 2.1; Hoffmann et al. 2022,
    App. F): the forward pass costs 2N, the backward twice that, 2N for the gradients with respect
    to the activations and 2N for those with respect to the weights. A frozen weight needs no weight
    gradient, but the activation gradient still flows through it to the trainable weights below, so
    a model with N_trainable of its N parameters trained costs `4N + 2 N_trainable` per token. For
    LoRA (Hu et al. 2021, arXiv 2106.09685, Sec. 4.2: no gradients "for the vast majority of the
    parameters") with N = N_base + N_adapter and N_trainable = N_adapter that is
    `4 N_base + 6 N_adapter`, about 2/3 of full fine-tuning's 6N; `None` (every parameter trained)
    is 6N. Counting the activation gradient down to the first layer is exact for adapters on
    every layer (the default, "all-linear"); with adapters on the top layers only it overcounts.
    """
    if n_params <= 0:
        raise ValueError(f"n_params: expected a positive parameter count, got {n_params}")
    trained = n_params if trainable_params is None else int(trainable_params)
    if not 0 <= trained <= n_params:
        raise ValueError(f"trainable_params: expected 0..{n_params}, got {trainable_params}")
    return float(2 * FORWARD_FLOPS_PER_PARAM * n_params + FORWARD_FLOPS_PER_PARAM * trained)


def flop_params(model: torch.nn.Module, trainable_only: bool = False) -> int:
    """N for the FLOPs estimate: parameters used in a per-token matmul (see module docstring);
    `trainable_only`: those of them that are trained (`requires_grad`)."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    embed = get_in() if callable(get_in) else None
    head = get_out() if callable(get_out) else None
    excluded = {id(embed.weight)} if embed is not None else set()
    active = active_expert_fraction(model)
    seen: set[int] = set()
    total = 0.0
    for p in model.parameters():
        # `parameters()` already yields a tied tensor once; `seen` guards odd custom modules.
        if id(p) in seen or id(p) in excluded:
            continue
        seen.add(id(p))
        if p.requires_grad or not trainable_only:
            total += p.numel() * active.get(id(p), 1.0)
    if head is not None and id(head.weight) in excluded and (head.weight.requires_grad or not trainable_only):
        total += head.weight.numel()
    return round(total)


class ComputeMeter:
    """Cumulative compute of one run; `state_dict()`/`load_state_dict()` carry it across a resume.

    `num_devices` is every device the run holds (generator and trainer together; on a single shared
    device, 1). `role_devices` gives the devices each role uses, for its busy device-hours.

    `trainable_params` (None: all of `n_params`) prices a training token at
    `train_flops_per_token`; `generation_params` (None: `n_params`) is the N of the model the
    engines run and of a forward with the adapter disabled (LoRA: the merged weights, the base's N).
    """

    def __init__(
        self,
        n_params: int,
        num_devices: int = 1,
        role_devices: Mapping[str, int] | None = None,
        clock: Any = time.monotonic,
        trainable_params: int | None = None,
        generation_params: int | None = None,
    ) -> None:
        if n_params <= 0:
            raise ValueError(f"n_params: expected a positive parameter count, got {n_params}")
        self.train_flops_per_token = train_flops_per_token(n_params, trainable_params)
        if generation_params is not None and not 0 < generation_params <= n_params:
            raise ValueError(f"generation_params: expected 1..{n_params}, got {generation_params}")
        self.generation_params = int(generation_params if generation_params is not None else n_params)
        if num_devices <= 0:
            raise ValueError(f"num_devices: expected >= 1, got {num_devices}")
        self.n_params = int(n_params)
        self.num_devices = int(num_devices)
        self.role_devices = dict(role_devices or {"generator": num_devices, "trainer": num_devices})
        self._clock = clock
        self.wall_seconds = 0.0
        self.busy_seconds: dict[str, float] = {role: 0.0 for role in self.role_devices}
        self.flops = 0.0
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.samples = 0
        self.trained_tokens = 0
        self.trained_samples = 0
        self.logprob_tokens = 0
        self.auxiliary_trained_tokens = 0
        self.reward_model_tokens = 0
        self._running_since: float | None = None
        self._running_depth = 0
        # The generator and trainer threads of a pipelined run report to one meter.
        self._lock = threading.RLock()

    # -- time ------------------------------------------------------------------------------------

    @contextmanager
    def running(self) -> Iterator[None]:
        """Count wall-clock x `num_devices` while inside (nesting counts the time once)."""
        with self._lock:
            if self._running_depth == 0:
                self._running_since = self._clock()
            self._running_depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._running_depth -= 1
                if self._running_depth == 0 and self._running_since is not None:
                    self.wall_seconds += self._clock() - self._running_since
                    self._running_since = None

    @contextmanager
    def busy(self, role: str) -> Iterator[None]:
        """Count `role`'s busy wall-clock while inside (for its device-hours and idle fraction)."""
        if role not in self.role_devices:
            raise ValueError(f"role: unknown {role!r}; expected one of {', '.join(self.role_devices)}")
        start = self._clock()
        try:
            yield
        finally:
            with self._lock:
                self.busy_seconds[role] += self._clock() - start

    def elapsed_seconds(self) -> float:
        """Running wall-clock so far, including the open `running()` interval."""
        with self._lock:
            since = self._running_since
            extra = self._clock() - since if since is not None else 0.0
            return self.wall_seconds + extra

    def idle_fraction(self, role: str) -> float:
        """Share of the running wall-clock that `role` was not busy (0 before any time passed)."""
        elapsed = self.elapsed_seconds()
        if elapsed <= 0:
            return 0.0
        return max(0.0, 1.0 - self.busy_seconds[role] / elapsed)

    # -- work ------------------------------------------------------------------------------------

    def add_generation(self, generated_tokens: int, samples: int, prompt_tokens: int = 0) -> None:
        """Sampled tokens (2N each) and the prompt tokens the engine prefilled (2N each)."""
        with self._lock:
            self.generated_tokens += int(generated_tokens)
            self.prompt_tokens += int(prompt_tokens)
            self.samples += int(samples)
            tokens = int(generated_tokens) + int(prompt_tokens)
            self.flops += FORWARD_FLOPS_PER_PARAM * self.generation_params * tokens

    def add_training(self, tokens: int, samples: int) -> None:
        """Tokens through a training forward + backward (prompt and response, no padding): 6N each,
        `4N + 2 N_trainable` when only part of the model is trained (`train_flops_per_token`)."""
        with self._lock:
            self.trained_tokens += int(tokens)
            self.trained_samples += int(samples)
            self.flops += self.train_flops_per_token * int(tokens)

    def add_logprob_pass(self, tokens: int, n_params: int | None = None) -> None:
        """A forward-only pass (reference model, old-log-prob recomputation): 2N per token."""
        with self._lock:
            self.logprob_tokens += int(tokens)
            self.flops += FORWARD_FLOPS_PER_PARAM * (n_params or self.n_params) * int(tokens)

    def add_auxiliary_training(self, tokens: int, n_params: int, trainable_params: int | None = None) -> None:
        """Tokens through a forward + backward of another model trained beside the policy (a
        critic): `train_flops_per_token(n_params, trainable_params)` each (6 n_params when every
        parameter trains; a LoRA critic's `4N + 2 N_trainable`). Counted in the FLOPs, not in the
        policy's `trained_tokens`."""
        with self._lock:
            self.auxiliary_trained_tokens += int(tokens)
            self.flops += train_flops_per_token(int(n_params), trainable_params) * int(tokens)

    def add_reward_model(self, tokens: int, n_params: int) -> None:
        """Tokens through a reward model (a classifier's inputs; a judge's prompts and generated
        verdict tokens, scalerl/rewards/reward_model.py): a forward each, 2 n_params per token."""
        with self._lock:
            self.reward_model_tokens += int(tokens)
            self.flops += FORWARD_FLOPS_PER_PARAM * int(n_params) * int(tokens)

    # -- reporting -------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, float | int]:
        """Cumulative totals, the keys every eval row carries."""
        with self._lock:
            hours = self.elapsed_seconds() / 3600.0
            out: dict[str, float | int] = {
                "compute_device_hours": self.num_devices * hours,
                "flops": self.flops,
                "samples": self.samples,
                "tokens": self.generated_tokens,
                "trained_tokens": self.trained_tokens,
                "wall_hours": hours,
            }
            for role, seconds in self.busy_seconds.items():
                out[f"{role}_device_hours"] = self.role_devices[role] * seconds / 3600.0
            return out

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "n_params": self.n_params,
                "num_devices": self.num_devices,
                "role_devices": dict(self.role_devices),
                "wall_seconds": self.elapsed_seconds(),
                "busy_seconds": dict(self.busy_seconds),
                "flops": self.flops,
                "generated_tokens": self.generated_tokens,
                "prompt_tokens": self.prompt_tokens,
                "samples": self.samples,
                "trained_tokens": self.trained_tokens,
                "trained_samples": self.trained_samples,
                "logprob_tokens": self.logprob_tokens,
                "auxiliary_trained_tokens": self.auxiliary_trained_tokens,
                "reward_model_tokens": self.reward_model_tokens,
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from saved totals (the device layout of the new process is kept)."""
        with self._lock:
            self.wall_seconds = float(state["wall_seconds"])
            if self._running_since is not None:
                self._running_since = self._clock()
            for role, seconds in state.get("busy_seconds", {}).items():
                self.busy_seconds[role] = float(seconds)
                self.role_devices.setdefault(role, self.num_devices)
            self.flops = float(state["flops"])
            for key in ("generated_tokens", "prompt_tokens", "samples", "trained_tokens",
                        "trained_samples", "logprob_tokens", "auxiliary_trained_tokens",
                        "reward_model_tokens"):
                setattr(self, key, int(state.get(key, 0)))
