"""Tools an environment offers the model: a calculator, a Python interpreter, a document search.

A tool has a `name`, a `description` and JSON-schema `parameters` (what a chat template's tool list
shows the model), `call(arguments) -> str` (the observation) and `close()`. A tool instance lives for
one episode: `ToolBox.open()` makes fresh instances for each trajectory, and `close()` destroys their
state when it ends (the interpreter's variables never leak from one episode to the next).

A tool signals a failure by raising `ToolError(kind, message)`; any other exception is a bug in the
tool and is reported as kind `tool_error`. The environment turns either into an error observation
and counts it by kind (see `environment.py`); the episode goes on.

Custom tools load by dotted path like custom verifiers: `agentic.tools: ["my_pkg.tools:Weather"]`
names a class or function that, called with no arguments, returns a tool.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from scalerl.config import ConfigError
from scalerl.inputs import InputError
from scalerl.rewards.registry import import_object
from scalerl.rewards.sandbox import Sandbox, SandboxResult

ERROR_KINDS: tuple[str, ...] = (
    "malformed", "unknown_tool", "bad_arguments", "tool_error", "timeout", "output_limit", "killed",
)


class ToolError(Exception):
    """A tool call that failed in a way the model should be told about; `kind` is counted."""

    def __init__(self, kind: str, message: str) -> None:
        if kind not in ERROR_KINDS:
            raise ValueError(f"ToolError kind: {kind!r} is not one of {ERROR_KINDS}")
        super().__init__(message)
        self.kind = kind


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str
    parameters: dict[str, Any]

    def call(self, arguments: Mapping[str, Any]) -> str: ...

    def close(self) -> None: ...


def schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI-style function schema chat templates render (`tools=[...]`)."""
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}


def _string_arg(arguments: Mapping[str, Any], key: str, tool: str) -> str:
    value = arguments.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ToolError("bad_arguments", f"{tool}: needs a non-empty string argument {key!r}")
    extra = sorted(set(arguments) - {key, "k"})
    if extra:
        raise ToolError("bad_arguments", f"{tool}: unknown argument(s) {extra}")
    return value


# ------------------------------------------------------------------------------------------ calculator

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_CALC_NODES = 256
MAX_CALC_DIGITS = 4096


