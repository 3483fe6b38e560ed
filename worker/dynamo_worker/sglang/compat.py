"""Check, without importing SGLang (no torch, no GPU), that the pinned SGLang has all we use of it.

``python -m dynamo_worker.sglang.compat [--sglang-src DIR]`` reads SGLang's Python source with ``ast``:
every ``async_generate`` keyword, sampling parameter and ``ServerArgs`` field our code uses, every
module / name / member in ``uses``, the string literals we read from SGLang's outputs, the field order of
the KV event messages we decode, and that no flag of ours shadows one of SGLang's. Exit 0 when all
hold; otherwise 1, with one line per problem.

Without ``--sglang-src``, the pinned wheel is fetched with ``pip download --no-deps`` and its Python
files unpacked under ``~/.cache/dynamo-sglang/`` (reused by later runs), so the check needs the package
index once and nothing of SGLang's dependencies.
"""

from __future__ import annotations

import argparse
import ast
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dynamo_worker.runtime.settings import cache_root
from dynamo_worker.sglang import uses
from dynamo_worker.sglang.uses import Use

__all__ = ["CompatError", "SourceIndex", "check", "fetch_sglang_source", "main"]

log = logging.getLogger(__name__)

PIP_TIMEOUT_S = 600


class CompatError(RuntimeError):
    """SGLang's source could not be obtained; the message says how to provide it."""


