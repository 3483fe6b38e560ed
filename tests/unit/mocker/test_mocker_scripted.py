"""The mocker's deterministic stand-ins for what a real engine computes: JSON instances of a schema
(its simulated grammar backend), embedding vectors, logprobs, and the --script file's checks."""

from __future__ import annotations

import json
import math

import pytest
from dynamo_worker.mocker.scripted import embedding, json_for_schema, load_script, token_logprobs


def test_json_for_schema_satisfies_types_enums_required_and_refs():
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 3},
            "age": {"type": "integer", "minimum": 5, "maximum": 9},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2},
            "kind": {"anyOf": [{"const": "x"}, {"type": "integer"}]},
            "ref": {"$ref": "#/$defs/flag"},
        },
        "required": ["name", "age", "tags", "kind", "ref"],
        "$defs": {"flag": {"type": "boolean"}},
    }
    for seed in range(20):
        v = json_for_schema(schema, seed)
        assert set(v) == {"name", "age", "tags", "kind", "ref"}
        assert isinstance(v["name"], str) and len(v["name"]) <= 3
        assert 5 <= v["age"] <= 9 and len(v["tags"]) == 2 and set(v["tags"]) <= {"a", "b"}
        assert v["kind"] == "x" and isinstance(v["ref"], bool)
    assert json_for_schema(schema, 3) == json_for_schema(schema, 3)


def test_embedding_is_a_deterministic_unit_vector_and_matryoshka_truncates():
    a, b = embedding([1, 2, 3], 32), embedding([1, 2, 4], 32)
    assert a == embedding([1, 2, 3], 32) and a != b
    assert abs(math.sqrt(sum(x * x for x in a)) - 1) < 1e-9
    short = embedding([1, 2, 3], 32, dimensions=8)
    assert len(short) == 8 and abs(math.sqrt(sum(x * x for x in short)) - 1) < 1e-9


def test_token_logprobs_rank_the_chosen_token_first():
    lp = token_logprobs(7, [7, 9, 11, 13], 0.5, 3)
    assert lp.token_id == 7 and lp.top[0].token_id == 7 and len(lp.top) == 3
    assert lp.logprob < 0 and [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)


def test_script_file_errors_name_the_rule(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"match": "a", "reply": "b"}, {"match": 1}]))
    with pytest.raises(ValueError, match="rule 1"):
        load_script(path)
    path.write_text(json.dumps([{"match": "a", "reply": "b"}]))
    assert load_script(path)[0].reply == "b"