def evaluate_arithmetic(expression: str) -> int | float:
    """Exact integer (or float) arithmetic over `+ - * / // % **` and parentheses, nothing else.

    Parsed with `ast` and walked by hand: no names, calls or attributes can run. Bounded so one call
    cannot hang the run: at most `MAX_CALC_NODES` nodes, results of at most `MAX_CALC_DIGITS` digits.
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ToolError("bad_arguments", f"calculator: not an arithmetic expression ({err.msg})") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_CALC_NODES:
        raise ToolError("bad_arguments", f"calculator: expression too long ({nodes} nodes)")

    def check(value: Any) -> Any:
        if isinstance(value, int) and value.bit_length() > MAX_CALC_DIGITS * 3.33:
            raise ToolError("bad_arguments", f"calculator: result over {MAX_CALC_DIGITS} digits")
        if isinstance(value, float) and not math.isfinite(value):
            raise ToolError("tool_error", "calculator: result is not finite")
        return value

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return check(_UNARY[type(node.op)](walk(node.operand)))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64 and abs(left) > 1:
                raise ToolError("bad_arguments", "calculator: exponent too large")
            try:
                return check(_BINARY[type(node.op)](left, right))
            except ZeroDivisionError:
                raise ToolError("tool_error", "calculator: division by zero") from None
            except OverflowError:
                raise ToolError("tool_error", "calculator: overflow") from None
        raise ToolError("bad_arguments", f"calculator: {type(node).__name__} is not allowed")

    return walk(tree)


class Calculator:
    """Exact arithmetic on one expression (`{"expression": "48213907+55128344"}` -> `103342251`)."""

    name = "calculator"
    description = "Evaluate an arithmetic expression exactly (+ - * / // % ** and parentheses)."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 48213907+55128344"}},
        "required": ["expression"],
    }

    def call(self, arguments: Mapping[str, Any]) -> str:
        value = evaluate_arithmetic(_string_arg(arguments, "expression", self.name))
        return repr(value) if isinstance(value, float) else str(value)

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------ python

# Runs every cell of the episode in one namespace; earlier cells run with their output discarded, so
# the program's output is the last cell's. A last expression statement is printed, as in a REPL.
_RUNNER = r'''
import ast, contextlib, io, json, sys, traceback
cells = json.load(open("cells.json"))
ns = {"__name__": "__main__"}
def run(src, show):
    tree = ast.parse(src, "<cell>", "exec")
    last = None
    if show and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), ns)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), ns)
        if value is not None:
            print(repr(value))
for src in cells[:-1]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            run(src, False)
        except BaseException:
            pass
try:
    run(cells[-1], True)
except SystemExit:
    raise
except BaseException:
    lines = traceback.format_exc().splitlines()
    print("\n".join(lines[-3:]), file=sys.stderr)
    sys.exit(1)
'''


class PythonInterpreter:
    """Runs model-written Python in `scalerl.rewards.sandbox` (no network, scratch-only writes, time,
    memory and process limits), with state kept for one episode.

    The sandbox starts a fresh, empty process per run, so state is kept by replay: each call runs the
    episode's earlier cells (output discarded) and then the new one, in one namespace. A cell that
    was killed (timeout, output cap, a signal such as the memory limit) is not kept, so it cannot
    poison later calls. `close()` forgets the cells: nothing of an episode outlives it (each run's
    scratch directory is removed by the sandbox).
    """

    name = "python"
    description = "Run Python code; prints what the code prints (and the value of a last expression)."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python source"}},
        "required": ["code"],
    }

    def __init__(self, sandbox: Sandbox, *, wall_s: float = 10.0, max_output_chars: int = 2000) -> None:
        self.sandbox = sandbox
        self.wall_s = float(wall_s)
        self.max_output_chars = int(max_output_chars)
        self._cells: list[str] = []

    @property
    def cells(self) -> list[str]:
        return list(self._cells)

    def call(self, arguments: Mapping[str, Any]) -> str:
        code = _string_arg(arguments, "code", self.name)
        cells = [*self._cells, code]
        result = self.sandbox.run_python(
            {"main.py": _RUNNER, "cells.json": json.dumps(cells)}, "main.py", wall_s=self.wall_s
        )
        failure = _python_failure(result)
        if failure is not None:
            raise failure
        self._cells = cells
        out = result.stdout.decode("utf-8", "replace")
        if result.exit_code:
            out += result.stderr.decode("utf-8", "replace")
        out = out.strip() or "(no output)"
        if len(out) > self.max_output_chars:
            out = out[: self.max_output_chars] + f"... [{len(out) - self.max_output_chars} chars cut]"
        return out

    def close(self) -> None:
        self._cells = []


def _python_failure(result: SandboxResult) -> ToolError | None:
    reason = result.reason
    if reason == "sandbox_error":
        return ToolError("tool_error", f"python: the sandbox failed: {result.error}")
    if reason == "timeout":
        return ToolError("timeout", f"python: killed after {result.wall_s:.1f} s (time limit)")
    if reason == "output_limit":
        return ToolError("output_limit", "python: killed for printing too much")
    if reason == "signal":
        return ToolError("killed", f"python: killed by signal {result.signal} (memory or process limit)")
    return None


# ------------------------------------------------------------------------------------------ search


@dataclass(frozen=True)
class Document:
    id: str
    text: str


def load_corpus(path: str | Path) -> list[Document]:
    """Documents from a `.jsonl` file (`text`, optional `id`/`title` per line), a `.txt` file (one
    document per non-empty line) or a folder (one document per `.txt`/`.md` file, sorted by name)."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"agentic.corpus_path: {root} does not exist")
    docs: list[Document] = []
    if root.is_dir():
        for f in sorted(p for p in root.rglob("*") if p.suffix.lower() in (".txt", ".md")):
            text = f.read_text(encoding="utf-8").strip()
            if text:
                docs.append(Document(str(f.relative_to(root)), text))
    elif root.suffix.lower() == ".jsonl":
        for lineno, line in enumerate(root.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{root}:{lineno}: not valid JSON ({err.msg})") from None
            text = row.get("text") if isinstance(row, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{root}:{lineno}: no 'text' string")
            title = row.get("title")
            body = f"{title}: {text}" if isinstance(title, str) and title else text
            docs.append(Document(str(row.get("id", f"{root.name}:{lineno}")), body))
    else:
        for lineno, line in enumerate(root.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                docs.append(Document(f"{root.name}:{lineno}", line.strip()))
    if not docs:
        raise ValueError(f"agentic.corpus_path: {root} holds no documents")
    return docs


class SearchIndex:
    """A BM25 index over a corpus (the `bm25s` library), built once and shared by every episode."""

    def __init__(self, documents: Sequence[Document]) -> None:
        try:
            import bm25s
        except ImportError as err:
            raise ImportError("the search tool needs bm25s: pip install 'scalerl[agentic]'") from err
        if not documents:
            raise ValueError("search index: no documents")
        self._bm25s = bm25s
        self.documents = list(documents)
        self._retriever = bm25s.BM25()
        self._retriever.index(bm25s.tokenize([d.text for d in self.documents], stopwords="en",
                                             show_progress=False), show_progress=False)
        self._lock = threading.Lock()  # bm25s retrieval is not documented as thread-safe

    def search(self, query: str, k: int) -> list[tuple[Document, float]]:
        """The top-`k` documents with a positive BM25 score, best first."""
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:
            return []
        k = min(k, len(self.documents))
        with self._lock:
            ids, scores = self._retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return [(self.documents[int(i)], float(s)) for i, s in zip(ids[0], scores[0], strict=True) if s > 0]


class Search:
    """Document search: `{"query": "...", "k": 3}` -> the best passages, numbered, with their ids."""

    name = "search"
    description = "Search the document collection; returns the most relevant passages."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"query": {"type": "string"}, "k": {"type": "integer", "minimum": 1}},
        "required": ["query"],
    }

    def __init__(self, index: SearchIndex, *, default_k: int = 3, max_chars: int = 300) -> None:
        self.index = index
        self.default_k = default_k
        self.max_chars = max_chars

    def call(self, arguments: Mapping[str, Any]) -> str:
        query = _string_arg(arguments, "query", self.name)
        k = arguments.get("k", self.default_k)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 20:
            raise ToolError("bad_arguments", "search: 'k' must be an integer in [1, 20]")
        hits = self.index.search(query, k)
        if not hits:
            return "no results"
        lines = [f"[{n}] ({doc.id}) {doc.text[: self.max_chars]}" for n, (doc, _) in enumerate(hits, 1)]
        return "\n".join(lines)

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------ the box

BUILTIN_TOOLS: tuple[str, ...] = ("calculator", "python", "search")
ToolFactory = Callable[[], Tool]


@dataclass
class ToolSettings:
    """What the built-in tools need: the sandbox (python), the corpus (search), limits."""

    sandbox: Sandbox | None = None
    timeout_s: float = 10.0
    corpus_path: str | None = None
    max_output_chars: int = 2000


def tool_factories(names: Sequence[str], settings: ToolSettings) -> dict[str, ToolFactory]:
    """Name -> per-episode factory, for built-in names and `module:attr` paths (key path named on error)."""
    factories: dict[str, ToolFactory] = {}
    index: SearchIndex | None = None
    for i, spec in enumerate(names):
        where = f"agentic.tools[{i}]"
        if spec == "calculator":
            factory: ToolFactory = Calculator
        elif spec == "python":
            if settings.sandbox is None:
                raise ConfigError(f"{where}: the python tool needs a sandbox")
            sandbox = settings.sandbox
            sandbox.require_isolation(f"the python tool ({where})")  # fail closed, before any episode

            def factory(sandbox: Sandbox = sandbox) -> Tool:
                return PythonInterpreter(sandbox, wall_s=settings.timeout_s,
                                         max_output_chars=settings.max_output_chars)
        elif spec == "search":
            if settings.corpus_path is None:
                raise ConfigError(f"{where}: the search tool needs agentic.corpus_path (a file or folder)")
            if index is None:
                try:
                    index = SearchIndex(load_corpus(settings.corpus_path))
                except (OSError, ValueError) as err:  # the corpus the config names: bad input
                    text = str(err)
                    raise InputError(text if text.startswith("agentic.corpus_path") else
                                     f"agentic.corpus_path: {text}") from None
                except ImportError as err:  # bm25s is an optional extra
                    raise ConfigError(f"{where}: {err}") from None
            built = index

            def factory(built: SearchIndex = built) -> Tool:
                return Search(built, max_chars=settings.max_output_chars)
        elif ":" in spec or "." in spec:
            try:
                factory = import_object(spec, "tool")
            except ValueError as err:
                raise ConfigError(f"{where}: {err}") from None
            if not callable(factory):
                raise ConfigError(f"{where}: {spec!r} is not callable (a tool class or factory)")
        else:
            raise ConfigError(f"{where}: unknown tool {spec!r} (built-in: {', '.join(BUILTIN_TOOLS)}, "
                             "or 'package.module:Factory')")
        try:
            probe = factory()
        except Exception as err:
            raise ConfigError(f"{where}: making {spec!r} failed: {type(err).__name__}: {err}") from None
        if not isinstance(probe, Tool):
            raise ConfigError(f"{where}: {spec!r} did not make a tool (needs name, description, "
                             "parameters, call, close)")
        if probe.name in factories:
            raise ConfigError(f"{where}: a second tool named {probe.name!r}")
        probe.close()
        factories[probe.name] = factory
    return factories


class ToolBox:
    """The tools of one environment; `open()` gives one episode its own instances."""

    def __init__(self, factories: Mapping[str, ToolFactory]) -> None:
        self.factories = dict(factories)

    @property
    def names(self) -> list[str]:
        return list(self.factories)

    def open(self) -> dict[str, Tool]:
        return {name: make() for name, make in self.factories.items()}

    def schemas(self) -> list[dict[str, Any]]:
        tools = self.open()
        try:
            return [schema(t) for t in tools.values()]
        finally:
            for t in tools.values():
                t.close()
