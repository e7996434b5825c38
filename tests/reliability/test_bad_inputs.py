"""Bad input, one kind per case: exit status 2, one message naming what and where, nothing written.

Each case runs the real command line (`scalerl.cli.main`) in an empty folder holding only the
case's files, and checks

* the exit status is 2 (argparse's own errors included);
* stderr holds exactly one `error:` message, no traceback, and it matches the case's pattern: the
  input named by its config key, flag, file or variable, and where (file:line, key path);
* no file was created, changed or removed (no run directory, no partial output), and neither the
  warm start nor the Hugging Face Hub was reached: every check runs before any work.

`CASES` is the table of docs/reliability.md ("Bad input"); a test keeps the two in step.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import scalerl.assembly.warm_start as ws_mod
from scalerl.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
RUN_CONFIG = "max_steps: 2\nmodel:\n  name_or_path: model\n"


def _corrupt_checkpoint(root: Path) -> None:
    from scalerl.training.checkpoint import write_manifest

    ckpt = root / "run" / "checkpoints" / "step_000003"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"\0" * 64)
    (ckpt / "state.json").write_text('{"step": 3}')
    write_manifest(ckpt)
    (ckpt / "model.safetensors").write_bytes(b"\0" * 63 + b"\1")  # one flipped bit after the save


def _checkpoint(root: Path, run: str = "run", manifest: bool = True) -> None:
    """A complete checkpoint of the run in folder `run` at step 3 (its manifest written or not)."""
    from scalerl.training.checkpoint import write_manifest

    ckpt = root / run / "checkpoints" / "step_000003"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"\0" * 64)
    (ckpt / "config.json").write_text("{}")
    (ckpt / "state.json").write_text('{"step": 3}')
    if manifest:
        write_manifest(ckpt)


def _two_runs(root: Path) -> None:
    _checkpoint(root, "run")
    _checkpoint(root, "other")


# Aliases of aliases: 9 levels of 9, 387 million values once expanded ("billion laughs").
ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 9))
DEEP_ROW = '{"prompt": ' + "[" * 20000 + "]" * 20000 + "}\n"


@dataclass(frozen=True)
class Case:
    kind: str
    group: str
    argv: tuple[str, ...]
    message: str  # a regular expression searched in stderr
    files: dict[str, str | bytes] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None


MODEL = {"model/config.json": "{}"}
TRAIN = ("train", "--output-dir", "out")
ROWS = {"ok.jsonl": '{"prompt": "1+1?", "answer": "2", "task": "math"}\n'}
CURVE = "".join(f'{{"step": {i}, "compute_device_hours": {0.1 * i:.1f}, "val_pass_rate": 0.{i}}}\n'
                for i in range(1, 7))

CASES: list[Case] = [
    # -- config files and overrides
    Case("config-file-missing", "config", (*TRAIN, "-c", "nope.yaml"), r"nope\.yaml: config file not found"),
    Case("config-yaml-syntax", "config", (*TRAIN, "-c", "c.yaml"),
         r"c\.yaml:3:1: invalid YAML: expected ',' or '\]'.*started at line 2, column 7",
         {"c.yaml": "optim:\n  lr: [1\n"}),
    Case("config-not-utf8", "config", (*TRAIN, "-c", "c.yaml"), r"c\.yaml: not UTF-8 text \(byte 13",
         {"c.yaml": b"optim:\n  lr: \xff\n"}),
    Case("config-top-level-not-mapping", "config", (*TRAIN, "-c", "c.yaml"),
         r"c\.yaml:1: top level must be a mapping", {"c.yaml": "- a\n- b\n"}),
    Case("config-unknown-key", "config", (*TRAIN, "-c", "c.yaml"),
         r"c\.yaml:2: optim\.lrr: unknown key \(did you mean 'lr'\?\)", {"c.yaml": "optim:\n  lrr: 1\n"}),
    Case("config-wrong-type", "config", (*TRAIN, "-c", "c.yaml"),
         r"c\.yaml:3: optim\.lr: Input should be a valid number.*'abc'",
         {"c.yaml": "seed: 1\noptim:\n  lr: abc\n"}),
    Case("config-sandbox-unknown-key", "config", (*TRAIN, "-c", "c.yaml"),
         r"c\.yaml:3: rewards\.sandbox\.memroy_mb: unknown key \(did you mean 'memory_mb'\?\)",
         {"c.yaml": "rewards:\n  sandbox:\n    memroy_mb: 256\n"}),
    Case("override-without-equals", "config", (*TRAIN, "optim.lr"),
         r"override 'optim\.lr': expected key\.path=value"),
    Case("override-unknown-key", "config", (*TRAIN, "optim.lrr=1"),
         r"override 'optim\.lrr=1': optim\.lrr: unknown key"),
    Case("override-out-of-range", "config", (*TRAIN, "generation.n=0"),
         r"override 'generation\.n=0': generation\.n: Input should be greater than or equal to 1"),
    Case("override-sandbox-out-of-range", "config", (*TRAIN, "rewards.sandbox.wall_s=0"),
         r"override 'rewards\.sandbox\.wall_s=0': rewards\.sandbox\.wall_s: Input should be greater than 0"),
    Case("override-section-not-mapping", "config", (*TRAIN, "optim=3"),
         r"override 'optim=3': optim: Input should be a valid dictionary"),
    Case("override-bad-choice", "config", (*TRAIN, "data.format=xml"),
         r"override 'data\.format=xml': data\.format: Input should be 'auto'"),
    Case("unknown-recipe", "config", (*TRAIN, "--recipe", "nope"),
         r"unknown recipe 'nope'; known recipes: .*scalerl"),
    Case("task-difficulty-beyond-its-levels", "config",
         (*TRAIN, "data.synthetic.task=code", "data.synthetic.difficulty=[1,6]"),
         r"data\.synthetic\.difficulty: task 'code' has levels 1\.\.5, got \[1, 6\]"),
    Case("tool-task-without-environment", "config",
         (*TRAIN, "data.synthetic.task=tool_math", "agentic.environment=null"),
         r"agentic\.environment: task 'tool_math' is a tool-use task: it needs agentic\.environment=tools"),
    # -- the reward side, built from the config before any work (assembly.inputs.check_verifiers)
    Case("verifier-path-not-importable", "config", (*TRAIN, "rewards.verifiers.mine=nope.nope:f"),
         r"rewards\.verifiers\.mine: verifier path 'nope\.nope:f': cannot import module 'nope\.nope'"),
    Case("verifier-not-callable", "config", (*TRAIN, "rewards.verifiers.math=os:sep"),
         r"rewards\.verifiers\.math: verifier 'os:sep': '/' is not callable"),
    Case("task-without-verifier", "config", (*TRAIN, "--data", "chess.jsonl"),
         r"rewards\.verifiers: no verifier for task 'chess' in data\.train_path \(known: code, math\); set "
         r"rewards\.verifiers\.chess=package\.module:function",
         {"chess.jsonl": '{"prompt": "e4?", "answer": "e5", "task": "chess"}\n'}),
    Case("agentic-environment-not-importable", "config", (*TRAIN, "agentic.environment=nope.mod:make"),
         r"error: agentic\.environment path 'nope\.mod:make': cannot import module 'nope\.mod'"),
    Case("agentic-skyrl-not-an-env", "config", (*TRAIN, "agentic.environment=skyrl:os:path"),
         r"agentic\.environment: ('os:path' is not a skyrl_gym BaseTextEnv subclass|'skyrl:\.\.\.' needs "
         r"skyrl-gym)"),
    Case("agentic-unknown-tool", "config", (*TRAIN, "agentic.environment=tools", "agentic.tools=[abacus]"),
         r"agentic\.tools\[0\]: unknown tool 'abacus' \(built-in: calculator, python, search"),
    Case("agentic-tool-twice", "config",
         (*TRAIN, "agentic.environment=tools", "agentic.tools=[calculator,calculator]"),
         r"agentic\.tools\[1\]: a second tool named 'calculator'"),
    Case("agentic-search-without-corpus", "config",
         (*TRAIN, "agentic.environment=tools", "agentic.tools=[search]"),
         r"agentic\.tools\[0\]: the search tool needs agentic\.corpus_path"),
    Case("agentic-corpus-bad-row", "config",
         (*TRAIN, "agentic.environment=tools", "agentic.tools=[search]", "agentic.corpus_path=docs.jsonl"),
         r"agentic\.corpus_path: docs\.jsonl:2: no 'text' string",
         {"docs.jsonl": '{"text": "a"}\n{"nope": 1}\n'}),
    Case("ablate-verifier-not-importable", "config",
         ("ablate", "--loo", "rewards.verifiers.mine=nope.nope:f"),
         r"scalerl ablate: error: rewards\.verifiers\.mine: verifier path 'nope\.nope:f': cannot import"),
    Case("config-file-is-a-directory", "config", (*TRAIN, "-c", "cdir.yaml"),
         r"cdir\.yaml: is a directory, not a config file", {"cdir.yaml/x": "y"}),
    Case("config-file-is-a-fifo", "config", (*TRAIN, "-c", "c.yaml"), r"c\.yaml: not a regular file",
         setup=lambda root: os.mkfifo(root / "c.yaml")),
    Case("config-duplicate-key", "config", (*TRAIN, "-c", "c.yaml"),
         r"c\.yaml:3: optim\.lr: duplicate key \(first at line 2\); keep one of them",
         {"c.yaml": "optim:\n  lr: 1.0e-5\n  lr: 2.0e-5\n"}),
    Case("config-alias-bomb", "config", (*TRAIN, "-c", "c.yaml"),
         r"c\.yaml: the document expands to \d{9} values through its aliases \(more than 100000\)",
         {"c.yaml": ALIAS_BOMB}),
    # -- prompt data, every loader format
    Case("data-missing", "data", (*TRAIN, "--data", "nope.jsonl"),
         r"data\.train_path: nope\.jsonl: no such file or directory"),
    Case("jsonl-invalid-json", "data", (*TRAIN, "--data", "d.jsonl"),
         r"data\.train_path: d\.jsonl: 1 row\(s\) rejected:\n  invalid JSON: 1\n"
         r"    d\.jsonl:2: not valid JSON",
         {"d.jsonl": ROWS["ok.jsonl"] + "{bad\n"}),
    Case("jsonl-missing-prompt", "data", (*TRAIN, "--data", "d.jsonl"),
         r"d\.jsonl:1: no 'prompt' or 'messages' field", {"d.jsonl": '{"question": "a", "answer": "1"}\n'}),
    Case("json-truncated", "data", (*TRAIN, "--data", "d.json"),
         r"data\.train_path: d\.json:1: not valid JSON",
         {"d.json": '[{"prompt": "a", "answer": "1"}, '}),
    Case("json-not-objects", "data", (*TRAIN, "--data", "d.json"),
         r"d\.json:0: expected a JSON object, got int",
         {"d.json": "[1, 2]\n"}),
    Case("csv-ragged-row", "data", (*TRAIN, "--data", "d.csv"), r"d\.csv:2: 1 cells but the header has 2",
         {"d.csv": 'prompt,answer\n"a,1\n'}),
    Case("tsv-ragged-row", "data", (*TRAIN, "--data", "d.tsv"), r"d\.tsv:2: 1 cells but the header has 2",
         {"d.tsv": "prompt\tanswer\nhello\n"}),
    Case("parquet-corrupt", "data", (*TRAIN, "--data", "d.parquet"),
         r"data\.train_path: d\.parquet: unreadable Parquet file", {"d.parquet": b"not parquet"}),
    Case("hf-dataset-folder-corrupt", "data", (*TRAIN, "--data", "ds"),
         r"data\.train_path: ds: unreadable Hugging Face `save_to_disk` folder",
         {"ds/state.json": "{bad", "ds/dataset_info.json": "{bad"}),
    Case("data-unsupported-file-type", "data", (*TRAIN, "--data", "d.txt"),
         r"data\.train_path: d\.txt: unsupported file type '\.txt'", {"d.txt": "x"}),
    Case("data-empty-file", "data", (*TRAIN, "--data", "d.jsonl"),
         r"data\.train_path: d\.jsonl: no usable prompt rows \(0 read\)", {"d.jsonl": ""}),
    Case("data-folder-without-files", "data", (*TRAIN, "--data", "dir"),
         r"data\.train_path: dir: no \.jsonl/.* files in this folder", {"dir/README": "x"}),
    Case("eval-extra-set-missing", "data", (*TRAIN, "eval.extra_sets={hard: hard.jsonl}"),
         r"eval\.extra_sets\.hard: hard\.jsonl: no such file"),
    Case("template-prompts-too-long", "data", (*TRAIN, "data.template=r1"),
         r"data\.max_prompt_tokens=256 with data\.template=r1: prompt tokenization: \d+ row\(s\) rejected:\n"
         r"  prompt too long: \d+"),
    Case("data-check-bad-rows", "data", ("data", "check", "d.jsonl"),
         r"d\.jsonl: 1 row\(s\) rejected:\n  missing answer: 1\n"
         r"    d\.jsonl:1: task 'math' needs a gold answer",
         {"d.jsonl": '{"prompt": "a"}\n'}),
    Case("benchmark-row-bad-field", "data", (*TRAIN, "--data", "g.jsonl", "data.format=gsm8k"),
         r"data\.train_path: g\.jsonl: 1 row\(s\) rejected:\n  bad answer: 1\n"
         r"    g\.jsonl:1: field 'answer': no '#### <answer>' line \(GSM8K's layout\)",
         {"g.jsonl": '{"question": "How many?", "answer": "Three."}\n'}),
    Case("reasoning-gym-unknown-dataset", "data", (*TRAIN, "data.source=reasoning_gym:leg_countin"),
         r"data\.source=reasoning_gym:leg_countin \(options: data\.reasoning_gym\.config\): no "
         r"reasoning-gym dataset 'leg_countin'; did you mean leg_counting"),
    Case("decontaminate-output-exists", "data",
         ("data", "decontaminate", "ok.jsonl", "--against", "ok.jsonl", "--out", "ok.jsonl"),
         r"--out ok\.jsonl: exists; decontaminate never replaces a file", ROWS),
    Case("data-check-not-utf8", "data", ("data", "check", "d.jsonl"), r"d\.jsonl: not UTF-8 text",
         {"d.jsonl": b'{"prompt": "\xff", "answer": "1"}\n'}),
    Case("data-check-fifo", "data", ("data", "check", "p.jsonl"), r"p\.jsonl: not a regular file or folder",
         setup=lambda root: os.mkfifo(root / "p.jsonl")),
    Case("jsonl-nested-too-deep", "data", (*TRAIN, "--data", "d.jsonl"),
         r"data\.train_path: d\.jsonl: 1 row\(s\) rejected:\n  invalid JSON: 1\n    d\.jsonl:2: nested too "
         r"deeply to parse", {"d.jsonl": ROWS["ok.jsonl"] + DEEP_ROW}),
    Case("heldout-leaves-no-training-prompts", "data", (*TRAIN, "--data", "ok.jsonl"),
         r"data\.heldout_size: 64 held-out prompts leave none of the 1 usable prompt\(s\) of "
         r"data\.train_path ok\.jsonl for training", ROWS),
    # -- model and tokenizer
    Case("model-folder-missing", "model", (*TRAIN, "--model", "./nope"),
         r"model\.name_or_path: \./nope: no such directory"),
    Case("model-folder-without-config", "model", (*TRAIN, "--model", "m"),
         r"model\.name_or_path: m: folder has no config\.json", {"m/weights.bin": "x"}),
    Case("model-path-is-a-file", "model", (*TRAIN, "--model", "m.bin"),
         r"model\.name_or_path: m\.bin is a file", {"m.bin": "x"}),
    Case("model-config-invalid-json", "model", (*TRAIN, "--model", "m"),
         r"model\.name_or_path: m/config\.json:1:2: not valid JSON", {"m/config.json": "{bad"}),
    Case("tokenizer-folder-missing", "model", (*TRAIN, "--model", "model", "model.tokenizer=./tok"),
         r"model\.tokenizer: \./tok: no such directory", MODEL),
    # -- run directories and checkpoints
    Case("output-dir-is-a-file", "run", ("train", "--output-dir", "f", "--model", "model"),
         r"output_dir: f is a file; expected a run directory", {"f": "x", **MODEL}),
    Case("output-dir-under-a-file", "run", ("train", "--output-dir", "f/run", "--model", "model"),
         r"output_dir: f/run is under f, which is a file", {"f": "x", **MODEL}),
    Case("output-dir-holds-a-run", "run", ("train", "--output-dir", "run", "--model", "model"),
         r"output_dir: run already holds a run \(metrics\.jsonl\); pass --resume",
         {"run/metrics.jsonl": "", **MODEL}),
    Case("sandbox-isolation-unavailable", "run",
         (*TRAIN, "--data", "d.jsonl", "rewards.sandbox.unshare=/nonexistent/unshare"),
         r"rewards\.sandbox\.isolation: 'auto' cannot be had here \(no namespace mode works here: "
         r"(?:namespaces|userns): cannot start /nonexistent/unshare.*needed for the code task in "
         r"data\.train_path; .*rewards\.sandbox\.isolation=none",
         {"d.jsonl": '{"prompt": "Double n.", "task": "code", "tests": [{"stdin": "2", "stdout": "4"}]}\n'}),
    Case("output-dir-not-ours", "run", ("train", "--output-dir", "mine", "--model", "model"),
         r"--output-dir: mine is not empty and was not made by scalerl \(no \.scalerl-owner\.json\)",
         {"mine/notes.txt": "mine", **MODEL}),
    Case("output-dir-of-another-command", "run", ("train", "--output-dir", "s", "--model", "model"),
         r"--output-dir: s is not empty and holds the output of `scalerl sft`",
         {"s/.scalerl-owner.json": '{"kind": "sft"}', "s/config.json": "{}", **MODEL}),
    Case("sft-output-not-ours", "run", ("sft", "--output", "mine"),
         r"--output: mine is not empty and was not made by scalerl", {"mine/notes.txt": "mine"}),
    Case("demo-output-not-ours", "run", ("demo", "--output-dir", "mine"),
         r"--output-dir: mine is not empty and was not made by scalerl", {"mine/notes.txt": "mine"}),
    Case("ablate-output-not-ours", "run", ("ablate", "--loo", "--output-dir", "mine"),
         r"--output-dir: mine is not empty and was not made by scalerl", {"mine/notes.txt": "mine"}),
    Case("output-file-exists", "run", ("data", "synth", "--n", "3", "--out", "ok.jsonl"),
         r"--out ok\.jsonl: exists; pass --overwrite to replace it", ROWS),
    Case("plot-file-exists", "run", ("fit", "m.jsonl", "--plot", "p.png"),
         r"--plot p\.png: exists; pass --overwrite to replace it", {"m.jsonl": CURVE, "p.png": "mine"}),
    Case("watch-plot-file-exists", "run", ("watch", "m.jsonl", "--once", "--plot", "p.png"),
         r"--plot p\.png: exists; pass --overwrite to replace it", {"m.jsonl": CURVE, "p.png": "mine"}),
    Case("output-folder-unwritable", "run",
         ("data", "synth", "--n", "3", "--out", "/proc/scalerl-nope/x.jsonl"),
         r"--out /proc/scalerl-nope/x\.jsonl: cannot write \(/proc/scalerl-nope: No such file or "
         r"directory\)"),
    Case("resume-without-a-run", "run", (*TRAIN, "--resume"),
         r"--resume: out holds no run to resume \(no config\.yaml\)"),
    Case("resume-checkpoint-missing", "checkpoint", (*TRAIN, "--resume", "run/checkpoints/step_000009"),
         r"--resume: checkpoint run/checkpoints/step_000009 not found"),
    Case("resume-checkpoint-corrupt", "checkpoint",
         ("train", "--output-dir", "run", "--resume", "run/checkpoints/step_000003"),
         r"run/checkpoints/step_000003/model\.safetensors: SHA-256 differs from manifest\.json",
         {"run/config.yaml": RUN_CONFIG, **MODEL}, setup=_corrupt_checkpoint),
    Case("eval-not-a-checkpoint", "checkpoint", ("eval", "./ck"),
         r"ck: neither a run directory \(config\.yaml\) nor a saved model", {"ck/state.json": "{}"}),
    Case("resume-checkpoint-of-another-run", "checkpoint",
         ("train", "--output-dir", "run", "--resume", "other/checkpoints/step_000003"),
         r"--resume: other/checkpoints/step_000003 belongs to the run in other, not to the run in run; .*"
         r"--resume-from-other", {"run/config.yaml": RUN_CONFIG, "other/config.yaml": RUN_CONFIG, **MODEL},
         setup=_two_runs),
    Case("resume-from-other-into-a-run", "checkpoint",
         ("train", "--output-dir", "run", "--resume", "other/checkpoints/step_000003", "--resume-from-other"),
         r"--resume-from-other: run already holds a run \(config\.yaml\)",
         {"run/config.yaml": RUN_CONFIG, "other/config.yaml": RUN_CONFIG, **MODEL}, setup=_two_runs),
    Case("resume-checkpoint-unverified", "checkpoint",
         ("train", "--output-dir", "run", "--resume", "run/checkpoints/step_000003"),
         r"run/checkpoints/step_000003/manifest\.json: missing, so the checkpoint's files cannot be "
         r"verified.*pass --trust-unverified", {"run/config.yaml": RUN_CONFIG, **MODEL},
         setup=lambda root: _checkpoint(root, manifest=False)),
    Case("export-checkpoint-unverified", "checkpoint",
         ("export", "run/checkpoints/step_000003", "--out", "m2"),
         r"run/checkpoints/step_000003/manifest\.json: missing.*pass --trust-unverified",
         {"run/config.yaml": RUN_CONFIG, **MODEL}, setup=lambda root: _checkpoint(root, manifest=False)),
    Case("resume-changes-a-frozen-key", "checkpoint",
         ("train", "--output-dir", "run", "--resume", "run/checkpoints/step_000003", "seed=5"),
         r"--resume: seed: 0 -> 5: cannot change in a resumed run \(run/config\.yaml holds the run's "
         r"config\)",
         {"run/config.yaml": RUN_CONFIG, **MODEL}, setup=_checkpoint),
    # -- metrics files given to fit / compare
    Case("fit-path-missing", "metrics", ("fit", "nope"), r"nope: no such file or directory"),
    Case("fit-not-a-run-directory", "metrics", ("fit", "dir"),
         r"dir: not a scalerl run directory \(no metrics",
         {"dir/notes.txt": "x"}),
    Case("fit-malformed-jsonl", "metrics", ("fit", "m.jsonl"), r"m\.jsonl:2: malformed JSON",
         {"m.jsonl": CURVE.splitlines()[0] + "\n{bad\n"}),
    Case("fit-csv-not-a-number", "metrics", ("fit", "m.csv"),
         r"m\.csv:3: compute_device_hours = 'abc' is not",
         {"m.csv": "step,compute_device_hours,val_pass_rate\n1,0.1,0.2\n2,abc,0.3\n"}),
    Case("fit-no-reward-column", "metrics", ("fit", "m.csv"), r"m\.csv: none of the default y columns",
         {"m.csv": "step,compute_device_hours\n1,0.1\n"}),
    Case("fit-named-column-missing", "metrics", ("fit", "m.jsonl", "--x", "nope"),
         r"m\.jsonl: no x column 'nope' \(have: ", {"m.jsonl": CURVE}),
    Case("fit-too-few-points", "metrics", ("fit", "m.jsonl"), r"only 1 point\(s\) .* a fit needs at least 4",
         {"m.jsonl": CURVE.splitlines()[0] + "\n"}),
    Case("compare-malformed-run", "metrics", ("compare", "a.jsonl", "b.jsonl"), r"b\.jsonl:1: malformed JSON",
         {"a.jsonl": CURVE, "b.jsonl": "{bad\n"}),
    Case("fit-binary-file", "metrics", ("fit", "m.jsonl"),
         r"m\.jsonl: not UTF-8 text \(invalid start byte\): a binary file\?",
         {"m.jsonl": b"\x7fELF\x02\x01\x01\x00" + bytes(range(256))}),
    Case("fit-value-overflows", "metrics", ("fit", "m.jsonl"),
         r"m\.jsonl:2: compute_device_hours = 1e\+308 is beyond 1e\+300: .* rescale the column",
         {"m.jsonl": CURVE.splitlines()[0]
          + '\n{"step": 2, "compute_device_hours": 1e308, "val_pass_rate": 0.3}\n'}),
    Case("fit-nested-too-deep", "metrics", ("fit", "m.jsonl"),
         r"m\.jsonl:1: malformed JSON \(nested too deeply to parse\)", {"m.jsonl": DEEP_ROW}),
    # -- command-line arguments
    Case("cli-unknown-option", "cli", (*TRAIN, "--frobnicate"), r"unrecognized arguments: --frobnicate"),
    Case("cli-not-an-integer", "cli", (*TRAIN, "--max-steps", "x"),
         r"argument --max-steps: invalid int value"),
    Case("cli-max-steps-out-of-range", "cli", (*TRAIN, "--max-steps", "-1"),
         r"override 'max_steps=-1': max_steps: Input should be greater than or equal to 1"),
    Case("cli-device-unknown", "cli", (*TRAIN, "--device", "foo"), r"--device: 'foo' is not a torch device"),
    Case("cli-device-absent", "cli", (*TRAIN, "--device", "cuda:7"),
         r"--device: cuda:7: (CUDA is not available|this machine has \d+ CUDA device)"),
    Case("cli-device-unknown-sft", "cli", ("sft", "--device", "foo"),
         r"--device: 'foo' is not a torch device"),
    Case("cli-device-unknown-eval", "cli", ("eval", "model", "--device", "foo"),
         r"--device: 'foo' is not a torch device", MODEL),
    Case("cli-device-unknown-difficulty", "cli",
         ("data", "difficulty", "ok.jsonl", "--model", "model", "--out", "r.jsonl", "--device", "foo"),
         r"--device: 'foo' is not a torch device", {**ROWS, **MODEL}),
    Case("cli-device-unknown-ablate", "cli", ("ablate", "--loo", "--device", "foo"),
         r"--device: 'foo' is not a torch device"),
    Case("cli-device-unknown-demo", "cli", ("demo", "--device", "foo"),
         r"--device: 'foo' is not a torch device"),
    Case("cli-bad-field-map", "cli", ("data", "check", "ok.jsonl", "--field-map", "promptquestion"),
         r"argument --field-map: expected FIELD=COLUMN", ROWS),
    Case("cli-pass-rate-reversed", "cli",
         ("data", "curate", "ok.jsonl", "--pass-rate", "0.9", "0.1", "--out", "o.jsonl"),
         r"--pass-rate 0\.9 0\.1: LO is above HI", ROWS),
    # -- environment variables
    Case("env-cache-dir-is-a-file", "env", TRAIN,
         r"environment variable SCALERL_CACHE_DIR: .*/f is a file; expected a cache folder", {"f": "x"},
         env={"SCALERL_CACHE_DIR": "{tmp}/f"}),
    Case("env-offline-uncached-model", "env", (*TRAIN, "--model", "someone/not-cached-model"),
         r"model\.name_or_path: 'someone/not-cached-model' is not a local folder and not in the Hugging Face "
         r"cache \(offline mode is on\)", env={"HF_HUB_OFFLINE": "1"}),
]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else (-1, 0)
            for p in root.rglob("*")}


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the warm start nor the Hub may be reached: every check must come first."""
    import huggingface_hub

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("work started before the inputs were checked")

    monkeypatch.setattr(ws_mod, "warm_start_default", refuse)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", refuse)


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize("case", CASES, ids=[c.kind for c in CASES])
def test_bad_input_exits_2_with_one_message_and_writes_nothing(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, content in case.files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    if case.setup is not None:
        case.setup(tmp_path)
    for var, value in case.env.items():
        monkeypatch.setenv(var, value.format(tmp=tmp_path))
    before = _tree(tmp_path)
    try:
        status = main(list(case.argv))
    except SystemExit as exit_:  # argparse
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err, err
    assert len(re.findall(r"^scalerl[\w ]*: error: ", err, flags=re.MULTILINE)) == 1, err
    assert re.search(case.message, err), f"{case.message!r} not in:\n{err}"
    assert _tree(tmp_path) == before, "files were created, changed or removed"


def test_the_docs_table_lists_every_case() -> None:
    rows = re.findall(r"^\| *`([a-z0-9-]+)` *\|", DOC.read_text(), flags=re.MULTILINE)
    assert rows == [c.kind for c in CASES]
    assert len(CASES) >= 25 and len({c.kind for c in CASES}) == len(CASES)
    groups = {"config", "data", "model", "run", "checkpoint", "metrics", "cli", "env"}
    assert {c.group for c in CASES} == groups

