from __future__ import annotations

import copy

import torch

from scalerl.config import AlgorithmConfig, OptimConfig
from scalerl.training.policy import is_activation_checkpointing, load_policy
from scalerl.training.trainer import Trainer


def test_load_from_saved_directory_zeroes_dropout(make_policy, model_config, tmp_path):
    policy = make_policy()
    policy.model.config.attention_dropout = 0.3
    policy.save_pretrained(tmp_path / "m")
    loaded = load_policy(model_config(name_or_path=str(tmp_path / "m")), device="cpu")
    assert loaded.model.config.attention_dropout == 0.0
    assert loaded.model.training  # train mode, so gradient checkpointing can run
    assert loaded.pad_token_id == policy.pad_token_id and loaded.eos_token_id == 1
    chat = [{"role": "user", "content": "Compute 57 + 68"}]
    for text in ("Compute 57 + 68\n", "<think>7+8=15>5</think>\\boxed{15}"):
        assert loaded.tokenizer.encode(text) == policy.tokenizer.encode(text)
    assert (loaded.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
            == policy.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, policy.model(ids).logits)
    ref = loaded.load_reference()
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())


def test_gradient_checkpointing_gives_the_same_gradients(make_policy, make_groups):
    plain = make_policy()
    ckpt = make_policy(gradient_checkpointing=True)
    assert is_activation_checkpointing(ckpt.model) and not is_activation_checkpointing(plain.model)
    groups = make_groups(plain)
    grads = []
    for policy in (plain, ckpt):
        trainer = Trainer(copy.deepcopy(policy), AlgorithmConfig(), OptimConfig(micro_batch_size=4))
        trainer.compute_gradients(groups)
        grads.append([p.grad.clone() for p in trainer.policy.model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
