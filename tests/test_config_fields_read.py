"""No option may parse and then be ignored: every field of the `RunConfig` tree is read by the package.

A static check over `scalerl/` (config.py itself excluded: its validators check values, they do not
use them). The tree is walked from `RunConfig`, so sections added later are covered without editing
this test. A read is an attribute access `x.field` (or `getattr(x, "field")`) where `x` is known to
hold that field's section: a parameter or return annotated with the section's class, a name or
`self.` attribute assigned from such an expression, `RunConfig()` / `.model_copy()` of one, or a
sub-section reached from one (`cfg.generation.length_control`), or a field of a settings class
annotated with a section (`DriverSettings.pipeline: PipelineConfig`, `settings.pipeline.k`). A
property of a section that is read counts as reading the fields its body reads. A section handed
over whole as a dict (`.model_dump()`, except the root, which is only saved) counts for the fields
whose names its consumer mentions.

This is deliberately conservative: a field read only through an untyped variable is reported, and
the fix is to type the variable (or to delete the field).
"""

from __future__ import annotations

import ast
import types
import typing
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from scalerl import config as config_module
from scalerl.config import RunConfig

PACKAGE = Path(config_module.__file__).resolve().parent


def section_of(annotation: object) -> type[BaseModel] | None:
    """The pydantic section an annotation holds (`X`, `X | None`, `Optional[X]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        found = [s for a in typing.get_args(annotation) if (s := section_of(a)) is not None]
        return found[0] if len(found) == 1 else None
    return None


def sections(root: type[BaseModel] = RunConfig) -> dict[str, type[BaseModel]]:
    """Every section class reachable from `root`, by class name."""
    out = {root.__name__: root}
    for f in root.model_fields.values():
        sub = section_of(f.annotation)
        if sub is not None and sub.__name__ not in out:
            out.update(sections(sub))
    return out


def leaf_fields(root: type[BaseModel] = RunConfig, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """(key path, section class name, field name) of every non-section field under `root`."""
    for name, f in root.model_fields.items():
        sub = section_of(f.annotation)
        if sub is not None:
            yield from leaf_fields(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", root.__name__, name


SECTIONS = sections()
SUBSECTION = {(cls, name): sub.__name__ for cls, model in SECTIONS.items()
              for name, f in model.model_fields.items() if (sub := section_of(f.annotation)) is not None}
FIELDS = {cls: set(model.model_fields) for cls, model in SECTIONS.items()}


def holder_fields(package: Path) -> dict[tuple[str, str], str]:
    """(class, field) -> section, for classes of the package whose annotated fields hold sections.

    Components take their own sections bundled in settings classes (`DriverSettings.pipeline:
    PipelineConfig`); a field read through such a class is a read of the section's field."""
    out: dict[tuple[str, str], str] = {}
    for path in sorted(package.rglob("*.py")):
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            if cls.name in SECTIONS:
                continue
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    found = _section_name(stmt.annotation)
                    if found is not None:
                        out[(cls.name, stmt.target.id)] = found
    return out


def _section_name(node: ast.expr | None) -> str | None:
    """The section class an annotation names, sections only (see `annotation_section`)."""
    if isinstance(node, ast.Name):
        return node.id if node.id in SECTIONS else None
    if isinstance(node, ast.Attribute):
        return node.attr if node.attr in SECTIONS else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _section_name(node.left) or _section_name(node.right)
    return None


HOLDER_FIELDS = holder_fields(PACKAGE)
HOLDERS = {cls for cls, _ in HOLDER_FIELDS}
KNOWN = set(SECTIONS) | HOLDERS


