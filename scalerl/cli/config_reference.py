"""docs/config.md, generated from `RunConfig`: every key with its type, default and meaning.

The meaning is the field's pydantic `description`, else the comment lines written just above the
field in `scalerl/config.py`, else the section's docstring names it. The page is generated so it
cannot drift from the schema: `tests/test_docs_config.py` fails when the committed page differs from
what this module prints. Regenerate with

    python -m scalerl.cli.config_reference > docs/config.md
"""

from __future__ import annotations

import inspect
import io
import sys
import tokenize
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from scalerl.config import RunConfig

HEADER = """# Configuration reference

Every key of a run's configuration (`scalerl train -c FILE.yaml key.sub=value ...`), generated from
`scalerl/config.py` by `python -m scalerl.cli.config_reference > docs/config.md`;
`tests/test_docs_config.py` fails when this page is stale. Each section forbids unknown keys: a typo
is an error naming the key path (and file:line for YAML). Cross-key rules (which combinations are
refused) are checked at load time and named in the error.
"""


def _field_comments(cls: type[BaseModel]) -> dict[str, str]:
    """Comment lines directly above each `name: type = ...` line of the class body."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    pending: list[str] = []
    depth_line = None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            # only comments at field indentation (4 spaces) belong to the next field
            if tok.start[1] == 4:
                pending.append(tok.string.lstrip("#").strip())
            continue
        if tok.type == tokenize.NAME and tok.start[1] == 4 and tok.start[0] != depth_line:
            depth_line = tok.start[0]
            line = source.splitlines()[tok.start[0] - 1].strip()
            if ":" in line and not line.startswith(("def ", "class ", "@", "return", "if ")):
                name = line.split(":", 1)[0].strip()
                if name.isidentifier() and pending:
                    out[name] = " ".join(pending)
            pending = []
    return out


def _type_name(annotation: Any) -> str:
    text = repr(annotation) if not isinstance(annotation, type) else annotation.__name__
    text = text.replace("typing.", "").replace("NoneType", "None")
    return text


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _default(field: Any) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(cls: type[BaseModel], prefix: str, sections: list[tuple[str, type[BaseModel]]]) -> list[str]:
    comments = _field_comments(cls)
    rows = []
    hints = typing.get_type_hints(cls)
    for name, field in cls.model_fields.items():
        annotation = hints.get(name, field.annotation)
        path = f"{prefix}{name}"
        if _is_section(annotation):
            sections.append((path, annotation))
            rows.append(f"| `{path}` | section | | see [{path}](#{path.replace('.', '')}) |")
            continue
        meaning = field.description or comments.get(name, "")
        rows.append(f"| `{path}` | `{_cell(_type_name(annotation))}` | `{_cell(_default(field))}` | "
                    f"{_cell(meaning)} |")
    return rows


def render() -> str:
    out = [HEADER]
    todo: list[tuple[str, type[BaseModel]]] = [("", RunConfig)]
    while todo:
        path, cls = todo.pop(0)
        found: list[tuple[str, type[BaseModel]]] = []
        title = path or "top level"
        out.append(f"\n## {title}\n")
        doc = inspect.getdoc(cls)
        if doc and cls is not RunConfig and doc != inspect.getdoc(BaseModel):
            out.append(" ".join(doc.split()) + "\n")
        out.append("| key | type | default | meaning |\n| --- | --- | --- | --- |")
        out.extend(_rows(cls, f"{path}." if path else "", found))
        todo.extend(found)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args and args[0] == "--check":
        page = Path(args[1] if len(args) > 1 else "docs/config.md")
        if not page.is_file() or page.read_text() != text:
            print(f"{page} is stale: regenerate with python -m scalerl.cli.config_reference > {page}",
                  file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
