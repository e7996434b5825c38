"""Benchmark sets as `eval.extra_sets` (a path, or `{path, format}`) and in `scalerl eval --format`:
loaded in their published layouts, checked as a run checks its inputs, and reported per set with
mean@k and pass@k (closed forms on scripted completions scored by the real math verifier)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

import scalerl.cli
from scalerl.assembly.evaluate import EvalSource, eval_records
from scalerl.assembly.inputs import prompt_tasks
from scalerl.config import RunConfig, load_config
from scalerl.data import load_prompts
from scalerl.evaluation import Evaluator
from scalerl.inputs import InputError
from scalerl.pipeline import GroupScorer
from scalerl.rewards import RewardRouter
from scalerl.rollout import GenerationRequest, SamplingParams
from scalerl.rollout.protocol import Completion
from tests.data.test_benchmarks import AIME, GSM8K, MATH500

TEXTS = ["\\boxed{18}", "\\boxed{7}", "\\boxed{25}", "no answer",
         "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}"]


def _write(tmp_path: Path) -> dict[str, Path]:
    files = {"gsm8k": (GSM8K, {**GSM8K, "answer": "#### 7"}), "aime": (AIME,), "math": (MATH500,)}
    out = {}
    for name, rows in files.items():
        out[name] = tmp_path / f"{name}.jsonl"
        out[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_extra_sets_config_takes_a_format(tmp_path: Path) -> None:
    paths = _write(tmp_path)
    cfg = load_config(overrides=[f"eval.extra_sets.gsm8k.path={paths['gsm8k']}",
                                 "eval.extra_sets.gsm8k.format=gsm8k",
                                 f"eval.extra_sets.aime={{path: {paths['aime']}, format: aime}}"])
    sources = cfg.eval.extra_set_sources
    assert (sources["gsm8k"].format, sources["aime"].format) == ("gsm8k", "aime")
    assert prompt_tasks(cfg)["math"] == ["data.synthetic.task=math", "eval.extra_sets.gsm8k",
                                         "eval.extra_sets.aime"]
    # Read without its format, GSM8K's columns are not a prompt record: the run refuses it (exit 2).
    bad = load_config(overrides=[f"eval.extra_sets.gsm8k={paths['gsm8k']}"])
    with pytest.raises(InputError, match=r"(?s)eval\.extra_sets\.gsm8k: .*gsm8k\.jsonl:1: no 'prompt'"):
        prompt_tasks(bad)


def test_each_set_reports_mean_and_pass_at_k(tmp_path: Path) -> None:
    paths = _write(tmp_path)
    sets = {name: load_prompts(p, format=name).records for name, p in paths.items()}
    # Scripted samples (token id = index into TEXTS): gsm8k q1 right 2/3, q2 ("7") right 1/3;
    # aime right 0/3; math right 3/3.
    plan = {"gsm8k": [[0, 0, 3], [3, 1, 2]], "aime": [[3, 0, 1]], "math": [[4, 4, 4]]}

    def generate(requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for i, r in enumerate(requests):
            name = r.request_id.split("/")[1]
            for j, tok in enumerate(plan[name][i]):
                out.append(Completion(r.request_id, j, r.prompt_ids, [tok], [-0.5], [0], [True], "stop", 0))
        return out

    router = RewardRouter()
    scorer = GroupScorer(router, lambda ids: TEXTS[ids[0]], max_workers=1)
    try:
        ev = Evaluator(sets["gsm8k"], lambda r: [1], scorer, k=3, params=SamplingParams(max_new_tokens=4),
                       extra_sets={"aime": sets["aime"], "math": sets["math"]})
        plan["heldout"] = plan["gsm8k"]
        out = ev.run(generate)
    finally:
        scorer.close()
        router.close()
    assert out["val_pass_rate"] == pytest.approx((2 / 3 + 1 / 3) / 2) and out["val_pass_at_k"] == 1.0
    assert out["val_aime_pass_rate"] == 0.0 and out["val_aime_pass_at_k"] == 0.0
    assert out["val_math_pass_rate"] == 1.0 and out["val_math_pass_at_k"] == 1.0
    assert out["val_math_entropy"] == pytest.approx(0.5)


def test_eval_format_flag(tmp_path: Path) -> None:
    paths = _write(tmp_path)
    source = EvalSource("unused", None, RunConfig())
    records, what = eval_records(source, str(paths["gsm8k"]), None, "gsm8k")
    assert [r.answer for r in records] == ["18", "7"] and what.endswith("gsm8k.jsonl (gsm8k)")
    with pytest.raises(InputError, match="--format gsm8k: reads the file named by --data"):
        eval_records(source, None, None, "gsm8k")
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error: exit 2
        scalerl.cli.main(["eval", str(tmp_path), "--data", str(paths["gsm8k"]), "--format", "nope"])
    assert exit_.value.code == 2
