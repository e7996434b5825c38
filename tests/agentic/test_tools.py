"""The built-in tools: calculator, BM25 search over a user corpus, the sandboxed Python interpreter
(state per episode; the code verifier's hostile programs, sent from inside a multi-turn episode)."""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest

from scalerl.agentic.chat import ChatFormat
from scalerl.agentic.environment import ToolEnvironment
from scalerl.agentic.rollout import TrajectoryEngine
from scalerl.agentic.toolcalls import ToolCall, format_tool_call
from scalerl.agentic.tools import (
    Calculator,
    PythonInterpreter,
    Search,
    SearchIndex,
    ToolBox,
    ToolError,
    ToolSettings,
    evaluate_arithmetic,
    load_corpus,
    tool_factories,
)
from scalerl.config import AgenticConfig
from scalerl.rewards.sandbox import Sandbox, SandboxConfig
from tests.agentic.fakes import ScriptedEngine
from tests.agentic.test_rollout import TOK, decode, run

REPO = Path(__file__).resolve().parents[2]


def test_calculator_is_exact_and_bounded() -> None:
    assert evaluate_arithmetic("48213907+55128344") == 103342251
    assert evaluate_arithmetic("(2**64 - 1) * 3 // 7 % 1000") == ((2**64 - 1) * 3 // 7) % 1000
    assert evaluate_arithmetic("-3/4") == -0.75
    assert Calculator().call({"expression": "123456789123456789*987654321987654321"}) == str(
        123456789123456789 * 987654321987654321)
    for expr, kind in [("__import__('os').system('id')", "bad_arguments"), ("9**9**9", "bad_arguments"),
                       ("1/0", "tool_error"), ("x+1", "bad_arguments"), ("1+", "bad_arguments"),
                       ("+".join(["1"] * 300), "bad_arguments")]:
        with pytest.raises(ToolError) as err:
            evaluate_arithmetic(expr)
        assert err.value.kind == kind, expr
    with pytest.raises(ToolError, match="non-empty string"):
        Calculator().call({"expression": 3})


def test_search_ranks_a_user_corpus_with_bm25(tmp_path: Path) -> None:
    pytest.importorskip("bm25s")
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("\n".join([
        '{"id": "paris", "title": "Paris", "text": "Paris is the capital of France, on the Seine."}',
        '{"id": "rome", "text": "Rome is the capital of Italy; the Tiber runs through it."}',
        '{"id": "seine", "text": "The Seine flows through Paris into the English Channel."}',
    ]))
    index = SearchIndex(load_corpus(corpus))
    tool = Search(index)
    out = tool.call({"query": "Seine river Paris", "k": 2})
    lines = out.splitlines()
    assert len(lines) == 2 and {"(paris)", "(seine)"} == {line.split()[1] for line in lines}
    assert tool.call({"query": "Tiber"}).startswith("[1] (rome) Rome is the capital")
    assert tool.call({"query": "zebra xylophone"}) == "no results"
    with pytest.raises(ToolError, match="'k' must be"):
        tool.call({"query": "Paris", "k": 0})
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.txt").write_text("alpha beta")
    assert [d.id for d in load_corpus(tmp_path / "folder")] == ["a.txt"]
    with pytest.raises(ValueError, match=r"docs.jsonl:2: no 'text'"):
        bad = tmp_path / "docs.jsonl"
        bad.write_text('{"text": "ok"}\n{"title": "no text"}\n')
        load_corpus(bad)


def test_tool_specs_are_checked_with_their_key_path() -> None:
    with pytest.raises(ValueError, match=r"agentic.tools\[1\]: unknown tool 'abacus'"):
        tool_factories(["calculator", "abacus"], ToolSettings())
    with pytest.raises(ValueError, match=r"agentic.tools\[0\]: the search tool needs agentic.corpus_path"):
        tool_factories(["search"], ToolSettings())
    with pytest.raises(ValueError, match=r"agentic.tools\[0\]: .*did not make a tool"):
        tool_factories(["builtins:dict"], ToolSettings())
    with pytest.raises(ValueError, match=r"agentic.tools\[0\]: .*is not callable"):
        tool_factories(["tests.agentic.test_tools:REPO"], ToolSettings())
    assert list(tool_factories(["tests.agentic.test_rollout:BrokenTool"], ToolSettings())) == ["broken"]


def test_the_python_tool_fails_closed_where_the_sandbox_cannot_isolate() -> None:
    unisolatable = Sandbox(SandboxConfig(unshare="/nonexistent/unshare", max_parallel=1))
    with pytest.raises(ValueError, match=r"rewards\.sandbox\.isolation: 'auto' cannot be had here .*"
                                         r"needed for the python tool \(agentic\.tools\[1\]\)"):
        tool_factories(["calculator", "python"], ToolSettings(sandbox=unisolatable))
    assert unisolatable.stats()["runs"] == 0


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxConfig(max_parallel=2, nproc=16, memory_mb=256, wall_s=3.0,
                                 max_output_bytes=64 * 1024))


