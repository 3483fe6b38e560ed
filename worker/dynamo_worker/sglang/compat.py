"""Check, without importing SGLang (no torch, no GPU), that an SGLang release has all we use of it.

``python -m dynamo_worker.sglang.compat --sglang-src DIR`` (or ``--version V``, or ``--window`` for
the oldest and the newest release of ``uses.SGLANG_WINDOW``) reads SGLang's Python source with ``ast``
and checks what our code relies on, in whichever layout that release has:

- every ``async_generate`` keyword and sampling parameter the handler sends;
- every ``ServerArgs`` field the worker reads (before start, and after start through
  ``resolved.resolved_args``), in either ``ServerArgs`` layout (``source.server_args_layout``), and
  that no flag of ours shadows one of SGLang's;
- every module / name / member in ``uses`` (alternatives in ``uses.ONE_OF``: one must exist), and the
  string literals we read from SGLang's outputs;
- the KV event structs: their msgspec options (tagged arrays or tagged maps, ``omit_defaults``) and
  fields against what ``kv_events.py`` reads, and every ``StorageMedium`` value mapped to one of our
  tiers; then, with msgspec, a batch built with SGLang's own struct classes is encoded and decoded by
  ``kv_events.decode_batch`` and must give the expected events.

Exit 0 when all hold; otherwise 1, with one line per problem; 2 when the source cannot be had. Releases
given by version are fetched with ``pip download --no-deps`` and their Python files unpacked under the
project cache folder (``runtime.settings.cache_root``: ``$DYNAMO_CACHE``, else
``$XDG_CACHE_HOME/dynamo-sglang``, else ``~/.cache/dynamo-sglang``), reused by later runs.
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
from pathlib import Path
from typing import Any

from dynamo_api.errors import DynamoError

from dynamo_worker.runtime.settings import cache_root
from dynamo_worker.sglang import uses
from dynamo_worker.sglang.kv_events import MEDIA, DecodedBatch, KvEventDecodeError, decode_batch
from dynamo_worker.sglang.source import (
    LayoutError,
    ServerArgsLayout,
    SourceIndex,
    load_structs,
    server_args_layout,
    struct_options,
)
from dynamo_worker.sglang.uses import Use

__all__ = ["CompatError", "check", "check_use", "fetch_sglang_source", "kv_event_problems", "main"]

log = logging.getLogger(__name__)

PIP_TIMEOUT_S = 600
# Every release ships the same Python files in each platform's wheel: fetch one fixed wheel, so the
# cache holds the same file whatever machine runs the check.
WHEEL_PLATFORM = ["--platform", "manylinux_2_34_x86_64", "--python-version", "3.11", "--implementation", "cp"]


class CompatError(DynamoError, RuntimeError):
    """SGLang's source could not be obtained; the message says how to provide it."""


