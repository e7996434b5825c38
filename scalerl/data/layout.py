"""Which files of a dataset folder are one config and one split, the way the Hugging Face Hub lays
them out, so that a folder holding several is read only once one of each is chosen.

A snapshot of the Hub's `openai/gsm8k` holds `main/train-00000-of-00001.parquet`,
`main/test-00000-of-00001.parquet`, `socratic/train-...` and `socratic/test-...`: two configs
(subsets) of two splits each. Reading such a folder whole trains on the test split of both. The
rules follow `datasets`' own data-file patterns (`datasets.data_files`, `KEYWORDS_IN_FILENAME_BASE_
PATTERNS` / `KEYWORDS_IN_DIR_NAME_BASE_PATTERNS`):

* a file's split is the split keyword its name starts with (`train-0000.parquet`, `test.jsonl`,
  `validation_1.csv`) or a folder on its path named by one (`train/part-0.parquet`); the keywords
  are datasets' `SPLIT_KEYWORDS` (train/training, validation/valid/dev/val, test/testing/eval/
  evaluation), each read as its canonical split name;
* its config is the first folder on its path that is neither a split keyword nor `data`
  (`main/train-...` is config `main`; `data/train-...` and `train-...` are the default config, "");
* a folder where no file names a split is one dataset: every file is read (nothing to choose).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

# datasets.splits / datasets.data_files.SPLIT_KEYWORDS: keyword -> canonical split name.
SPLIT_KEYWORDS: dict[str, str] = {
    "train": "train", "training": "train",
    "validation": "validation", "valid": "validation", "dev": "validation", "val": "validation",
    "test": "test", "testing": "test", "eval": "test", "evaluation": "test",
}
_SEPARATORS = ("-", "_", ".", " ")


def _name_split(name: str) -> str | None:
    """The split a file name starts with (`train-00000-of-00001.parquet` -> train), else None."""
    lower = name.lower()
    for keyword in sorted(SPLIT_KEYWORDS, key=len, reverse=True):  # "training" before "train"
        if lower.startswith(keyword) and (len(lower) == len(keyword) or lower[len(keyword)] in _SEPARATORS):
            return SPLIT_KEYWORDS[keyword]
    return None


def file_split(rel: Path) -> str | None:
    """The split of a file at `rel` (relative to the dataset folder): a folder on its path named by
    a split keyword, else its file name's leading keyword; None when neither names one."""
    for part in rel.parts[:-1]:
        if part.lower() in SPLIT_KEYWORDS:
            return SPLIT_KEYWORDS[part.lower()]
    return _name_split(rel.name)


def file_config(rel: Path) -> str:
    """The config (subset) of a file at `rel`: its first folder that is neither a split keyword nor
    `data`; "" (the default config) when there is none."""
    for part in rel.parts[:-1]:
        if part.lower() not in SPLIT_KEYWORDS and part != "data":
            return part
    return ""


def group_files(root: Path, files: Sequence[Path]) -> dict[tuple[str, str], list[Path]]:
    """(config, split) -> its files, in the order given. A file that names no split is in split ""
    (a folder where none does is one group, ("", ""))."""
    groups: dict[tuple[str, str], list[Path]] = {}
    named = any(file_split(f.relative_to(root)) is not None for f in files)
    for f in files:
        rel = f.relative_to(root)
        key = (file_config(rel), file_split(rel) or "") if named else ("", "")
        groups.setdefault(key, []).append(f)
    return groups


def _shown(names: Sequence[str]) -> str:
    return ", ".join(repr(n) if n else "(none)" for n in names)


def choose(
    root: Path, groups: dict[tuple[str, str], list[Path]], subset: str | None, split: str | None,
    keys: tuple[str, str] = ("subset", "split"),
) -> list[Path]:
    """The files of one config and one split; a ValueError naming what the folder holds and the key
    (`keys`: the config keys of subset and split, e.g. `data.subset`, `data.split`) to choose with
    when it holds several and none is chosen, or when the chosen one is not there."""
    configs = sorted({c for c, _ in groups})
    if subset is not None:
        if subset not in configs:
            raise ValueError(f"{root}: {keys[0]}={subset!r} is not a config (subset) of this folder; "
                             f"its configs are {_shown(configs)}")
        configs = [subset]
    elif len(configs) > 1:
        raise ValueError(f"{root}: holds {len(configs)} configs (subsets) {_shown(configs)}; choose one "
                         f"with {keys[0]}")
    config = configs[0]
    splits = sorted({s for c, s in groups if c == config})
    if split is not None:
        wanted = SPLIT_KEYWORDS.get(split.lower(), split)
        if wanted not in splits:
            where = f" of config {config!r}" if config else ""
            raise ValueError(f"{root}: {keys[1]}={split!r} is not a split{where} in this folder; its "
                             f"splits are {_shown(splits)}")
        splits = [wanted]
    elif len(splits) > 1:
        where = f" in config {config!r}" if config else ""
        raise ValueError(f"{root}: holds {len(splits)} splits{where} {_shown(splits)}; choose one with "
                         f"{keys[1]}")
    return groups[(config, splits[0])]
