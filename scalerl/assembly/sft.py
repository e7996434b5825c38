"""A supervised fine-tuning run from a `RunConfig` and an `SFTConfig`: `scalerl sft`'s work.

The run's config gives the model (`model.*`) and the prompt format (`data.system_prompt`,
`data.think_system_prompt`, `data.template`); `sft` the hyper-parameters. The embedded default (no
model, no data, on the CPU) is the cached warm start `scalerl train` uses (`warm_start_default`),
copied to `output` if one is given; anything else loads the model, trains it on `data` (or the
synthetic gold traces) and saves it with its `sft_info.json`. Returns where the model is.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

from scalerl.config import ConfigError, RunConfig
from scalerl.data.tokenize import bind_chat_template_kwargs
from scalerl.ownership import check_output_dir_owned, mark_output_dir
from scalerl.training.sft_config import SFTConfig

Say = Callable[[str], None]


def sft_run(
    cfg: RunConfig,
    sft: SFTConfig,
    *,
    data: str | None = None,
    field_map: Mapping[str, str] | None = None,
    output: str | None = None,
    device: str | None = None,
    on_step: Callable[[int, float], None] | None = None,
    say: Say = lambda message: None,
) -> Path:
    """Fine-tune (or fetch the cached warm start) and return the saved model's directory."""
    from scalerl.assembly.warm_start import default_sft_records, system_prompt_of, warm_start_default
    from scalerl.training.sft import (
        INFO_FILE,
        SFT_KIND,
        examples_from_records,
        save_sft_model,
        solution_pairs,
        train_sft,
    )
    from scalerl.training.threads import run_threads

    if cfg.model.lora.r > 0:
        raise ConfigError("model.lora.r: `scalerl sft` trains every weight (the warm start LoRA runs "
                          "start from); LoRA applies to `scalerl train` (set model.lora.r=0 here)")
    if cfg.model.name_or_path is None and data is None and device in (None, "cpu"):
        path = warm_start_default(cfg, sft, on_step=on_step)
        if output:
            out = Path(output)
            check_output_dir_owned(out, SFT_KIND, "--output")
            tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                shutil.copytree(path, tmp)
                mark_output_dir(tmp, SFT_KIND)
                if out.is_dir() and any(out.iterdir()):
                    check_output_dir_owned(out, SFT_KIND, "--output")  # an SFT output of ours only
                    shutil.rmtree(out)
                os.replace(tmp, out)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            path = out
        return path

    from scalerl.training.policy import load_policy
    from scalerl.training.sft_data import read_sft_pairs

    pairs = read_sft_pairs(data, dict(field_map or {})) if data else None
    with run_threads(cfg.model, device):
        policy = load_policy(cfg.model, device=device)
        if pairs is None:
            pairs = solution_pairs(default_sft_records(cfg))
        tokenizer = bind_chat_template_kwargs(policy.tokenizer, cfg.data.chat_template_kwargs)
        examples = examples_from_records(pairs, tokenizer, system_prompt_of(cfg.data), sft.max_length,
                                         cfg.data.template)
        say(f"sft: {len(examples)} examples, {sft.steps} steps of {sft.batch_size}")
        result = train_sft(policy, examples, sft, on_step=on_step)
    out = Path(output) if output else Path(cfg.output_dir) / "sft"
    save_sft_model(policy, out, {"sft": asdict(sft), "data": data, "model": cfg.model.name_or_path,
                                 "final_loss": result.final_loss, "seconds": result.seconds})
    say(f"sft: final loss {result.final_loss:.4f} in {result.seconds:.0f}s; saved to {out}/ "
        f"({INFO_FILE} has the details)")
    return out


__all__ = ["sft_run"]
