"""What the mocker answers instead of its usual word salad: scripted replies, JSON that follows a
schema (the simulated grammar backend), embedding vectors and logprobs, all deterministic.

- ``--script FILE``: a JSON list of ``{"match": TEXT, "reply": TEXT}``. A request whose prompt, decoded
  with the model's tokenizer, contains ``match`` is answered with ``reply`` (tokenized with the same
  tokenizer, special tokens recognized), then ends with ``stop``. The first matching rule wins. This is
  how tests get a tool call, a reasoning block or harmony text in any model family's format.
- ``json_for_schema``: an instance of a JSON schema (first ``enum``/``const`` value, first ``anyOf``
  branch, required properties, ``minItems`` items, values derived from a seed), which is what the
  mocker "decodes" for ``structured.json_schema``.
- ``embedding``: a unit vector from the token ids: the sum of one pseudo-random vector per (token,
  position) pair, normalized; Matryoshka ``dimensions`` keep the first components, renormalized.
- ``token_logprobs``: a log probability for the chosen token and ``k`` alternatives below it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamo_worker.protocol import TokenLogprob, TopLogprob

__all__ = ["ScriptRule", "embedding", "json_for_schema", "load_script", "token_logprobs"]


@dataclass(frozen=True)
class ScriptRule:
    match: str
    reply: str


def load_script(path: Path) -> list[ScriptRule]:
    """Rules from ``path``; raises ``ValueError`` naming what is wrong with the file."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--script {path}: cannot read a JSON list of rules ({e})") from None
    if not isinstance(data, list):
        raise ValueError(f"--script {path}: expected a JSON list of {{'match', 'reply'}} objects")
    rules = []
    for i, rule in enumerate(data):
        fields = (rule.get("match"), rule.get("reply")) if isinstance(rule, dict) else (None, None)
        if not all(isinstance(f, str) for f in fields):
            raise ValueError(f"--script {path}: rule {i} needs string fields 'match' and 'reply'")
        rules.append(ScriptRule(rule["match"], rule["reply"]))
    return rules


_MASK = 2**64 - 1


def _rng(seed: int, *salt: int) -> random.Random:
    values = [v & _MASK for v in (seed, *salt)]
    digest = hashlib.blake2b(struct.pack(f"<{len(values)}Q", *values), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


@functools.lru_cache(maxsize=65536)
def _unit(seed: int, token: int, slot: int, dim: int) -> tuple[float, ...]:
    rng = _rng(seed, token, slot)
    return tuple(rng.gauss(0.0, 1.0) for _ in range(dim))


_WORDS = ("alpha", "bravo", "delta", "echo", "lima", "oscar", "tango", "zulu")


def json_for_schema(schema: Any, seed: int, depth: int = 0, root: Any = None) -> Any:
    """A JSON value that satisfies the common subset of ``schema`` (see module doc): a local ``$ref``
    followed, then ``const``, ``enum``, the first branch of ``anyOf``/``oneOf``/``allOf``, else a value
    of its type."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 16:
        return None
    rng = _rng(seed, depth)
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        return json_for_schema(_resolve(root, ref), seed, depth + 1, root)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[rng.randrange(len(enum))]
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            return json_for_schema(branches[0], seed, depth + 1, root)
    kind = _kind(schema)
    make = _BY_TYPE.get(kind, _string) if isinstance(kind, str) else _string
    return make(schema, seed, depth, root, rng)


def _resolve(root: Any, ref: str) -> Any:
    """The schema a local ``$ref`` (``#/$defs/name``) points at; ``{}`` when nothing is there."""
    target: Any = root
    for part in ref[2:].split("/"):
        target = target.get(part, {}) if isinstance(target, dict) else {}
    return target


def _kind(schema: dict[str, Any]) -> Any:
    """The schema's type (the first that is not ``null`` of a list); by default ``object`` when it has
    properties, else ``string``."""
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    return kind


def _object(schema: dict[str, Any], seed: int, depth: int, root: Any, _rng: random.Random) -> Any:
    """The required properties (all of them when none is), each from its schema."""
    props = schema.get("properties") or {}
    required = schema.get("required") or list(props)
    return {
        name: json_for_schema(props.get(name, {}), seed * 31 + i, depth + 1, root)
        for i, name in enumerate(required)
    }


def _array(schema: dict[str, Any], seed: int, depth: int, root: Any, _rng: random.Random) -> Any:
    """``minItems`` items (at least one), each from the ``items`` schema."""
    count = max(int(schema.get("minItems") or 1), 1)
    items = schema.get("items") or {}
    return [json_for_schema(items, seed * 17 + i, depth + 1, root) for i in range(count)]


def _integer(schema: dict[str, Any], _seed: int, _depth: int, _root: Any, rng: random.Random) -> Any:
    low, high = int(schema.get("minimum", 0)), int(schema.get("maximum", 100))
    return rng.randint(low, max(low, high))


def _number(schema: dict[str, Any], _seed: int, _depth: int, _root: Any, rng: random.Random) -> Any:
    least, most = float(schema.get("minimum", 0)), float(schema.get("maximum", 100))
    return round(rng.uniform(least, max(least, most)), 3)


def _boolean(_schema: dict[str, Any], _seed: int, _depth: int, _root: Any, rng: random.Random) -> Any:
    return rng.random() < 0.5


def _null(_schema: dict[str, Any], _seed: int, _depth: int, _root: Any, _rng: random.Random) -> Any:
    return None


def _string(schema: dict[str, Any], _seed: int, _depth: int, _root: Any, rng: random.Random) -> Any:
    """A word, repeated up to ``minLength`` and cut at ``maxLength``."""
    word = _WORDS[rng.randrange(len(_WORDS))]
    shortest, longest = int(schema.get("minLength", 0)), schema.get("maxLength")
    word = (word * (shortest // len(word) + 1))[: max(shortest, len(word))]
    return word[: int(longest)] if longest is not None else word


# A value of each JSON type (any other type: a string).
_BY_TYPE: dict[str, Callable[[dict[str, Any], int, int, Any, random.Random], Any]] = {
    "object": _object,
    "array": _array,
    "integer": _integer,
    "number": _number,
    "boolean": _boolean,
    "null": _null,
}


def embedding(
    token_ids: Sequence[int], dim: int, dimensions: int | None = None, seed: int = 0
) -> list[float]:
    vector = [0.0] * dim
    for position, token in enumerate(token_ids):
        for k, x in enumerate(_unit(seed, token, position % 8, dim)):
            vector[k] += x
    if dimensions is not None:
        vector = vector[:dimensions]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def token_logprobs(token: int, alternatives: Sequence[int], chance: float, k: int) -> TokenLogprob:
    chosen = -(0.05 + 2.0 * chance)
    top = [TopLogprob(token_id=token, logprob=chosen)]
    for j, alt in enumerate(t for t in alternatives if t != token):
        if len(top) >= k:
            break
        top.append(TopLogprob(token_id=alt, logprob=chosen - 1.0 - j))
    return TokenLogprob(token_id=token, logprob=chosen, top=top[:k])
