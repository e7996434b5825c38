"""Study variants: leave-one-out and grid ablations as override lists over a base config.

Pure functions: nothing is run or written. A `Variant` is a name (stable and file-system safe,
used as the run directory), the `key.sub=value` overrides that turn the base into it, and a
description. `apply_variant` resolves one against a base config and validates it.

Leave-one-out (ScaleRL, Khatri et al. 2025, arXiv 2510.13786, Sec. 4 and Fig. 7): starting from
the base, each design axis in turn is reverted to its counterpart in the paper's base algorithm
(Sec. 2; the `base` recipe). `LOO_AXES` lists the axes and what each reverts to.

Grid: the cartesian product of values for chosen keys (`--grid pipeline.k=1,4,8 ...`).

Coupled axes (ScaleRL Sec. 5, and the IsoCompute work): named presets that move several keys
together so the comparison is the one the paper makes (`COUPLED_AXES`): generations per prompt
at a fixed total batch (n x B constant), the batch size, the generation length (with the
length-control budgets scaled along), and data reuse (Tan et al. 2025: a fixed total of prompts
drawn from D_total / tau unique ones).
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from scalerl.config import ConfigError, RunConfig, build_config, override_layer, parse_override
from scalerl.inputs import InputError


@dataclass(frozen=True)
class Variant:
    """One run of a study: `overrides` applied on top of the base config."""

    name: str
    overrides: list[str] = field(default_factory=list)
    description: str = ""


@dataclass(frozen=True)
class LooAxis:
    """A design axis of the recipe and the settings of the paper's base algorithm on that axis."""

    name: str
    baseline: Mapping[str, Any]
    what: str


# The baseline values are those of the paper's base algorithm (Sec. 2, the `base` recipe), except
# length control: the paper's setup always interrupts over-long thinking, so the leave-one-out on
# that axis swaps interruptions for the length penalty they were compared against (App. A.10).
LOO_AXES: tuple[LooAxis, ...] = (
    LooAxis(
        "loss",
        {"algorithm.loss_type": "grpo", "algorithm.eps_low": 0.2, "algorithm.eps_high": 0.28},
        "loss type: DAPO-style clipped GRPO surrogate (eps 0.2 / 0.28) instead of CISPO",
    ),
    LooAxis("aggregation", {"algorithm.aggregation": "sample"}, "loss aggregation: sample average"),
    LooAxis("adv_norm", {"algorithm.adv_norm": "group"}, "advantage normalization: per group (prompt)"),
    LooAxis("fp32_lm_head", {"model.fp32_lm_head": False}, "precision: LM head in the model dtype"),
    LooAxis(
        "zero_variance_filter",
        {"algorithm.zero_variance_filter": False, "algorithm.dynamic_sampling": False},
        "batch definition: zero-variance groups stay in the batch",
    ),
    LooAxis(
        "no_positive_resampling",
        {"algorithm.no_positive_resampling": False},
        "curriculum: solved prompts keep being sampled",
    ),
    LooAxis(
        "off_policy",
        {"pipeline.off_policy": "ppo_offpolicy", "pipeline.k": 8},
        "off-policy algorithm: PPO-off-policy-8 instead of PipelineRL",
    ),
    LooAxis(
        "length_control",
        {"generation.length_control.kind": "overlong_penalty"},
        "length control: overlong length penalty instead of interruptions",
    ),
)

LOO_PREFIX = "loo-"
_MAX_NAME = 200  # below the usual 255-byte file-name limit, with room for a prefix
_SAFE = re.compile(r"[^A-Za-z0-9._+-]+")
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9._+/-]*")


# ---------------------------------------------------------------------------------------------
# Keys and values


def _key_error(key: str, message: str) -> InputError:
    return InputError(f"{key}: {message}")


