"""`scalerl serve MODEL --port 0` answers an OpenAI client (a tiny saved model; in process, and as the
command in a subprocess under `make test-envs`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from scalerl.assembly.evaluate import resolve_source  # noqa: E402
from scalerl.assembly.serve import start_serving  # noqa: E402
from scalerl.cli import main  # noqa: E402
from scalerl.models.tiny import TinyModelSpec, build_tiny_model, build_tiny_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def save_tiny(model_dir: Path) -> Path:
    spec = TinyModelSpec(hidden_size=32, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=64,
                         max_position_embeddings=256)
    build_tiny_model(spec).save_pretrained(model_dir)
    build_tiny_tokenizer().save_pretrained(model_dir)
    return model_dir


def test_start_serving_answers_an_openai_client_from_a_saved_model(tmp_path: Path) -> None:
    serving = start_serving(resolve_source(str(save_tiny(tmp_path / "tiny"))), device="cpu", max_tokens=5)
    try:
        client = openai.OpenAI(base_url=serving.url, api_key="x", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert r.usage.completion_tokens <= 5 and r.model == "tiny"
        assert r.system_fingerprint == "scalerl-policy-0"
        assert [m.id for m in client.models.list().data] == ["tiny"]
    finally:
        serving.close()


def test_serve_refuses_bad_input_with_exit_2(tmp_path: Path, capsys) -> None:
    assert main(["serve", str(tmp_path / "nope"), "--port", "0"]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--port", "0"]) == 2  # neither a run nor a model
    with pytest.raises(SystemExit):
        main(["serve", "x", "--port", "70000"])


@pytest.mark.envs
def test_scalerl_serve_answers_an_openai_client(tmp_path: Path) -> None:
    model_dir = save_tiny(tmp_path / "tiny")
    record = tmp_path / "calls.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "SCALERL_API_KEY": "sk-serve-test"}
    proc = subprocess.Popen([sys.executable, "-m", "scalerl.cli", "serve", str(model_dir), "--port", "0",
                             "--device", "cpu", "--record", str(record)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        line = proc.stdout.readline()
        assert " at http://127.0.0.1:" in line and "API key required" in line, line + proc.stderr.read()
        url = line.split(" at ", 1)[1].split()[0]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        client = openai.OpenAI(base_url=url, api_key="sk-serve-test", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=6, seed=1)
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 6
        assert r.system_fingerprint == "scalerl-policy-0" and r.model == "tiny"
        c = client.completions.create(model="tiny", prompt="1+1=", max_tokens=4)
        assert isinstance(c.choices[0].text, str)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "serve: stopped" in out and "sk-serve-test" not in out + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "sk-serve-test" not in record.read_text()
    calls = [json.loads(x) for x in record.read_text().splitlines()]
    assert [x["kind"] for x in calls] == ["chat", "completion"]
    assert len(calls[0]["completion_ids"]) == r.usage.completion_tokens == len(calls[0]["logprobs"])
