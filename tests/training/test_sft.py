"""SFT: response-only loss, learning, determinism, the cached warm start, data reading, the CLI."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import scalerl.assembly.warm_start as ws_mod
from scalerl.assembly.build import load_records
from scalerl.assembly.warm_start import warm_start_default
from scalerl.cli.sft import _sft_config, register
from scalerl.config import DataConfig, RunConfig, SyntheticDataConfig
from scalerl.data.split import split_heldout
from scalerl.data.synthetic import make_synthetic, write_synthetic_jsonl
from scalerl.data.tokenize import encode_prompt
from scalerl.training import sft as sft_mod
from scalerl.training.sft import SFTConfig, examples_from_records, sft_loss, solution_pairs, train_sft
from scalerl.training.sft_data import read_sft_pairs


@pytest.fixture
def small_run(model_config) -> RunConfig:
    data = DataConfig(synthetic=SyntheticDataConfig(num_prompts=40, difficulty=(1, 2)), heldout_size=8)
    return RunConfig(model=model_config(), data=data)


def _examples(policy, n: int = 48):
    return examples_from_records(solution_pairs(make_synthetic("math", n, seed=0, difficulty=(1, 3))),
                                 policy.tokenizer, None, 256)


def test_examples_are_chat_prompt_then_response_and_eos(make_policy):
    policy = make_policy()
    record = make_synthetic("math", 1, seed=0)[0]
    ex = examples_from_records([(record, record.metadata["solution"])], policy.tokenizer, None, 256)[0]
    assert list(ex.prompt_ids) == encode_prompt(record, policy.tokenizer)
    assert ex.response_ids[-1] == policy.tokenizer.eos_token_id
    assert policy.tokenizer.decode(list(ex.response_ids[:-1])) == record.metadata["solution"]
    with pytest.raises(ValueError, match="max_length"):
        examples_from_records([(record, record.metadata["solution"])], policy.tokenizer, None, 10)


def test_loss_is_mean_nll_of_response_tokens_only(make_policy):
    policy = make_policy()
    examples = _examples(policy, 3)
    loss, count = sft_loss(policy, examples)
    nll, total = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            ids = torch.tensor([list(ex.prompt_ids) + list(ex.response_ids)])
            logp = torch.log_softmax(policy.model(ids).logits.float(), dim=-1)[0]
            p = len(ex.prompt_ids)
            for t, tok in enumerate(ex.response_ids):
                nll -= float(logp[p + t - 1, tok])
                total += 1
    assert count == total
    assert float(loss.detach()) == pytest.approx(nll / total, rel=1e-5)


def test_training_lowers_loss_and_is_deterministic(make_policy):
    cfg = SFTConfig(steps=25, batch_size=8, lr=3e-3, warmup_steps=2, seed=5)
    runs = []
    for _ in range(2):
        policy = make_policy()
        result = train_sft(policy, _examples(policy), cfg)
        runs.append((result, [p.detach().clone() for p in policy.model.parameters()]))
    (r1, w1), (r2, w2) = runs
    assert r1.losses == r2.losses
    assert all(torch.equal(a, b) for a, b in zip(w1, w2, strict=True))
    assert sum(r1.losses[-5:]) / 5 < 0.75 * sum(r1.losses[:5]) / 5


def test_warm_start_is_cached_and_loadable(tmp_path, monkeypatch, small_run, tiny):
    cfg = small_run
    sft = SFTConfig(steps=3, batch_size=4)
    path = warm_start_default(cfg, sft, cache_dir=tmp_path)
    info = json.loads((path / "sft_info.json").read_text())
    assert info["sft"]["steps"] == 3 and info["examples"] == len(ws_mod.default_sft_records(cfg)) > 0
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # the kernels that trained it
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.hidden_size == tiny.hidden_size and tok.eos_token == "<|end|>"

    def no_training(*a, **k):
        raise AssertionError("the cached model should have been reused")

    monkeypatch.setattr(ws_mod, "train_sft", no_training)
    assert warm_start_default(cfg, sft, cache_dir=tmp_path) == path
    monkeypatch.undo()
    other = warm_start_default(cfg, SFTConfig(steps=3, batch_size=4, seed=1), cache_dir=tmp_path)
    assert other != path
    with pytest.raises(ValueError, match="tiny"):
        warm_start_default(RunConfig(model={"name_or_path": "gpt2"}), sft, cache_dir=tmp_path)


def test_warm_start_never_trains_on_rl_prompts(small_run):
    cfg = small_run
    records = ws_mod.default_sft_records(cfg)
    rl_records = make_synthetic("math", 40, cfg.data.synthetic.seed, (1, 2))
    heldout = split_heldout(rl_records, 8, cfg.data.heldout_seed).heldout
    assert records and all(r.metadata["solution"] for r in records)
    sft_prompts = {r.prompt for r in records}
    assert not sft_prompts & {r.prompt for r in rl_records}
    assert not sft_prompts & {r.prompt for r in heldout}


def test_warm_start_keeps_to_its_own_levels(small_run):
    # RL on levels 1 and 3 at 1:1, warm start on level 1 only: level 3's format is never shown.
    syn = small_run.data.synthetic.model_copy(update={"num_prompts": 60, "difficulty": (1, 3),
                                                      "weights": [1, 0, 1], "warm_start_difficulty": (1, 1)})
    cfg = small_run.model_copy(update={"data": small_run.data.model_copy(update={"synthetic": syn})})
    rl_levels = {r.metadata["difficulty"] for r in load_records(cfg)}
    sft_records = ws_mod.default_sft_records(cfg)
    assert rl_levels == {1, 3}
    assert sft_records and {r.metadata["difficulty"] for r in sft_records} == {1}
    assert not {r.prompt for r in sft_records} & {r.prompt for r in load_records(cfg)}
    # Without its own range the warm start follows the RL set's levels and weights.
    same = cfg.model_copy(update={"data": cfg.data.model_copy(update={"synthetic": syn.model_copy(
        update={"warm_start_difficulty": None})})})
    assert {r.metadata["difficulty"] for r in ws_mod.default_sft_records(same)} == {1, 3}


def test_read_sft_pairs_formats(tmp_path):
    f = tmp_path / "a.jsonl"
    rows = [
        {"prompt": "hi", "response": "yo"},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {"question": "2+2", "answer": "4"},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n")
    pairs = read_sft_pairs(f)
    assert [(r.prompt, r.messages, resp) for r, resp in pairs] == [
        ("hi", None, "yo"), (None, [{"role": "user", "content": "q"}], "a")
    ]
    assert pairs[0][0].source == f"{f}:1"
    pq.write_table(pa.Table.from_pylist([rows[2]]), tmp_path / "b.parquet")
    pairs = read_sft_pairs(tmp_path / "b.parquet", {"prompt": "question", "response": "answer"})
    assert pairs[0][0].prompt == "2+2" and pairs[0][1] == "4"
    syn = write_synthetic_jsonl(tmp_path / "syn.jsonl", "math", 3)
    assert all(resp.startswith("<think>") for _, resp in read_sft_pairs(syn))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: no response"):
        read_sft_pairs(bad)


def test_cli_trains_on_a_file_and_saves(tmp_path, tiny):
    data = write_synthetic_jsonl(tmp_path / "train.jsonl", "math", 12, difficulty=(1, 2))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    out = tmp_path / "out"
    overrides = [f"model.tiny.{k}={v}" for k, v in tiny.model_dump().items()]
    args = parser.parse_args(["sft", *overrides, "--data", str(data), "--output", str(out), "--steps", "2",
                              "--batch-size", "4", "--device", "cpu"])
    assert args.func(args) == 0
    assert (out / "sft_info.json").is_file() and list(out.glob("*.safetensors"))
    AutoModelForCausalLM.from_pretrained(out)


def test_one_warm_start_for_every_recipe(tmp_path, monkeypatch, small_run):
    """RL-only settings (fp32_lm_head, dtype, activation checkpointing) do not make a new warm start:
    every recipe starts from the same cached model."""
    from scalerl.assembly.run import resolve_run_config
    from scalerl.recipes import recipe_names

    sft = SFTConfig(steps=2, batch_size=4)
    first = warm_start_default(small_run, sft, cache_dir=tmp_path)

    def no_training(*a, **k):
        raise AssertionError("a second warm start was trained")

    monkeypatch.setattr(ws_mod, "train_sft", no_training)
    flags = [f"model.tiny.{k}={v}" for k, v in small_run.model.tiny.model_dump().items()]
    flags += ["data.synthetic.num_prompts=40", "data.synthetic.difficulty=[1, 2]", "data.heldout_size=8"]
    fp32_heads = set()
    for name in recipe_names():
        cfg = resolve_run_config(name, [], flags)
        fp32_heads.add(cfg.model.fp32_lm_head)
        assert warm_start_default(cfg, sft, cache_dir=tmp_path) == first, name
    assert fp32_heads == {True, False}  # the recipes do differ in this RL setting
    for override in ("model.dtype=bfloat16", "model.gradient_checkpointing=true"):
        cfg = resolve_run_config("scalerl", [], [*flags, override])
        assert warm_start_default(cfg, sft, cache_dir=tmp_path) == first, override


def test_the_run_seed_does_not_change_the_base_model(monkeypatch, small_run):
    """`scalerl train` / `demo` with seeds 0 and 3 start from one warm start (the RL seeds of one
    base model); `model.init_seed` picks another base model."""
    from scalerl.assembly.run import prepare_model

    seen = []
    monkeypatch.setattr(ws_mod, "warm_start_default",
                        lambda cfg, sft, **kw: seen.append(sft.seed) or f"/sft-{sft.seed}")
    for seed, init_seed in ((0, 0), (3, 0), (3, 2)):
        cfg = small_run.model_copy(update={"seed": seed, "model": small_run.model.model_copy(
            update={"init_seed": init_seed})})
        assert prepare_model(cfg).model.name_or_path == f"/sft-{init_seed}"
        # `scalerl sft` without --seed makes the same model.
        no_flags = argparse.Namespace(**{f.name: None for f in fields(SFTConfig)})
        assert _sft_config(no_flags, cfg).seed == init_seed
    assert seen == [0, 0, 2]


def test_warm_start_weights_do_not_depend_on_the_callers_threads(tmp_path, monkeypatch, small_run):
    seen = []
    real = sft_mod.train_sft

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(ws_mod, "train_sft", spy)
    before = torch.get_num_threads()
    try:
        for i, threads in enumerate((2, 1)):
            torch.set_num_threads(threads)
            warm_start_default(small_run, SFTConfig(steps=2, batch_size=4), cache_dir=tmp_path / str(i))
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert seen == [ws_mod.WARM_START_THREADS] * 2 == [1, 1]
    a, b = (next((tmp_path / str(i)).glob("tiny-*/model.safetensors")).read_bytes() for i in range(2))
    assert a == b


def test_progress_printer_shows_steps_and_time_left(capsys):
    report = sft_mod.progress_printer(50, prefix="warm start", every=25)
    for step in range(1, 51):
        report(step, 1.0 / step)
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split()[3] for ln in lines] == ["1/50", "25/50", "50/50"]
    assert "s to go" in lines[1] and "to go" not in lines[0] and "to go" not in lines[2]
