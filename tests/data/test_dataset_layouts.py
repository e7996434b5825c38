"""Dataset layouts the Hugging Face way (scalerl/data/layout.py, scalerl/data/loaders.py): a snapshot
folder laid out as the Hub's openai/gsm8k (with and without its README's config declarations), a
`save_to_disk` DatasetDict, parquet shards, a list of files; several configs or splits unchosen are
refused naming the key to choose with."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scalerl.data.loaders import load_prompts
from scalerl.data.rejects import DataError

KEYS = ("data.subset", "data.split")

# The front matter of the Hub's openai/gsm8k README.md (its `configs:` block), as a snapshot holds it.
GSM8K_README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train-*
  - split: test
    path: socratic/test-*
---
# Dataset Card for GSM8K
"""


def gsm8k_rows(config: str, split: str, n: int) -> list[dict[str, str]]:
    """Rows in GSM8K's columns: `question`, and `answer` a worked solution ending '#### N'."""
    return [{"question": f"[{config}/{split}] What is {i} + {i}?",
             "answer": f"{i} + {i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i}"} for i in range(n)]


def make_gsm8k_snapshot(root: Path, readme: bool = True, sizes: dict[str, int] | None = None) -> Path:
    """A folder laid out as `huggingface-cli download openai/gsm8k --repo-type dataset` leaves it."""
    sizes = sizes or {"train": 6, "test": 3}
    for config in ("main", "socratic"):
        (root / config).mkdir(parents=True)
        for split, n in sizes.items():
            table = pa.Table.from_pylist(gsm8k_rows(config, split, n))
            pq.write_table(table, root / config / f"{split}-00000-of-00001.parquet")
    (root / ".gitattributes").write_text("*.parquet filter=lfs\n")
    if readme:
        (root / "README.md").write_text(GSM8K_README)
    return root


@pytest.mark.parametrize("readme", [False, True], ids=["files", "readme-configs"])
def test_gsm8k_snapshot_refused_until_subset_and_split_are_chosen(
    tmp_path: Path, readme: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if readme:  # datasets.load_dataset reads the snapshot; its cache goes to the test's tmp dir
        datasets = pytest.importorskip("datasets")
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    snap = make_gsm8k_snapshot(tmp_path / "gsm8k", readme=readme)
    with pytest.raises(DataError,
                       match=r"2 configs \(subsets\) .*'main', 'socratic'.*choose one with data\.subset"):
        load_prompts(snap, format="gsm8k", keys=KEYS)
    with pytest.raises(DataError, match=r"2 splits.*'test', 'train'.*choose one with data\.split"):
        load_prompts(snap, format="gsm8k", subset="main", keys=KEYS)
    got = load_prompts(snap, format="gsm8k", subset="main", split="train", keys=KEYS).records
    assert [r.prompt for r in got] == [f"[main/train] What is {i} + {i}?" for i in range(6)]
    assert [r.answer for r in got] == [str(2 * i) for i in range(6)]  # '#### N' read as the gold
    test = load_prompts(snap, format="gsm8k", subset="socratic", split="test", keys=KEYS).records
    assert {r.prompt.split("]")[0] for r in test} == {"[socratic/test"}
    with pytest.raises(DataError, match=r"data\.subset='nope' is not a config"):
        load_prompts(snap, format="gsm8k", subset="nope", split="train", keys=KEYS)


def test_one_config_folder_needs_only_the_split(tmp_path: Path) -> None:
    snap = make_gsm8k_snapshot(tmp_path / "gsm8k", readme=False)
    main = snap / "main"
    with pytest.raises(DataError, match=r"choose one with data\.split"):
        load_prompts(main, format="gsm8k", keys=KEYS)
    assert len(load_prompts(main, format="gsm8k", split="test", keys=KEYS).records) == 3


def test_parquet_shards_of_one_split_are_read_together(tmp_path: Path) -> None:
    data = tmp_path / "ds" / "data"
    data.mkdir(parents=True)
    for shard in range(3):
        rows = [{"prompt": f"p{shard}-{i}", "answer": str(i)} for i in range(2)]
        pq.write_table(pa.Table.from_pylist(rows), data / f"train-0000{shard}-of-00003.parquet")
    test_rows = pa.Table.from_pylist([{"prompt": "q", "answer": "1"}])
    pq.write_table(test_rows, data / "test-00000-of-00001.parquet")
    got = load_prompts(tmp_path / "ds", split="train", default_task="math").records
    assert [r.prompt for r in got] == [f"p{s}-{i}" for s in range(3) for i in range(2)]
    with pytest.raises(DataError, match=r"2 splits 'test', 'train'; choose one with split"):
        load_prompts(tmp_path / "ds", default_task="math")


def test_folder_naming_no_split_is_read_whole(tmp_path: Path) -> None:
    for sub in ("a", "b"):
        (tmp_path / "ds" / sub).mkdir(parents=True)
        (tmp_path / "ds" / sub / "rows.jsonl").write_text(json.dumps({"prompt": sub, "answer": "1"}) + "\n")
    assert [r.prompt for r in load_prompts(tmp_path / "ds", default_task="math").records] == ["a", "b"]


def test_save_to_disk_dataset_dict(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({split: datasets.Dataset.from_list(gsm8k_rows("main", split, n))
                               for split, n in (("train", 4), ("test", 2))})
    dd.save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DataError, match=r"holds 2 splits \['test', 'train'\]; choose one with data\.split"):
        load_prompts(tmp_path / "saved", format="gsm8k", keys=KEYS)
    got = load_prompts(tmp_path / "saved", format="gsm8k", split="test", keys=KEYS).records
    assert [r.answer for r in got] == ["0", "2"]
    with pytest.raises(DataError, match=r"data\.subset='main': a `save_to_disk` folder has no configs"):
        load_prompts(tmp_path / "saved", format="gsm8k", subset="main", split="test", keys=KEYS)


def test_a_list_of_files_is_read_in_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.parquet"
    a.write_text(json.dumps({"prompt": "first", "answer": "1"}) + "\n")
    pq.write_table(pa.Table.from_pylist([{"prompt": "second", "answer": "2"}]), b)
    got = load_prompts([str(a), str(b)], default_task="math").records
    assert [(r.prompt, r.id) for r in got] == [("first", "a:1"), ("second", "b:0")]
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
        load_prompts([str(a), str(tmp_path / "missing.jsonl")], default_task="math")


def test_a_choice_without_a_path_is_a_config_error() -> None:
    from scalerl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"data\.split: chooses within data\.train_path, which is unset"):
        load_config(overrides=["data.split=train"])


def test_a_missing_path_under_a_local_folder_is_not_asked_of_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="prompt data not found: data/gsm8k"):
        load_prompts("data/gsm8k", default_task="math")  # owner/name in form, but data/ is here
