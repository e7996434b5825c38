from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from scalerl.telemetry.compute import ComputeMeter, flop_params


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _qwen(tied: bool) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(cfg)


@pytest.mark.parametrize("tied", [True, False])
def test_flop_params_closed_form(tied):
    h, i, layers, vocab, kv = 16, 40, 2, 50, 2 * (16 // 4)
    attn = (h * h + h) + 2 * (h * kv + kv) + h * h  # q,k,v with bias; o without
    mlp = 3 * h * i
    norms = 2 * h
    expected = layers * (attn + mlp + norms) + h + vocab * h  # + final norm + LM head
    model = _qwen(tied)
    assert flop_params(model) == expected
    total = sum(p.numel() for p in model.parameters())
    assert total == expected + (0 if tied else vocab * h)  # the embedding lookup is excluded


def test_flops_arithmetic():
    meter = ComputeMeter(n_params=1000)
    meter.add_generation(generated_tokens=100, samples=4, prompt_tokens=20)
    meter.add_training(tokens=150, samples=4)
    meter.add_logprob_pass(tokens=150)
    assert meter.flops == 2 * 1000 * 120 + 6 * 1000 * 150 + 2 * 1000 * 150
    snap = meter.snapshot()
    assert snap["samples"] == 4 and snap["tokens"] == 100 and snap["trained_tokens"] == 150


def test_device_hours_count_allocation_and_busy_time():
    clock = FakeClock()
    meter = ComputeMeter(10, num_devices=2, role_devices={"generator": 1, "trainer": 1}, clock=clock)
    with meter.running():
        with meter.busy("generator"):
            clock.t += 900
        clock.t += 900  # both idle: still paid for
        with meter.running():  # nesting does not double count
            clock.t += 1800
    clock.t += 3600  # outside running(): e.g. evaluation, not counted
    snap = meter.snapshot()
    assert snap["compute_device_hours"] == pytest.approx(2 * 1.0)
    assert snap["generator_device_hours"] == pytest.approx(0.25)
    assert snap["trainer_device_hours"] == 0.0
    assert meter.idle_fraction("generator") == pytest.approx(0.75)
    with pytest.raises(ValueError, match="role"), meter.busy("nobody"):
        pass


def test_state_round_trip_continues_totals():
    clock = FakeClock()
    a = ComputeMeter(10, clock=clock)
    with a.running():
        clock.t += 360
        a.add_training(5, 1)
    b = ComputeMeter(10, clock=clock)
    b.load_state_dict(a.state_dict())
    with b.running():
        clock.t += 360
    assert b.snapshot()["compute_device_hours"] == pytest.approx(0.2)
    assert b.flops == a.flops and b.trained_tokens == 5


def test_meter_on_a_real_model_uses_flop_params():
    model = torch.nn.Linear(4, 3)
    assert flop_params(model) == 15
