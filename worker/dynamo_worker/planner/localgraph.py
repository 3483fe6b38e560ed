"""The planner's graph from a manifest file instead of the Kubernetes API (``--graph-file``).

For a planner with no Kubernetes around it: under ``dynamo-run``, which runs the graph's pods as local
processes from the same file, or by hand beside a graph served some other way. ``LocalGraph`` offers
the planner's run loop what ``kube.GraphClient`` offers (``run.GraphSource``):

- ``get_graph``: the graph as the file held it when the planner started, in ``nvidia.com/v1alpha1`` (a
  v1beta1 manifest is converted with the operator's own converter), the shape the API server answers
  with. It is read once: dynamo-run starts the processes from the file once and never changes them;
- ``set_replicas``: refused (``GraphFileError``): replicas written into a file scale nothing, so the
  planner runs with ``--dry-run`` here (its settings refuse ``--graph-file`` without it) and logs what
  it would scale;
- ``event``: a log line, ``Event <type> <reason>: <message>``, where a cluster would get an Event.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml
from dynamo_api.conversion import ConversionError, convert, load_graph
from dynamo_api.models import API_VERSION, KIND
from pydantic import ValidationError

from dynamo_worker.planner.kube import KubeError

__all__ = ["GraphFileError", "LocalGraph"]

log = logging.getLogger(__name__)


class GraphFileError(KubeError):
    """The graph file cannot be read, or a write it cannot take; the message names the fix. A
    ``KubeError`` (with no HTTP status), so the run loop treats it as any failure of its graph source."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "", message)


def _problems(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(document)'}: {e['msg']}" for e in error.errors()
    )


def read_graph(text: str, source: str, graph: str, namespace: str) -> dict[str, Any]:
    """The ``DynamoGraphDeployment`` named ``graph`` in ``text`` (YAML, one or more documents; other
    kinds are skipped) as a v1alpha1 object, in ``namespace`` unless it names its own. Pure."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = getattr(e, "problem", None) or e
        raise GraphFileError(
            f"--graph-file {source} is not valid YAML ({where}{what}); fix the file"
        ) from None
    graphs = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    names = [str((g.get("metadata") or {}).get("name")) for g in graphs]
    found = [g for g, name in zip(graphs, names, strict=True) if name == graph]
    if len(found) != 1:
        held = ", ".join(names) or f"no {KIND}"
        raise GraphFileError(
            f"--graph-file {source} holds {len(found)} {KIND} named {graph!r} (it holds: {held}); pass "
            f"--graph with the name of the graph to plan, or the file that holds {graph!r}"
        )
    raw = {"apiVersion": API_VERSION, **found[0]}  # no apiVersion: read as v1alpha1, as dynamo-run does
    try:
        load_graph(raw)  # the operator's own reading: errors name the manifest's fields
        alpha = convert(raw, API_VERSION)
    except ValidationError as e:
        raise GraphFileError(
            f"--graph-file {source} is not a valid {KIND}: {_problems(e)}; fix the manifest"
        ) from None
    except ConversionError as e:
        raise GraphFileError(f"--graph-file {source}: {e}") from None
    alpha.setdefault("metadata", {}).setdefault("namespace", namespace)
    return alpha


class LocalGraph:
    """The graph of a manifest file, for a planner without Kubernetes (see the module docstring)."""

    def __init__(self, path: str, namespace: str, graph: str) -> None:
        self.path = path
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise GraphFileError(
                f"cannot read --graph-file {path}: {e.strerror}; pass the path of the {KIND} manifest"
            ) from None
        self._graph = read_graph(text, path, graph, namespace)

    async def __aenter__(self) -> LocalGraph:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def get_graph(self) -> dict[str, Any]:
        return self._graph

    async def set_replicas(self, replicas: dict[str, int]) -> None:
        wanted = ", ".join(f"{name}={n}" for name, n in replicas.items())
        raise GraphFileError(
            f"cannot set replicas ({wanted}) in --graph-file {self.path}: a file scales nothing; run with "
            "--dry-run to log the decisions, or without --graph-file to scale the graph on Kubernetes"
        )

    async def event(self, graph: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        level = logging.WARNING if type_ == "Warning" else logging.INFO
        log.log(level, "Event %s %s: %s", type_, reason, message)
