from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scalerl.data import DataError, PromptRecord, load_prompts, write_jsonl

ROWS = [
    {"question": "What is 2+2?", "solution": "4", "level": 1},
    {"question": "What is 3*3?", "solution": 9, "level": 2},
]


def _jsonl(path: Path, rows: list[dict], raw_lines: tuple[str, ...] = ()) -> Path:
    lines = [json.dumps(r) for r in rows] + list(raw_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_field_map_default_task_and_metadata(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "train.jsonl", ROWS)
    res = load_prompts(path, field_map={"prompt": "question", "answer": "solution"}, default_task="math")
    assert res.rows_read == 2 and not res.rejects
    a, b = res.records
    assert (a.id, a.task, a.prompt, a.answer) == ("train:1", "math", "What is 2+2?", "4")
    assert b.answer == "9"  # numbers become answer text
    assert a.metadata == {"level": 1}  # unmapped columns are kept
    assert a.source == f"{path}:1" and b.source == f"{path}:2"


def test_bad_rows_raise_with_file_line_and_count(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "d.jsonl",
        [{"id": "a", "task": "math", "prompt": "ok", "answer": "1"}],
        raw_lines=(
            "",  # blank lines are not rows
            '{"id": "b", "task": "math", "prompt": "   ", "answer": "1"}',
            '{"id": "c", "task": "math", "answer": "1"}',
            '{"id": "d", "task": "math", "prompt": "no answer"}',
            "{not json",
            '{"id": "a", "task": "math", "prompt": "again", "answer": "2"}',
            '{"id": "e", "task": "code", "prompt": "p", "tests": [{"nope": 1}]}',
        ),
    )
    with pytest.raises(DataError) as err:
        load_prompts(path)
    msg = str(err.value)
    assert "6 row(s) rejected" in msg
    for line, reason in [(3, "empty prompt"), (4, "missing prompt"), (5, "missing answer"),
                         (6, "invalid JSON"), (7, "duplicate id"), (8, "bad tests")]:
        assert f"{path}:{line}:" in msg and reason in msg
    assert f"already used at {path}:1" in msg


def test_skip_mode_counts_rejects(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "d.jsonl",
        [{"id": "a", "task": "math", "prompt": "ok", "answer": "1"},
         {"id": "b", "prompt": "no task", "answer": "1"},
         {"id": "c", "task": "math", "prompt": "", "answer": "1"}],
    )
    res = load_prompts(path, on_error="skip")
    assert [r.id for r in res.records] == ["a"]
    assert res.rows_read == 3
    assert res.rejects.total == 2
    assert res.rejects.to_dict() == {"missing task": 1, "empty prompt": 1}


def test_all_rows_bad_is_an_error_even_when_skipping(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [{"question": "q"}])
    with pytest.raises(DataError, match="no usable prompt rows"):
        load_prompts(path, on_error="skip", default_task="math")


def test_csv_with_json_cells_and_multiline_quotes(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "task", "prompt", "tests", "answer"])
        tests = json.dumps([{"assert": "assert f(1) == 2"}])
        w.writerow(["c1", "code", "Write f\nover two lines", tests, ""])
        w.writerow(["m1", "math", "1+1?", "", "2"])
        w.writerow(["m2", "math", "", "", "3"])
        w.writerow(["m3", "math", "too", "many", "cells", "here"])
    res = load_prompts(path, on_error="skip")
    c1, m1 = res.records
    assert c1.tests == [{"assert": "assert f(1) == 2"}] and c1.answer is None
    assert c1.source == f"{path}:2"
    assert m1.source == f"{path}:4"  # the quoted cell on line 2 spans lines 2-3
    assert res.rejects.to_dict() == {"empty prompt": 1, "bad CSV row": 1}
    assert any(f"{path}:6" in ex for ex in res.rejects.examples["bad CSV row"])


def test_parquet_messages_and_row_index_source(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    table = pa.table({
        "uid": ["x", "y"],
        "messages": [[{"role": "user", "content": "hi"}], [{"role": "robot", "content": "hi"}]],
        "tests": [[{"assert": None, "stdin": "1\n", "stdout": "2\n"}], [{"assert": "assert 1", "stdin": None,
                                                                        "stdout": None}]],
    })
    pq.write_table(table, path)
    res = load_prompts(path, field_map={"id": "uid"}, default_task="code", on_error="skip")
    (x,) = res.records
    assert x.id == "x" and x.messages == [{"role": "user", "content": "hi"}]
    assert x.tests == [{"stdin": "1\n", "stdout": "2\n"}]  # Arrow's None-filled struct keys dropped
    assert x.source == f"{path}:0"
    assert res.rejects.to_dict() == {"bad messages": 1}
    assert f"{path}:1" in res.rejects.examples["bad messages"][0]


def test_json_array_file(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"id": "a", "task": "math", "prompt": "p", "answer": "1"}]))
    (rec,) = load_prompts(path).records
    assert rec.id == "a" and rec.source == f"{path}:0"


