"""SGLang's Python source read without importing SGLang (no torch, no GPU): what ``compat`` checks.

``SourceIndex`` parses SGLang's modules with ``ast`` on demand. On top of it:

- ``server_args_layout``: the fields and command-line flags of ``ServerArgs`` in either layout SGLang
  has used in our window: a dataclass whose body declares the fields (``server_args.py``, up to 0.5.19)
  or a ``msgspec.defstruct`` assembled from the namespace classes listed in ``_INPUT_NAMESPACES``
  (``sglang/srt/arg_groups/fields/``, from 0.5.20). Flags are derived the way SGLang's
  ``add_cli_args_from_dataclass`` derives them (``A[T, "help"]`` or ``A[T, Arg(cli_name=...,
  aliases=[...], no_cli=...)]``), plus the flags ``add_cli_args`` registers by hand.
- ``struct_options``: the msgspec options of a ``msgspec.Struct`` class (``array_like``, ``tag``,
  ``omit_defaults``, ...), inherited from its bases as msgspec inherits them.
- ``load_structs``: SGLang's own ``msgspec.Struct`` class definitions of one module, executed (class
  bodies only, verbatim) against the real ``msgspec``; the module's other imports (SGLang internals
  that need numpy or torch) are not executed.
"""

from __future__ import annotations

import ast
import enum
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamo_api.errors import DynamoError

__all__ = [
    "FlagInfo",
    "LayoutError",
    "ServerArgsLayout",
    "SourceIndex",
    "load_structs",
    "server_args_layout",
    "struct_options",
]

SERVER_ARGS_MODULE = "sglang.srt.server_args"


@dataclass
class SourceIndex:
    """SGLang's modules parsed on demand from ``root`` (the folder that contains ``sglang/``)."""

    root: Path
    _trees: dict[str, ast.Module | None] = field(default_factory=dict)

    def path(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = self.path(module)
            self._trees[module] = ast.parse(path.read_text(), filename=str(path)) if path else None
        return self._trees[module]

    def top_level(self, module: str) -> dict[str, ast.AST]:
        """Top-level names of ``module``. A class keeps its ``ClassDef`` even when the module later
        rebinds the name (0.5.20+ replaces ``class ServerArgs`` by ``msgspec.defstruct(...)``)."""
        names: dict[str, ast.AST] = {}
        tree = self.tree(module)
        for node in tree.body if tree else ():
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names[node.name] = node
                continue
            bound: list[str] = []
            if isinstance(node, ast.Assign):
                bound = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                bound = [node.target.id]
            elif isinstance(node, (ast.ImportFrom, ast.Import)):
                for a in node.names:
                    names.setdefault((a.asname or a.name).split(".")[0], node)
                continue
            for name in bound:
                if not isinstance(names.get(name), ast.ClassDef):
                    names[name] = node
        return names

    def find_class(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        """The class ``name`` as seen from ``module``, following ``from x import name`` re-exports."""
        node = self.top_level(module).get(name)
        if isinstance(node, ast.ClassDef):
            return module, node
        if isinstance(node, ast.ImportFrom) and node.module is not None and depth < 5:
            target = node.module if node.level == 0 else _relative(module, node.module, node.level)
            original = next((a.name for a in node.names if (a.asname or a.name) == name), name)
            return self.find_class(target, original, depth + 1)
        return None

    def members(self, module: str, cls: str, depth: int = 0) -> dict[str, ast.AST]:
        """Methods, class attributes, and ``self.x`` assignments of a class and its bases."""
        found = self.find_class(module, cls)
        if found is None:
            return {}
        where, node = found
        members: dict[str, ast.AST] = {}
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                members[item.name] = item
                members.update((attr, item) for attr in _self_attributes(item))
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                members[item.target.id] = item
            elif isinstance(item, ast.Assign):
                members.update((t.id, item) for t in item.targets if isinstance(t, ast.Name))
        if depth < 5:
            for base in node.bases:
                if isinstance(base, ast.Name):
                    for name, member in self.members(where, base.id, depth + 1).items():
                        members.setdefault(name, member)
        return members

    def annotated_fields(self, module: str, cls: str, depth: int = 0) -> list[ast.AnnAssign]:
        """The ``name: T [= default]`` declarations of a class, its bases' first; a field a subclass
        declares again keeps its base's place (as dataclasses and msgspec order them)."""
        found = self.find_class(module, cls)
        if found is None:
            return []
        where, node = found
        inherited: list[ast.AnnAssign] = []
        if depth < 5:
            for base in node.bases:
                if isinstance(base, ast.Name):
                    inherited += self.annotated_fields(where, base.id, depth + 1)
        own = {
            _name(i): i for i in node.body if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)
        }
        merged = [own.pop(_name(i), i) for i in inherited]
        return merged + list(own.values())

    def fields_in_order(self, module: str, cls: str) -> list[str]:
        return [_name(i) for i in self.annotated_fields(module, cls)]

    def string_literals(self, module: str) -> set[str]:
        tree = self.tree(module)
        if tree is None:
            return set()
        return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _name(node: ast.AnnAssign) -> str:
    assert isinstance(node.target, ast.Name)
    return node.target.id


def _relative(module: str, target: str, level: int) -> str:
    parts = module.split(".")
    return ".".join([*parts[: len(parts) - level], target])


def _self_attributes(fn: ast.AST) -> set[str]:
    """Names ``x`` of every ``self.x = ...`` (or ``self.x: T = ...``) inside ``fn``."""
    found: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                found.add(t.attr)
    return found


# --- ServerArgs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlagInfo:
    """One ``ServerArgs`` field as the command line sees it."""

    flags: tuple[str, ...]  # empty: the field has no flag of its own (``no_cli`` or no ``Arg``)
    is_bool: bool  # a ``store_true`` flag (takes no value)
    value_type: str = ""  # "int", "float", "str", ...: the field's type without Optional
    default: Any = None  # the declared default where it is a literal


@dataclass(frozen=True)
class ServerArgsLayout:
    kind: str  # "dataclass" or "defstruct"
    fields: dict[str, FlagInfo]
    manual_flags: frozenset[str]  # registered by hand in add_cli_args (e.g. --config)

    def flags(self) -> set[str]:
        return {f for info in self.fields.values() for f in info.flags} | set(self.manual_flags)


def _annotation_meta(node: ast.AnnAssign) -> tuple[ast.AST | None, ast.AST | None]:
    """``(inner type, Arg(...) call or help string)`` of ``A[T, ...]`` / ``Annotated[T, ...]``."""
    ann = node.annotation
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):  # a quoted annotation
        ann = ast.parse(ann.value, mode="eval").body
    if not isinstance(ann, ast.Subscript):
        return ann, None
    base = ann.value
    base_name = ast.unparse(base).rsplit(".", 1)[-1]
    if base_name not in ("A", "Annotated") or not isinstance(ann.slice, ast.Tuple):
        return ann, None
    inner, *meta = ann.slice.elts
    for item in meta:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            return inner, item
        if isinstance(item, ast.Call) and isinstance(item.func, ast.Name) and item.func.id == "Arg":
            return inner, item
    return inner, None


