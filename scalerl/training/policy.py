"""The trained policy: any Hugging Face causal LM (or the embedded tiny default) plus its tokenizer.

Precision: parameters and optimizer state stay in float32; `dtype="bfloat16"` runs forward and
backward under bf16 autocast (mixed precision with fp32 master weights), so small updates are not
lost to bf16 rounding of the weights themselves. The FP32 LM head (ScaleRL Sec. 3.2) is a separate
flag honoured by `scalerl.models.lm_head`, which computes the head and log-softmax in float32 even
under autocast.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    PreTrainedModel,
)

from scalerl.config import ConfigError, LoraConfig, ModelConfig
from scalerl.models.loading import load_pretrained_tokenizer
from scalerl.models.lora import adapter_disabled, is_lora, merged_copy, merged_state_dict, wrap_lora
from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer

ModelFactory = Callable[[], torch.nn.Module]


def tiny_spec(cfg: ModelConfig) -> TinyModelSpec:
    t = cfg.tiny
    return TinyModelSpec(
        hidden_size=t.hidden_size,
        num_layers=t.num_layers,
        num_heads=t.num_heads,
        num_kv_heads=t.num_kv_heads,
        intermediate_size=t.intermediate_size,
        max_position_embeddings=t.max_position_embeddings,
        num_experts=t.num_experts,
        num_experts_per_tok=t.num_experts_per_tok,
        moe_intermediate_size=t.moe_intermediate_size,
        shared_expert_intermediate_size=t.shared_expert_intermediate_size,
        norm_topk_prob=t.norm_topk_prob,
    )


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _without_dropout(config: Any) -> Any:
    # Policy-gradient log-probs must match the generator's, which never drops out; the model stays
    # in train mode (gradient checkpointing only runs there), so dropout is zeroed at the source.
    for key, value in config.to_dict().items():
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
            setattr(config, key, 0.0)
    return config


def load_model(cfg: ModelConfig, device: torch.device) -> PreTrainedModel:
    """The model named by `cfg`, float32, dropout off, on `device` (the tiny default without a name)."""
    if cfg.name_or_path is None:
        model = build_tiny_model(tiny_spec(cfg), seed=cfg.init_seed)
        _without_dropout(model.config)
    else:
        config = _without_dropout(AutoConfig.from_pretrained(cfg.name_or_path))
        model = AutoModelForCausalLM.from_pretrained(cfg.name_or_path, config=config, dtype=torch.float32)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    if cfg.attn_implementation is not None:
        try:
            model.set_attn_implementation(cfg.attn_implementation)
        except (ImportError, ValueError) as err:  # flash-attn missing, no CUDA, or not for this model
            raise ConfigError(f"model.attn_implementation={cfg.attn_implementation!r}: {err}") from None
    return model.to(device)


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute layer activations in the backward pass (transformers 5 renamed the method)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


def is_activation_checkpointing(model: PreTrainedModel) -> bool:
    flag = getattr(model, "is_activation_checkpointing", None)
    return bool(flag if flag is not None else model.is_gradient_checkpointing)


def load_tokenizer(cfg: ModelConfig) -> Any:
    if cfg.name_or_path is None and cfg.tokenizer is None:
        return build_tiny_tokenizer()
    tok = load_pretrained_tokenizer(str(cfg.tokenizer or cfg.name_or_path))
    if tok.pad_token_id is None:
        # Padding positions are masked everywhere; any id works, and eos always exists.
        tok.pad_token = tok.eos_token
    return tok


@dataclass
class Policy:
    """A causal LM being trained, its tokenizer, and how to run it.

    `reference_factory` builds the frozen reference model for the KL term (the policy's initial
    weights); it is called only when a KL term is used. A LoRA policy (`apply_lora`) has none: its
    reference is the model itself with the adapter disabled (`reference_model`).
    """

    model: PreTrainedModel
    tokenizer: Any
    fp32_lm_head: bool = True
    dtype: str = "float32"
    reference_factory: ModelFactory | None = field(default=None, repr=False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    @property
    def eos_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward-pass precision context (bf16 autocast, or nothing for float32)."""
        if self.dtype == "bfloat16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @property
    def lora(self) -> bool:
        """Whether the model is a LoRA (peft) model: only its adapter is trained."""
        return is_lora(self.model)

    @contextlib.contextmanager
    def reference_model(self, cached: torch.nn.Module | None = None) -> Any:
        """The KL reference for the duration of the block: for LoRA the policy itself with the
        adapter disabled (the base weights, no second copy of them in memory), else `cached` or a
        fresh `load_reference()`."""
        if self.lora:
            with adapter_disabled(self.model) as base:
                yield base
        else:
            yield cached if cached is not None else self.load_reference()

    def generation_copy(self) -> torch.nn.Module:
        """A plain copy of the model for an in-process engine: the adapter merged in for LoRA."""
        return merged_copy(self.model) if self.lora else copy.deepcopy(self.model)

    def load_reference(self) -> torch.nn.Module:
        if self.reference_factory is None:
            raise ValueError(
                "algorithm.kl_coef > 0 needs a reference model, but this policy was built without a "
                "reference_factory (load it with load_policy, or pass one)"
            )
        ref = self.reference_factory().to(self.device)
        ref.eval()
        ref.requires_grad_(False)
        return ref

    def save_pretrained(self, path: str | Path) -> None:
        """Model (safetensors) and tokenizer, loadable with `from_pretrained(path)`; a LoRA model
        is saved merged (a plain causal LM: what the engines run)."""
        (merged_copy(self.model) if self.lora else self.model).save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))

    def weights_for_engine(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the weights for `engine.update_weights`.

        A copy, not views: an engine applying it from another thread must not see the trainer's
        in-place optimizer updates land half-way through a decode step. A LoRA model sends its
        merged weights `W + (alpha / r) B A` under the base model's names (`merged_state_dict`).
        """
        if self.lora:
            return merged_state_dict(self.model, "cpu")
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}


def load_policy(cfg: ModelConfig, device: str | torch.device | None = None) -> Policy:
    """Load the model and tokenizer named by `cfg`, ready to train."""
    dev = resolve_device(device)
    model = load_model(cfg, dev)
    tokenizer = load_tokenizer(cfg)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        raise ValueError(
            f"model.tokenizer: {len(tokenizer)} tokens but the model's embedding has "
            f"{model.get_input_embeddings().weight.shape[0]} rows"
        )
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.train()
    frozen = cfg.model_copy()
    return Policy(
        model=model,
        tokenizer=tokenizer,
        fp32_lm_head=cfg.fp32_lm_head,
        dtype=cfg.dtype,
        reference_factory=lambda: load_model(frozen, dev),
    )


def apply_lora(policy: Policy, cfg: LoraConfig, seed: int = 0) -> Policy:
    """`policy` with its model wrapped in LoRA adapters (`cfg.r` > 0; `scalerl.models.lora`): only
    the adapter is trainable, the reference is the base with the adapter disabled (no
    `reference_factory`, so no second copy of the base is ever built). The model is wrapped in
    place: use the returned policy, not `policy`.

    A's random init (peft's Kaiming-uniform; B = 0) is drawn from `seed` (a run passes its own
    `seed`) on a forked RNG: the same adapter in every process, and the caller's RNG untouched."""
    if cfg.r <= 0:
        return policy
    checkpointing = is_activation_checkpointing(policy.model)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = wrap_lora(policy.model, cfg.r, cfg.alpha, cfg.dropout, cfg.target_modules)
    except (ImportError, ValueError) as err:
        raise ConfigError(str(err)) from None
    if checkpointing:
        # Non-reentrant checkpointing (enable_activation_checkpointing) needs no input gradients;
        # kept on the wrapped model's base as it was set.
        model.config.use_cache = False
    model.train()
    return Policy(model=model, tokenizer=policy.tokenizer, fp32_lm_head=policy.fp32_lm_head,
                  dtype=policy.dtype, reference_factory=None)
