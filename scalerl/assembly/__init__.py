"""The composition root: the only code that reads the whole `RunConfig` and builds a run from it.

Every component below this package takes its own section (an engine its `EngineSpec`, the trainer
its `AlgorithmConfig` and `OptimConfig`, the rewards router its `RewardConfig`, the driver its
`DriverSettings`); this package picks those sections out of the run's config and wires the pieces:
policy and trainer, engine(s), prompts and held-out split, rewards, evaluator, telemetry,
checkpoints, and the local or the Ray backend (`local`, `ray`: two implementations chosen here;
neither imports this package's `build` back). Commands (`scalerl.cli`) and studies
(`scalerl.studies`) build runs through it.

Modules: `sections` (each component's settings from the run's config), `backend` (the seam between
the root and its two backends), `local` and `ray` (the backends), `build` (a run around a backend:
`build_training`, `train`), `run` (`train_run`: what `scalerl train` and the studies run, with
resume and session records), `warm_start` (the embedded default's SFT warm start), `sft`,
`evaluate`, `curation` (what `scalerl sft`, `eval` and `data difficulty` build), `inputs` (every
input of a run checked before any work).

Nothing is imported eagerly: `scalerl --help` must not pay for torch.
"""
