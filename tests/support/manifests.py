"""Read the documents of a manifest file: the graph, and the DynamoModels beside it (examples/lora-*.yaml
hold both, as a user's file may)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

GRAPH_KIND = "DynamoGraphDeployment"
MODEL_KIND = "DynamoModel"


def documents(path: Path, kind: str) -> list[dict[str, Any]]:
    """The documents of ``kind`` in ``path``, in order."""
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict) and d.get("kind") == kind]


def graph_of(path: Path) -> dict[str, Any]:
    """The one DynamoGraphDeployment of ``path``."""
    (graph,) = documents(path, GRAPH_KIND)
    return graph
