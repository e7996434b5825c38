"""Every script in `benchmarks/` runs from a clean checkout: each one in a subprocess, the way a user
runs it (this interpreter, the repository root as working directory), in its smallest mode, and its
printed results are checked (exit status, the ratio lines, numbers that parse and are consistent with
each other), not only that it ran.

Speed ratios themselves are not asserted against their targets: on a shared CI machine they measure
the load. What is asserted is what does not depend on timing (agreement of results, token and sample
counts, slot occupancy, version lags) plus "positive and finite" for the timed numbers.

Every subprocess gets `SCALERL_CACHE_DIR` in a temporary directory (the SFT warm starts are cached
there, never in ~/.cache), one OpenMP thread (CI machines are small and shared) and no Hub access
(nothing here may need a download). Cost on a loaded 2-core machine: about ten minutes, hence the
`bench` marker: deselected from `make test`, run by `make test-bench` (which `.ci/run` calls).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
pytestmark = pytest.mark.bench
NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
TESTED = {
    "bench_engine.py",
    "bench_sigmoid_fit.py",
    "bench_pipeline.py",
    "bench_objectives_vs_trl.py",
    "bench_vs_trl.py",
    "predictive_accuracy.py",
    "simulate_scale.py",
    "bench_scaleout.py",
    "hostile_corpus.py",
    "bwrap_jail.py",  # where bubblewrap is installed (test_bwrap_jail_against_ours)
    "band_calibration.py",
    "bench_prefix_cache.py",  # with vLLM: tests/with_vllm/test_vllm_bench.py
    "bench_real_shape.py",
    "bench_step_vs_trl.py",
    "bench_sync_check.py",
    "forecast_calibration.py",
    "bench_lora.py",
    "bench_endpoint.py",
    "bench_distill.py",
    "decision_study.py",
    "first_half_table.py",
}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One scalerl cache for the module: warm starts made by one test are reused by the next."""
    return tmp_path_factory.mktemp("scalerl_cache")