def test_interpreter_state_lives_for_one_episode(sandbox: Sandbox) -> None:
    py = PythonInterpreter(sandbox, wall_s=3.0)
    assert py.call({"code": "x = 20\nprint('set')"}) == "set"
    assert py.call({"code": "x * 2 + 2"}) == "42"  # earlier cells replayed, their output hidden
    assert "ZeroDivisionError" in py.call({"code": "1/0"})
    assert py.call({"code": "x"}) == "20"
    py.close()
    assert "NameError" in py.call({"code": "x"})  # a new episode starts empty


def python_call(code: str) -> str:
    return format_tool_call(ToolCall("python", {"code": textwrap.dedent(code)}))


def test_hostile_programs_from_inside_an_episode_are_contained(sandbox: Sandbox, monkeypatch) -> None:
    prot = sandbox.protections
    secret = secrets.token_hex(8)
    monkeypatch.setenv("SCALERL_TOOL_SECRET", secret)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(5)
    accepted: list[bool] = []

    def accept() -> None:
        try:
            listener.accept()
            accepted.append(True)
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    outside = Path(tempfile.mkdtemp(prefix=".tool-test-", dir=REPO))
    os.chmod(outside, 0o777)
    programs = [
        "keep = 7\nprint('kept')",
        # fork bomb, bounded at 300 processes
        """
        import os, time
        n = 0
        for _ in range(300):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(30); os._exit(0)
            n += 1
        print('forked', n, flush=True)
        time.sleep(30)
        """,
        # memory bomb, bounded at 3 GB
        """
        chunks = []
        try:
            for _ in range(30):
                chunks.append(bytearray(100 * 1024 * 1024))
        except MemoryError:
            pass
        print('allocated', len(chunks) * 100)
        """,
        f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {listener.getsockname()[1]}), timeout=1)
            print('connected')
        except OSError as err:
            print('blocked', type(err).__name__)
        """,
        f"""
        try:
            open({str(outside / 'escape.txt')!r}, 'w').write('x')
            print('wrote')
        except OSError as err:
            print('refused', type(err).__name__)
        """,
        "import os\nprint('secret', os.environ.get('SCALERL_TOOL_SECRET'))",
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
        "import time\ntime.sleep(30)",
        "print('still here', keep)",
    ]

    def policy(context: str) -> str:
        n = context.count("<tool_response>")
        return python_call(programs[n]) if n < len(programs) else "\\boxed{579}"

    box = ToolBox(tool_factories(["python"], ToolSettings(sandbox=sandbox, timeout_s=3.0)))
    engine = TrajectoryEngine(ScriptedEngine(TOK, policy), lambda: ToolEnvironment(box, timeout_s=10.0),
                              ChatFormat(TOK), decode,
                              AgenticConfig(max_turns=12, max_total_tokens=8000, max_observation_tokens=80))
    try:
        (c,) = run(engine, max_new_tokens=600)
    finally:
        listener.close()
    info = c.metadata["agentic"]
    assert info["end"] == "answer" and info["tool_calls"] == len(programs)
    observations = TOK.decode(c.token_ids).split("<tool_response>")[1:]
    obs = [o.split("</tool_response>")[0] for o in observations]
    assert obs[0] == "kept"
    assert obs[1].startswith("error (timeout)")  # the bomb hit RLIMIT_NPROC and slept to the wall limit
    assert int(obs[2].split()[1]) < sandbox.config.memory_mb
    if prot.network_isolated:
        assert obs[3].startswith("blocked") and not accepted
    if prot.readonly_filesystem:
        assert obs[4].startswith("refused") and not (outside / "escape.txt").exists()
    assert obs[5] == "secret None"
    assert obs[6].startswith("error (output_limit)") and obs[7].startswith("error (timeout)")
    assert obs[8] == "still here 7"  # killed cells are not replayed; the episode's state survived
    assert info["tool_errors"] == {"timeout": 2, "output_limit": 1}
    outside.rmdir()