def _subsection(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    annotation = model.model_fields[name].annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def check_key(key: str) -> tuple[str, ...]:
    """Split `key` into its path; `ValueError` naming it unless it is a setting of the tree.

    A setting is a leaf: a section (`pipeline`) is refused, as is anything below a leaf.
    """
    path = tuple(key.split("."))
    if not key or not all(path):
        raise _key_error(key or "<empty>", "empty key segment")
    model: type[BaseModel] | None = RunConfig
    for i, part in enumerate(path):
        here = ".".join(path[: i + 1])
        if model is None:
            raise _key_error(key, f"{'.'.join(path[:i])} is a setting, it has no sub-keys")
        if part not in model.model_fields:
            close = difflib.get_close_matches(part, list(model.model_fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _key_error(key, f"unknown key {here!r}{hint}")
        model = _subsection(model, part)
    if model is not None:
        raise _key_error(key, f"is a section, not a setting; its keys: {', '.join(model.model_fields)}")
    return path


def get_value(config: RunConfig, key: str) -> Any:
    """The value at `key` in `config` (as `model_dump` shows it)."""
    node: Any = config.model_dump()
    for part in check_key(key):
        node = node[part]
    return node


def _normal(value: Any) -> Any:
    """Tuples as lists, so values compare equal however they were written."""
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    return value


def _reads_back(text: str) -> Any:
    return _normal(parse_override(f"k={text}")[1])


def _same(a: Any, b: Any) -> bool:
    # `True == 1` in Python, but an override that turns a flag into a number is not the same value.
    return type(a) is type(b) and a == b


def format_value(value: Any) -> str:
    """Render `value` so that `parse_override("key=" + text)` reads it back unchanged.

    Plain words stay bare (`grpo`, `Qwen/Qwen3-8B`); other strings are quoted; numbers, booleans,
    null, lists and mappings are written in JSON, which YAML reads as flow syntax.
    """
    v = _normal(value)
    if isinstance(v, float) and math.isinf(v):
        text = ".inf" if v > 0 else "-.inf"
    elif isinstance(v, str) and _PLAIN.fullmatch(v):
        text = v
    elif isinstance(v, (str, bool, int, float, list, dict)) or v is None:
        text = json.dumps(v)
    else:
        raise ValueError(f"cannot write {value!r} ({type(value).__name__}) as an override value")
    if not _same(_reads_back(text), v) and isinstance(v, str) and text == v:
        text = json.dumps(v)  # a bare word YAML reads as something else: `true`, `null`, `1e-3`
    back = _reads_back(text)
    if not _same(back, v):
        raise ValueError(f"value {value!r} cannot be written as an override (it reads back as {back!r})")
    return text


def override(key: str, value: Any) -> str:
    """`key=value` with the value rendered by `format_value`."""
    check_key(key)
    return f"{key}={format_value(value)}"


def apply_variant(base: RunConfig, variant: Variant | Sequence[str]) -> RunConfig:
    """`base` with the variant's overrides applied, validated (`ConfigError` names the key)."""
    overrides = variant.overrides if isinstance(variant, Variant) else list(variant)
    return build_config([(base.model_dump(), {}), override_layer(overrides)])


# ---------------------------------------------------------------------------------------------
# Leave-one-out


def loo_axis_names() -> list[str]:
    return [axis.name for axis in LOO_AXES]


def loo_variants(base_config: RunConfig, axes: Iterable[str] | None = None) -> list[Variant]:
    """One variant per axis on which `base_config` differs from the paper's base algorithm.

    The variant sets that axis back to the baseline (`LOO_AXES`), touching only the keys whose
    value differs; an axis the base already shares with the baseline yields no variant. `axes`
    restricts the study to the named axes (in `LOO_AXES` order). The base run itself is not a
    variant: a study runs it alongside them.
    """
    wanted = None if axes is None else list(axes)
    if wanted is not None:
        known = loo_axis_names()
        unknown = [a for a in wanted if a not in known]
        if unknown:
            raise InputError(f"unknown leave-one-out axis {unknown[0]!r}; axes: {', '.join(known)}")
    variants = []
    for axis in LOO_AXES:
        if wanted is not None and axis.name not in wanted:
            continue
        changed = [
            (key, get_value(base_config, key), value)
            for key, value in axis.baseline.items()
            if _normal(get_value(base_config, key)) != _normal(value)
        ]
        if not changed:
            continue
        changes = "; ".join(f"{key}: {format_value(old)} -> {format_value(new)}" for key, old, new in changed)
        variants.append(
            Variant(
                name=LOO_PREFIX + axis.name,
                overrides=[override(key, new) for key, _, new in changed],
                description=f"{axis.what} ({changes})",
            )
        )
    return variants


# ---------------------------------------------------------------------------------------------
# Grid


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets, braces and quotes (`[1, 2],3` -> `[1, 2]`, `3`)."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def parse_grid_arg(text: str) -> tuple[str, list[Any]]:
    """`"pipeline.k=1,4,8"` -> `("pipeline.k", [1, 4, 8])`; values are read as YAML, like overrides.

    Commas inside brackets or quotes do not split: `generation.length_control.think_budget=[8, 16],[16, 32]`.
    """
    if "=" not in text:
        raise InputError(f"grid {text!r}: expected key.path=v1,v2,...")
    key, raw = text.split("=", 1)
    key = key.strip()
    check_key(key)
    items = [item.strip() for item in _split_top_level(raw)]
    if not raw.strip() or any(not item for item in items):
        raise _key_error(key, f"grid {text!r}: empty value in the list")
    try:
        values = [parse_override(f"{key}={item}")[1] for item in items]
    except ConfigError as err:
        raise _key_error(key, str(err)) from None
    return key, values


def parse_grid_args(texts: Iterable[str]) -> dict[str, list[Any]]:
    """Several `--grid` arguments into one grid; a key given twice is an error naming it."""
    grid: dict[str, list[Any]] = {}
    for text in texts:
        key, values = parse_grid_arg(text)
        if key in grid:
            raise _key_error(key, "given twice in the grid")
        grid[key] = values
    return grid


def _slug(value: Any) -> str:
    """A file-name-safe rendering of a value; a hash keeps lossy renderings distinct."""
    # The override text, not the raw value: the string "null" (quoted) and None (null) differ there.
    text = format_value(value)
    slug = _SAFE.sub("_", text).strip("_") or "empty"
    if slug != text:
        slug += "-h" + hashlib.sha1(text.encode()).hexdigest()[:6]
    return slug


def _labels(keys: Sequence[str]) -> dict[str, str]:
    """Each key's last segment, or its full path where two keys share the last segment."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (short if last.count(short) == 1 else k) for k, short in zip(keys, last, strict=True)}


def _one_line(err: ConfigError) -> str:
    """A config error's problems on one line (it lists them one per line under a heading)."""
    lines = [line.strip() for line in str(err).splitlines()]
    return "; ".join(lines[1:] if len(lines) > 1 else lines)


def _bounded(name: str) -> str:
    if len(name) <= _MAX_NAME:
        return name
    return name[: _MAX_NAME - 9] + "-h" + hashlib.sha1(name.encode()).hexdigest()[:7]


def grid_variants(base_config: RunConfig, grid: Mapping[str, Sequence[Any]]) -> list[Variant]:
    """The cartesian product of `grid` (keys in the given order; the last key varies fastest).

    Every key must be a setting of the config tree and every combination must validate against
    `base_config`; errors name the key (and the offending value). Names look like
    `k-4__loss_type-grpo`: each key's last segment (its full path if two keys share it), `-`,
    the value.
    """
    if not grid:
        raise InputError("grid: no key to vary")
    keys = list(grid)
    for key in keys:
        check_key(key)
        values = list(grid[key])
        if not values:
            raise _key_error(key, "no value to try")
        rendered = [json.dumps(_normal(v), sort_keys=True) for v in values]
        dupes = sorted({r for r in rendered if rendered.count(r) > 1})
        if dupes:
            raise _key_error(key, f"value {dupes[0]} given twice")
        for value in values:
            try:
                apply_variant(base_config, [override(key, value)])
            except ConfigError as err:
                raise _key_error(key, f"value {value!r} is not valid: {_one_line(err)}") from None
    labels = _labels(keys)
    variants = []
    for combo in itertools.product(*(list(grid[k]) for k in keys)):
        overrides = [override(k, v) for k, v in zip(keys, combo, strict=True)]
        try:
            apply_variant(base_config, overrides)
        except ConfigError as err:
            combo_text = ", ".join(overrides)
            raise InputError(f"grid combination {combo_text} is not valid: {_one_line(err)}") from None
        name = "__".join(f"{labels[k]}-{_slug(v)}" for k, v in zip(keys, combo, strict=True))
        variants.append(Variant(name=_bounded(name), overrides=overrides, description=", ".join(overrides)))
    return variants


# ---------------------------------------------------------------------------------------------
# Coupled axes


@dataclass(frozen=True)
class CoupledAxis:
    """A named study axis whose one value sets several keys (`apply`), with defaults from the base."""

    name: str
    what: str
    value_name: str
    defaults: Callable[[RunConfig], list[int]]  # the values studied unless given
    apply: Callable[[RunConfig, int], list[tuple[str, Any]]]  # ValueError naming a value it cannot run
    label: Callable[[RunConfig, int], str]  # the variant's name


def _scaled_values(base: int, factors: Sequence[float] = (0.5, 1.0, 2.0), low: int = 1) -> list[int]:
    values = sorted({round(base * f) for f in factors})
    return [v for v in values if v >= low]


def _quotient(what: str, total: int, value: int, total_name: str, factors: str) -> int:
    """``total // value``, or the input error naming the axis value that does not divide it."""
    if total % value:
        raise InputError(f"{what}: does not divide {total_name} = {total} ({factors})")
    return total // value


def _n_at_fixed_batch(base: RunConfig, n: int) -> list[tuple[str, Any]]:
    if n < 2:
        raise InputError(f"generations per prompt {n}: needs n >= 2 (one sample: no group variance)")
    g, p = base.generation.n, base.pipeline.prompts_per_step
    b = _quotient(f"generations per prompt {n}", g * p, n, "the total batch n x B",
                  f"generation.n={g} x pipeline.prompts_per_step={p}")
    return [("generation.n", n), ("pipeline.prompts_per_step", b)]


def _batch_size(base: RunConfig, b: int) -> list[tuple[str, Any]]:
    if b < 1:
        raise InputError(f"batch size {b}: needs at least one prompt per step")
    return [("pipeline.prompts_per_step", b)]


def _generation_length(base: RunConfig, length: int) -> list[tuple[str, Any]]:
    """`max_new_tokens`, with every length-control budget scaled by the same factor, so forced
    interruption (or the overlong penalty) sits at the same fraction of the budget."""
    g = base.generation
    lc = g.length_control
    if length < 1:
        raise InputError(f"generation length {length}: must be >= 1 token")
    f = length / g.max_new_tokens
    lo, hi = lc.think_budget
    think = [max(1, round(lo * f)), max(1, round(hi * f))]
    answer = max(1, round(lc.answer_budget * f))
    if lc.kind == "interruption" and think[1] + answer > length:
        raise InputError(f"generation length {length}: too short for the interruption budgets "
                         f"(think {think}, answer {answer})")
    return [("generation.max_new_tokens", length), ("generation.length_control.think_budget", think),
            ("generation.length_control.answer_budget", answer),
            ("generation.length_control.overlong_cache", max(1, round(lc.overlong_cache * f)))]


def total_prompts(base: RunConfig) -> int:
    """D_total of a run: the prompt slots of its batches, max_steps x prompts_per_step (dynamic
    sampling's refills draw more, and are counted as `refill_prompts` in the run's rows)."""
    return base.max_steps * base.pipeline.prompts_per_step


def _data_reuse(base: RunConfig, tau: int) -> list[tuple[str, Any]]:
    """Tan et al. 2025's data reuse: D_total fixed, D_unique = D_total / tau unique prompts."""
    if tau < 1:
        raise InputError(f"reuse factor {tau}: must be >= 1")
    p = base.pipeline.prompts_per_step
    unique = _quotient(f"reuse factor {tau}", total_prompts(base), tau, "the total prompts D_total",
                       f"max_steps={base.max_steps} x pipeline.prompts_per_step={p}")
    return [("data.max_train_prompts", unique)]


COUPLED_AXES: dict[str, CoupledAxis] = {
    axis.name: axis
    for axis in (
        CoupledAxis(
            "generations_per_prompt",
            "generations per prompt n at a fixed total batch n x B (ScaleRL Sec. 5: more samples of fewer "
            "prompts, or fewer samples of more)", "n",
            lambda base: [v for v in _scaled_values(base.generation.n, low=2)
                          if (base.generation.n * base.pipeline.prompts_per_step) % v == 0],
            _n_at_fixed_batch,
            lambda base, n: f"n{n}-B{base.generation.n * base.pipeline.prompts_per_step // n}",
        ),
        CoupledAxis(
            "batch_size",
            "prompts per optimizer step B, generations per prompt fixed (ScaleRL Sec. 5: larger batches "
            "reach a higher asymptote, later)", "B",
            lambda base: _scaled_values(base.pipeline.prompts_per_step),
            _batch_size,
            lambda base, b: f"B{b}",
        ),
        CoupledAxis(
            "generation_length",
            "response budget max_new_tokens, length-control budgets scaled along (ScaleRL Sec. 5: "
            "longer generation, lower efficiency early, higher asymptote)", "max_new_tokens",
            lambda base: _scaled_values(base.generation.max_new_tokens),
            _generation_length,
            lambda base, n: f"len{n}",
        ),
        CoupledAxis(
            "data_reuse",
            "data reuse tau at a fixed total of prompts D_total = max_steps x prompts_per_step: each run "
            "trains on D_unique = D_total / tau unique prompts (data.max_train_prompts; Tan et al. 2025: "
            "D_total = tau x D_unique, performance insensitive to tau up to ~25)", "tau",
            lambda base: [t for t in (1, 2, 4, 8) if total_prompts(base) % t == 0],
            _data_reuse,
            lambda base, tau: f"tau{tau}-U{total_prompts(base) // tau}",
        ),
    )
}


def coupled_variants(base_config: RunConfig, name: str, values: Sequence[int] | None = None) -> list[Variant]:
    """One variant per value of the coupled axis `name` (its defaults from the base unless given).

    The variant whose value is the base's own has no overrides that change anything; it is still a
    variant (the study's reference point). Errors name the axis and the value.
    """
    axis = COUPLED_AXES.get(name)
    if axis is None:
        raise InputError(f"--coupled: unknown axis {name!r}; axes: {', '.join(COUPLED_AXES)}")
    chosen = list(values) if values is not None else axis.defaults(base_config)
    if len(chosen) < 2:
        raise InputError(f"--coupled {name}: needs at least two values to compare, got {chosen}")
    if len(set(chosen)) != len(chosen):
        raise InputError(f"--coupled {name}: a value is given twice in {chosen}")
    variants = []
    for value in chosen:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"--coupled {name}: values are integers ({axis.value_name}), got {value!r}")
        try:
            pairs = axis.apply(base_config, value)
        except ValueError as err:
            raise InputError(f"--coupled {name}: {err}") from None
        overrides = [override(k, v) for k, v in pairs]
        try:
            apply_variant(base_config, overrides)
        except ConfigError as err:
            raise InputError(f"--coupled {name}: value {value} is not valid: {_one_line(err)}") from None
        variants.append(Variant(name=axis.label(base_config, value), overrides=overrides,
                                description=f"{axis.value_name}={value}: " + ", ".join(overrides)))
    return variants
