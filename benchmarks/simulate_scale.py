"""sync / PPO-off-policy-k / PipelineRL-k at the paper's scale, simulated: the shape of ScaleRL Fig. 4a.

A discrete-event simulation (`scalerl.pipeline.simulate`; virtual clock, nothing sleeps) in which the
real admission controller (`scalerl.pipeline.staleness.StalenessController`) decides every
admission, driven by modelled devices: 64 generation engines with continuous batching and a
per-step decode time, 48 prompts x 16 samples per step, long-tailed (lognormal) lengths up to 12,288
tokens, a modelled training step and weight transfer. The device times are assumptions (orders of
magnitude for an 8B model, docs/scaleout_sim.md), not measurements: what the run shows is how the
three schedules compare under the same devices, not absolute speeds.

Printed per mode: simulated samples/s and tokens/s, generator idle fraction (engine time with
nothing to run), slot occupancy, trainer idle fraction, the version lag of trained samples and
tokens (asserted <= k for the pipeline by the controller and by the simulator), then the ratios
between modes; `--sweep` adds the k sweep of PPO-off-policy-k and PipelineRL-k (cf. Fig. 4b).

    python benchmarks/simulate_scale.py             # paper scale (a few seconds per mode)
    python benchmarks/simulate_scale.py --sweep     # + k in 1, 2, 4, 8, 16
    python benchmarks/simulate_scale.py --quick     # small smoke run (CI)
    python benchmarks/simulate_scale.py --admission deadline            # the pipeline's deadline rule
    python benchmarks/simulate_scale.py --compare-admission             # bounded/deadline/partial, k sweep

Under `partial` (partial rollouts) the bound is on each group's segment since its last admission
(`scalerl/pipeline/staleness.py`): the simulator asserts it per group, and the tokens trained more
than k versions late are counted and printed, not asserted.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from scalerl.pipeline.simulate import SimConfig, SimResult, simulate
from scalerl.pipeline.staleness import ADMISSIONS
from scalerl.rollout.emulated import LengthModel

SWEEP = (1, 2, 4, 8, 16)


def base_config(args: argparse.Namespace) -> SimConfig:
    if args.quick:
        cfg = SimConfig(num_engines=8, slots=32, prompts_per_step=8, n=8, max_new_tokens=2048,
                        length=LengthModel(500.0, 0.5, 0.6), steps=16, train_step_s=0.5,
                        train_token_s=1.5e-5)
    else:
        cfg = SimConfig()
    overrides = {
        name: value
        for name, value in (("num_engines", args.engines), ("steps", args.steps), ("seed", args.seed),
                            ("placement", args.placement), ("max_new_tokens", args.max_new_tokens),
                            ("max_outstanding_groups", args.max_outstanding))
        if value is not None
    }
    return replace(cfg, **overrides)


def run(cfg: SimConfig, mode: str, k: int, admission: str = "bounded") -> SimResult:
    steps = cfg.steps if mode != "ppo_offpolicy" else max(k, cfg.steps - cfg.steps % k)
    pipeline = mode == "pipeline"
    result = simulate(replace(cfg, mode=mode, k=k, steps=steps,  # type: ignore[arg-type]
                              admission=admission if pipeline else "bounded",
                              max_outstanding_groups=cfg.max_outstanding_groups if pipeline else 0))
    bound = result.config.max_lag
    # `partial` bounds the segment since the last (re-)admission, which the simulator checks per group.
    checked = result.config.admission != "partial"
    if checked and (max(result.sample_lags) > bound or max(result.token_lags) > bound):
        raise AssertionError(f"{mode} k={k}: a trained sample lags more than {bound} versions")
    return result


def name(r: SimResult) -> str:
    c = r.config
    out = c.mode if c.admission == "bounded" else f"{c.mode}/{c.admission}"
    return out + (f"/cap{c.max_outstanding_groups}" if c.max_outstanding_groups else "")


def percentiles(r: SimResult, tokens: bool = False) -> str:
    lags = r.token_lags if tokens else r.sample_lags
    return "/".join(str(r.lag_percentile(lags, q)) for q in (0.1, 0.5, 0.9, 0.99)) + f"/{max(lags)}"


def row(r: SimResult) -> str:
    c = r.config
    lag_max = max(r.sample_lags)
    return (f"{name(r):>17} k={c.k:<2d} {r.steps:4d} steps {r.seconds:8.0f}s  "
            f"{r.samples_per_s:7.2f} samples/s  {r.tokens_per_s:9.0f} tok/s  "
            f"gen idle {100 * r.generator_idle_frac:5.1f}%  occupancy {100 * r.occupancy:5.1f}%  "
            f"weight loads {100 * r.update_frac:4.1f}%  trainer idle {100 * r.trainer_idle_frac:5.1f}%  "
            f"lag mean {r.lag_mean(r.sample_lags):.2f} max {lag_max} "
            f"(tokens {r.lag_mean(r.token_lags):.2f})  truncated {100 * r.truncated / r.samples:4.1f}%")


def lag_distribution(r: SimResult) -> str:
    total = sum(r.sample_lags.values())
    lags = range(r.config.k + 1)
    shares = "  ".join(f"{lag}: {100 * r.sample_lags.get(lag, 0) / total:4.1f}%" for lag in lags)
    return f"{name(r):>17} k={r.config.k:<2d} {shares}"


def ratio(a: SimResult, b: SimResult) -> str:
    idle = a.generator_idle_frac / b.generator_idle_frac if b.generator_idle_frac else float("nan")
    return (f"{name(a)} k={a.config.k} / {name(b)} k={b.config.k}: "
            f"samples/s x{a.samples_per_s / b.samples_per_s:.2f}  generator idle x{idle:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small setting (CI smoke run)")
    parser.add_argument("--k", type=int, default=None,
                        help="k of ppo_offpolicy and pipeline (default 8; quick 4)")
    parser.add_argument("--engines", type=int, default=None, help="generation engines (default 64)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per mode (default 64)")
    parser.add_argument("--placement", choices=("group", "sample"), default=None,
                        help="a group's samples on one engine (default) or each sample placed alone")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="length cap (default 12288)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--sweep", action="store_true", help=f"also sweep k over {SWEEP}")
    parser.add_argument("--admission", choices=ADMISSIONS, default="bounded",
                        help="the pipeline's admission rule (pipeline.admission; default bounded)")
    parser.add_argument("--max-outstanding", type=int, default=None,
                        help="pipeline.max_outstanding_groups of the pipeline runs (default 0: no cap)")
    parser.add_argument("--compare-admission", action="store_true",
                        help=f"only the pipeline, admission {'/'.join(ADMISSIONS)}, k over {SWEEP}")
    args = parser.parse_args()
    k = args.k or (4 if args.quick else 8)
    cfg = base_config(args)
    lm = cfg.length
    print(f"setting: {cfg.num_engines} engines x {cfg.slots} slots ({cfg.placement} placement), "
          f"{cfg.prompts_per_step} prompts x {cfg.n} samples per step; lengths lognormal "
          f"(median {lm.median:.0f}, prompt sigma {lm.prompt_sigma}, sample sigma {lm.sample_sigma}) "
          f"capped at {cfg.max_new_tokens}")
    print(f"devices: decode step {1e3 * cfg.decode_step_s:.1f} ms + {1e3 * cfg.decode_token_s:.2f} ms "
          f"per sequence in flight; train step {cfg.train_step_s:.1f} s + {1e6 * cfg.train_token_s:.2f} us "
          f"per token; "
          f"weights {cfg.weight_transfer_s:.1f} s transfer + {cfg.weight_update_s:.1f} s load\n")
    if args.compare_admission:
        compare_admission(cfg)
        return

    modes = ("sync", "ppo_offpolicy", "pipeline")
    results = {mode: run(cfg, mode, 1 if mode == "sync" else k, args.admission) for mode in modes}
    for r in results.values():
        print(row(r), flush=True)
    print("\nversion lag of trained samples (share per lag):")
    for r in results.values():
        print(lag_distribution(r))
    sync, ppo, pipe = results["sync"], results["ppo_offpolicy"], results["pipeline"]
    print(f"\n{name(pipe)} max lag {max(pipe.sample_lags)} <= k={k}: OK")
    print("\nratios:")
    for a, b in ((pipe, ppo), (pipe, sync), (ppo, sync)):
        print(ratio(a, b))

    if args.sweep:
        print("\nk sweep (samples/s; generator idle; mean sample lag):")
        for kk in SWEEP:
            p, o = run(cfg, "pipeline", kk, args.admission), run(cfg, "ppo_offpolicy", kk)
            print(f"k={kk:<2d}  pipeline {p.samples_per_s:7.2f}  idle {100 * p.generator_idle_frac:5.1f}%  "
                  f"lag {p.lag_mean(p.sample_lags):5.2f}   ppo_offpolicy {o.samples_per_s:7.2f}  "
                  f"idle {100 * o.generator_idle_frac:5.1f}%  lag {o.lag_mean(o.sample_lags):5.2f}   "
                  f"pipeline / ppo x{p.samples_per_s / o.samples_per_s:.2f}", flush=True)


def compare_admission(cfg: SimConfig) -> None:
    """The pipeline under each admission rule (and the deadline rule with the outstanding groups
    capped at what the engines hold at once), k sweep: throughput, idle, lag percentiles of trained
    samples and tokens, and the share of tokens trained more than k versions late (`partial` only)."""
    engines_hold = cfg.num_engines * cfg.slots // cfg.n
    print("pipeline admission rules (lag percentiles p10/p50/p90/p99/max of trained samples, then of trained "
          f"tokens; cap = {engines_hold} groups, what the engines hold at once; tokens > k: share of trained "
          "tokens more than k versions older than the trainer):")
    for kk in SWEEP:
        b, d, p = (run(cfg, "pipeline", kk, rule) for rule in ("bounded", "deadline", "partial"))
        capped = run(replace(cfg, max_outstanding_groups=max(engines_hold, cfg.prompts_per_step)), "pipeline",
                     kk, "deadline")
        for r in (b, d, capped, p):
            rule = r.config.admission + ("+cap" if r.config.max_outstanding_groups else "")
            renewed = f"  renewed {r.groups_renewed}" if r.config.admission == "partial" else ""
            print(f"k={kk:<2d} {rule:>12}  {r.samples_per_s:6.2f} samples/s  "
                  f"gen idle {100 * max(0.0, r.generator_idle_frac):5.1f}%  "
                  f"trainer idle {100 * r.trainer_idle_frac:5.1f}%  occupancy {100 * r.occupancy:5.1f}%  "
                  f"lag mean {r.lag_mean(r.sample_lags):5.2f} pct {percentiles(r):>13}  "
                  f"token lag {r.lag_mean(r.token_lags):5.2f} pct {percentiles(r, tokens=True):>13}  "
                  f"tokens > k {100 * r.stale_token_frac():4.1f}%{renewed}", flush=True)
        print(f"k={kk:<2d} deadline / bounded: samples/s x{d.samples_per_s / b.samples_per_s:.2f}  "
              f"deadline+cap / bounded: x{capped.samples_per_s / b.samples_per_s:.2f}  "
              f"partial / bounded: x{p.samples_per_s / b.samples_per_s:.2f}  "
              f"partial / deadline: x{p.samples_per_s / d.samples_per_s:.2f}", flush=True)

if __name__ == "__main__":
    main()
