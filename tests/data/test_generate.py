"""`scalerl data generate`'s parts: the selection rules against a hand-written reference, samples
kept whole through the engine and verifiers, the resumable work file, counts, and the command's
refusals (existing output, unknown rule). The loop with real training is test_generate_loop.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from scalerl.cli import main
from scalerl.data import DataError, write_jsonl
from scalerl.data.difficulty import DifficultySettings, estimate_pass_rates, partial_path
from scalerl.data.generate import PromptSamples, Sample, SamplesFile, build_rows, select
from scalerl.data.synthetic import make_math_task
from scalerl.evaluation.difficulty import sample_chunk
from scalerl.models.tiny import build_tiny_tokenizer
from scalerl.rewards import RewardConfig, RewardRouter
from scalerl.rewards.groups import GroupScorer
from scalerl.rollout.protocol import Completion, GenerationRequest, SamplingParams
from scalerl.training.sft_data import read_sft_pairs


def settings(**kw: Any) -> DifficultySettings:
    base: dict[str, Any] = dict(model={"name_or_path": "m", "sha256": "abc"}, engine="embedded", k=4,
                                temperature=1.0, seed=0, max_new_tokens=16, template="chat",
                                system_prompt=None, length_control="none")
    return DifficultySettings(**{**base, **kw})


# index, correct, tokens, truncated
SAMPLES = [Sample(0, "a", False, 5, False), Sample(1, "b", True, 9, False), Sample(2, "c", True, 4, False),
           Sample(3, "d", True, 12, True), Sample(4, "e", True, 4, False), Sample(5, "f", True, 9, False)]


def test_selection_rules_match_a_written_out_reference() -> None:
    # Correct and not truncated: 1 (9 tokens), 2 (4), 4 (4), 5 (9); sample 3 (12, truncated) never.
    assert [s.index for s in select(SAMPLES, "all_correct")] == [1, 2, 4, 5]
    assert [s.index for s in select(SAMPLES, "one_per_prompt")] == [1]
    assert [s.index for s in select(SAMPLES, "shortest_correct")] == [2]  # 4 tokens, tie with 4: lower index
    assert [s.index for s in select(SAMPLES, "longest_correct")] == [1]  # 9 tokens (12 was cut), tie: lower
    assert select(SAMPLES[:1], "shortest_correct") == []
    with pytest.raises(ValueError, match="--select: one of"):
        select(SAMPLES, "best")


def test_rows_are_sft_rows_and_every_sample_is_counted(tmp_path: Path) -> None:
    records = make_math_task(3, seed=1, difficulty=(1, 1))
    results = {records[0].id: PromptSamples(records[0].id, tuple(SAMPLES)),
               records[1].id: PromptSamples(records[1].id, tuple(SAMPLES[:1]) * 1, verifier_failures=1),
               records[2].id: PromptSamples(records[2].id, (Sample(0, "z", True, 3, False),))}
    rows, counts = build_rows(records, results, "all_correct", "ckpt")
    assert [r["id"] for r in rows] == [f"{records[0].id}/{i}" for i in (1, 2, 4, 5)] + [f"{records[2].id}/0"]
    assert (counts.prompts, counts.samples, counts.correct, counts.kept) == (3, 8, 6, 5)
    assert (counts.correct_truncated, counts.prompts_kept, counts.prompts_without_kept) == (1, 2, 1)
    assert counts.verifier_failures == 1
    assert counts.per_prompt[records[0].id] == {"correct": 5, "k": 6, "pass_rate": 5 / 6, "kept": 4}
    meta = rows[0]["metadata"]["generated"]
    assert meta["pass_rate"] == 5 / 6 and meta["sample_index"] == 1 and meta["rule"] == "all_correct"
    # `scalerl sft` reads them: the prompt, and the sample (not the gold solution) as the target.
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = read_sft_pairs(path)
    assert [(p.prompt, resp) for p, resp in pairs][:2] == [(records[0].prompt, "b"), (records[0].prompt, "c")]


def test_sample_chunk_keeps_each_samples_text_and_verdict() -> None:
    tok = build_tiny_tokenizer()
    records = make_math_task(3, seed=1, difficulty=(1, 2))

    def generate(requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for q in requests:
            record = next(r for r in records if r.id == q.metadata["prompt_id"])
            for j in range(q.params.n):  # sample j is right when j is odd
                text = f"<think>{'x' * j}</think>\\boxed{{{record.answer if j % 2 else 'no'}}}"
                ids = tok.encode(text)
                out.append(Completion(q.request_id, j, q.prompt_ids, ids, [0.0] * len(ids), [0] * len(ids),
                                      [True] * len(ids), "length" if j == 3 else "stop", 0))
        return out[::-1]

    router = RewardRouter(RewardConfig(math_workers=1))
    scorer = GroupScorer(router, lambda ids: tok.decode(ids), max_workers=2, success_threshold=0.5)
    try:
        got = sample_chunk(records, lambda r: [5], generate, scorer, SamplingParams(max_new_tokens=8),
                           settings(), lambda ids: tok.decode(ids))
    finally:
        scorer.close()
        router.close()
    for record, res in zip(records, got, strict=True):
        assert res.id == record.id and [s.index for s in res.samples] == [0, 1, 2, 3]
        assert [s.correct for s in res.samples] == [False, True, False, True]
        assert [s.truncated for s in res.samples] == [False, False, False, True]
        assert res.samples[1].text == f"<think>x</think>\\boxed{{{record.answer}}}"
        assert res.samples[1].tokens == len(tok.encode(res.samples[1].text))


def fake_samples(record: Any) -> PromptSamples:
    n = len(record.id) % 4
    return PromptSamples(record.id,
                         tuple(Sample(j, f"{record.id}:{j}", j < n, 3 + j, False) for j in range(4)))


def test_killed_then_resumed_writes_what_an_uninterrupted_run_writes(tmp_path: Path) -> None:
    records = make_math_task(9, seed=2, difficulty=(1, 3))
    whole = estimate_pass_rates(records, SamplesFile.open(tmp_path / "a.partial", settings()),
                                lambda part: [fake_samples(r) for r in part], chunk_size=2)
    calls: list[int] = []

    def dying(part: Sequence[Any]) -> list[PromptSamples]:
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(len(part))
        return [fake_samples(r) for r in part]

    work = tmp_path / "b.partial"
    with pytest.raises(KeyboardInterrupt):
        estimate_pass_rates(records, SamplesFile.open(work, settings()), dying, chunk_size=2)
    resumed_file = SamplesFile.open(work, settings())
    assert len(resumed_file.done) == 4
    seen: list[str] = []

    def rest(part: Sequence[Any]) -> list[PromptSamples]:
        seen.extend(r.id for r in part)
        return [fake_samples(r) for r in part]

    again = estimate_pass_rates(records, resumed_file, rest, chunk_size=2)
    assert len(seen) == 5 and again == whole
    assert build_rows(records, again, "all_correct", "m") == build_rows(records, whole, "all_correct", "m")
    # A work file started with other settings, or a difficulty work file, is not resumed.
    with pytest.raises(DataError, match="other settings: k"):
        SamplesFile.open(work, settings(k=8))
    from scalerl.data.difficulty import PartialFile

    PartialFile.open(tmp_path / "d.partial", settings())
    with pytest.raises(DataError, match="not a scalerl_generate work file"):
        SamplesFile.open(tmp_path / "d.partial", settings())


def test_command_refuses_existing_output_and_unknown_rule(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    write_jsonl(make_math_task(2, seed=1, difficulty=(1, 1)), prompts)
    out = tmp_path / "sft.jsonl"
    out.write_text("mine\n")
    assert main(["data", "generate", "nowhere", "--prompts", str(prompts), "--out", str(out)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err and out.read_text() == "mine\n"
    with pytest.raises(SystemExit) as err:
        main(["data", "generate", "m", "--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl"),
              "--select", "best"])
    assert err.value.code == 2
    assert not partial_path(tmp_path / "o.jsonl").exists()


def test_the_command_resumes_an_interrupted_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import scalerl.evaluation.difficulty as engine_half
    from scalerl.models.tiny import TinyModelSpec, build_tiny_model

    model = tmp_path / "model"
    spec = TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                         max_position_embeddings=256)
    tok = build_tiny_tokenizer()
    build_tiny_model(spec, vocab_size=len(tok), seed=0).save_pretrained(str(model))
    tok.save_pretrained(str(model))
    prompts = tmp_path / "p.jsonl"
    write_jsonl(make_math_task(6, seed=2, difficulty=(1, 2)), prompts)

    def args(out: Path, *extra: str) -> list[str]:
        return ["data", "generate", str(model), "--prompts", str(prompts), "--out", str(out), "--k", "3",
                "--max-new-tokens", "12", "--chunk", "2", "--no-progress", "--device", "cpu", *extra]

    whole = tmp_path / "whole.jsonl"
    assert main(args(whole)) == 0
    real = engine_half.sample_chunk
    sampled: list[str] = []

    def dies_on_the_second_chunk(records: Sequence[Any], *a: Any) -> list[PromptSamples]:
        if len(sampled) == 2:
            raise KeyboardInterrupt
        sampled.extend(r.id for r in records)
        return real(records, *a)

    monkeypatch.setattr(engine_half, "sample_chunk", dies_on_the_second_chunk)
    out = tmp_path / "out.jsonl"
    assert main(args(out)) == 130  # interrupted, as by Ctrl-C
    assert not out.exists() and partial_path(out).exists()
    sampled.clear()

    def counting(records: Sequence[Any], *a: Any) -> list[PromptSamples]:
        sampled.extend(r.id for r in records)
        return real(records, *a)

    monkeypatch.setattr(engine_half, "sample_chunk", counting)
    assert main(args(out)) == 0
    assert len(sampled) == 4  # the two saved prompts are not sampled again
    assert out.read_bytes() == whole.read_bytes() and not partial_path(out).exists()
    stats = json.loads((tmp_path / "out.jsonl.stats.json").read_text())
    assert stats == json.loads((tmp_path / "whole.jsonl.stats.json").read_text())
    assert stats["prompts"] == 6 and stats["samples"] == 18
    assert stats["kept"] == len(out.read_text().splitlines())
