"""docs/config.md, generated from `RunConfig`: every key with its type, default and meaning.

The meaning is the field's pydantic `description`, else the comment lines written just above the
field in `scalerl/config.py`, else the section's docstring names it. The page is generated so it
cannot drift from the schema: `tests/test_docs_config.py` fails when the committed page differs from
what this module prints. Regenerate with

    python -m scalerl.cli.config_reference > docs/config.md
"""

from __future__ import annotations

import inspect
import io
import sys
import tokenize
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from scalerl.config import RunConfig

HEADER = """# Configuration reference

Every key of a run's configuration (`scalerl train -c FILE.yaml key.sub=value ...`), generated from
`scalerl/config.py` by `python -m scalerl.cli.config_reference > docs/config.md`;
`tests/test_docs_config.py` fails when this page is stale. Each section forbids unknown keys: a typo
is an error naming the key path (and file:line for YAML). Cross-key rules (which combinations are
refused) are checked at load time and named in the error.
"""

#: Meanings of keys whose field has neither a description nor a comment in scalerl/config.py.
#: tests/test_docs_state.py checks every key here exists and every key of the page has a meaning.
MEANINGS: dict[str, str] = {
    "data.split": "the split of a dataset or folder holding several (train, test, ...); refused unchosen",
    "recipe": "the recipe the run was built from (set by --recipe; a label only inside a YAML file)",
    "max_time_s": "also stop after this many seconds of wall clock; null = no limit",
    "model.tokenizer": "a tokenizer other than the model's own (path or Hub id)",
    "data.system_prompt": "a system prompt for every chat prompt",
    "algorithm.dual_clip_c": ("dual clip (Ye et al. 2020): bound the loss of negative-advantage tokens"
                              " at c; null = off"),
    "algorithm.offpolicy_mask_delta": ("DeepSeek-V3.2's off-policy sequence mask: drop negative-advantage"
        " sequences whose KL(old || theta) exceeds delta; null = off"),
    "optim.grad_clip": "clip the gradient's global norm; null = off",
    "distributed.address": ("the Ray cluster to join; null = RAY_ADDRESS, a `ray start` head here,"
                            " else a new local one"),
    "agentic.environment": ("the multi-turn environment (tools, skyrl:..., agent:..., verifiers:...,"
                            " pkg.mod:factory); null = single-turn"),
    "agentic.corpus_path": "documents for the search tool",
    "algorithm.critic.model": "the value model (path or Hub id); null = a copy of the policy's base",
    "algorithm.critic.value_clip": "PPO's value clipping range; null = off",
    "algorithm.distill.teacher": "the teacher model for on-policy distillation; null = off",
    "rewards.sandbox.python": "the interpreter that runs programs; null = this one",
    "rewards.sandbox.unshare": "the unshare binary that makes the namespaces; null = the one on PATH",
    "name": "the run's label in plots, tables and the W&B run",
    "seed": ("the run's seed: offsets the rollout, prompt-order and evaluation streams"
        " (model.init_seed keeps the base model)"),
    "output_dir": ("the run folder (metrics.jsonl, checkpoints, config.yaml); never overwritten"
        " unless it is scalerl's own"),
    "max_steps": "optimizer steps to train",
    "model.dtype": "the weights' dtype in trainer and engine; the LM head follows model.fp32_lm_head",
    "model.gradient_checkpointing": "recompute activations in backward to save memory",
    "data.field_map": "column renames into the prompt record (e.g. {question: prompt})",
    "data.default_task": "the verifier task of rows that name none",
    "data.heldout_size": ("prompts held out of the training file for the curve (mean@k every eval.every"
        " steps)"),
    "data.heldout_seed": "seed of the held-out split",
    "data.shuffle_seed": "seed of the training prompts' order",
    "data.think_system_prompt": "use the built-in `<think>` system prompt (data.system_prompt wins if set)",
        "data.max_prompt_tokens": ("longest prompt in tokens; longer rows are"
        " an error naming file:line, or skipped"
        " with on_bad_row=skip"),
    "data.on_bad_row": ("a malformed or overlong row: stop with its file:line (error) or skip it and"
        " count it (skip)"),
    "generation.engine": "the rollout engine: the embedded one (any HF causal LM) or vLLM",
    "generation.temperature": "sampling temperature of training rollouts",
    "generation.top_p": "nucleus sampling; < 1 truncates the support (see algorithm.keep_sampling_mask)",
    "generation.top_k": "top-k sampling; 0 = off",
    "generation.max_new_tokens": "response length limit in tokens",
    "generation.seed": "seed of the rollout stream (offset by the run's seed)",
    "algorithm.loss_type": ("the policy objective: CISPO (ScaleRL), GRPO/PPO clip (DAPO with eps_high),"
        " GSPO, Kimi k1.5 mirror descent"),
    "algorithm.aggregation": ("how token losses are averaged: per prompt, per sample, over all tokens, or a"
        " constant divisor (Dr. GRPO)"),
    "algorithm.adv_norm": ("advantage scaling: by the batch's std (ScaleRL), the group's (GRPO) or none"
        " (Dr. GRPO)"),
    "algorithm.eps_low": "lower clip of the importance ratio, 1 - eps_low",
    "algorithm.eps_high": "upper clip of the importance ratio, 1 + eps_high (clip-higher when > eps_low)",
        "algorithm.recompute_old_logprobs": ("pi_old from the trainer's own"
        " pass before the update instead of the engine's"
        " log-probs (TIS needs it)"),
    "algorithm.kl_coef": "weight of the KL term to the reference policy; 0 = none",
    "algorithm.kl_coef_by_task": ("per task, the KL weight of that task's samples in place of kl_coef"
        " (KL loss only, not kl_in_reward)"),
    "algorithm.kl_estimator": "KL estimator: k1, k2, k3, or DeepSeek-V3.2's unbiased k3",
    "algorithm.kl_in_reward": "subtract the KL from the reward instead of adding a loss term",
    "algorithm.entropy_coef": "weight of the entropy bonus (positive raises entropy)",
    "algorithm.zero_variance_filter": "drop groups whose rewards are all equal (no gradient), counted",
    "algorithm.no_positive_resampling": ("retire a prompt once its pass rate reaches retire_threshold"
        " (ScaleRL)"),
    "algorithm.retire_threshold": "pass rate at which no_positive_resampling retires a prompt",
    "algorithm.dynamic_sampling": ("DAPO: refill the batch with new groups for those dropped as"
        " zero-variance"),
        "algorithm.keep_sampling_mask": ("DeepSeek-V3.2: renormalise pi_old"
        " and pi_theta over the sampler's recorded"
        " top-k/top-p set"),
    "optim.lr": "AdamW learning rate (the default suits the tiny model; ~1e-6 for 0.5B-7B models)",
    "optim.betas": "AdamW betas",
    "optim.eps": "AdamW epsilon (ScaleRL: 1e-15)",
    "optim.weight_decay": "AdamW weight decay",
    "optim.warmup_steps": "linear learning-rate warm-up, then constant",
    "optim.max_consecutive_bad_steps": "stop after this many non-finite (skipped) steps in a row",
    "pipeline.off_policy": ("sync, PPO-off-policy-k (k updates per generation round) or PipelineRL-k"
        " (in-flight updates, max lag k)"),
    "eval.temperature": "sampling temperature of held-out evaluations",
    "eval.at_start": "evaluate before the first step (the curve's R0 point)",
    "checkpoint.keep": "checkpoints kept (older ones rotated out)",
    "logging.tensorboard": "write TensorBoard scalars under the run folder",
    "logging.wandb": "log to Weights & Biases",
    "logging.wandb_project": "the W&B project",
    "logging.progress": "the tqdm progress bar and per-evaluation lines",
    "logging.samples_per_step": "samples written per logged step (logging.samples_every)",
    "rewards.correct_reward": "reward of a correct answer",
    "rewards.incorrect_reward": "reward of a wrong answer",
    "rewards.failure_reward": "reward when the verifier fails (error, timeout, NaN), counted",
    "rewards.partial_credit": "code: the fraction of tests passed instead of all-or-nothing",
    "rewards.verifier_timeout_s": "bound on one verifier call",
    "rewards.math_timeout_s": "bound on one math-verify check (in a killable worker)",
    "rewards.math_workers": "math-verify worker processes",
    "rewards.code_timeout_s": "default wall-clock limit of one code test run",
    "distributed.backend": "one process (local) or Ray engine actors and FSDP2 ranks (ray)",
    "distributed.num_engines": "engine actors",
    "distributed.engine_num_cpus": "Ray CPUs per engine actor",
    "distributed.engine_num_gpus": "GPUs per engine actor",
    "distributed.weight_sync": ("how weights reach the engines: Ray's object store or a collective"
        " (gloo/NCCL)"),
    "distributed.startup_timeout_s": "bound on an actor's start-up (loads torch and a model)",
    "distributed.engine_restart_backoff_s": ("wait before restarting a dead engine, doubling per failed"
        " attempt"),
    "agentic.tools": "the tools of the built-in environment: calculator, python, search or pkg.mod:Factory",
    "agentic.max_turns": "model turns per trajectory",
    "agentic.context_strategy": ("what happens when the context passes context_budget (DeepSeek-V3.2's"
        " strategies)"),
    "agentic.context_fraction": ("trigger context_strategy at this share of the model's context window"
        " (DeepSeek-V3.2: 0.8); with context_budget, the smaller"),
    "agentic.thinking_retention": ("which earlier reasoning stays in the context (DeepSeek-V3.2's rule, or"
        " all)"),
    "agentic.max_observation_tokens": "tool output kept per call, in tokens",
    "agentic.tool_timeout_s": "bound on one tool call",
    "agentic.env_workers": "threads running environment steps",
    "agentic.agent_timeout_s": "bound on one agent program (agent: environments)",
    "forecast.enabled": "refit the sigmoid after each evaluation while training (forecast_* on eval rows)",
    "model.tiny.hidden_size": "the tiny default's width",
    "model.tiny.num_layers": "the tiny default's layers",
    "model.tiny.num_heads": "attention heads",
    "model.tiny.num_kv_heads": "key/value heads (grouped-query attention)",
    "model.tiny.intermediate_size": "MLP width",
    "model.tiny.max_position_embeddings": "longest sequence",
    "model.tiny.num_experts_per_tok": "routed experts per token (MoE)",
    "model.tiny.moe_intermediate_size": "width of each routed expert",
    "model.tiny.shared_expert_intermediate_size": "width of the shared expert",
    "model.tiny.norm_topk_prob": "renormalise the selected experts' router weights",
    "model.lora.dropout": "dropout on the adapter's input in training passes",
    "model.lora.target_modules": "the linear layers that get adapters",
    "data.reasoning_gym.size": "prompts drawn from the generators",
    "data.reasoning_gym.seed": "seed of the generators",
    "data.reasoning_gym.config": "options of the one dataset data.source names",
    "data.reasoning_gym.datasets": "the weighted mix when data.source is reasoning_gym",
    "data.synthetic.task": "the built-in task: addition (math), code, their mix, or the tool-use tasks",
    "data.synthetic.num_prompts": "prompts generated",
    "data.synthetic.difficulty": "range of difficulty levels drawn",
    "data.synthetic.seed": "seed of the generated prompts",
        "generation.length_control.kind": ("over-long responses: forced"
        " interruption (ScaleRL), DAPO's overlong penalty,"
        " Kimi's length reward, or none"),
        "generation.length_control.think_budget": ("thinking tokens after"
        " which the interruption phrase is forced (drawn in this"
        " range)"),
    "generation.length_control.answer_budget": "tokens left for the answer after an interruption",
    "generation.length_control.phrase": "the forced end-of-thinking text",
    "generation.length_control.kimi_coef": "weight of Kimi k1.5's length reward",
    "generation.length_control.kimi_ramp_steps": "steps over which kimi_coef ramps up after the warm-up",
    "algorithm.critic.gamma": "discount of GAE",
    "algorithm.critic.lr_scale": "the critic's learning rate as a multiple of optim.lr",
    "algorithm.tis.enabled": ("truncated importance sampling between the engine's and the trainer's"
        " log-probs"),
    "algorithm.tis.cap": "TIS truncation of the ratio",
    "algorithm.tis.level": "TIS per token or per sequence",
    "algorithm.curriculum.order": "epoch shuffles, or easiest prompts first (Kimi k1.5)",
    "algorithm.curriculum.priority": "uniform draws, or weighted by failure rate (Kimi k1.5)",
    "algorithm.curriculum.difficulty_key": "the record's metadata key holding its difficulty",
    "algorithm.curriculum.ramp_prompts": "draws after which every prompt is open (easy_to_hard)",
    "algorithm.curriculum.start_fraction": "share of the easiest prompts open at the start (easy_to_hard)",
    "algorithm.distill.coef": "weight of the teacher's reverse-KL signal",
    "algorithm.distill.reward_weight": "weight of the outcome reward beside it (0: pure distillation)",
    "rewards.sandbox.file_size_mb": "largest file a program may write",
    "rewards.sandbox.open_files": "open files per program",
    "rewards.sandbox.scratch_inodes": "files in the private /tmp",
        "rewards.sandbox.isolation": ("namespace mode; auto picks the"
        " strongest that works and refuses to run without"
        " one"),
    "rewards.sandbox.tree_memory_mb": "memory of a program's whole process tree (per-run cgroup)",
    "rewards.sandbox.cgroup": "use a per-run cgroup for tree limits: auto, v1, v2 or off",
    "rewards.sandbox.uid_base": "first of the unprivileged uids programs run as (root only)",
}