def annotation_section(node: ast.expr | None) -> str | None:
    """The section class an annotation names (`RunConfig`, `cfg.RunConfig`, `"RunConfig"`, `X | None`)."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return annotation_section(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return None
    if isinstance(node, ast.Name):
        return node.id if node.id in KNOWN else None
    if isinstance(node, ast.Attribute):
        return node.attr if node.attr in KNOWN else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return annotation_section(node.left) or annotation_section(node.right)
    if isinstance(node, ast.Subscript):  # Optional[X]
        return annotation_section(node.slice)
    return None


class Reads:
    """What the package reads, filled by walking every module twice (types settle on the second)."""

    def __init__(self) -> None:
        self.read: set[tuple[str, str]] = set()
        self.dumped: set[str] = set()
        self.names_mentioned: set[str] = set()
        self.returns: dict[str, str] = {}
        self.self_attrs: dict[tuple[str, str], str] = {}
        self.property_reads: dict[tuple[str, str], set[str]] = {}

    def type_of(self, node: ast.expr, env: dict[str, str], cls: str | None) -> str | None:
        if isinstance(node, ast.Name):
            return env.get(node.id)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" and cls is not None:
                found = self.self_attrs.get((cls, node.attr))
                if found is not None:
                    return found
            owner = self.type_of(node.value, env, cls)
            if owner is None:
                return None
            return SUBSECTION.get((owner, node.attr)) or HOLDER_FIELDS.get((owner, node.attr))
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "model_copy":
                return self.type_of(func.value, env, cls)
            if isinstance(func, ast.Attribute) and func.attr in ("model_validate", "model_construct"):
                return annotation_section(func.value)
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in KNOWN:
                return name
            return self.returns.get(name) if name is not None else None
        if isinstance(node, ast.IfExp):
            return self.type_of(node.body, env, cls) or self.type_of(node.orelse, env, cls)
        if isinstance(node, ast.BoolOp):  # `settings or AgenticConfig()`
            return next((t for v in node.values if (t := self.type_of(v, env, cls)) is not None), None)
        return None

    def visit_module(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found = annotation_section(node.returns)
                if found is not None:
                    self.returns[node.name] = found
            if isinstance(node, ast.Attribute):
                self.names_mentioned.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                self.names_mentioned.add(node.value)
        self._scope(tree, {}, None)

    def _scope(self, node: ast.AST, env: dict[str, str], cls: str | None) -> None:
        env = dict(env)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                found = annotation_section(getattr(arg, "annotation", None))
                if found is not None:
                    env[arg.arg] = found
        body = list(ast.iter_child_nodes(node))
        for _ in range(2):  # assignments may come after the uses that an earlier loop iteration sees
            for child in self._walk_scope(body):
                if isinstance(child, (ast.Assign, ast.AnnAssign)):
                    value = child.value
                    targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                    found = self.type_of(value, env, cls) if value is not None else None
                    if isinstance(child, ast.AnnAssign):
                        found = found or annotation_section(child.annotation)
                    for target in targets:
                        if found is None:
                            continue
                        if isinstance(target, ast.Name):
                            env[target.id] = found
                        elif (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                              and target.value.id == "self" and cls is not None):
                            self.self_attrs[(cls, target.attr)] = found
                elif isinstance(child, ast.NamedExpr):
                    found = self.type_of(child.value, env, cls)
                    if found is not None:
                        env[child.target.id] = found
        for child in self._walk_scope(body):
            if isinstance(child, ast.Attribute):
                owner = self.type_of(child.value, env, cls)
                if owner is not None:
                    self._mark(owner, child.attr)
            elif isinstance(child, ast.Call):
                func = child.func
                if isinstance(func, ast.Name) and func.id == "getattr" and len(child.args) >= 2:
                    owner = self.type_of(child.args[0], env, cls)
                    name = child.args[1]
                    if owner is not None and isinstance(name, ast.Constant) and isinstance(name.value, str):
                        self._mark(owner, name.value)
                if isinstance(func, ast.Attribute) and func.attr == "model_dump":
                    owner = self.type_of(func.value, env, cls)
                    if owner is not None and owner != RunConfig.__name__:
                        self.dumped.add(owner)
        for child in body:
            for inner in self._nested_scopes(child):
                inner_cls = inner.name if isinstance(inner, ast.ClassDef) else cls
                self._scope(inner, env if not isinstance(inner, ast.ClassDef) else {}, inner_cls)

    @staticmethod
    def _walk_scope(nodes: list[ast.AST]) -> Iterator[ast.AST]:
        """Every node of these statements, not descending into nested functions or classes."""
        stack = list(nodes)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            yield node
            stack.extend(ast.iter_child_nodes(node))

    @staticmethod
    def _nested_scopes(node: ast.AST) -> Iterator[ast.AST]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            yield node
            return
        for child in ast.iter_child_nodes(node):
            yield from Reads._nested_scopes(child)

    def _mark(self, owner: str, attr: str) -> None:
        if attr in FIELDS.get(owner, ()):
            self.read.add((owner, attr))
        for name in self.property_reads.get((owner, attr), ()):
            self.read.add((owner, name))


def section_properties() -> dict[tuple[str, str], set[str]]:
    """(section, property) -> the fields its body reads through `self`."""
    tree = ast.parse(Path(config_module.__file__).read_text())
    out: dict[tuple[str, str], set[str]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in SECTIONS):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            if any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list):
                out[(cls.name, fn.name)] = {
                    a.attr for a in ast.walk(fn) if isinstance(a, ast.Attribute)
                    and isinstance(a.value, ast.Name) and a.value.id == "self" and a.attr in FIELDS[cls.name]
                }
    return out


def unread_fields(package: Path = PACKAGE, skip: tuple[Path, ...] = ()) -> list[str]:
    reads = Reads()
    reads.property_reads = section_properties()
    trees = [ast.parse(p.read_text(), filename=str(p)) for p in sorted(package.rglob("*.py"))
             if p.resolve() != Path(config_module.__file__).resolve() and p not in skip]
    for _ in range(2):  # return annotations and self-attributes of other modules settle first
        for tree in trees:
            reads.visit_module(tree)
    return [path for path, cls, name in leaf_fields()
            if (cls, name) not in reads.read
            and not (cls in reads.dumped and name in reads.names_mentioned)]


def test_every_config_field_is_read_by_the_package() -> None:
    unread = unread_fields()
    assert not unread, f"config fields that nothing in scalerl/ reads (dead options): {unread}"


def test_the_check_sees_through_the_ways_fields_are_read(tmp_path: Path) -> None:
    # The check itself must fail for a field nothing reads: take the package minus one reader.
    assert len(list(leaf_fields())) > 50 and "generation.vllm.enforce_eager" in {p for p, *_ in leaf_fields()}
    factory = PACKAGE / "rollout" / "factory.py"
    assert "generation.vllm.enforce_eager" in unread_fields(skip=(factory,))