def _value_type(inner: ast.AST | None) -> str:
    """``int`` for ``int``, ``Optional[int]`` and ``int | None``; the source text otherwise."""
    if inner is None:
        return ""
    if isinstance(inner, ast.Subscript) and ast.unparse(inner.value).endswith("Optional"):
        inner = inner.slice
    if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.BitOr):
        sides = [
            s for s in (inner.left, inner.right) if not (isinstance(s, ast.Constant) and s.value is None)
        ]
        inner = sides[0] if len(sides) == 1 else inner
    return ast.unparse(inner)


def _flag_info(node: ast.AnnAssign) -> FlagInfo:
    inner, meta = _annotation_meta(node)
    value_type = _value_type(inner)
    is_bool = value_type == "bool"
    try:
        default = ast.literal_eval(node.value) if node.value is not None else None
    except ValueError:
        default = None
    if meta is None:
        return FlagInfo((), is_bool, value_type, default)
    keywords = {k.arg: k.value for k in meta.keywords} if isinstance(meta, ast.Call) else {}
    no_cli = keywords.get("no_cli")
    if isinstance(no_cli, ast.Constant) and no_cli.value is True:
        return FlagInfo((), is_bool, value_type, default)
    cli_name = keywords.get("cli_name")
    primary = (
        cli_name.value
        if isinstance(cli_name, ast.Constant) and isinstance(cli_name.value, str)
        else "--" + _name(node).replace("_", "-")
    )
    aliases = keywords.get("aliases")
    extra = (
        tuple(e.value for e in aliases.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
        if isinstance(aliases, (ast.List, ast.Tuple))
        else ()
    )
    action = keywords.get("action")
    is_bool = is_bool and action is None
    return FlagInfo((primary, *extra), is_bool, value_type, default)


def _manual_flags(index: SourceIndex) -> frozenset[str]:
    """Flags ``ServerArgs.add_cli_args`` registers by hand (``parser.add_argument("--x", ...)``)."""
    fn = index.members(SERVER_ARGS_MODULE, "ServerArgs").get("add_cli_args")
    flags: set[str] = set()
    for node in ast.walk(fn) if fn is not None else ():
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            flags.update(
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
            )
    return frozenset(flags)


def _namespace_classes(index: SourceIndex) -> list[str] | None:
    """The names listed in ``_INPUT_NAMESPACES`` (the defstruct layout), or None."""
    node = index.top_level(SERVER_ARGS_MODULE).get("_INPUT_NAMESPACES")
    value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
    if not isinstance(value, (ast.List, ast.Tuple)):
        return None
    return [e.id for e in value.elts if isinstance(e, ast.Name)]


class LayoutError(DynamoError, ValueError):
    """SGLang's ``ServerArgs`` is declared in a way this reader does not know."""


def server_args_layout(index: SourceIndex) -> ServerArgsLayout:
    """The fields and flags of ``ServerArgs`` under ``index`` (see the module docstring)."""
    found = index.find_class(SERVER_ARGS_MODULE, "ServerArgs")
    if found is None:
        raise LayoutError(f"{SERVER_ARGS_MODULE} defines no class ServerArgs")
    _, cls = found
    namespaces = _namespace_classes(index)
    decls: list[ast.AnnAssign] = []
    if namespaces is not None:
        kind = "defstruct"
        for name in namespaces:
            if index.find_class(SERVER_ARGS_MODULE, name) is None:
                raise LayoutError(f"_INPUT_NAMESPACES names {name}, not a class {SERVER_ARGS_MODULE} knows")
            decls += index.annotated_fields(SERVER_ARGS_MODULE, name)
        decls += index.annotated_fields(SERVER_ARGS_MODULE, "ServerArgs")
    elif any(_is_dataclass_decorator(d) for d in cls.decorator_list):
        kind = "dataclass"
        decls = index.annotated_fields(SERVER_ARGS_MODULE, "ServerArgs")
    else:
        raise LayoutError(
            "ServerArgs is neither a dataclass nor a msgspec.defstruct built from _INPUT_NAMESPACES"
        )
    if not decls:
        raise LayoutError(f"found no ServerArgs fields in the {kind} layout")
    fields = {_name(d): _flag_info(d) for d in decls}
    return ServerArgsLayout(kind=kind, fields=fields, manual_flags=_manual_flags(index))


def _is_dataclass_decorator(node: ast.AST) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return (isinstance(target, ast.Attribute) and target.attr == "dataclass") or (
        isinstance(target, ast.Name) and target.id == "dataclass"
    )


# --- msgspec structs -----------------------------------------------------------------------------

STRUCT_OPTIONS = ("array_like", "tag", "tag_field", "omit_defaults")


def struct_options(index: SourceIndex, module: str, cls: str, depth: int = 0) -> dict[str, Any]:
    """The msgspec options given in the class statements of ``cls`` and its bases (the nearest
    wins, as msgspec inherits them). Values are Python literals; a non-literal is kept as source."""
    found = index.find_class(module, cls)
    if found is None:
        return {}
    where, node = found
    options: dict[str, Any] = {}
    if depth < 5:
        for base in node.bases:
            if isinstance(base, ast.Name):
                options.update(struct_options(index, where, base.id, depth + 1))
    for kw in node.keywords:
        if kw.arg in STRUCT_OPTIONS:
            try:
                options[kw.arg] = ast.literal_eval(kw.value)
            except ValueError:
                options[kw.arg] = ast.unparse(kw.value)
    return options


def _is_struct_or_enum(node: ast.ClassDef, known: set[str]) -> bool:
    for base in node.bases:
        text = ast.unparse(base)
        if text in ("msgspec.Struct", "Struct", "enum.Enum", "Enum") or text in known:
            return True
    return False


def load_structs(index: SourceIndex, module: str) -> tuple[dict[str, type], dict[str, str]]:
    """SGLang's ``msgspec.Struct`` (and enum) classes of ``module``, built by executing their class
    statements from SGLang's source against the real ``msgspec`` (imported here: needs msgspec).
    Returns the classes by name and, for each class that could not be built, why."""
    import msgspec

    tree = index.tree(module)
    if tree is None:
        raise LayoutError(f"SGLang has no module {module}")
    name = f"_sglang_source_{abs(hash((str(index.root), module)))}"
    mod = types.ModuleType(name)
    mod.__dict__.update({"msgspec": msgspec, "enum": enum, "__name__": name})
    typing_names = ("Any", "Optional", "Union", "List", "Dict", "Literal")
    mod.__dict__.update({n: getattr(typing, n) for n in typing_names})
    sys.modules[name] = mod  # msgspec resolves string annotations through the class's module
    built: dict[str, type] = {}
    failed: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or not _is_struct_or_enum(node, set(built) | set(failed)):
            continue
        code = compile(ast.Module(body=[node], type_ignores=[]), str(index.path(module)), "exec")
        try:
            exec(code, mod.__dict__)  # SGLang's class statement, verbatim
            built[node.name] = mod.__dict__[node.name]
        except Exception as e:  # a class that needs more of SGLang than msgspec: reported, not fatal
            failed[node.name] = repr(e)
    return built, failed