def _field_comments(cls: type[BaseModel]) -> dict[str, str]:
    """Comment lines directly above each `name: type = ...` line of the class body."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    pending: list[str] = []
    depth_line = None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            # only comments at field indentation (4 spaces) belong to the next field
            if tok.start[1] == 4:
                pending.append(tok.string.lstrip("#").strip())
            continue
        if tok.type == tokenize.NAME and tok.start[1] == 4 and tok.start[0] != depth_line:
            depth_line = tok.start[0]
            line = source.splitlines()[tok.start[0] - 1].strip()
            if ":" in line and not line.startswith(("def ", "class ", "@", "return", "if ")):
                name = line.split(":", 1)[0].strip()
                if name.isidentifier() and pending:
                    out[name] = " ".join(pending)
            pending = []
    return out


def _type_name(annotation: Any) -> str:
    text = repr(annotation) if not isinstance(annotation, type) else annotation.__name__
    text = text.replace("typing.", "").replace("NoneType", "None")
    return text


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _default(field: Any) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(cls: type[BaseModel], prefix: str, sections: list[tuple[str, type[BaseModel]]]) -> list[str]:
    comments = _field_comments(cls)
    rows = []
    hints = typing.get_type_hints(cls)
    for name, field in cls.model_fields.items():
        annotation = hints.get(name, field.annotation)
        path = f"{prefix}{name}"
        if _is_section(annotation):
            sections.append((path, annotation))
            rows.append(f"| `{path}` | section | | see [{path}](#{path.replace('.', '')}) |")
            continue
        meaning = field.description or comments.get(name, "") or MEANINGS.get(path, "")
        rows.append(f"| `{path}` | `{_cell(_type_name(annotation))}` | `{_cell(_default(field))}` | "
                    f"{_cell(meaning)} |")
    return rows


def render() -> str:
    out = [HEADER]
    todo: list[tuple[str, type[BaseModel]]] = [("", RunConfig)]
    while todo:
        path, cls = todo.pop(0)
        found: list[tuple[str, type[BaseModel]]] = []
        title = path or "top level"
        out.append(f"\n## {title}\n")
        doc = inspect.getdoc(cls)
        if doc and cls is not RunConfig and doc != inspect.getdoc(BaseModel):
            out.append(" ".join(doc.split()) + "\n")
        out.append("| key | type | default | meaning |\n| --- | --- | --- | --- |")
        out.extend(_rows(cls, f"{path}." if path else "", found))
        todo.extend(found)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args and args[0] == "--check":
        page = Path(args[1] if len(args) > 1 else "docs/config.md")
        if not page.is_file() or page.read_text() != text:
            print(f"{page} is stale: regenerate with python -m scalerl.cli.config_reference > {page}",
                  file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
