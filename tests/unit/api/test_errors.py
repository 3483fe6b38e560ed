"""dynamo_api.errors: every exception class defined in a module of dynamo_api, dynamo_operator or
dynamo_worker derives from DynamoError (so a new one cannot forget), keeps its standard-library base,
and is drawn in errors.py's tree under its parent with that base."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import dynamo_api.errors
import pytest
from dynamo_api.errors import DynamoError

PACKAGES = ("dynamo_api", "dynamo_clients", "dynamo_operator", "dynamo_worker")


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _exceptions() -> list[type[BaseException]]:
    found = []
    for package in PACKAGES:
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            module = importlib.import_module(info.name)
            found += [
                obj
                for obj in vars(module).values()
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name
            ]
    return found


EXCEPTIONS = _exceptions()


def test_every_exception_of_ours_derives_from_dynamo_error():
    assert len(EXCEPTIONS) > 40, "the walk found the modules"
    outside = [_name(c) for c in EXCEPTIONS if not issubclass(c, DynamoError)]
    assert outside == [], f"derive these from dynamo_api.errors.DynamoError: {outside}"


def test_the_standard_library_bases_callers_catch_are_kept():
    by_name = {c.__name__: c for c in EXCEPTIONS}
    assert issubclass(by_name["ManifestError"], ValueError)
    assert issubclass(by_name["PortUnavailable"], OSError)
    assert issubclass(by_name["DiscoveryError"], RuntimeError)
    with pytest.raises(DynamoError):
        raise by_name["WorkerTimeout"]("10.0.0.7:9000", "no first token within 5s")


def _drawn() -> list[tuple[str, str, set[str]]]:
    """errors.py's tree: each class drawn, its drawn parent and standard-library bases."""
    drawn = []
    parents = ["DynamoError"]
    doc = dynamo_api.errors.__doc__ or ""
    for line in doc.splitlines():
        m = re.match(r"^\s*((?:[│ ]   )*)[├└]── (\w+)(?: \(([\w, ]+)\))?", line)
        if m:
            depth = len(m[1]) // 4
            del parents[depth + 1 :]
            drawn.append((m[2], parents[depth], set(m[3].split(", ")) if m[3] else set()))
            parents.append(m[2])
    return drawn


def test_the_tree_in_the_docstring_is_the_tree_in_the_code():
    actual = []
    for cls in EXCEPTIONS:
        if issubclass(cls, DynamoError) and cls is not DynamoError:
            (parent,) = [b for b in cls.__bases__ if issubclass(b, DynamoError)]
            std = {b.__name__ for b in cls.__bases__ if b.__module__ == "builtins"}
            actual.append((cls.__name__, parent.__name__, std))
    assert sorted(_drawn(), key=str) == sorted(actual, key=str)


def test_the_tree_in_the_docs_is_the_docstrings():
    docs = (Path(__file__).parents[3] / "docs" / "errors.md").read_text()
    (block,) = re.findall(r"```text\n(DynamoError\n.*?)```", docs, re.S)
    doc = dynamo_api.errors.__doc__ or ""
    drawn = [line.removeprefix("    ") for line in doc.splitlines() if line.startswith("    ")]
    assert block.splitlines() == drawn
