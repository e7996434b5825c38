"""Loading prompt sets from JSONL, JSON, Parquet, CSV/TSV, and local Hugging Face `datasets` folders.

Each row becomes a `PromptRecord` whose `source` is "path:N": the 1-based line for JSONL/CSV/TSV
(the header is line 1 of a CSV), the 0-based row index for Parquet, JSON arrays and `datasets`
folders. Bad rows are gathered over the whole file and then either raised together (default) or
skipped and counted (`on_error="skip"`); see `scalerl.data.rejects`.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl.data.benchmarks import BENCHMARK_FORMATS, row_to_benchmark_record
from scalerl.data.fields import check_field_map, row_to_record
from scalerl.data.layout import choose, group_files
from scalerl.data.records import PromptRecord
from scalerl.data.rejects import (
    DataError,
    MissingDataError,
    OnError,
    RejectLog,
    RowError,
    check_on_error,
    settle,
)

FILE_SUFFIXES: tuple[str, ...] = (".jsonl", ".ndjson", ".json", ".parquet", ".csv", ".tsv")
# `format=` names, and the suffixes each one reads in a folder; "auto" goes by suffix.
FORMAT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "jsonl": (".jsonl", ".ndjson"),
    "json": (".json",),
    "parquet": (".parquet",),
    "csv": (".csv",),
    "tsv": (".tsv",),
}
# A benchmark format (scalerl.data.benchmarks) reads its published columns from any file type above.
FORMATS: tuple[str, ...] = ("auto", *FORMAT_SUFFIXES, "hf", *BENCHMARK_FORMATS)

Row = Mapping[str, Any] | RowError


@dataclass
class LoadResult:
    """The records loaded, how many rows were read, and what was rejected (when skipping)."""

    records: list[PromptRecord]
    rows_read: int
    rejects: RejectLog = field(default_factory=RejectLog)


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Row]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                yield lineno, RowError("invalid JSON", f"not valid JSON ({err.msg}, column {err.colno})")
                continue
            except RecursionError:  # a row nested deeper than Python's parser goes: a bad row too
                yield lineno, RowError("invalid JSON", "nested too deeply to parse")
                continue
            if isinstance(obj, dict):
                yield lineno, obj
            else:
                yield lineno, RowError("invalid JSON", f"expected a JSON object, got {type(obj).__name__}")


def _iter_json(path: Path) -> Iterator[tuple[int, Row]]:
    # `Dataset.to_json` writes JSON lines under a .json name; a JSON array is the other common shape.
    with path.open(encoding="utf-8") as f:
        head = f.read(4096).lstrip()
    if not head.startswith("["):
        yield from _iter_jsonl(path)
        return
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    except RecursionError:
        raise DataError(f"{path}: not valid JSON (nested too deeply to parse)") from None
    for index, obj in enumerate(items):
        if isinstance(obj, dict):
            yield index, obj
        else:
            yield index, RowError("invalid JSON", f"expected a JSON object, got {type(obj).__name__}")


def _iter_csv(path: Path, delimiter: str) -> Iterator[tuple[int, Row]]:
    # Long code tests in one cell exceed csv's default 128 KiB field limit.
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        try:
            header = next(reader)
        except StopIteration:
            return
        if len(set(header)) != len(header):
            raise DataError(f"{path}:1: duplicate column names in header {header}")
        last_line = reader.line_num
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                raise DataError(f"{path}:{reader.line_num}: unreadable CSV ({err})") from None
            start, last_line = last_line + 1, reader.line_num  # a quoted cell may span several lines
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                yield start, RowError(
                    "bad CSV row", f"{len(cells)} cells but the header has {len(header)} columns"
                )
                continue
            yield start, dict(zip(header, cells, strict=True))


def _iter_parquet(path: Path) -> Iterator[tuple[int, Row]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise DataError(f"{path}: unreadable Parquet file ({err})") from None
    index = 0
    for batch in pf.iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            yield index, row
            index += 1


def _import_datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{what}; reading it needs the optional dependency `datasets` "
            "(pip install 'scalerl[datasets]')"
        ) from None
    return datasets


def _one_split(loaded: Any, where: str, split: str | None, keys: tuple[str, str]) -> Any:
    """One split of a `DatasetDict` (the only one, or `split`); a DataError naming the splits and
    the key to choose with otherwise. A `Dataset` is returned as it is."""
    if not hasattr(loaded, "keys"):
        return loaded
    names = sorted(loaded.keys())
    if split is None:
        if len(names) != 1:
            raise DataError(f"{where}: holds {len(names)} splits {names}; choose one with {keys[1]}")
        split = names[0]
    if split not in loaded:
        raise DataError(f"{where}: {keys[1]}={split!r} is not a split of this dataset; its splits are "
                        f"{names}")
    return loaded[split]


def _iter_hf_dataset(path: Path, split: str | None, keys: tuple[str, str] = ("subset", "split")
                     ) -> Iterator[tuple[int, Row]]:
    datasets = _import_datasets(f"{path}: a Hugging Face `datasets` folder")
    try:
        loaded = datasets.load_from_disk(str(path))
    except (ValueError, OSError, KeyError, TypeError) as err:
        # datasets' own message names neither the folder nor which of its files is bad.
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"{path}: unreadable Hugging Face `save_to_disk` folder ({reason})") from None
    yield from enumerate(_one_split(loaded, str(path), split, keys))


def _iter_load_dataset(name: str, subset: str | None, split: str | None,
                       keys: tuple[str, str]) -> Iterator[tuple[int, Row]]:
    """Rows of `datasets.load_dataset(name, subset, split=split)`: a Hub id, or a local snapshot
    folder whose README.md declares its configs. Several configs or splits and none chosen: a
    DataError naming them and the key to choose with (`keys`: subset's and split's)."""
    datasets = _import_datasets(f"{name}: a dataset read by `datasets.load_dataset`")
    try:
        configs = list(datasets.get_dataset_config_names(name))
    except Exception as err:  # network, missing repo, unreadable README: datasets raises many types
        raise DataError(f"{name}: not a local file or folder, and `datasets` cannot read it as a dataset "
                        f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
    if subset is None and len(configs) > 1:
        raise DataError(f"{name}: holds {len(configs)} configs (subsets) {sorted(configs)}; choose one "
                        f"with {keys[0]}")
    if subset is not None and configs and subset not in configs:
        raise DataError(f"{name}: {keys[0]}={subset!r} is not a config of this dataset; its configs are "
                        f"{sorted(configs)}")
    try:
        loaded = datasets.load_dataset(name, subset)
    except Exception as err:
        raise DataError(f"{name}: `datasets.load_dataset` failed ({type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''})") from None
    yield from enumerate(_one_split(loaded, name, split, keys))


def declares_configs(path: Path) -> bool:
    """A dataset folder whose README.md front matter declares `configs:` (a Hub snapshot):
    `datasets.load_dataset` reads it by those declarations."""
    readme = path / "README.md"
    if not readme.is_file():
        return False
    lines = readme.read_text(encoding="utf-8", errors="replace").splitlines()
    if not lines or lines[0].strip() != "---":
        return False
    for line in lines[1:]:
        if line.strip() == "---":
            return False
        if line.startswith("configs:"):
            return True
    return False


# A Hugging Face Hub id ("openai/gsm8k") given where no local path of that name exists; a name
# ending in a data file's suffix is a missing file, not an id.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def is_hub_id(text: str) -> bool:
    """`owner/name`, not ending in a data file suffix (`data/train.jsonl` is a missing file), whose
    `owner` is no local folder (`data/gsm8k` with a `data/` here is a mistyped local path, not a
    reason to ask the Hub)."""
    return (bool(_HUB_ID.match(text)) and not text.lower().endswith(FILE_SUFFIXES)
            and not Path(text.split("/", 1)[0]).is_dir())


def _file_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    suffix = path.suffix.lower()
    for name, suffixes in FORMAT_SUFFIXES.items():
        if suffix in suffixes:
            return name
    raise DataError(
        f"{path}: unsupported file type {suffix!r}; supported: {', '.join(FILE_SUFFIXES)} "
        "(or name the format with format=...)"
    )


def _iter_file(path: Path, fmt: str) -> Iterator[tuple[int, Row]]:
    fmt = _file_format(path, fmt)
    if fmt == "jsonl":
        return _iter_jsonl(path)
    if fmt == "json":
        return _iter_json(path)
    if fmt == "parquet":
        return _iter_parquet(path)
    if fmt in ("csv", "tsv"):
        return _iter_csv(path, "\t" if fmt == "tsv" else ",")
    raise DataError(f"{path}: format {fmt!r} reads a folder saved by `datasets`, not a file")


def is_hf_dataset_dir(path: Path) -> bool:
    """A folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk`."""
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def data_files(root: Path, split: str | None = None, fmt: str = "auto", subset: str | None = None,
               keys: tuple[str, str] = ("subset", "split")) -> list[Path]:
    """Data files under a folder (of one format, or any supported), sorted, of one config and one
    split (`scalerl.data.layout`: a folder holding several is refused unless they are chosen)."""
    suffixes = FILE_SUFFIXES if fmt == "auto" else FORMAT_SUFFIXES[fmt]
    found = sorted(
        p for p in root.rglob("*")
        if p.is_file() and p.suffix.lower() in suffixes and not any(
            part.startswith(".") for part in p.relative_to(root).parts
        )
    )
    if not found:
        raise DataError(f"{root}: no {'/'.join(suffixes)} files in this folder")
    try:
        return choose(root, group_files(root, found), subset, split, keys)
    except ValueError as err:
        raise DataError(str(err)) from None


def _sources(
    path: Path, split: str | None, fmt: str, subset: str | None = None,
    keys: tuple[str, str] = ("subset", "split"),
) -> Iterator[tuple[Path, str, Iterable[tuple[int, Row]]]]:
    """(file shown in `source`, id prefix for rows without an id, rows) for each file to read."""
    if path.is_dir():
        if fmt == "hf" or (fmt == "auto" and is_hf_dataset_dir(path)):
            if not is_hf_dataset_dir(path):
                raise DataError(f"{path}: format 'hf' needs a folder written by `save_to_disk`")
            if subset is not None:
                raise DataError(f"{path}: {keys[0]}={subset!r}: a `save_to_disk` folder has no configs "
                                f"(unset {keys[0]})")
            yield path, path.name, _iter_hf_dataset(path, split, keys)
            return
        if fmt == "auto" and declares_configs(path):
            yield path, path.name, _iter_load_dataset(str(path), subset, split, keys)
            return
        for file in data_files(path, split, fmt, subset, keys):
            rel = file.relative_to(path)
            yield file, str(rel.with_suffix("")), _iter_file(file, fmt)
        return
    if subset is not None or split is not None:
        raise DataError(f"{path}: a single file has no configs or splits (unset {keys[0]} / {keys[1]})")
    yield path, path.stem, _iter_file(path, fmt)


def load_prompts(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    field_map: Mapping[str, str] | None = None,
    default_task: str | None = None,
    split: str | None = None,
    format: str = "auto",
    on_error: OnError = "error",
    gold_free_tasks: Collection[str] = (),
    subset: str | None = None,
    keys: tuple[str, str] = ("subset", "split"),
) -> LoadResult:
    """Load prompt records from a file, a folder, a list of them, or a dataset id.

    `path`: a data file; a folder of data files (one config and one split of it,
    `scalerl.data.layout`); a `save_to_disk` folder (a `Dataset`, or one split of a `DatasetDict`);
    a folder whose README.md declares its configs (a Hub snapshot) or a Hub id, both read by
    `datasets.load_dataset`; or a list of any of these, read in order. `subset` (the config name)
    and `split` choose within a folder or dataset that holds several; one that holds several and
    none chosen is a `DataError` naming them and the key to choose with (`keys`: how the caller
    names subset and split, e.g. `("data.subset", "data.split")`).

    `field_map` maps record fields to column names (`{"prompt": "question", "answer": "solution"}`);
    unmapped record fields are read from the column of the same name, and other columns go into
    `metadata`. `default_task` is used when a row has no task column. `format` ("auto": by
    suffix, or one of `FORMATS`) forces the reader of a file, or the file type read in a folder;
    a benchmark name (`scalerl.data.benchmarks.BENCHMARK_FORMATS`: gsm8k, math, aime, amc,
    humaneval, mbpp) reads files by suffix and their rows in that benchmark's published layout.
    Rows without an id get "<file stem>:N". With `on_error="error"` any bad row raises a
    `DataError` listing all of them; with "skip" they are dropped and counted in
    `LoadResult.rejects`. Rows of a task in `gold_free_tasks` need no `answer` or `tests`
    (`fields.row_to_record`).
    """
    on_error = check_on_error(on_error)
    fmap = check_field_map(field_map)
    if format not in FORMATS:
        raise DataError(f"format: must be one of {FORMATS}, got {format!r}")
    benchmark = format if format in BENCHMARK_FORMATS else None
    if benchmark is not None and fmap:
        raise DataError(f"field_map: format {benchmark!r} reads the benchmark's own columns; "
                        "drop the field map (or use format auto with one)")
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not paths:
        raise DataError("no prompt data path given (an empty list)")
    file_format = "auto" if benchmark is not None else format

    sources: list[tuple[Path, str, Iterable[tuple[int, Row]]]] = []
    for one in paths:
        root = Path(one)
        if root.exists() and not root.is_dir() and not root.is_file():  # a FIFO: reading could block
            raise DataError(f"{root}: not a regular file or folder")
        if root.exists():
            sources.extend(_sources(root, split, file_format, subset, keys))
        elif file_format == "auto" and is_hub_id(str(one)):
            sources.append((root, root.name, _iter_load_dataset(str(one), subset, split, keys)))
        else:
            raise MissingDataError(f"prompt data not found: {root}")
    shown = str(paths[0]) if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} more)"

    records: list[PromptRecord] = []
    first_seen: dict[str, str] = {}
    rejects = RejectLog()
    rows_read = 0
    for file, id_prefix, rows in sources:
        try:
            for n, row in rows:
                rows_read += 1
                where = f"{file}:{n}"
                try:
                    if isinstance(row, RowError):
                        raise row
                    if benchmark is not None:
                        record = row_to_benchmark_record(row, benchmark, fallback_id=f"{id_prefix}:{n}",
                                                         source=where)
                    else:
                        record = row_to_record(
                            row, field_map=fmap, default_task=default_task,
                            fallback_id=f"{id_prefix}:{n}", source=where, gold_free_tasks=gold_free_tasks,
                        )
                    if record.id in first_seen:
                        earlier = first_seen[record.id]
                        raise RowError("duplicate id", f"id {record.id!r} already used at {earlier}")
                except RowError as err:
                    rejects.add(err.reason, where, err.message)
                    continue
                except ValueError as err:  # PromptRecord's own checks
                    rejects.add("bad record", where, str(err))
                    continue
                first_seen[record.id] = where
                records.append(record)
        except UnicodeDecodeError as err:
            raise DataError(f"{file}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        except OSError as err:  # unreadable (permissions, a FIFO's error, EIO): the user's file, named
            raise DataError(f"{file}: cannot read ({err.strerror or err})") from None

    settle(rejects, on_error, shown)
    if not records:
        raise DataError(f"{shown}: no usable prompt rows ({rows_read} read)\n{rejects.summary()}")
    return LoadResult(records=records, rows_read=rows_read, rejects=rejects)


def write_jsonl(records: Iterable[PromptRecord], path: str | os.PathLike[str]) -> Path:
    """Write records as JSON lines in the format `load_prompts` reads back without a field map.

    `source` is not written: it is where a record was read from, and is set again on loading.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for record in records:
            row = {k: v for k, v in record.to_dict().items() if k != "source" and v is not None}
            if not row.get("metadata"):
                row.pop("metadata", None)
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return out


def write_jsonl_atomic(records: Iterable[PromptRecord], path: str | os.PathLike[str]) -> Path:
    """`write_jsonl`, whole or not at all: written beside `path`, then renamed over it."""
    from scalerl.atomic import atomic_path

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out, suffix=".jsonl") as tmp:
        write_jsonl(records, tmp)
    return out
