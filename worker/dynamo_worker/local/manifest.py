"""Read a DynamoGraphDeployment manifest with the manifest models and validation of dynamo_api.

``load_manifest`` parses the YAML file with ``dynamo_api.models.DynamoGraphDeployment`` (the
schema) and judges it with ``dynamo_api.validation.validate`` (the semantic checks the
operator's ``render`` runs), so a manifest the operator refuses is refused here with the same
``Problem``s: the same field paths and messages. What only this machine can decide (GPUs, commands it
can run) is ``plan.plan_graph``'s job.

``parse_models`` reads the ``DynamoModel`` documents beside the graph (``dynamo_api.dynamo_model``,
judged by its ``problems``, as the operator's webhook judges them); ``local.loras`` loads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from dynamo_api import dynamo_model
from dynamo_api.conversion import load_graph
from dynamo_api.errors import DynamoError
from dynamo_api.models import KIND, DynamoGraphDeployment
from dynamo_api.validation import Problem, validate
from pydantic import ValidationError

from dynamo_worker.local.plan import format_problems

__all__ = ["ManifestError", "load_manifest", "load_models", "parse_manifest", "parse_models"]


class ManifestError(DynamoError, ValueError):
    """The manifest cannot be read or is not a valid DynamoGraphDeployment.

    ``problems`` holds the operator's ``Problem``s when the graph parsed but fails its semantic
    validation (empty for unreadable files and schema errors).
    """

    def __init__(self, message: str, problems: tuple[Problem, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def format_validation_error(error: ValidationError) -> str:
    lines = [f"{_loc(e['loc']) or '(document)'}: {e['msg']}" for e in error.errors()]
    return "\n".join(lines)


def parse_manifest(text: str, source: str = "manifest") -> DynamoGraphDeployment:
    """The one DynamoGraphDeployment in ``text`` (other kinds in a multi-document file are skipped).

    Raises ``ManifestError`` when it is not YAML, not exactly one graph, or a graph the operator would
    refuse (schema errors, then the operator's validation problems, one ``field: message`` per line).
    """
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise ManifestError(f"{source} is not valid YAML: {e}") from None
    graphs = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(graphs) != 1:
        kinds = ", ".join(str(d.get("kind")) if isinstance(d, dict) else type(d).__name__ for d in docs)
        raise ManifestError(
            f"{source} holds {len(graphs)} {KIND} documents (kinds found: {kinds or 'none'}); "
            f"dynamo-run runs exactly one: put one {KIND} in the file"
        )
    try:
        dgd = load_graph(graphs[0])  # nvidia.com/v1alpha1 or v1beta1
    except ValidationError as e:
        raise ManifestError(f"{source} is not a valid {KIND}:\n{format_validation_error(e)}") from None
    problems = validate(dgd)
    if problems:
        raise ManifestError(f"{source} is not a valid {KIND}:\n{format_problems(problems)}", problems)
    return dgd


def parse_models(text: str, source: str = "manifest") -> tuple[dynamo_model.DynamoModel, ...]:
    """The ``DynamoModel`` documents of ``text``, in order. Raises ``ManifestError`` naming the document
    when one is not a valid DynamoModel (schema errors, then ``dynamo_model.problems``)."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise ManifestError(f"{source} is not valid YAML: {e}") from None
    models = []
    for doc in (d for d in docs if isinstance(d, dict) and d.get("kind") == dynamo_model.KIND):
        name = (doc.get("metadata") or {}).get("name", "(unnamed)")
        try:
            dm = dynamo_model.DynamoModel.model_validate(doc)
        except ValidationError as e:
            raise ManifestError(
                f"{source}: {dynamo_model.KIND} {name} is not valid:\n{format_validation_error(e)}"
            ) from None
        problems = dynamo_model.problems(dm)
        if problems:
            raise ManifestError(
                f"{source}: {dynamo_model.KIND} {name} is not valid:\n{format_problems(problems)}", problems
            )
        models.append(dm)
    return tuple(models)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise ManifestError(
            f"cannot read {path}: {e.strerror}; pass the path of a {KIND} YAML file"
        ) from None


def load_manifest(path: Path) -> DynamoGraphDeployment:
    return parse_manifest(_read(path), str(path))


def load_models(path: Path) -> tuple[dynamo_model.DynamoModel, ...]:
    return parse_models(_read(path), str(path))
