"""The embedded engine at a real vocabulary (issue 23, "the engine side at this shape"): generation and
evaluation hold at most one step's logits per sequence, `[batch, vocab]`, never `[batch, tokens, vocab]`.

Two checks:

- Every tensor an aten op allocates during `generate` and `evaluate` is recorded (a
  `TorchDispatchMode`; views and in-place results are not allocations and are skipped); of those
  whose last dimension is the vocabulary, none has more rows than the engine has slots. A control
  shows the recorder sees a full-sequence projection (`model(ids).logits`). Tiny model, default suite.
- `real_shape` (deselected by default, `make test-real-shape`): random-init Qwen2 with Qwen2.5-0.5B's
  layer shape and vocabulary 151,936 (2 layers; `benchmarks/bench_real_shape.py`'s `save_model`), one
  fresh process per length, prompts of 512 vs 2,048 tokens and responses of 32 vs 128. Each phase's
  peak RSS growth over the RSS at its start is read from the kernel (`/proc/self/status` VmHWM after
  `echo 5 > /proc/self/clear_refs` resets the high-water mark): the prefill, the decode steps after it,
  and an evaluation through the same engine. Compared with the float32 logits of every position,
  `[B, tokens, V]` (what a full-sequence projection would hold), and the same op recorder runs there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = Path(__file__).resolve().parents[2]
REAL_VOCAB = 151_936
SLOTS = 4
INIT_STD = 0.2


class VocabTensors(TorchDispatchMode):
    """Records the shape of every tensor an op allocates whose last dimension is `vocab`."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.shapes: Counter[tuple[int, ...]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        # A result sharing an input's storage (a view, an in-place op) allocates nothing.
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if (isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab
                    and t.untyped_storage().data_ptr() not in inputs):
                self.shapes[tuple(t.shape)] += 1
        return out

    @property
    def max_rows(self) -> int:
        """The most vocabulary-sized rows one allocated tensor held (its numel / vocab)."""
        return max((int(torch.Size(s).numel()) // self.vocab for s in self.shapes), default=0)


class NonEmpty:
    """Verifier: correct iff the completion decodes to some text."""

    def score(self, record: object, completion_text: str) -> float:
        return float(bool(completion_text))


def decode(ids: list[int]) -> str:
    return " ".join(map(str, ids))


def generate_and_evaluate(model: torch.nn.Module, prompt: int, response: int, recorder: VocabTensors) -> None:
    """One top-p request (keep-sampling-mask's support recorded) with `SLOTS` samples, then an
    evaluation of two prompts, k = 2, through the same engine, under `recorder`."""
    from scalerl.data.records import PromptRecord
    from scalerl.evaluation import evaluate
    from scalerl.pipeline import GroupScorer
    from scalerl.rollout import EmbeddedEngine, GenerationRequest, SamplingParams

    engine = EmbeddedEngine(model, max_batch_size=SLOTS, fp32_lm_head=True, seed=0, eos_token_ids=())
    vocab = engine.vocab_size
    ids = [8 + i % (vocab - 8) for i in range(prompt)]
    params = SamplingParams(n=SLOTS, max_new_tokens=response, top_p=0.95, return_support=True, seed=1)
    scorer = GroupScorer(NonEmpty(), decode, max_workers=0)
    records = [PromptRecord(id=f"q{i}", task="t", prompt="x") for i in range(2)]
    with recorder:
        out = engine.generate([GenerationRequest("r", ids, params)])
        metrics = evaluate(engine.generate, records, lambda r: ids, 2,
                           SamplingParams(max_new_tokens=response), scorer)
    assert [c.num_tokens for c in out] == [response] * SLOTS
    assert all(len(c.support or []) == response for c in out)
    assert metrics["val_response_length"] == response


def test_generation_and_evaluation_allocate_one_row_of_logits_per_sequence() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab = 4096  # no other dimension of this model equals it
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).eval()
    recorder = VocabTensors(vocab)
    generate_and_evaluate(model, prompt=40, response=6, recorder=recorder)
    assert recorder.max_rows == SLOTS, recorder.shapes
    assert (SLOTS, vocab) in recorder.shapes

    # Control: the recorder sees a full-sequence projection, so the assertion above can fail.
    control = VocabTensors(vocab)
    with control, torch.no_grad():
        model(input_ids=torch.arange(8, 48).unsqueeze(0))
    assert control.max_rows == 40, control.shapes


# ------------------------------------------------------------------------------- real shape (slow)
def _bench() -> Any:
    """`benchmarks/bench_real_shape.py`, imported from its file (its model builder is reused)."""
    path = ROOT / "benchmarks" / "bench_real_shape.py"
    spec = importlib.util.spec_from_file_location("bench_real_shape", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _status_mb() -> dict[str, float]:
    text = Path("/proc/self/status").read_text()
    return {key: int(re.search(key + r":\s+(\d+) kB", text).group(1)) / 1024  # type: ignore[union-attr]
            for key in ("VmRSS", "VmHWM")}


def _reset_peak() -> float:
    """Reset the kernel's RSS high-water mark (Linux >= 4.0, proc(5) clear_refs); the RSS now, MB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mb()["VmRSS"]


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """One length setting in this fresh process: peak RSS growth (MB) of each phase over its start."""
    from transformers import AutoModelForCausalLM

    from scalerl.data.records import PromptRecord
    from scalerl.evaluation import evaluate
    from scalerl.pipeline import GroupScorer
    from scalerl.rollout import EmbeddedEngine, GenerationRequest, SamplingParams

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = AutoModelForCausalLM.from_pretrained(spec["model"], attn_implementation="sdpa",
                                                 dtype=torch.float32)
    engine = EmbeddedEngine(model, max_batch_size=SLOTS, fp32_lm_head=True, seed=0, eos_token_ids=())
    prompt, response, vocab = spec["prompt"], spec["response"], engine.vocab_size
    ids = [8 + (7 * i) % (vocab - 8) for i in range(prompt)]
    top_p = SamplingParams(n=SLOTS, max_new_tokens=response, top_p=0.95, return_support=True, seed=1)
    # Warm-up: the float32 head copy, the KV cache's first buffers, the kernels' workspaces.
    engine.generate([GenerationRequest("warm", ids[:16], SamplingParams(n=SLOTS, max_new_tokens=2, top_p=0.95,
                                                                        return_support=True))])
    out: dict[str, Any] = {"rss_start_mb": _status_mb()["VmRSS"]}

    base = _reset_peak()
    engine.submit([GenerationRequest("r", ids, top_p)])
    done = engine.step()  # admits all SLOTS samples: the prefill of their prompts, the first token
    out["prefill_mb"] = _status_mb()["VmHWM"] - base
    base = _reset_peak()
    while engine.num_unfinished():
        done += engine.step()
    out["decode_mb"] = _status_mb()["VmHWM"] - base
    assert [c.num_tokens for c in done] == [response] * SLOTS
    assert all(len(c.support or []) == response and min(c.support or [0]) > 0 for c in done)
    out["support_min"] = min(min(c.support or [0]) for c in done)

    scorer = GroupScorer(NonEmpty(), decode, max_workers=0)
    records = [PromptRecord(id=f"q{i}", task="t", prompt="x") for i in range(2)]
    base = _reset_peak()
    metrics = evaluate(engine.generate, records, lambda r: ids, 2, SamplingParams(max_new_tokens=response),
                       scorer)
    out["eval_mb"] = _status_mb()["VmHWM"] - base
    assert metrics["val_response_length"] == response

    if spec["record"]:
        recorder = VocabTensors(vocab)
        generate_and_evaluate(model, prompt=prompt, response=4, recorder=recorder)
        out["max_vocab_rows"] = recorder.max_rows
        out["vocab_shapes"] = sorted(recorder.shapes)
    return out


def run_child(model: Path, prompt: int, response: int, record: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    spec = {"model": str(model), "prompt": prompt, "response": response, "record": record}
    proc = subprocess.run(
        [sys.executable, __file__, json.dumps(spec)],
        capture_output=True, text=True, timeout=1500, env=env, cwd=str(ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def full_logits_mb(tokens: int) -> float:
    """float32 logits of `tokens` positions for each of the `SLOTS` sequences: `[B, tokens, V] * 4` bytes."""
    return SLOTS * tokens * REAL_VOCAB * 4 / 2**20


@pytest.mark.real_shape
@pytest.mark.timeout(1800)
def test_engine_at_vocab_151936_holds_one_step_of_logits(tmp_path: Path) -> None:
    bench = _bench()
    shape = bench.Shape(**{**bench.asdict(bench.QWEN25_05B), "layers": 2})
    # Init std 0.2: peaked next-token distributions (top-p 0.95 keeps ~2-200 tokens, as a trained
    # model's do), rather than the near-flat ones of 0.02 where every step's top-p cut is a full sort.
    bench.save_model(shape, tmp_path, init_std=INIT_STD)
    lengths: Sequence[tuple[int, int]] = ((512, 32), (2048, 128))
    # The op recorder at the shorter length only (it is the same code path; the longer one's memory
    # figures would show a full-prompt projection, [4, 2048, V] float32 = 4.6 GiB, at once).
    rows = {p: run_child(tmp_path, p, r, record=p == lengths[0][0]) for p, r in lengths}
    report = []
    for p, r in lengths:
        row = rows[p]
        report.append(f"prompt {p} response {r}: prefill +{row['prefill_mb']:.0f} MB (full-prompt logits "
                      f"{full_logits_mb(p):.0f}), decode +{row['decode_mb']:.0f} MB (response logits "
                      f"{full_logits_mb(r):.0f}), eval +{row['eval_mb']:.0f} MB; largest vocab tensor rows "
                      f"{row.get('max_vocab_rows', '-')}")
    (lo, r_lo), (hi, r_hi) = lengths
    peak = {p: max(rows[p]["prefill_mb"], rows[p]["decode_mb"], rows[p]["eval_mb"]) for p, _ in lengths}
    growth, full = peak[hi] - peak[lo], full_logits_mb(hi + r_hi) - full_logits_mb(lo + r_lo)
    report.append(f"peak growth {lo}->{hi}: +{growth:.0f} MB vs full-sequence logits +{full:.0f} MB "
                  f"(ratio {growth / full:.3f})")
    print("\n".join(report))
    # The largest vocabulary-sized allocation is one row per slot, [batch, vocab].
    assert rows[lo]["max_vocab_rows"] == SLOTS, rows[lo]["vocab_shapes"]
    for p, _ in lengths:
        row = rows[p]
        # Prefill and evaluation: the decoder's own activations, a small part of the prompt's logits.
        assert row["prefill_mb"] < 0.25 * full_logits_mb(p), report
        assert row["eval_mb"] < 0.25 * full_logits_mb(p), report
    # Decode steps keep nothing vocabulary-sized from step to step: their peak stays below the
    # logits of the longer response's tokens by far (the KV cache is ~2 kB per token at this shape).
    assert rows[hi]["decode_mb"] < 0.25 * full_logits_mb(r_hi), report
    assert growth < 0.2 * full, report


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