def run_script(name: str, *args: str, cache_dir: Path, timeout: float) -> str:
    """Run `benchmarks/<name>`; fail with its output unless it exits 0; return its stdout."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SCALERL_CACHE_DIR": str(cache_dir),
        "MPLCONFIGDIR": str(cache_dir / "matplotlib"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )
    assert proc.returncode == 0, (
        f"{name} exited with {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-4000:]}"
        f"\n--- stderr (tail)\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


def rate_matches(count: int, seconds: float, rate: float, *, seconds_step: float, rate_step: float) -> bool:
    """A printed rate agrees with its printed count and seconds, each rounded to its step (a fixed
    relative tolerance fails a short run: 0.20 s printed for 0.205 s is 2.5% off)."""
    low = count / (seconds + seconds_step / 2) - rate_step / 2
    high = count / max(seconds - seconds_step / 2, 1e-12) + rate_step / 2
    return low <= rate <= high


def match(pattern: str, text: str) -> re.Match[str]:
    """The first line matching `pattern` (which may use the NUM placeholder `{N}`)."""
    m = re.search(pattern.replace("{N}", NUM), text, flags=re.MULTILINE)
    assert m is not None, f"no line matches {pattern!r} in:\n{text}"
    return m


def positive(x: str) -> float:
    value = float(x)
    assert math.isfinite(value) and value > 0, x
    return value


def test_every_benchmark_script_has_a_test() -> None:
    assert {p.name for p in BENCHMARKS.glob("*.py")} == TESTED


@pytest.mark.timeout(240)
def test_bench_engine_quick(cache_dir: Path) -> None:
    out = run_script("bench_engine.py", "--quick", cache_dir=cache_dir, timeout=210)
    assert "32 prompts, batch 8, max_new_tokens 64" in out
    sides = {}
    for name in ("HF generate\\(\\):", "EmbeddedEngine:"):
        m = match(rf"^{name}\s+(\d+) tokens\s+({{N}}) s\s+({{N}}) tok/s\s+[\w-]+ occupancy ({{N}})$", out)
        tokens, seconds, tps, occupancy = int(m[1]), positive(m[2]), positive(m[3]), float(m[4])
        assert tokens > 0 and 0 < occupancy <= 1
        assert rate_matches(tokens, seconds, tps, seconds_step=1e-2, rate_step=0.1)
        sides[name] = (tps, occupancy)
    ratio = positive(match(r"^throughput ratio \(engine / generate\): ({N})x", out)[1])
    (hf_tps, hf_occ), (eng_tps, eng_occ) = sides.values()
    assert ratio == pytest.approx(eng_tps / hf_tps, rel=0.02, abs=0.01)
    # Occupancy does not depend on timing (same seeds, same sampled lengths): continuous batching keeps
    # its slots busier than static batches that decode until their longest row ends.
    assert eng_occ > hf_occ
    # The vLLM column runs where vLLM is importable (tests/with_vllm checks it) and says why not elsewhere.
    if re.search(r"^VLLMEngine:", out, flags=re.MULTILINE) is None:
        assert match(r"^vLLM column: not run \((.+)\)$", out)[1]


@pytest.mark.timeout(180)
def test_bench_sigmoid_fit_quick(cache_dir: Path) -> None:
    out = run_script("bench_sigmoid_fit.py", "--quick", "--repeats", "1", cache_dir=cache_dir, timeout=150)
    assert "literal = 7100 curve_fit calls" in out
    # Exit status 0 already says the fast fit found the literal grid search's cell; check the lines too.
    m = match(r"-> same cell: (\w+), \|dB\| = ({N})$", out)
    assert m[1] == "True" and float(m[2]) <= 1e-3
    assert positive(match(r"speed ratio literal / fast: ({N})x\s+agreement: OK$", out)[1]) > 1
    lo, hi = match(r"^1000 bootstrap refits .*; A 95% interval \[({N}), ({N})\]$", out).groups()
    assert 0 < float(lo) < float(hi) < 1
    m = match(r"^speed ratio: min ({N})x, median ({N})x; all cells agree: (\w+)$", out)
    assert positive(m[1]) > 1 and positive(m[2]) > 1 and m[3] == "True"


@pytest.mark.timeout(240)
def test_bench_pipeline_quick(cache_dir: Path) -> None:
    out = run_script("bench_pipeline.py", "--quick", cache_dir=cache_dir, timeout=210)
    lags, samples_per_s = {}, {}
    for mode, k in (("sync", 1), ("ppo_offpolicy", 8), ("pipeline", 8)):
        m = match(rf"^\s*{mode} k={k}: (\d+) steps in\s+({{N}})s\s+({{N}}) samples/s\s+({{N}}) gen tok/s\s+"
                  rf"idle\s+({{N}})%\s+lag mean ({{N}}) max (\d+)$", out)
        assert int(m[1]) == 16  # --quick: 16 optimizer steps per mode
        assert positive(m[2]) and positive(m[4])
        samples_per_s[mode] = positive(m[3])
        assert 0 <= float(m[5]) <= 100
        lags[mode] = (float(m[6]), int(m[7]))
    assert "\nratios to sync:\n" in out
    for mode, k in (("sync", 1), ("ppo_offpolicy", 8), ("pipeline", 8)):
        ratio = match(rf"^\s*{mode} k={k}: samples/s x\s*({{N}})\s+generator idle x\s*(\S+)$", out)
        expected = samples_per_s[mode] / samples_per_s["sync"]
        assert positive(ratio[1]) == pytest.approx(expected, rel=0.01, abs=0.006)
    # Version lags follow from the schedules, not from timing: sync trains on the current policy,
    # ppo_offpolicy on rounds of k=8 steps generated by one policy (lags 0..7), the pipeline within max_lag.
    assert lags["sync"] == (0.0, 0)
    assert lags["ppo_offpolicy"] == (3.5, 7)
    assert 0 <= lags["pipeline"][0] <= lags["pipeline"][1] <= 8


ROW = re.compile(
    rf"^(?P<case>\S.*?)\s+(?P<ours>{NUM})\s+(?P<trl>{NUM})\s+(?P<dv>{NUM})\s+(?:(?P<dg>{NUM})\s+)?"
    r"(?P<ok>yes|NO|differs by definition)$"
)


@pytest.mark.timeout(240)
def test_bench_objectives_vs_trl_agree(cache_dir: Path) -> None:
    pytest.importorskip("trl")
    out = run_script("bench_objectives_vs_trl.py", cache_dir=cache_dir, timeout=210)
    assert match(r"^TRL (\S+) \(transformers", out)
    rows: dict[str, list[re.Match[str]]] = {}
    section, tolerance = "", math.nan
    for line in out.splitlines():
        if head := re.match(rf"^(Losses, float\d+|Advantages, float32) .*\(tolerance ({NUM})", line):
            section, tolerance = head[1], float(head[2])
            rows[section] = []
        elif (row := ROW.match(line)) is not None:
            assert section, line
            rows[section].append(row)
            if row["ok"] == "differs by definition":
                continue
            # The printed max differences: tiny, within the dtype's tolerance (relative to |loss| >= 1).
            scale = max(1.0, abs(float(row["ours"])))
            assert row["ok"] == "yes", line
            assert float(row["dv"]) <= tolerance * scale, line
            if row["dg"] is not None:
                assert float(row["dg"]) <= tolerance * scale, line
    assert set(rows) == {"Losses, float64", "Losses, float32", "Advantages, float32"}
    assert len(rows["Losses, float64"]) == len(rows["Losses, float32"]) == 8  # every loss case, both dtypes
    assert all(r["dg"] is not None for r in rows["Losses, float64"] + rows["Losses, float32"])
    adv = {r["case"].strip(): r for r in rows["Advantages, float32"]}
    assert {k: r["ok"] for k, r in adv.items()} == {
        "advantages, group scaling": "yes", "advantages, none scaling": "yes",
        "advantages, batch scaling": "differs by definition",
    }
    # The known batch-scaling difference is one factor for the whole batch, printed with its spread.
    m = match(r"scalerl = ({N}) x TRL on every sample \(spread ({N})\)", out)
    assert positive(m[1]) > 1 and float(m[2]) < 1e-5
    assert float(adv["advantages, batch scaling"]["ours"]) == pytest.approx(
        float(m[1]) * float(adv["advantages, batch scaling"]["trl"]), rel=1e-4)
    assert "all agreeing cases within tolerance" in out and "MISMATCH" not in out


@pytest.mark.timeout(420)
def test_bench_vs_trl_smoke(cache_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    out_json = tmp_path / "vs_trl.json"
    # A 2-step warm start, one step per side and clock budgets of a second, one sample per held-out
    # prompt, one snapshot per side (the final one): every code path of the comparison, in about 30 s.
    out = run_script(
        "bench_vs_trl.py", "--sft-steps", "2", "--budget-s", "1", "--sync-budget-s", "1", "--eval-k", "1",
        "--eval-every-s", "1000", "--threads", "1", "--json", str(out_json),
        cache_dir=cache_dir, timeout=390,
    )
    assert match(r"^TRL \S+, transformers \S+, torch \S+, 1 threads", out)
    assert match(r"budgets \(a\) 1s \(b\) 1s per side; eval mean@1, length control none$", out)
    for part_header in ("(a) matched synchronous GRPO", "(b) best recipes: held-out mean@k"):
        assert part_header in out
    for side in ("scalerl", "TRL"):
        # Part (a): side, steps, train s, samples/s, w/o 1st ('-' after one step), step s, gen tok/s, ...
        m = match(rf"^{side}\s+(\d+)\s+({{N}})\s+({{N}})\s+(\S+)\s+({{N}})\s+({{N}})\s+({{N}})"
                  r"\s+({N})", out)
        assert int(m[1]) >= 1 and all(positive(m[i]) for i in (2, 3, 5, 6, 7))
        assert 0 <= float(m[8]) <= 1
        assert match(rf"^  {side}\s+0:({{N}})(?:\s+\d+:{{N}})+$", out)  # (b) curve: start, then snapshots
    ratios = match(r"^ratio scalerl / TRL: samples/s x({N}) \(without the first step x(\S+); "
                   r"median step time x({N})\), generated tokens/s x({N})$", out)
    assert all(positive(ratios[i]) for i in (1, 3, 4))
    assert match(r"^time to target, TRL / scalerl: first .+, smoothed \(trailing mean of 3\) .+$", out)
    assert match(r"^final pass rate at equal training clock, scalerl / TRL: last x\S+", out)

    data = json.loads(out_json.read_text())
    assert data["args"]["sft_steps"] == 2 and data["eval"]["k"] == 1 and data["threads"] == 1
    model = Path(data["model_path"])
    assert model.parent == cache_dir / "sft"  # the warm start lives in SCALERL_CACHE_DIR
    assert json.loads((model / "sft_info.json").read_text())["sft"]["steps"] == 2
    assert data["summary"]["a"]["samples_per_s_ratio"] == pytest.approx(float(ratios[1]), abs=0.006)
    sides = data["sides"]
    assert set(sides) == {"a/scalerl", "a/TRL", "b/scalerl", "b/TRL"}
    # (a) is matched: both sides train B x n = 8 x 8 samples per optimizer step.
    for key in ("a/scalerl", "a/TRL"):
        assert sides[key]["steps"] >= 1 and sides[key]["samples_trained"] == 64 * sides[key]["steps"]
    for key, side in sides.items():
        assert side["threads"] == [1], key
        curve = side["curve"]
        assert curve[0]["step"] == 0 and curve[0]["pass_rate"] == sides["a/scalerl"]["curve"][0]["pass_rate"]
        assert len(curve) >= 2 and all(0 <= p["pass_rate"] <= 1 for p in curve), key


@pytest.fixture(scope="module")
def warm_start(cache_dir: Path) -> Path:
    """A 2-step SFT warm start of the tiny default (the script's own default is the 400-step one)."""
    from scalerl.assembly.run import resolve_run_config
    from scalerl.assembly.warm_start import warm_start_default
    from scalerl.training.sft import SFTConfig

    cfg = resolve_run_config("scalerl", [], ["seed=0"])
    return warm_start_default(cfg, SFTConfig(steps=2, seed=0), cache_dir=cache_dir / "sft")


@pytest.mark.timeout(360)
def test_predictive_accuracy_tiny(cache_dir: Path, tmp_path: Path, warm_start: Path) -> None:
    out_dir = tmp_path / "acc"
    steps = 24  # pipeline-8 front-loads generation FLOPs: 24 small steps leave enough points to fit
    out = run_script(
        "predictive_accuracy.py", "--recipes", "scalerl", "--max-steps", str(steps),
        "--output-dir", str(out_dir), "--bootstrap", "50",
        "eval.every=1", "eval.k=1", "data.heldout_size=8", "pipeline.prompts_per_step=2", "generation.n=4",
        "logging.progress=false", f"model.name_or_path={warm_start}",
        cache_dir=cache_dir, timeout=330,
    )
    m = match(r"^scalerl\s+(\d+)/(\d+)\s+({N})\b.*\s({N})\s+({N})\s+({N})\s+\S+ / \S+\s+(ok|WARN)$", out)
    fitted, points = int(m[1]), int(m[2])
    assert 4 <= fitted < points == steps + 1  # an evaluation before the first step and after each one
    assert match(r"^1 recipe\(s\): mean abs error ({N}), max ({N}); (\d) of 1 within the paper's", out)
    assert f"written to {out_dir / 'accuracy.md'}, {out_dir / 'summary.json'}" in out

    assert "| scalerl |" in (out_dir / "accuracy.md").read_text()
    assert (out_dir / "curves.png").stat().st_size > 0
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["recipes"] == ["scalerl"] and summary["overall"]["n"] == 1
    assert summary["fit"]["n_boot"] == 50
    (run,) = summary["runs"]
    assert run["status"] == "completed" and run["error"] is None
    assert run["abs_error"] == pytest.approx(abs(run["predicted"] - run["observed"]))
    assert run["observed"] == pytest.approx(float(m[4]), abs=6e-4)
    rows = [json.loads(line) for line in (out_dir / "runs" / "scalerl" / "metrics.jsonl").open()]
    assert sum(r.get("kind") == "eval" for r in rows) == points
    assert max(r["step"] for r in rows if r.get("kind") == "step") == steps


# ---------------------------------------------------------------------------------------------- scale-out
SIM_ROW = (r"^\s*{mode} k={k}\s+(\d+) steps\s+({N})s\s+({N}) samples/s\s+({N}) tok/s\s+gen idle\s+({N})%\s+"
           r"occupancy\s+({N})%\s+weight loads\s+({N})%\s+trainer idle\s+({N})%\s+lag mean ({N}) max (\d+) "
           r"\(tokens ({N})\)\s+truncated\s+({N})%$")


@pytest.mark.timeout(180)
def test_simulate_scale_quick(cache_dir: Path) -> None:
    out = run_script("simulate_scale.py", "--quick", cache_dir=cache_dir, timeout=150)
    assert "8 engines x 32 slots (group placement), 8 prompts x 8 samples per step" in out
    rows = {}
    for mode, k in (("sync", 1), ("ppo_offpolicy", 4), ("pipeline", 4)):
        m = match(SIM_ROW.format(mode=mode, k=k, N="{N}"), out)
        assert int(m[1]) == 16
        for i in (5, 6, 7, 8):
            assert 0 <= float(m[i]) <= 100
        rows[mode] = {"sps": positive(m[3]), "idle": float(m[5]), "lag": (float(m[9]), int(m[10]))}
    # A simulation: no timing noise, so the schedules' order and lags are exact properties of the run.
    assert rows["sync"]["lag"] == (0.0, 0) and rows["ppo_offpolicy"]["lag"] == (1.5, 3)
    assert rows["pipeline"]["lag"][0] > 0 and rows["pipeline"]["lag"][1] <= 4
    assert rows["pipeline"]["sps"] > rows["ppo_offpolicy"]["sps"] > rows["sync"]["sps"]
    assert rows["pipeline"]["idle"] < rows["ppo_offpolicy"]["idle"] < rows["sync"]["idle"]
    shares = match(r"^\s*ppo_offpolicy k=4\s+0: ({N})%\s+1: ({N})%\s+2: ({N})%\s+3: ({N})%\s+4:\s+({N})%$",
                   out)
    assert [float(x) for x in shares.groups()] == [25.0, 25.0, 25.0, 25.0, 0.0]
    assert "pipeline max lag" in out and "<= k=4: OK" in out
    for a, b in (("pipeline", "ppo_offpolicy"), ("pipeline", "sync"), ("ppo_offpolicy", "sync")):
        kb = 1 if b == "sync" else 4
        r = match(rf"^{a} k=4 / {b} k={kb}: samples/s x({{N}})\s+generator idle x({{N}})$", out)
        assert float(r[1]) == pytest.approx(rows[a]["sps"] / rows[b]["sps"], rel=0.01, abs=0.006)


@pytest.mark.timeout(180)
def test_simulate_scale_compare_admission_quick(cache_dir: Path) -> None:
    out = run_script("simulate_scale.py", "--quick", "--compare-admission", cache_dir=cache_dir, timeout=150)
    pct5 = r"(\d+)/(\d+)/(\d+)/(\d+)/(\d+)"
    row = (r"^k={k}\s+{rule}\s+({N}) samples/s\s+gen idle\s+({N})%\s+trainer idle\s+({N})%\s+"
           rf"occupancy\s+({{N}})%\s+lag mean\s+({{N}}) pct\s+{pct5}\s+token lag\s+({{N}}) pct\s+{pct5}\s+"
           r"tokens > k\s+({N})%(?:\s+renewed (\d+))?$")
    for k in (1, 2, 4, 8, 16):
        got = {}
        for rule in ("bounded", "deadline", r"deadline\+cap", "partial"):
            m = match(row.format(k=k, rule=rule, N="{N}"), out)
            pct = [int(m[i]) for i in range(6, 11)]
            token_pct = [int(m[i]) for i in range(12, 17)]
            assert pct == sorted(pct) and token_pct == sorted(token_pct)  # percentiles ordered
            assert float(m[5]) <= pct[-1] and float(m[11]) <= token_pct[-1]
            stale = float(m[17])
            if rule == "partial":
                # Partial rollouts bound the segment since a group's last admission: earlier tokens
                # may be older than k, and they are counted, with the groups re-admitted.
                assert 0 <= stale <= 100 and m[18] is not None and int(m[18]) >= 0
                assert stale == 0.0 or token_pct[-1] > k
            else:  # the bound kept, per sample and per token, and nothing counted as stale
                assert pct[-1] <= k and token_pct[-1] <= k and stale == 0.0 and m[18] is None
            got[rule] = (positive(m[1]), float(m[2]))
        if k >= 2:  # the deadline rules idle the generators less than the bounded one
            assert got["deadline"][1] <= got["bounded"][1]
            assert got["partial"][1] <= got["deadline"][1]
        r = match(rf"^k={k}\s+deadline / bounded: samples/s x({{N}})\s+deadline\+cap / bounded: x({{N}})\s+"
                  rf"partial / bounded: x({{N}})\s+partial / deadline: x({{N}})$", out)
        assert float(r[1]) == pytest.approx(got["deadline"][0] / got["bounded"][0], rel=0.01, abs=0.006)
        assert float(r[3]) == pytest.approx(got["partial"][0] / got["bounded"][0], rel=0.01, abs=0.006)
        assert float(r[4]) == pytest.approx(got["partial"][0] / got["deadline"][0], rel=0.01, abs=0.006)
    # A deterministic simulation: at k = 8 renewing the groups the trainer waits for raises samples/s.
    k8 = match(r"^k=8\s+deadline / bounded: .*partial / deadline: x({N})$", out)
    assert float(k8[1]) > 1.0


@pytest.mark.timeout(240)
def test_bench_scaleout_quick(cache_dir: Path) -> None:
    out = run_script("bench_scaleout.py", "--quick", cache_dir=cache_dir, timeout=210)
    sps: dict[tuple[str, int], float] = {}
    for engines in (1, 2, 4):
        for mode, k in (("sync", 1), ("ppo_offpolicy", 2), ("pipeline", 2)):
            m = match(rf"^engines={engines}\s+{mode} k={k}: (\d+) steps in\s+({{N}})s\s+({{N}}) samples/s\s+"
                      rf"idle\s+({{N}})%\s+lag mean ({{N}}) max (\d+)\s+\|\s+simulated\s+({{N}}) samples/s\s+"
                      rf"idle\s+({{N}})%\s+measured/simulated x({{N}})$", out)
            assert int(m[1]) == 4  # --quick: 4 optimizer steps per run
            assert positive(m[3]) == pytest.approx(4 * 8 * 4 / positive(m[2]), rel=0.02)
            assert 0 <= float(m[4]) <= 100 and 0 <= float(m[8]) <= 100
            positive(m[7])
            assert positive(m[9]) == pytest.approx(float(m[3]) / float(m[7]), rel=0.02, abs=0.006)
            lag = (float(m[5]), int(m[6]))
            # Lags follow from the schedules whatever the timing: sync on-policy, ppo_offpolicy-2
            # rounds (lags 0 and 1), the pipeline within max_lag, also with a pool of engines.
            if mode == "sync":
                assert lag == (0.0, 0)
            elif mode == "ppo_offpolicy":
                assert lag == (0.5, 1)
            else:
                assert 0 <= lag[0] <= lag[1] <= 2
            sps[(mode, engines)] = float(m[3])
    for engines in (1, 2, 4):
        m = match(rf"^engines={engines}: ppo_offpolicy/sync x({{N}})\s+pipeline/sync x({{N}})\s+"
                  rf"pipeline/ppo_offpolicy x({{N}})$", out)
        assert float(m[3]) == pytest.approx(sps[("pipeline", engines)] / sps[("ppo_offpolicy", engines)],
                                            rel=0.02, abs=0.006)
    m = match(r"^\s*pipeline k=2: 2 engines x({N})\s+4 engines x({N})$", out)
    assert positive(m[2]) == pytest.approx(sps[("pipeline", 4)] / sps[("pipeline", 1)], rel=0.02, abs=0.006)


@pytest.mark.timeout(240)
def test_bench_scaleout_compare_admission_quick(cache_dir: Path) -> None:
    """Each admission rule through the real pipeline on 1, 2, 4 emulated engines: rows that add up,
    the sample and token lags within k under the strict rules, re-admissions only under partial."""
    out = run_script("bench_scaleout.py", "--quick", "--compare-admission", cache_dir=cache_dir, timeout=210)
    sps: dict[tuple[str, int], float] = {}
    renewals: dict[str, int] = {}
    for rule in ("bounded", "deadline", "partial"):
        for engines in (1, 2, 4):
            m = match(rf"^engines={engines} pipeline/{rule}\s+k=2: (\d+) steps in\s+({{N}})s\s+"
                      rf"({{N}}) samples/s\s+idle\s+({{N}})%\s+lag mean ({{N}}) max (\d+)\s+"
                      rf"token lag mean ({{N}}) max (\d+)\s+"
                      rf"renewed (\d+)\s+\|\s+simulated\s+({{N}}) samples/s\s+idle\s+({{N}})%\s+"
                      rf"tokens > k ({{N}})%$", out)
            assert int(m[1]) == 4
            assert positive(m[3]) == pytest.approx(4 * 8 * 4 / positive(m[2]), rel=0.02)
            lag, token_lag, renewed = int(m[6]), int(m[8]), int(m[9])
            assert float(m[5]) <= lag and float(m[7]) <= token_lag
            if rule != "partial":
                assert lag <= 2 and token_lag <= 2 and renewed == 0 and float(m[12]) == 0.0
            sps[(rule, engines)] = float(m[3])
            renewals[rule] = renewals.get(rule, 0) + renewed
    # Half a step fits one engine's 16 slots: under partial the trainer re-admits groups it would wait for.
    assert renewals["partial"] > 0
    for rule in ("bounded", "deadline", "partial"):
        m = match(rf"^pipeline/{rule}\s*: 2 engines x({{N}}) \(({{N}})\)\s+4 engines x({{N}}) \(({{N}})\)$",
                  out)
        assert float(m[3]) == pytest.approx(sps[(rule, 4)] / sps[(rule, 1)], rel=0.02, abs=0.006)
        assert float(m[4]) == pytest.approx(float(m[3]) / 4, abs=0.006)
    for engines in (1, 2, 4):
        m = match(rf"^engines={engines}: deadline/bounded samples/s x({{N}})\s+partial/bounded x({{N}})$",
                  out)
        assert float(m[2]) == pytest.approx(sps[("partial", engines)] / sps[("bounded", engines)],
                                            rel=0.02, abs=0.006)


@pytest.mark.timeout(120)
def test_hostile_corpus_subset(cache_dir: Path) -> None:
    """Three programs (the full corpus runs in tests/rewards/test_sandbox_corpus.py): the table has
    their rows, each contained, and the summary counts them."""
    out = run_script("hostile_corpus.py", "--jail", "ours", "--only", "fork_bomb,env_secret,write_outside",
                     cache_dir=cache_dir, timeout=100)
    assert match(r"^protections: sandbox mode '(\w+)'", out)[1] in ("namespaces", "userns", "none")
    for name in ("fork_bomb", "env_secret", "write_outside"):
        row = match(rf"^\| {name} \| [^|]+ \| [^|]+ \| (\w+) \| (\w+) \| ({{N}}) \|", out)
        assert row[2] == "yes" and positive(row[3])
    m = match(r"^programs tried: (\d+); escapes: (\d+); not tried: (\d+);", out)
    assert (int(m[1]), int(m[2]), int(m[3])) == (3, 0, 0)
    listing = run_script("hostile_corpus.py", "--list", cache_dir=cache_dir, timeout=60)
    assert len(listing.strip().splitlines()) >= 30
def test_band_calibration_on_the_paper_curves(cache_dir: Path) -> None:
    """The coverage table: one row per paper curve plus the pooled row, percentages that add up."""
    out = run_script("band_calibration.py", "--bootstrap", "300", cache_dir=cache_dir, timeout=300)
    rows = {m.group(1): m for m in re.finditer(
        r"^(paper 8B dense|paper Scout MoE|pooled)\s+(\d+|-)/(\d+)\s.*?(\d+)%\s+(\d+)%$", out, re.M)}
    assert set(rows) == {"paper 8B dense", "paper Scout MoE", "pooled"}, out
    assert int(rows["paper 8B dense"].group(3)) == 10 and int(rows["paper Scout MoE"].group(3)) == 11
    # The drift band is never narrower than the plain residual band it extends.
    for m in rows.values():
        assert int(m.group(4)) >= int(m.group(5)), out
    assert 80 <= int(rows["pooled"].group(4)) <= 100, out


def test_bench_prefix_cache_without_vllm_names_the_install() -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is importable here: tests/with_vllm/test_vllm_bench.py runs the benchmark")
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_prefix_cache.py"), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "generation.engine=vllm: vLLM is not usable here" in proc.stderr


@pytest.mark.timeout(400)
def test_bench_real_shape_quick(cache_dir: Path, tmp_path: Path) -> None:
    """Peak memory is a property of the step, not of the load: the full-logit path's growth with
    response length must dwarf the chunked one's, and both paths must compute the same loss."""
    out = run_script("bench_real_shape.py", "--quick", "--json", str(tmp_path / "r.json"),
                     cache_dir=cache_dir, timeout=600)  # 4 fresh processes + TRL: ~4 min on a loaded CPU
    for path in ("chunked", "full"):
        for length in (32, 256):
            row = rf"^{path}\s+L=\s*{length}\s+peak\s+({{N}}) GB\s+step\s+({{N}}) s\s+({{N}}) tokens/s$"
            m = match(row, out)
            positive(m[1]), positive(m[2]), positive(m[3])
    chunked = float(match(r"^growth chunked: ({N}) GB per 1k", out)[1])
    full = positive(match(r"^growth full: ({N}) GB per 1k", out)[1])
    ratio = float(match(r"^ratio growth chunked/full: ({N})", out)[1])
    assert ratio == pytest.approx(chunked / full, abs=1e-3)
    assert chunked < 0.5 * full
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    for c, f in zip(results["chunked"], results["full"], strict=True):
        assert c["length"] == f["length"] and c["tokens"] == f["tokens"] == 4 * (64 + c["length"])
        assert c["skipped"] == f["skipped"] == 0.0
        assert c["loss"] == pytest.approx(f["loss"], rel=1e-5, abs=1e-7)
    # Throughput side by side: packing changes the speed, never the loss.
    for side in ("padded", "packed"):
        positive(match(rf"^{side}\s+({{N}}) tokens/s", out)[1])
    ratio = float(match(r"^ratio tokens/s packed/padded: ({N})", out)[1])
    tput = json.loads((tmp_path / "r.json").read_text())["throughput"]
    rates = tput["tokens_per_s"]
    assert ratio == pytest.approx(rates["packed"] / rates["padded"], abs=5e-3)
    assert tput["loss"]["packed"] == pytest.approx(tput["loss"]["padded"], rel=1e-5, abs=1e-6)
    assert max(tput["lengths"]) > 3 * min(tput["lengths"])  # long-tailed, or packing has nothing to do
    # The head's closed-form gradient against autograd's, side by side: the speed may change, the
    # loss after the same updates may not (both sides train their own copy on the same batch).
    head = json.loads((tmp_path / "r.json").read_text())["head_grad"]
    for side in ("now", "before"):
        positive(match(rf"^{side}\s+step\s+({{N}}) s", out)[1])
    ratio = float(match(r"^ratio step time before/now: ({N})", out)[1])
    assert ratio == pytest.approx(head["median_s"]["before"] / head["median_s"]["now"], abs=5e-3)
    assert head["loss"]["now"] == pytest.approx(head["loss"]["before"], rel=1e-5, abs=1e-6)
    assert sum(head["lengths"]) > 16  # more response tokens than one chunk: the chunked path runs


@pytest.mark.timeout(420)
def test_bench_step_vs_trl_quick(cache_dir: Path, tmp_path: Path) -> None:
    """One whole GRPO step per side: the printed rates, ratio, phase split and roofline ratios must
    agree with each other and with the step's sample and token counts."""
    out = run_script("bench_step_vs_trl.py", "--quick", "--json", str(tmp_path / "s.json"),
                     cache_dir=cache_dir, timeout=400)  # ~35 s on a loaded 2-core machine
    peak = positive(match(r"^machine: dense float32 matmul peak ({N}) GFLOP/s", out)[1])
    bandwidth = positive(match(r"copy bandwidth ({N}) GB/s", out)[1])
    rates = {}
    for side in ("scalerl", "TRL"):
        m = match(rf"^{side}\s+({{N}})\s+({{N}})\s+({{N}})\s+({{N}})((?:\s+{{N}}s\s+{{N}}%){{7}})$", out)
        step, sps, tps, tokens = (positive(m[i]) for i in (1, 2, 3, 4))
        # --quick: 2 prompts x 2 samples of at most 8 new tokens.
        # the step time is printed to 0.01 s (a quick step is ~0.05 s): compare within that rounding
        assert step == pytest.approx(4 / sps, rel=0.03, abs=0.006)
        assert tokens <= 4 * 8 and tps == pytest.approx(tokens * sps / 4, rel=0.03)
        phases = [float(x) for x in re.findall(rf"({NUM})s\s+{NUM}%", m[5])]
        shares = [float(x) for x in re.findall(rf"{NUM}s\s+({NUM})%", m[5])]
        assert min(phases) >= -0.01 and sum(phases) == pytest.approx(step, abs=0.01 * len(phases))
        assert sum(shares) == pytest.approx(100.0, abs=0.1 * len(shares))
        assert phases[0] > 0 and phases[3] > 0  # generation, forward+backward
        roof = match(rf"^{side} roofline: trainer ({{N}}) GFLOP/s = ({{N}}) of matmul peak; generation "
                     rf"({{N}}) GB/s of weights = ({{N}}) of copy bandwidth$", out)
        assert positive(roof[2]) == pytest.approx(float(roof[1]) / peak, rel=0.02, abs=1e-3)
        assert positive(roof[4]) == pytest.approx(float(roof[3]) / bandwidth, rel=0.02, abs=1e-3)
        rates[side] = (sps, tps)
    m = match(r"^ratio scalerl/TRL: samples/s ({N}), tokens/s ({N}) \(target >= 2\)$", out)
    assert positive(m[1]) == pytest.approx(rates["scalerl"][0] / rates["TRL"][0], rel=0.01, abs=0.005)
    assert positive(m[2]) == pytest.approx(rates["scalerl"][1] / rates["TRL"][1], rel=0.01, abs=0.005)
    sides = json.loads((tmp_path / "s.json").read_text())["sides"]
    for side in sides.values():
        assert side["samples"] == 4 and side["skipped"] == 0
        assert side["real_tokens"] == side["gen_tokens"] + 4 * 8  # 8-token prompts, both sides


@pytest.mark.timeout(200)
def test_bwrap_jail_against_ours(cache_dir: Path) -> None:
    """The bubblewrap comparison (docs/reliability_sandbox.md): a corpus subset through the bwrap
    jail, contained, and one interleaved A/B timing round, both jails' medians positive."""
    import shutil

    if shutil.which("bwrap") is None or os.geteuid() != 0:
        pytest.skip("needs root and bwrap (apt-get install bubblewrap)")
    out = run_script("hostile_corpus.py", "--jail", "bwrap", "--only", "env_secret,write_outside",
                     cache_dir=cache_dir, timeout=100)
    assert match(r"^protections: bwrap jail \(bubblewrap ", out)
    m = match(r"^programs tried: (\d+); escapes: (\d+);", out)
    assert (int(m[1]), int(m[2])) == (2, 0)
    timing = run_script("bwrap_jail.py", "--runs", "1", cache_dir=cache_dir, timeout=100)
    for name in ("print", "syscalls"):
        row = match(rf"^\| {name} \| ({{N}}) \| ({{N}}) \| ({{N}}) \| ({{N}}) \|$", timing)
        assert all(positive(row[i]) for i in range(1, 5))


def test_forecast_calibration_replays_the_paper_curves(cache_dir: Path) -> None:
    """Both digitized paper curves are replayed evaluation by evaluation: coverage is a share of the
    prefixes tried (from min_evals = 4 to n - 1), and a stop, if any, is a fraction of the compute."""
    out = run_script("forecast_calibration.py", cache_dir=cache_dir, timeout=300)
    for curve, evals in (("paper 8B dense", 34), ("paper Scout MoE", 32)):
        m = match(rf"^{re.escape(curve)} \(Fig\. 1a\)\s+(\d+)\s+({{N}}) \((\w+)\)\s+(\d+)% of (\d+)\s+"
                  rf"(\d+)% of (\d+)\s+(.*)$", out)
        assert int(m[1]) == evals and 0 < float(m[2]) < 1
        assert int(m[5]) == evals - 4 and 0 <= int(m[4]) <= 100
        assert int(m[7]) <= int(m[5]) and 0 <= int(m[6]) <= 100
        stop = re.match(rf"(\d+)% \(k=(\d+), \|dA\| ({NUM})\)|never", m[8])
        assert stop is not None, m[8]
        if stop[1] is not None:
            assert 0 < int(stop[1]) <= 100 and 4 <= int(stop[2]) < evals
    # The pooled line counts every prefix of both curves: 30 + 28.
    pool = match(r"^pooled over 2 curves: .* at (\d+)% of (\d+) prefixes "
                 r"\(unflagged: (\d+)% of (\d+)\)$", out)
    assert int(pool[2]) == 58 and int(pool[4]) <= 58


def test_bench_sync_check_measures_both_sides(cache_dir: Path) -> None:
    """The sync check's cost: sender and engine fingerprints and the comparison, per model size,
    beside the weights' CPU copy that every sync makes anyway."""
    out = run_script("bench_sync_check.py", "--steps", "1", "--repeats", "3", "--skip-train",
                     "--real-shape", "quick", "--length", "32", "--probe-repeats", "2", "--step-repeats", "1",
                     cache_dir=cache_dir, timeout=300)
    for size in ("tiny", "20m"):
        m = match(rf"^{size}: ({{N}})M params, (\d+) tensors: sender ({{N}}) ms, engine ({{N}}) ms, "
                  rf"compare ({{N}}) ms; the weights' CPU copy ({{N}}) ms$", out)
        assert positive(m[1]) and int(m[2]) > 0
        assert all(positive(m[i]) for i in (3, 4, 5, 6))
    # the probe beside a trainer step, in one process: its share is the printed times' ratio
    m = match(r"^probe at the quick shape \(2 layers, vocabulary 8,192, ({N})M params\): trainer ({N}) ms \+ "
              r"engine ({N}) ms = ({N}) ms against a trainer step of 4 x \(64 \+ 32\) tokens ({N}) s: "
              r"({N})% of a step; gap float32 ({N}) nats, bf16 autocast vs float32 ({N}) nats$", out)
    trainer_ms, engine_ms, probe_ms, step_s, share = (float(m[i]) for i in range(2, 7))
    assert probe_ms == pytest.approx(trainer_ms + engine_ms, abs=0.11)
    assert share == pytest.approx(100 * probe_ms / 1e3 / step_s, rel=0.05)
    assert float(m[7]) < 1e-3 < float(m[8]) < 0.1  # float32 sides agree; bf16 autocast does not, quite


@pytest.mark.timeout(240)
def test_bench_lora_quick(cache_dir: Path) -> None:
    out = run_script("bench_lora.py", "--quick", cache_dir=cache_dir, timeout=220)
    rows = {}
    for name in ("full", "lora_r8", "lora_r32"):
        m = match(rf"^{name}\s+([\d,]+)\s+({{N}})%\s+({{N}})\s+({{N}})\s+({{N}})\s+({{N}})\s+({{N}})$", out)
        rows[name] = (int(m[1].replace(",", "")), float(m[2]), *(positive(m[i]) for i in range(3, 8)))
    full, r8, r32 = rows["full"], rows["lora_r8"], rows["lora_r32"]
    assert full[1] == 100.0 and 0 < r8[1] < r32[1] < 100.0 and r8[0] < r32[0] < full[0]
    # FLOPs per token: 6N full, 4N + 2 N_trainable with an adapter (N grows by the adapter's size).
    assert full[6] == 1.0 and r8[6] < 1.0


@pytest.mark.timeout(240)
def test_bench_endpoint_times_calls_and_batches_sessions(cache_dir: Path) -> None:
    out = run_script("bench_endpoint.py", cache_dir=cache_dir, timeout=220)
    direct = positive(match(r"^Endpoint\.chat, direct:\s+({N}) ms/call", out)[1])
    http = positive(match(r"^through HTTP, openai client:\s+({N}) ms/call", out)[1])
    positive(match(r"^GET /health \(uvicorn, httpx\):\s+({N}) ms/call", out)[1])
    assert direct < http  # HTTP adds to the in-process call, never the other way round
    for k in (1, 8):
        m = match(rf"^embedded tiny, {k} session\(s\):\s+(\d+) tokens in\s+({{N}}) s =\s+({{N}}) tokens/s",
                  out)
        tokens, seconds = int(m[1]), positive(m[2])
        assert 0 < tokens <= 32 * k
        assert rate_matches(tokens, seconds, positive(m[3]), seconds_step=1e-3, rate_step=1.0)


@pytest.mark.timeout(600)
def test_bench_distill_small(cache_dir: Path, tmp_path: Path) -> None:
    args = ("--steps", "2", "--rl-steps", "2", "--prompts", "2", "--n", "2", "--max-new-tokens", "8",
            "--heldout", "4", "--eval-every", "1", "--out", str(tmp_path / "d"))
    out = run_script("bench_distill.py", *args, cache_dir=cache_dir, timeout=580)
    result = json.loads(out[out.index("{"):])
    assert 0.0 <= result["teacher_pass_rate"] <= 1.0
    d, rl = result["distill"], result["rl"]
    assert len(d["reverse_kl"]) == 2 and all(math.isfinite(x) for x in d["reverse_kl"])
    assert d["flops"] > 0 and rl["flops"] > 0 and d["flops_per_step"] == pytest.approx(d["flops"] / 2)
    for curve in (d["curve"], rl["curve"]):
        assert all(0.0 <= p <= 1.0 for _, _, p in curve)


@pytest.mark.timeout(600)
def test_bench_distill_warm_student_small(cache_dir: Path, tmp_path: Path) -> None:
    args = ("--student", "warm_start", "--estimator", "full", "--steps", "2", "--rl-steps", "2",
            "--prompts", "2", "--n", "2", "--max-new-tokens", "8", "--heldout", "4", "--eval-every", "1",
            "--out", str(tmp_path / "d"))
    out = run_script("bench_distill.py", *args, cache_dir=cache_dir, timeout=580)
    result = json.loads(out[out.index("{"):])
    d, rl = result["distill"], result["rl"]
    # the teacher is the RL arm's final checkpoint, a loadable HF folder; its pass rate the last eval
    teacher = Path(result["teacher"])
    assert teacher.parent == tmp_path / "d" / "rl" / "checkpoints" and (teacher / "config.json").is_file()
    assert result["teacher_pass_rate"] == rl["final_pass_rate"] == rl["curve"][-1][2]
    assert rl["steps"] == 2 and d["steps"] == 2 and len(d["reverse_kl"]) == 2
    # both arms start from the same warm start, evaluated on the same draws
    assert d["curve"][0][:2] == rl["curve"][0][:2] == [0, 0.0]
    assert d["curve"][0][2] == rl["curve"][0][2] == result["start_pass_rate"]
    # RL reaches its own final pass rate by its end at the latest
    assert result["to_teacher"]["rl_flops"] is not None and result["to_teacher"]["rl_flops"] <= rl["flops"]


# ------------------------------------------------------------------------------ decisions, first half
REF = ROOT / "tests" / "studies" / "data"


def _run_rc(name: str, *args: str, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SCALERL_CACHE_DIR": str(cache_dir),
           "MPLCONFIGDIR": str(cache_dir / "matplotlib")}
    return subprocess.run([sys.executable, str(BENCHMARKS / name), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_decision_study_on_the_shipped_runs_exports_and_refuses_bad_input(
    cache_dir: Path, tmp_path: Path
) -> None:
    recipes = [f"--recipe={r}={REF / 'decision' / (r + '.csv')}"
               for r in ("scalerl", "gspo", "scalerl-lr3e-5", "scalerl-lr1e-5")]
    proc = _run_rc("decision_study.py", *recipes, "--export", str(tmp_path / "ex"),
                   "--json", str(tmp_path / "d.json"), cache_dir=cache_dir)
    assert proc.returncode == 0, proc.stderr  # the bar is met at both fractions (docs/studies.md)
    assert match(r"^at 25%: 0 of 6 pairs decided", proc.stdout)
    assert match(r"^at 50%: 2 of 6 pairs decided, 2 correct .* 0 wrong, 0 decided ties", proc.stdout)
    pooled = _run_rc("decision_study.py", *recipes, "--pool", "--fractions", "0.5", cache_dir=cache_dir)
    assert pooled.returncode == 1, pooled.stderr  # the pooled fits decide the tie
    assert match(r"^at 50%: 3 of 6 pairs decided, 2 correct .* 1 decided ties", pooled.stdout)
    # The second set's fits at 50% are all flagged: nothing decided by default, two pairs (both
    # right) when flagged fits may decide (docs/studies.md, "A fifth set").
    oos = [f"--recipe={r}={REF / 'decision_oos' / (r + '.csv')}"
           for r in ("scalerl", "gspo", "scalerl-lr3e-5", "scalerl-lr1e-5")]
    flagged = _run_rc("decision_study.py", *oos, "--flagged-decide", "--fractions", "0.5",
                      cache_dir=cache_dir)
    assert flagged.returncode == 0, flagged.stderr
    assert match(r"^at 50%: 2 of 6 pairs decided, 2 correct .* 0 wrong, 0 decided ties", flagged.stdout)
    assert flagged.stdout.count("DECIDED, flagged") == 2
    data = json.loads((tmp_path / "d.json").read_text())
    assert len(data["truth"]) == 6 and [s["fraction"] for s in data["scores"]] == [0.25, 0.5]
    assert data["rule"] == {"level": 0.95, "margin": 0.02, "flagged_decide": False, "pool": False}
    # The export reads back as the same points.
    again = (tmp_path / "ex" / "gspo.csv").read_text().splitlines()
    assert again[0] == "run,step,flops,val_pass_rate" and len(again) == 1 + 3 * 21
    bad = _run_rc("decision_study.py", recipes[0], "--recipe=nope", cache_dir=cache_dir)
    assert bad.returncode == 2 and "NAME=PATH" in bad.stderr
    kept = (tmp_path / "d.json").read_text()
    twice = _run_rc("decision_study.py", *recipes, "--json", str(tmp_path / "d.json"), cache_dir=cache_dir)
    assert twice.returncode == 2 and "exists" in twice.stderr and (tmp_path / "d.json").read_text() == kept


def test_first_half_table_on_the_shipped_seeds(cache_dir: Path, tmp_path: Path) -> None:
    proc = _run_rc("first_half_table.py", str(REF / "first_half" / "scalerl.csv"), "--bootstrap", "300",
                   cache_dir=cache_dir)
    assert proc.returncode == 1, proc.stderr  # 5 of 8 meet the bar (docs/studies.md)
    rows = re.findall(r"^(\d)\s+.*\s(ok|FLAGGED)\s+(met|MISSED)$", proc.stdout, re.M)
    assert len(rows) == 8 and [r[1] for r in rows].count("FLAGGED") == 3
    assert match(r"met on (\d) of 8", proc.stdout)
    bad = _run_rc("first_half_table.py", str(tmp_path / "missing"), cache_dir=cache_dir)
    assert bad.returncode == 2 and "missing" in bad.stderr


def _lengths_to_eos(out: Any, cap: int) -> list[int]:
    """Each generated row's length up to and including its first EOS (id 1), else ``cap``."""
    return [int((r == 1).nonzero()[0]) + 1 if (r == 1).any() else cap for r in out]


@pytest.mark.timeout(200)
def test_a_stop_probability_gives_the_random_model_long_tailed_lengths(tmp_path: Path) -> None:
    """`bench_real_shape.set_stop_prob` (bench_step_vs_trl.py --stop-prob): a random-init model that
    never stops (EOS ~1 in 8192 here) is made to stop with mean per-token probability 0.1; sampled
    lengths must then spread out (mean near 1/0.1, few at the cap), where before nearly all run to it."""
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(BENCHMARKS))
    import bench_real_shape as brs

    brs.save_model(brs.QUICK, tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    prompts = torch.randint(8, brs.QUICK.vocab, (64, 8), generator=torch.Generator().manual_seed(5))
    cap = 48

    def lengths() -> list[int]:
        torch.manual_seed(1)
        with torch.no_grad():
            out = model.generate(prompts, do_sample=True, max_new_tokens=cap, top_k=0, top_p=1.0,
                                 eos_token_id=1, pad_token_id=0)[:, prompts.shape[1]:]
        return _lengths_to_eos(out, cap)

    before = lengths()
    assert sum(n == cap for n in before) >= 60  # a random model runs to the cap
    achieved = brs.set_stop_prob(model, 0.1)
    assert abs(math.log(achieved / 0.1)) <= 0.05
    after = lengths()
    assert 4 <= statistics.mean(after) <= 25 and sum(n == cap for n in after) <= 16
    assert max(after) >= 4 * statistics.median(after)  # a long tail, not one length


@pytest.mark.timeout(200)
def test_both_sides_of_the_step_bench_sample_the_same_lengths(tmp_path: Path) -> None:
    """bench_step_vs_trl.py --stop-prob compares steps whose lengths are sampled: the embedded
    engine and HF `model.generate` (TRL's path) must draw them from one distribution on the same
    model folder, or the comparison measures the sampler. 256 samples a side (16 prompts x 16),
    Mann-Whitney on the lengths; an engine that ignored EOS would give all 48s."""
    import torch
    from scipy import stats
    from transformers import AutoModelForCausalLM

    from scalerl.config import ModelConfig
    from scalerl.rollout import EmbeddedEngine
    from scalerl.rollout.protocol import GenerationRequest, SamplingParams
    from scalerl.training.policy import load_model

    sys.path.insert(0, str(BENCHMARKS))
    import bench_real_shape as brs

    brs.save_model(brs.QUICK, tmp_path / "m", stop_prob=0.05)
    cap = 48
    prompts = torch.randint(8, brs.QUICK.vocab, (16, 16), generator=torch.Generator().manual_seed(3))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(prompts.repeat_interleave(16, 0), do_sample=True, max_new_tokens=cap, top_k=0,
                             top_p=1.0, eos_token_id=1, pad_token_id=0)[:, prompts.shape[1]:]
    hf = _lengths_to_eos(out, cap)
    engine = EmbeddedEngine(load_model(ModelConfig(name_or_path=str(tmp_path / "m")), torch.device("cpu")),
                            max_batch_size=256, seed=0, eos_token_ids=(1,), pad_token_id=0)
    params = SamplingParams(n=16, temperature=1.0, max_new_tokens=cap)
    ours = [c.num_tokens for c in engine.generate(
        [GenerationRequest(f"p{i}", p, params) for i, p in enumerate(prompts.tolist())])]
    assert len(ours) == len(hf) == 256
    assert sum(n == cap for n in hf) < 64 and sum(n == cap for n in ours) < 64
    assert stats.mannwhitneyu(hf, ours).pvalue > 0.01
    assert abs(statistics.mean(hf) - statistics.mean(ours)) < 0.25 * statistics.mean(hf)