def test_folder_of_files_with_split(tmp_path: Path) -> None:
    data = tmp_path / "ds" / "data"
    data.mkdir(parents=True)
    _jsonl(data / "train-00000.jsonl", [{"prompt": "a", "answer": "1"}])
    pq.write_table(pa.table({"prompt": ["b"], "answer": ["2"]}), data / "train-00001.parquet")
    _jsonl(data / "test-00000.jsonl", [{"prompt": "c", "answer": "3"}])
    res = load_prompts(tmp_path / "ds", split="train", default_task="math")
    assert [r.prompt for r in res.records] == ["a", "b"]
    assert [r.id for r in res.records] == ["data/train-00000:1", "data/train-00001:0"]
    with pytest.raises(DataError, match=r"2 splits 'test', 'train'; choose one with split"):
        load_prompts(tmp_path / "ds", default_task="math")  # train and test are never read together
    with pytest.raises(DataError, match="split='dev' is not a split"):
        load_prompts(tmp_path / "ds", split="dev", default_task="math")


def test_hf_datasets_folder(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"problem": "1+2?", "answer": "3"}, {"problem": "", "answer": "4"}])
    ds.save_to_disk(str(tmp_path / "single"))
    res = load_prompts(tmp_path / "single", field_map={"prompt": "problem"}, default_task="math",
                       on_error="skip")
    assert [r.prompt for r in res.records] == ["1+2?"]
    assert res.records[0].source == f"{tmp_path / 'single'}:0"
    assert res.rejects.to_dict() == {"empty prompt": 1}

    dd = datasets.DatasetDict({"train": ds.select([0]), "test": ds.select([0])})
    dd.save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(DataError, match=r"2 splits \['test', 'train'\]; choose one with split"):
        load_prompts(tmp_path / "dict", field_map={"prompt": "problem"}, default_task="math")
    got = load_prompts(tmp_path / "dict", split="test", field_map={"prompt": "problem"}, default_task="math")
    assert got.records[0].id == "dict:0"


def test_missing_datasets_package_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "state.json").write_text("{}")
    (folder / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataError, match=r"pip install 'scalerl\[datasets\]'"):
        load_prompts(folder, default_task="math")


def test_input_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        load_prompts(tmp_path / "nope.jsonl")
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(DataError, match=r"unsupported file type '\.txt'"):
        load_prompts(tmp_path / "d.txt")
    with pytest.raises(ValueError, match="unknown record field 'question'"):
        load_prompts(tmp_path / "d.txt", field_map={"question": "prompt"})
    with pytest.raises(ValueError, match="on_error"):
        load_prompts(tmp_path / "d.txt", on_error="ignore")  # type: ignore[arg-type]
    (tmp_path / "latin.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(DataError, match="not UTF-8"):
        load_prompts(tmp_path / "latin.jsonl")


def test_write_jsonl_round_trip(tmp_path: Path) -> None:
    records = [
        PromptRecord(id="m", task="math", prompt="Compute 1+1", answer="2", metadata={"difficulty": 1}),
        PromptRecord(id="c", task="code", messages=[{"role": "user", "content": "Write f"}],
                     tests=[{"stdin": "", "stdout": "1\n"}]),
    ]
    path = write_jsonl(records, tmp_path / "out" / "set.jsonl")
    loaded = load_prompts(path).records
    for want, got in zip(records, loaded, strict=True):
        assert got.source.startswith(str(path))
        got.source = ""
        assert got == want


def test_format_forces_the_reader(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "rows.txt", [{"prompt": "p", "answer": "1"}])
    (rec,) = load_prompts(path, format="jsonl", default_task="math").records
    assert rec.prompt == "p"
    folder = tmp_path / "mixed"
    folder.mkdir()
    _jsonl(folder / "a.jsonl", [{"prompt": "a", "answer": "1"}])
    pq.write_table(pa.table({"prompt": ["b"], "answer": ["2"]}), folder / "b.parquet")
    assert [r.prompt for r in load_prompts(folder, format="parquet", default_task="math").records] == ["b"]
    with pytest.raises(DataError, match="format 'hf' needs a folder"):
        load_prompts(folder, format="hf", default_task="math")
    with pytest.raises(ValueError, match="format: must be one of"):
        load_prompts(folder, format="xml")


def test_chat_turns_in_the_prompt_column(tmp_path: Path) -> None:
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": turns, "answer": "2"},
                                         {"prompt": [{"role": "system", "content": "only"}], "answer": "2"}])
    res = load_prompts(path, default_task="math", on_error="skip")
    (rec,) = res.records
    assert rec.prompt is None and rec.messages == turns
    assert rec.chat("ignored: the record has its own") == turns
    assert res.rejects.to_dict() == {"empty prompt": 1}
