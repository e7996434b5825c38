"""Input validation shared by the objective library.

Every check raises `ValueError` whose message starts with the offending argument's name, so a
trainer's config error or data bug points at the argument rather than at a broadcasting failure
deep inside a loss. Messages look like:

    mask: expected shape [N, T] = (4, 7) matching logprobs, got (4, 6)
    rewards: contains NaN at index 3
    loss_type: unknown 'foo'; expected one of cispo, grpo, gspo, kimi
    mask: no response tokens (empty mask)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor


def check_choice(name: str, value: object, choices: Iterable[str]) -> str:
    """Return `value` if it is one of `choices`, else raise naming `name` and the valid options."""
    options = sorted(choices)
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name}: unknown {value!r}; expected one of {', '.join(options)}")
    return value


def check_tensor(name: str, x: object) -> Tensor:
    """Raise unless `x` is a `torch.Tensor`."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def check_float_tensor(name: str, x: object, ndim: int | None = None, dims: str = "") -> Tensor:
    """Raise unless `x` is a floating-point tensor (of `ndim` dimensions, described as `dims`)."""
    t = check_tensor(name, x)
    if not t.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor {dims}, got shape {tuple(t.shape)}")
    return t


def check_same_shape(name: str, x: Tensor, ref_name: str, ref: Tensor, dims: str) -> None:
    """Raise unless `x.shape == ref.shape`; `dims` names the axes, e.g. "[N, T]"."""
    if x.shape != ref.shape:
        raise ValueError(
            f"{name}: expected shape {dims} = {tuple(ref.shape)} matching {ref_name}, got {tuple(x.shape)}"
        )


def _first_index(flags: Tensor) -> int | tuple[int, ...]:
    idx = tuple(int(i) for i in torch.nonzero(flags)[0].tolist())
    return idx[0] if len(idx) == 1 else idx


def check_finite(name: str, x: Tensor, where: Tensor | None = None) -> None:
    """Raise if `x` holds NaN or ±inf at a position where `where` is True.

    `where` (bool, same shape as `x`) restricts the check to response tokens, so padding may hold
    garbage without tripping it.
    """
    nan = torch.isnan(x)
    bad_inf = torch.isinf(x)
    if where is not None:
        nan = nan & where
        bad_inf = bad_inf & where
    # One host sync for the common all-clear case.
    if not bool((nan | bad_inf).any()):
        return
    if bool(nan.any()):
        raise ValueError(f"{name}: contains NaN at index {_first_index(nan)}")
    raise ValueError(f"{name}: contains inf at index {_first_index(bad_inf)}")


def as_bool_mask(name: str, mask: object, ref_name: str, ref: Tensor, dims: str = "[N, T]") -> Tensor:
    """Validate a response mask shaped like `ref` (bool, or 0/1 numbers) and return it as bool."""
    m = check_tensor(name, mask)
    check_same_shape(name, m, ref_name, ref, dims)
    if m.dtype == torch.bool:
        return m
    if m.is_complex():
        raise ValueError(f"{name}: expected a bool or 0/1 tensor, got {m.dtype}")
    if not bool(((m == 0) | (m == 1)).all()):
        raise ValueError(f"{name}: expected only 0/1 values (or a bool tensor)")
    return m != 0


def check_response_mask(mask: object, ref_name: str, ref: Tensor) -> Tensor:
    """Validate the `[N, T]` response mask against `ref`, requiring at least one response token."""
    m = as_bool_mask("mask", mask, ref_name, ref)
    if not bool(m.any()):
        raise ValueError("mask: no response tokens (empty mask)")
    return m


def check_group_ids(group_ids: object, n: int, ref_name: str) -> Tensor:
    """Validate `group_ids`: an integer tensor `[N]`, `N` matching `ref_name`'s first dimension."""
    g = check_tensor("group_ids", group_ids)
    if g.dtype == torch.bool or g.is_floating_point() or g.is_complex():
        raise ValueError(f"group_ids: expected an integer tensor, got {g.dtype}")
    if g.dim() != 1 or g.shape[0] != n:
        raise ValueError(f"group_ids: expected shape [N] = ({n},) matching {ref_name}, got {tuple(g.shape)}")
    return g


def check_advantages(advantages: object, ref: Tensor) -> Tensor:
    """Validate advantages `[N]` or `[N, T]` against `[N, T]` log-probs `ref`."""
    a = check_float_tensor("advantages", advantages)
    n, t = ref.shape
    if a.shape not in (torch.Size([n]), torch.Size([n, t])):
        raise ValueError(
            f"advantages: expected shape [N] = ({n},) or [N, T] = ({n}, {t}) matching logprobs, "
            f"got {tuple(a.shape)}"
        )
    return a


def check_number(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> float:
    """Return `value` as float if it is a finite real number within the given bounds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    v = float(value)
    if low is not None and (v < low or (v == low and not low_inclusive)):
        op = ">=" if low_inclusive else ">"
        raise ValueError(f"{name}: expected a number {op} {low:g}, got {value!r}")
    if high is not None and (v > high or (v == high and not high_inclusive)):
        op = "<=" if high_inclusive else "<"
        raise ValueError(f"{name}: expected a number {op} {high:g}, got {value!r}")
    return v


def check_positive_int(name: str, value: object) -> int:
    """Return `value` if it is an `int` > 0 (bool rejected)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return value


def as_row_or_token_mask(name: str, x: object, ref: Tensor) -> Tensor:
    """Validate a bool (or 0/1) mask shaped `[N]` or `[N, T]` like `ref`; return it broadcastable to `[N, T]`.

    A `[N]` mask comes back as `[N, 1]`.
    """
    t = check_tensor(name, x)
    n, length = ref.shape
    if t.shape == torch.Size([n]):
        return as_bool_mask(name, t, "logprobs", t, "[N]")[:, None]
    if t.shape == torch.Size([n, length]):
        return as_bool_mask(name, t, "logprobs", ref)
    raise ValueError(
        f"{name}: expected shape [N] = ({n},) or [N, T] = ({n}, {length}) matching logprobs, "
        f"got {tuple(t.shape)}"
    )