def fetch_sglang_source(version: str = uses.SGLANG_VERSION, cache_dir: Path | None = None) -> Path:
    """A folder holding ``sglang/`` (Python files only) of the pinned version, fetched once."""
    cache_dir = cache_dir or cache_root()
    dest = cache_dir / f"sglang-{version}-src"
    if (dest / "sglang" / "__init__.py").is_file():
        return dest
    downloads = cache_dir / "dl"
    wheels = sorted(downloads.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        cmd += [f"sglang=={version}", "-d", str(downloads)]
        try:
            subprocess.run(cmd, check=True, timeout=PIP_TIMEOUT_S, capture_output=True, text=True)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            output = getattr(e, "stderr", "") or ""
            raise CompatError(
                f"could not download sglang=={version} ({e}); {output.strip()[-500:]}\n"
                "reach the package index, or pass --sglang-src DIR (a folder that contains sglang/)"
            ) from None
        wheels = sorted(downloads.glob(f"sglang-{version}-*.whl"))
        if not wheels:
            raise CompatError(f"pip downloaded no sglang-{version} wheel into {downloads}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".sglang-{version}-", dir=cache_dir))
    try:
        with zipfile.ZipFile(wheels[-1]) as wheel:
            wheel.extractall(
                staging, [n for n in wheel.namelist() if n.startswith("sglang/") and n.endswith(".py")]
            )
        staging.rename(dest)
    except (zipfile.BadZipFile, OSError) as e:
        shutil.rmtree(staging, ignore_errors=True)
        if (dest / "sglang" / "__init__.py").is_file():  # another run finished first
            return dest
        raise CompatError(
            f"could not unpack {wheels[-1]} ({e}); delete it so that the next run downloads it again, "
            "or pass --sglang-src DIR (a folder that contains sglang/)"
        ) from None
    return dest


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
        names: dict[str, ast.AST] = {}
        tree = self.tree(module)
        for node in tree.body if tree else ():
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names[node.name] = node
            elif isinstance(node, ast.Assign):
                names.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names[node.target.id] = node
            elif isinstance(node, (ast.ImportFrom, ast.Import)):
                names.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
        return names

    def find_class(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        """The class ``name`` as seen from ``module``, following ``from x import name`` re-exports."""
        node = self.top_level(module).get(name)
        if isinstance(node, ast.ClassDef):
            return module, node
        if isinstance(node, ast.ImportFrom) and node.module and depth < 5:
            target = node.module if node.level == 0 else _relative(module, node.module, node.level)
            return self.find_class(target, name, depth + 1)
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
                    for name, item in self.members(where, base.id, depth + 1).items():
                        members.setdefault(name, item)
        return members

    def fields_in_order(self, module: str, cls: str) -> list[str]:
        found = self.find_class(module, cls)
        if found is None:
            return []
        return [
            i.target.id
            for i in found[1].body
            if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)
        ]

    def string_literals(self, module: str) -> set[str]:
        tree = self.tree(module)
        if tree is None:
            return set()
        return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


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


def _params(fn: ast.AST) -> set[str]:
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    a = fn.args
    return {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}


def check_use(index: SourceIndex, use: Use) -> str | None:
    """None when ``use`` exists in SGLang's source, else the problem."""
    if index.path(use.module) is None:
        return f"module {use.module} does not exist (used by {use.by})"
    if use.name is None:
        return None
    names = index.top_level(use.module)
    if use.name not in names and index.path(f"{use.module}.{use.name}") is None:
        return f"{use.module} has no {use.name} (used by {use.by})"
    if use.member is not None and use.member not in index.members(use.module, use.name):
        return f"{use.module}.{use.name} has no member {use.member} (used by {use.by})"
    return None


def _missing(what: str, wanted: Iterable[str], have: set[str]) -> list[str]:
    return [f"{what} has no {name!r}" for name in sorted(set(wanted) - have)]


def sglang_flags(index: SourceIndex) -> set[str]:
    """Every flag SGLang's ``ServerArgs.add_cli_args`` defines: one per field, plus the literal ones."""
    fields = index.fields_in_order("sglang.srt.server_args", "ServerArgs")
    literal = {s for s in index.string_literals("sglang.srt.server_args") if s.startswith("--")}
    return {"--" + f.replace("_", "-") for f in fields} | literal


def our_flags() -> set[str]:
    from dynamo_worker.sglang.args import _our_parser

    return {o for action in _our_parser()._actions for o in action.option_strings if o.startswith("--")} - {
        "--help"
    }


def check(
    root: Path, handler_path: Path = uses.PACKAGE_DIR / "handler.py", package_dir: Path = uses.PACKAGE_DIR
) -> list[str]:
    """Every problem of our use of the SGLang source under ``root``; empty when compatible."""
    index = SourceIndex(root)
    if index.path("sglang") is None:
        return [f"{root} holds no sglang/ package; pass the folder that contains sglang/"]
    problems: list[str] = []
    engine = index.members("sglang.srt.entrypoints.engine", "Engine")
    problems += _missing(
        "Engine.async_generate", uses.generate_keywords(handler_path), _params(engine.get("async_generate"))
    )
    sampling = set(index.fields_in_order("sglang.srt.sampling.sampling_params", "SamplingParams"))
    problems += _missing("SamplingParams", uses.sampling_keys(handler_path), sampling)
    server_fields = set(index.fields_in_order("sglang.srt.server_args", "ServerArgs"))
    problems += _missing("ServerArgs", uses.server_args_fields(package_dir), server_fields)
    for use in sorted({*uses.imported_names(package_dir), *uses.DECLARED}, key=str):
        problem = check_use(index, use)
        if problem:
            problems.append(problem)
    for module, literals in uses.STRING_LITERALS.items():
        problems += _missing(f"{module} (string literals)", literals, index.string_literals(module))
    for cls, layout in uses.KV_EVENT_LAYOUT.items():
        got = tuple(index.fields_in_order(uses.KV_EVENTS_MODULE, cls))
        if got != layout:
            problems.append(f"{uses.KV_EVENTS_MODULE}.{cls} fields are {got}, kv_events.py decodes {layout}")
    clashes = our_flags() & sglang_flags(index)
    problems += [f"our flag {flag} shadows SGLang's flag of the same name" for flag in sorted(clashes)]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_worker.sglang.compat", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--sglang-src", type=Path, help="a folder containing sglang/ (default: fetch the pin)"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where the pinned wheel is kept (default: the project cache folder)",
    )
    args = parser.parse_args(argv)
    try:
        root = args.sglang_src or fetch_sglang_source(cache_dir=args.cache_dir)
    except CompatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    problems = check(root)
    for problem in problems:
        print(f"INCOMPATIBLE: {problem}")
    if problems:
        print(f"{len(problems)} incompatibilities with the SGLang source in {root}")
        return 1
    print(f"OK: our use of SGLang matches the source in {root} (pinned {uses.SGLANG_VERSION})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