def fetch_sglang_source(version: str, cache_dir: Path | None = None) -> Path:
    """A folder holding ``sglang/`` (Python files only) of SGLang ``version``, fetched once."""
    cache_dir = cache_dir or cache_root()
    dest = cache_dir / f"sglang-{version}-src"
    if (dest / "sglang" / "__init__.py").is_file():
        return dest
    downloads = cache_dir / "dl"
    wheels = sorted(downloads.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        cmd += [*WHEEL_PLATFORM, f"sglang=={version}", "-d", str(downloads)]
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


def _params(fn: ast.AST | None) -> set[str]:
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    a = fn.args
    return {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}


def _missing(what: str, wanted: Iterable[str], have: set[str]) -> list[str]:
    return [f"{what} has no {name!r}" for name in sorted(set(wanted) - have)]


def our_flags() -> set[str]:
    from dynamo_worker.sglang.args import _our_parser

    return {o for action in _our_parser()._actions for o in action.option_strings if o.startswith("--")} - {
        "--help"
    }


# --- KV events -----------------------------------------------------------------------------------


def _kv_static_problems(index: SourceIndex) -> list[str]:
    """The msgspec options and fields of SGLang's KV event structs against what ``decode_batch``
    reads: tagged arrays are read by position, tagged maps by name, and ``omit_defaults`` may leave
    out only fields we can do without."""
    module = uses.KV_EVENTS_MODULE
    problems: list[str] = []
    for cls, wanted in uses.KV_EVENT_FIELDS.items():  # the batch may be an array or a map too
        where = f"{module}.{cls}"
        if index.find_class(module, cls) is None:
            problems.append(f"{where} does not exist (kv_events.py decodes it)")
            continue
        options = struct_options(index, module, cls)
        decls = {
            d.target.id: d for d in index.annotated_fields(module, cls) if isinstance(d.target, ast.Name)
        }
        names = list(decls)
        if cls != "EventBatch":
            tag = options.get("tag")
            if tag is not True and tag != cls:
                problems.append(f"{where} is tagged {tag!r}; kv_events.py dispatches on the tag {cls!r}")
            if options.get("tag_field", "type") != "type":
                problems.append(
                    f"{where} puts its tag in {options['tag_field']!r}; kv_events.py reads 'type'"
                )
        if options.get("array_like"):
            if tuple(names[: len(wanted)]) != wanted:
                problems.append(
                    f"{where} encodes as an array of {tuple(names)}; kv_events.py reads {wanted} by position"
                )
        else:
            problems += [
                f"{where} has no field {w!r} (kv_events.py reads it by name)"
                for w in wanted
                if w not in decls
            ]
        if options.get("omit_defaults"):
            for name in wanted:
                if name in decls and decls[name].value is not None and name not in uses.KV_EVENT_OPTIONAL:
                    problems.append(
                        f"{where}.{name} has a default and omit_defaults drops it from the wire; "
                        "kv_events.py needs it"
                    )
    return problems


def _kv_round_trip_problems(index: SourceIndex) -> list[str]:
    """Encode a batch with SGLang's own struct classes and decode it with ``decode_batch``."""
    try:
        import msgspec
    except ImportError:
        return ["msgspec is not installed, so the KV event round trip cannot run: pip install msgspec"]
    from dynamo_worker.protocol import AllBlocksCleared, BlockRemoved, BlockStored

    classes, failed = load_structs(index, uses.KV_EVENTS_MODULE)
    needed = ("KVEventBatch", "BlockStored", "BlockRemoved", "AllBlocksCleared")
    missing = [c for c in needed if c not in classes]
    if missing:
        why = "; ".join(f"{c}: {failed.get(c, 'not defined')}" for c in missing)
        return [f"could not build SGLang's KV event structs ({why})"]
    stored, removed, cleared = classes["BlockStored"], classes["BlockRemoved"], classes["AllBlocksCleared"]
    try:
        events: list[Any] = [
            stored(
                block_hashes=[11, 12],
                parent_block_hash=None,
                token_ids=[1, 2, 3, 4],
                block_size=2,
                lora_id=None,
                medium="GPU",
            ),
            stored(block_hashes=[13], parent_block_hash=12, token_ids=[5, 6], block_size=2, lora_id=None),
            stored(
                block_hashes=[99],
                parent_block_hash=None,
                token_ids=[7, 8],
                block_size=2,
                lora_id=None,
                medium="CPU_PINNED",
            ),
            removed(block_hashes=[11], medium="GPU"),
            removed(block_hashes=[13]),
            removed(block_hashes=[99], medium="CPU_PINNED"),
            cleared(),
        ]
        names_adapter = "lora_name" in getattr(stored, "__struct_fields__", ())
        if names_adapter:  # 0.5.23: the adapter's name on its blocks
            events.append(
                stored(
                    block_hashes=[21],
                    parent_block_hash=None,
                    token_ids=[9, 9],
                    block_size=2,
                    lora_id=None,
                    lora_name="a1",
                )
            )
        batch = classes["KVEventBatch"](ts=1.5, events=events, attn_dp_rank=3)
    except TypeError as e:
        return [f"SGLang's KV event structs cannot be built from the fields kv_events.py knows: {e}"]
    payload = msgspec.msgpack.encode(batch)
    expected = DecodedBatch(
        events=[
            BlockStored(parent_hash=None, block_hashes=[11, 12, 13], token_ids=[1, 2, 3, 4, 5, 6]),  # a chain
            BlockStored(parent_hash=None, block_hashes=[99], token_ids=[7, 8], medium="host"),
            BlockRemoved(block_hashes=[11]),
            BlockRemoved(block_hashes=[13]),
            BlockRemoved(block_hashes=[99], medium="host"),
            AllBlocksCleared(),
            *(
                [BlockStored(parent_hash=None, block_hashes=[21], token_ids=[9, 9], lora_name="a1")]
                if names_adapter
                else []
            ),
        ],
        dp_rank=3,
    )
    try:
        got = decode_batch(msgspec.msgpack.decode(payload))
    except KvEventDecodeError as e:
        return [f"kv_events.py cannot decode a batch SGLang encodes: {e}"]
    if got != expected:
        return [f"kv_events.py decodes a batch SGLang encodes as {got}, expected {expected}"]
    return []


def _kv_media_problems(index: SourceIndex) -> list[str]:
    """SGLang's ``StorageMedium`` values against the tiers ``kv_events.MEDIA`` maps: a tier SGLang adds
    would otherwise be skipped at run time (said once in the log), unseen by the router."""
    where = f"{uses.KV_EVENTS_MODULE}.{uses.STORAGE_MEDIUM_CLASS}"
    members = index.members(uses.KV_EVENTS_MODULE, uses.STORAGE_MEDIUM_CLASS)
    if not members:
        return [f"{where} does not exist (kv_events.py maps its values)"]
    values = {
        node.value.value
        for node in members.values()
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }
    return [
        f"{where} has the value {v!r}, which kv_events.MEDIA does not map to a tier: add it there"
        for v in sorted(values - {m for m in MEDIA if m})
    ]


def kv_event_problems(index: SourceIndex) -> list[str]:
    """Every way SGLang's KV event batches under ``index`` would not decode as ``kv_events.py`` expects."""
    problems = _kv_static_problems(index) + _kv_media_problems(index)
    return problems + _kv_round_trip_problems(index)


# --- the whole check ----------------------------------------------------------------------------


def _server_args_problems(layout: ServerArgsLayout, package_dir: Path) -> list[str]:
    wanted = uses.server_args_fields(package_dir) | set(uses.RESOLVED_FIELDS)
    return _missing("ServerArgs", wanted, set(layout.fields))


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
    try:
        layout = server_args_layout(index)
    except LayoutError as e:
        problems.append(f"cannot read ServerArgs: {e}")
    else:
        problems += _server_args_problems(layout, package_dir)
        clashes = our_flags() & layout.flags()
        problems += [f"our flag {flag} shadows SGLang's flag of the same name" for flag in sorted(clashes)]
    for use in sorted({*uses.imported_names(package_dir), *uses.DECLARED}, key=str):
        problem = check_use(index, use)
        if problem:
            problems.append(problem)
    for group in uses.ONE_OF:
        if all(check_use(index, use) for use in group):
            problems.append(f"none of {', '.join(map(str, group))} exists (used by {group[0].by})")
    for module, literals in uses.STRING_LITERALS.items():
        problems += _missing(f"{module} (string literals)", literals, index.string_literals(module))
    problems += kv_event_problems(index)
    return problems


def describe(root: Path) -> str:
    """How the release under ``root`` is read: its ServerArgs layout and KV event encoding."""
    index = SourceIndex(root)
    try:
        layout = server_args_layout(index).kind
    except LayoutError:
        layout = "unknown"
    resolved = (
        "resolved_dict()"
        if "resolved_dict" in index.members("sglang.srt.server_args", "ServerArgs")
        else "fields"
    )
    options = struct_options(index, uses.KV_EVENTS_MODULE, "BlockStored")
    encoding = "tagged arrays" if options.get("array_like") else "tagged maps"
    return f"ServerArgs {layout}, resolved values from {resolved}, KV events as {encoding}"


def _check_one(root: Path, label: str) -> int:
    problems = check(root)
    for problem in problems:
        print(f"INCOMPATIBLE: {problem}")
    if problems:
        print(f"{len(problems)} incompatibilities with {label} in {root}")
        return 1
    print(f"OK: our use of SGLang matches {label} in {root} ({describe(root)})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_worker.sglang.compat", description=__doc__.split("\n\n")[0]
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--sglang-src", type=Path, help="a folder containing sglang/")
    what.add_argument("--version", help="an SGLang release to fetch from the package index and check")
    what.add_argument(
        "--window",
        action="store_true",
        help=f"check the oldest and the newest release of the window ({' and '.join(uses.SGLANG_WINDOW)})",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where fetched wheels and their sources are kept (default: the project cache folder)",
    )
    args = parser.parse_args(argv)
    if args.sglang_src is not None:
        return _check_one(args.sglang_src, "the SGLang source")
    versions = [args.version] if args.version else list(uses.SGLANG_WINDOW)
    status = 0
    for version in versions:
        try:
            root = fetch_sglang_source(version, cache_dir=args.cache_dir)
        except CompatError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        status = max(status, _check_one(root, f"SGLang {version}"))
    return status


if __name__ == "__main__":
    sys.exit(main())
