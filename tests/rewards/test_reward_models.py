"""Reward models (`rewards.reward_models.<task>`): a classifier and an LLM judge, both tiny Qwen2
models built from a config and trained here in seconds (nothing downloaded). The classifier learns
to prefer digit answers to letter answers; the judge to say "yes" to digits and "no" to letters."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

from scalerl.config import ConfigError, RewardConfig, RunConfig, build_config
from scalerl.data.loaders import load_prompts
from scalerl.data.records import PromptRecord
from scalerl.data.rejects import DataError
from scalerl.models.tiny import build_tiny_tokenizer
from scalerl.rewards.groups import GroupScorer
from scalerl.rewards.registry import gold_free, gold_free_tasks
from scalerl.rewards.reward_model import group_zscores, parse_verdict, render_template, sigmoid_score
from scalerl.rewards.router import RewardRouter
from scalerl.rollout.protocol import Completion

QUESTION = "Say some digits"
JUDGE_TEMPLATE = "Q: {prompt}\nA: {response}\nCorrect?"


def _config(tok, **kw) -> Qwen2Config:
    return Qwen2Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, intermediate_size=64, max_position_embeddings=256,
                       pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                       tie_word_embeddings=True, **kw)


def answer(good: bool, rng: random.Random) -> str:
    chars = "0123456789" if good else "abcdefghij"
    return "".join(rng.choice(chars) for _ in range(rng.randint(4, 12)))


def train_classifier(path: Path, steps: int = 40) -> Path:
    """One logit, trained (BCE) to score digit answers high and letter answers low."""
    torch.manual_seed(0)
    rng = random.Random(0)
    tok = build_tiny_tokenizer()
    tok.padding_side = "right"
    model = Qwen2ForSequenceClassification(_config(tok, num_labels=1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        labels = [i % 2 for i in range(32)]
        texts = [tok.apply_chat_template([{"role": "user", "content": QUESTION},
                                          {"role": "assistant", "content": answer(bool(y), rng)}],
                                         tokenize=False) for y in labels]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(**enc).logits.squeeze(-1), torch.tensor(labels, dtype=torch.float))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def train_judge(path: Path, steps: int = 80) -> Path:
    """A causal LM that answers JUDGE_TEMPLATE with "yes" for digit answers, "no" for letters."""
    torch.manual_seed(0)
    rng = random.Random(1)
    tok = build_tiny_tokenizer()
    tok.padding_side = "right"
    model = Qwen2ForCausalLM(_config(tok))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        labels = [i % 2 for i in range(16)]
        prompts = [tok.apply_chat_template(
            [{"role": "user", "content": render_template(JUDGE_TEMPLATE, QUESTION, answer(bool(y), rng))}],
            tokenize=False, add_generation_prompt=True) for y in labels]
        full = [p + ("yes" if y else "no") + tok.eos_token for p, y in zip(prompts, labels, strict=True)]
        enc = tok(full, return_tensors="pt", padding=True, add_special_tokens=False)
        target = enc["input_ids"].clone()
        target[enc["attention_mask"] == 0] = -100
        for i, p in enumerate(prompts):
            target[i, : len(tok(p, add_special_tokens=False)["input_ids"])] = -100
        loss = model(**enc, labels=target).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_classifier(tmp_path_factory.mktemp("rm") / "classifier")


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_judge(tmp_path_factory.mktemp("rm") / "judge")


def record(task: str = "chat", i: int = 0) -> PromptRecord:
    return PromptRecord(id=f"p{i}", task=task, prompt=QUESTION)


def router_for(rm: dict, **rewards) -> RewardRouter:
    router = RewardRouter({"reward_models": {"chat": rm}, **rewards})
    router.check_tasks({"chat"})  # loads the model, as a run does before training
    return router


# -- pure functions -------------------------------------------------------------------------------

def test_sigmoid_and_group_zscores_closed_forms() -> None:
    assert sigmoid_score(0.0) == 0.5
    assert sigmoid_score(2.0, temperature=2.0) == pytest.approx(1 / (1 + math.e ** -1))
    assert sigmoid_score(-800.0) == 0.0 and sigmoid_score(800.0) == 1.0  # no overflow
    z = group_zscores([1.0, 2.0, 3.0])
    std = math.sqrt(2 / 3)
    assert z == pytest.approx([-1 / std, 0.0, 1 / std], rel=1e-5)
    assert group_zscores([4.0, 4.0]) == [0.0, 0.0] and group_zscores([7.0]) == [0.0]


def test_parse_verdict_yes_no_scores_and_malformed() -> None:
    assert parse_verdict("Yes, it is right", "yes_no") == (1.0, 1.0)
    assert parse_verdict("no.", "yes_no") == (0.0, 0.0)
    assert parse_verdict("nonsense yesterday", "yes_no") is None  # words containing yes/no do not count
    assert parse_verdict("7/10", "score") == (0.7, 7.0)
    assert parse_verdict("Score: 2.5", "score", score_max=5) == (0.5, 2.5)
    assert parse_verdict("12", "score") is None  # over score_max: malformed, not clipped
    assert parse_verdict("no number", "score") is None
    assert parse_verdict("VERDICT=PASS", "yes_no", r"VERDICT=(\w+)") is None  # not yes/no
    assert parse_verdict("VERDICT=yes", "yes_no", r"VERDICT=(\w+)") == (1.0, 1.0)


def test_render_template_leaves_other_braces() -> None:
    out = render_template("{prompt} | {response} | {\"json\": 1}", "P {response}", "\\boxed{3}")
    assert out == "P {response} | \\boxed{3} | {\"json\": 1}"


def test_config_rules_name_the_keys() -> None:
    def build(rewards: dict) -> RunConfig:
        return build_config([({"rewards": rewards}, {})])

    with pytest.raises(ConfigError, match=r"rewards\.reward_models\.t\.template"):
        build({"reward_models": {"t": {"path": "x", "kind": "judge"}}})
    with pytest.raises(ConfigError, match=r"\{response\}"):
        build({"reward_models": {"t": {"path": "x", "kind": "judge", "template": "{prompt}"}}})
    with pytest.raises(ConfigError, match="both a verifier and a reward model"):
        build({"verifiers": {"t": "a:b"}, "reward_models": {"t": {"path": "x", "kind": "classifier"}}})


def test_a_missing_model_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    router = RewardRouter({"reward_models": {"chat": {"path": str(tmp_path / "nope"), "kind": "classifier"}}})
    assert "chat" in router.tasks
    with pytest.raises(ConfigError, match=r"rewards\.reward_models\.chat\.path"):
        router.check_tasks({"chat"})


# -- classifier -----------------------------------------------------------------------------------

def test_classifier_batched_equals_one_by_one_and_prefers_digits(classifier: Path) -> None:
    rng = random.Random(5)
    texts = [answer(i % 2 == 0, rng) for i in range(10)]
    batched = router_for({"path": str(classifier), "kind": "classifier", "batch_size": 16})
    single = router_for({"path": str(classifier), "kind": "classifier", "batch_size": 1})
    a = batched.score_group(record(), texts)
    b = [single.score(record(), t) for t in texts]
    assert [o.reward for o in a] == pytest.approx([o.reward for o in b], abs=1e-5)
    assert all(0.0 <= o.reward <= 1.0 and o.status == "ok" for o in a)
    assert [o.correct for o in a] == [i % 2 == 0 for i in range(10)]  # the classifier it was trained to be
    stats = batched.stats()
    assert stats["chat"]["total"] == 10 and stats["chat"]["correct"] == 5
    assert stats["_reward_models"]["chat"]["calls"] == 1 and stats["_reward_models"]["chat"]["samples"] == 10


def test_group_normalisation_rewards_the_zscore_and_counts_flops(classifier: Path) -> None:
    charged: list[tuple[int, int]] = []
    router = router_for({"path": str(classifier), "kind": "classifier", "normalize": "group"},
                        correct_reward=5.0, incorrect_reward=-5.0)
    router.attach_compute(lambda tokens, n: charged.append((tokens, n)))
    out = router.score_group(record(), ["12345", "abcde", "67890", "fghij"])
    rewards = [o.reward for o in out]
    assert sum(rewards) == pytest.approx(0.0, abs=1e-4)  # z-scores, not on the +-5 scale
    assert sum(r * r for r in rewards) / 4 == pytest.approx(1.0, abs=1e-3)
    assert rewards[0] > 0 > rewards[1]
    rm = router.reward_models["chat"]
    assert sum(t for t, _ in charged) == rm.stats()["tokens"] > 0
    assert charged[0][1] == rm.n_params > 0


def test_group_scorer_sends_a_whole_group_to_the_model(classifier: Path) -> None:
    router = router_for({"path": str(classifier), "kind": "classifier"})
    tok = build_tiny_tokenizer()
    texts = ["1234", "abcd", "5678"]
    completions = [Completion(request_id="r", sample_index=i, prompt_ids=[1], token_ids=tok.encode(t),
                              logprobs=[0.0] * len(t), versions=[0] * len(t), loss_mask=[True] * len(t),
                              finish_reason="stop", start_version=0) for i, t in enumerate(texts)]
    scorer = GroupScorer(router, lambda ids: tok.decode(ids), max_workers=2)
    try:
        [batch] = scorer.score_all([("k", record(), completions)])
    finally:
        scorer.close()
    assert batch.correct == [True, False, True] and batch.failures == 0
    assert router.reward_models["chat"].stats()["calls"] == 1  # one call for the group, not three


# -- judge ----------------------------------------------------------------------------------------

def test_judge_verdicts_batched_and_one_by_one(judge: Path) -> None:
    rng = random.Random(7)
    texts = [answer(i % 3 != 0, rng) for i in range(6)]
    rm = {"path": str(judge), "kind": "judge", "template": JUDGE_TEMPLATE, "max_new_tokens": 4}
    charged: list[int] = []
    router = router_for(rm)
    router.attach_compute(lambda tokens, n: charged.append(tokens))
    out = router.score_group(record(), texts)
    assert [o.status for o in out] == ["ok"] * 6
    assert [o.correct for o in out] == [i % 3 != 0 for i in range(6)]
    assert [o.reward for o in out] == [1.0 if i % 3 else 0.0 for i in range(6)]
    one = router_for({**rm, "batch_size": 1})
    assert [one.score(record(), t).correct for t in texts] == [o.correct for o in out]
    # FLOPs: every prompt token and every generated token up to eos ("yes"/"no" then eos).
    stats = router.reward_models["chat"].stats()
    assert sum(charged) == stats["tokens"] and stats["malformed"] == 0


def test_malformed_verdicts_are_counted_failures_never_zero(judge: Path, tmp_path: Path) -> None:
    template = tmp_path / "judge.txt"
    template.write_text(JUDGE_TEMPLATE)
    # The judge says yes/no; asked for a number, every verdict is malformed.
    router = router_for({"path": str(judge), "kind": "judge", "template_path": str(template),
                         "verdict": "score", "max_new_tokens": 4}, failure_reward=-9.0)
    out = router.score_group(record(), ["123", "abc"])
    assert [o.status for o in out] == ["error", "error"] and all(o.reward == -9.0 for o in out)
    assert "malformed verdict" in out[0].detail
    assert router.stats()["chat"]["error"] == 2 and router.reward_models["chat"].stats()["malformed"] == 2
    tok = build_tiny_tokenizer()
    c = Completion(request_id="r", sample_index=0, prompt_ids=[1], token_ids=tok.encode("12"),
                   logprobs=[0.0, 0.0], versions=[0, 0], loss_mask=[True, True], finish_reason="stop",
                   start_version=0)
    scorer = GroupScorer(router, lambda ids: tok.decode(ids), max_workers=0, failure_reward=-9.0)
    [batch] = scorer.score_all([("k", record(), [c])])
    assert batch.failures == 1 and scorer.failures == 1  # the generator's verifier_failures


def test_the_embedded_engine_judges_token_for_token_as_hf_generate(judge: Path) -> None:
    # Both decode greedily in float32 from the same token ids: the same verdict texts, the same
    # tokens charged (prompt + generated up to eos), truncation counted the same way.
    rng = random.Random(11)
    texts = [answer(i % 2 == 0, rng) for i in range(6)] + ["x" * 300]  # the last one is truncated
    base = {"path": str(judge), "kind": "judge", "template": JUDGE_TEMPLATE, "max_new_tokens": 4,
            "max_length": 200}
    hf = router_for(base).reward_models["chat"]
    embedded = router_for({**base, "engine": "embedded", "batch_size": 3}).reward_models["chat"]
    prompts = [hf.judge_prompt(record(), t) for t in texts]
    assert embedded.judge_texts(prompts) == hf.judge_texts(prompts)
    a, b = hf.stats(), embedded.stats()
    assert a["truncated"] == b["truncated"] == 1 and a["tokens"] == b["tokens"] > 7 * 4
    assert [o.score for o in embedded.score_group(record(), texts[:6])] == [1.0, 0.0] * 3
    embedded.close()


def test_the_judge_engine_key_is_checked() -> None:
    def build(rm: dict) -> RunConfig:
        return build_config([({"rewards": {"reward_models": {"t": {"path": "x", **rm}}}}, {})])

    with pytest.raises(ConfigError, match=r"rewards\.reward_models\.t\.engine"):
        build({"kind": "classifier", "engine": "vllm"})
    with pytest.raises(ConfigError, match=r"rewards\.reward_models\.t\.engine"):
        build({"kind": "judge", "template": "{prompt}{response}", "engine": "sglang"})
    judge = {"kind": "judge", "template": "{prompt}{response}", "engine": "vllm"}
    assert build(judge).rewards.reward_models["t"].engine == "vllm"
    with pytest.raises(ConfigError, match=r"rewards\.reward_models\.t\.engine: a vLLM judge beside"):
        build_config([({"generation": {"engine": "vllm"},
                        "rewards": {"reward_models": {"t": {"path": "x", **judge}}}}, {})])


def test_a_vllm_judge_without_vllm_is_a_config_error_naming_the_key(judge: Path) -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed here: tests/with_vllm/test_vllm_judge.py runs the vLLM judge")
    router = RewardRouter({"reward_models": {"chat": {"path": str(judge), "kind": "judge", "engine": "vllm",
                                                      "template": JUDGE_TEMPLATE, "max_length": 200}}})
    with pytest.raises(ConfigError, match=r"rewards\.reward_models\.chat\.engine: vllm cannot serve"):
        router.check_tasks({"chat"})


# -- records without gold -------------------------------------------------------------------------

def test_rows_of_a_reward_model_task_need_no_answer(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    rows = [{"id": "a", "task": "chat", "prompt": "hi"},
            {"id": "b", "task": "math", "prompt": "1+1", "answer": "2"},
            {"id": "c", "task": "fmt", "prompt": "x"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match="missing answer"):
        load_prompts(path)  # today's rule, without a reward model
    cfg = RewardConfig.model_validate({"reward_models": {"chat": {"path": "m", "kind": "classifier"}},
                                       "verifiers": {"fmt": f"{__name__}:format_only"}})
    free = gold_free_tasks(cfg)
    assert free == {"chat", "fmt"}
    loaded = load_prompts(path, gold_free_tasks=free)
    assert [r.answer for r in loaded.records] == [None, "2", None]
    math_row = tmp_path / "bad.jsonl"
    math_row.write_text(json.dumps({"id": "m", "task": "math", "prompt": "1+1"}) + "\n")
    with pytest.raises(DataError, match="task 'math' needs a gold answer"):
        load_prompts(math_row, gold_free_tasks=free)  # math keeps its verifier, and its rule


@gold_free
def format_only(completion: str, record: PromptRecord) -> float:
    return float(completion.strip().endswith("."))


def test_a_run_learns_against_a_classifier_trained_here(classifier: Path, tmp_path: Path) -> None:
    """A random-init policy, gold-free prompts scored only by the classifier: the reward and the
    share of digits in the answers (what the classifier was trained to prefer) both rise."""
    from scalerl.assembly.build import build_training
    from scalerl.telemetry import read_rows

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "task": "chat", "prompt": QUESTION}) + "\n"
                            for i in range(40)))
    cfg = RunConfig.model_validate({
        "max_steps": 14, "seed": 0,
        "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
                           "intermediate_size": 64, "max_position_embeddings": 256}},
        "data": {"train_path": str(data), "heldout_size": 0},
        "generation": {"n": 8, "max_new_tokens": 8, "max_batch_size": 32, "length_control": {"kind": "none"}},
        "pipeline": {"off_policy": "sync", "prompts_per_step": 4},
        "optim": {"lr": 1e-2, "warmup_steps": 0},
        "eval": {"every": 1000, "at_start": False},
        "logging": {"progress": False},
        "rewards": {"reward_models": {"chat": {"path": str(classifier), "kind": "classifier"}}},
    })
    with build_training(cfg, tmp_path / "run", device="cpu", checkpoints=False) as run:
        run.driver.run()
        meter = run.driver.c.meter
        assert meter.reward_model_tokens > 0  # the classifier's forward passes are in the FLOPs
    rows = [r for r in read_rows(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "step"]
    reward = [r["reward_mean"] for r in rows]
    first, last = sum(reward[:3]) / 3, sum(reward[-3:]) / 3
    assert last > first + 0.15, [round(x, 3) for x in reward]
    assert rows[-1]["reward_model_samples_total/chat"] == 14 * 4 * 8
    assert rows[-1]["verifier_failures_total"] == 0


def test_run_inputs_check_the_reward_model_and_teacher_paths(tmp_path: Path) -> None:
    from scalerl.assembly.inputs import check_run_inputs
    from scalerl.inputs import InputError

    base = {"output_dir": str(tmp_path / "run"), "data": {"synthetic": {"num_prompts": 20}}}
    missing = str(tmp_path / "no-such-model")
    cfg = RunConfig.model_validate({**base, "rewards": {"reward_models": {
        "chat": {"path": missing, "kind": "classifier"}}}})
    with pytest.raises(InputError, match=r"rewards\.reward_models\.chat\.path"):
        check_run_inputs(cfg)
    cfg = RunConfig.model_validate({**base, "algorithm": {"distill": {"teacher": missing}}})
    with pytest.raises(InputError, match=r"algorithm\.distill\.teacher"):
        check_run_inputs(cfg)


def test_render_template_fills_the_rubric_once() -> None:
    out = render_template("R: {rubric} | {prompt} | {response}", "P {rubric}", "A", "cite {prompt}")
    assert out == "R: cite {prompt} | P {rubric} | A"
    with pytest.raises(ValueError, match=r"asks for \{rubric\}"):
        render_template("{rubric}{prompt}", "P", "A")


def test_the_judge_reads_each_rows_rubric_and_names_a_row_without_one(judge: Path) -> None:
    rm = {"path": str(judge), "kind": "judge", "template": "Rubric: {rubric}\n" + JUDGE_TEMPLATE,
          "max_new_tokens": 4}
    router = router_for(rm, failure_reward=-5.0)
    model = router.reward_models["chat"]
    rubric = PromptRecord(id="p1", task="chat", prompt=QUESTION, metadata={"rubric": "digits only"})
    text = model.judge_prompt(rubric, "123")
    assert "Rubric: digits only\nQ: Say some digits\nA: 123\nCorrect?" in text
    out = router.score_group(rubric, ["123"])
    assert out[0].status == "ok"
    bare = PromptRecord(id="p2", task="chat", prompt=QUESTION, source="rows.jsonl:2")
    out = router.score_group(bare, ["123", "456"])
    assert [o.status for o in out] == ["error", "error"] and all(o.reward == -5.0 for o in out)
    assert "row 'p2' (rows.jsonl:2) has no 'rubric' column" in out[0].detail
    assert router.stats()["chat"]["error"] == 2
    router.close()
