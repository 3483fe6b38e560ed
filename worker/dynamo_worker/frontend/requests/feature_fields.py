"""Request fields for tools, structured output and logprobs, as pydantic models (used by
``openai_models``), and a structural check of the JSON schemas clients send.

``check_schema`` is not a full JSON Schema validator: it catches what would make the engine's grammar
compiler fail or mean something else than the client thinks (a ``type`` that is not a JSON type,
``properties`` that is not an object of schemas, ``required`` that is not a list of names, ...), so
the client gets a 400 naming the place instead of an engine error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "FunctionDef",
    "JsonSchemaFormat",
    "MessageToolCall",
    "NamedToolChoice",
    "ResponseFormat",
    "Tool",
    "check_schema",
]

MAX_SCHEMA_DEPTH = 32
_JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains", "if", "then", "else")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


def check_schema(schema: Any, where: str = "schema", depth: int = 0) -> None:
    """Raise ``ValueError`` naming the first malformed part of a JSON schema: its ``type``, then its
    subschemas (depth first), then its other keywords."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ValueError(f"{where} must be a JSON schema object, got {type(schema).__name__}")
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"{where} nests deeper than {MAX_SCHEMA_DEPTH} levels")
    _check_type(schema.get("type"), where)
    for sub, sub_where in _subschemas(schema, where):
        check_schema(sub, sub_where, depth + 1)
    _check_keywords(schema, where)


def _check_type(kind: Any, where: str) -> None:
    for k in kind if isinstance(kind, list) else [kind] if kind is not None else []:
        if k not in _JSON_TYPES:
            raise ValueError(f"{where}.type is {k!r}; use one of {', '.join(sorted(_JSON_TYPES))}")


def _subschemas(schema: dict[str, Any], where: str) -> Iterator[tuple[Any, str]]:
    """Each subschema with its place, in order; raises for a keyword that cannot hold schemas."""
    for key in _SCHEMA_MAPS:
        if key in schema:
            value = schema[key]
            if not isinstance(value, dict):
                raise ValueError(f"{where}.{key} must be an object mapping names to schemas")
            yield from ((sub, f"{where}.{key}.{name}") for name, sub in value.items())
    for key in _SCHEMA_LISTS:
        if key in schema:
            value = schema[key]
            if not isinstance(value, list) or not value:
                raise ValueError(f"{where}.{key} must be a non-empty list of schemas")
            yield from ((sub, f"{where}.{key}[{i}]") for i, sub in enumerate(value))
    for key in _SCHEMA_ONE:
        if key in schema:
            yield schema[key], f"{where}.{key}"


def _is_number(value: Any) -> bool:
    return value is None or (not isinstance(value, bool) and isinstance(value, int | float))


# The other keywords a grammar compiler reads: (keyword, whether a value is well-formed, the rule).
# ``null`` counts as unset, except for ``$ref``.
_KEYWORD_RULES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    (
        "required",
        lambda v: v is None or (isinstance(v, list) and all(isinstance(r, str) for r in v)),
        "must be a list of property names",
    ),
    ("enum", lambda v: v is None or (isinstance(v, list) and bool(v)), "must be a non-empty list"),
    *(
        (key, _is_number, "must be a number")
        for key in ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems")
    ),
    ("$ref", lambda v: isinstance(v, str), "must be a string"),
)
_ABSENT = object()


def _check_keywords(schema: dict[str, Any], where: str) -> None:
    for key, well_formed, rule in _KEYWORD_RULES:
        value = schema.get(key, _ABSENT)
        if value is not _ABSENT and not well_formed(value):
            raise ValueError(f"{where}.{key} {rule}")


class FunctionDef(_Body):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        check_schema(v, "parameters")
        if v.get("type", "object") != "object":
            raise ValueError("parameters must be a JSON schema of type 'object'")
        return v


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class _FunctionName(_Body):
    name: Annotated[str, Field(min_length=1)]


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: _FunctionName


class _CalledFunction(_Body):
    name: Annotated[str, Field(min_length=1)]
    arguments: str = "{}"


class MessageToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: _CalledFunction


class JsonSchemaFormat(_Body):
    name: Annotated[str, Field(min_length=1, max_length=64)] = "response"
    description: str | None = None
    schema_: Annotated[dict[str, Any], Field(alias="schema")]
    strict: bool | None = None

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    @field_validator("schema_")
    @classmethod
    def _schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_schema(v, "schema")
        return v


class _Structure(_Body):
    begin: str
    end: str
    schema_: dict[str, Any] | None = Field(None, alias="schema")

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class ResponseFormat(_Body):
    """OpenAI's ``text`` / ``json_object`` / ``json_schema``, and SGLang's ``structural_tag`` (its legacy
    ``structures`` + ``triggers`` form, or xgrammar's ``format``), passed to the engine as sent."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    structures: list[_Structure] | None = None
    triggers: list[Annotated[str, Field(min_length=1)]] | None = None
    at_least_one: bool | None = None
    format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object with a 'schema'")
        if self.type == "structural_tag" and self.format is None and not (self.structures and self.triggers):
            raise ValueError("type 'structural_tag' needs 'structures' and 'triggers', or a 'format'")
        return self

    def structural_tag(self) -> str:
        """The tag as SGLang's engine takes it: this object as JSON."""
        return json.dumps(self.model_dump(exclude_none=True, by_alias=True, exclude={"json_schema"}))
