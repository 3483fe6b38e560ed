"""Parts of a real SGLang release, taken from its source where the release itself cannot be imported
(no torch, no GPU here): its ``ServerArgs`` command line and its ``--config`` merger.

- ``cli_from_source``: an ``SglangCli`` whose parser has exactly the flags that release's
  ``ServerArgs.add_cli_args`` registers, as ``source.server_args_layout`` reads them from its source
  (``store_true`` for boolean fields, one value of the field's type otherwise, with its declared
  default), and whose ``ServerArgs`` is a read-only record of the parsed values. A stand-in:
  SGLang's own ``ServerArgs`` needs torch to import.
- ``config_merger``: SGLang's own ``ConfigArgumentMerger`` class, loaded from that release's file at
  whichever path it has (its module imports only argparse and yaml).
- the fixtures ``sglang_sources``, ``oldest_src`` and ``newest_src``: the source of both ends of the
  window. The wheels are downloaded once (``pip download --no-deps``) into the project cache folder, the
  same files ``hack/sglang-compat.sh`` uses.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from dynamo_worker.sglang import compat, uses
from dynamo_worker.sglang.args import SglangCli
from dynamo_worker.sglang.source import SourceIndex, server_args_layout
from dynamo_worker.sglang.uses import CONFIG_PARSER_MODULES

from tests.support.purity import fetching_test_data
from tests.support.sglang_fake import FAKE_BOOTSTRAP_HOST

TYPES = {"int": int, "float": float, "str": str}


class ReadOnlyServerArgs:
    """The parsed values, read-only after construction like SGLang's ``ServerArgs``."""

    def __init__(self, values: dict[str, Any]) -> None:
        object.__setattr__(self, "_values", MappingProxyType(dict(values)))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"server_args.{name} assigned after construction; ServerArgs is read-only")


def _server_args_class(root: Path) -> type:
    layout = server_args_layout(SourceIndex(root))

    class ServerArgs(ReadOnlyServerArgs):
        @staticmethod
        def add_cli_args(parser: argparse.ArgumentParser) -> None:
            for name, info in layout.fields.items():
                if not info.flags:
                    continue
                if info.is_bool:
                    parser.add_argument(*info.flags, dest=name, action="store_true")
                else:
                    kind = TYPES.get(info.value_type, str)
                    parser.add_argument(*info.flags, dest=name, type=kind, default=info.default)
            for flag in sorted(layout.manual_flags - set(parser._option_string_actions)):
                parser.add_argument(flag)

        @classmethod
        def from_cli_args(cls, ns: argparse.Namespace) -> ServerArgs:
            return cls(vars(ns))

    return ServerArgs


def config_merger(root: Path) -> type:
    for module in CONFIG_PARSER_MODULES:
        path = root.joinpath(*module.split(".")).with_suffix(".py")
        if path.is_file():
            spec = importlib.util.spec_from_file_location(f"_sglang_config_{abs(hash(path))}", path)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod.ConfigArgumentMerger
    raise FileNotFoundError(f"no config merger under {root} ({CONFIG_PARSER_MODULES})")


def cli_from_source(root: Path, version: str) -> SglangCli:
    return SglangCli(
        version=version,
        server_args_class=_server_args_class(root),
        config_merger=config_merger(root),
        fake_bootstrap_host=FAKE_BOOTSTRAP_HOST,
    )


@pytest.fixture(scope="session")
def sglang_sources() -> dict[str, Path]:
    """``{version: folder containing sglang/}`` for both ends of the window."""
    with fetching_test_data():
        return {version: compat.fetch_sglang_source(version) for version in uses.SGLANG_WINDOW}


@pytest.fixture(scope="session")
def oldest_src(sglang_sources) -> Path:
    return sglang_sources[uses.SGLANG_WINDOW[0]]


@pytest.fixture(scope="session")
def newest_src(sglang_sources) -> Path:
    return sglang_sources[uses.SGLANG_WINDOW[1]]
