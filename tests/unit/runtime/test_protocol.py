"""Wire models of dynamo_worker.protocol: validation of requests, chunks, records and KV events, and the
chained block hashing every worker and router must compute identically."""

from __future__ import annotations

import pytest
from dynamo_worker.protocol import (
    MAX_ROOM,
    BlockStored,
    BootstrapInfo,
    GenerateChunk,
    GenerateRequest,
    InstanceRecord,
    KvEvent,
    KvEventBatch,
    SamplingOptions,
    StopConditions,
    WorkerError,
    hash_token_blocks,
)
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError


def _request(**kw) -> GenerateRequest:
    base = {"request_id": "r", "model": "m", "token_ids": [1, 2, 3], "stop": {"max_tokens": 4}}
    return GenerateRequest.model_validate({**base, **kw})


def test_request_roundtrips_through_json():
    req = _request(
        bootstrap_info={"bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": MAX_ROOM}
    )
    assert GenerateRequest.model_validate_json(req.model_dump_json()) == req


@pytest.mark.parametrize(
    "bad",
    [
        {"token_ids": []},
        {"stop": {"max_tokens": 0}},
        {"request_id": ""},
        {"version": 2},
        {"unknown_field": 1},
        {"sampling": {"top_k": 0}},
        {"sampling": {"temperature": -1}},
        {"bootstrap_info": {"bootstrap_host": "h", "bootstrap_port": 0, "bootstrap_room": 1}},
        {"bootstrap_info": {"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": MAX_ROOM + 1}},
    ],
)
def test_invalid_requests_are_rejected(bad):
    with pytest.raises(ValidationError):
        _request(**bad)


def test_sampling_top_k_minus_one_means_disabled():
    assert SamplingOptions(top_k=-1).top_k == -1


def test_error_is_set_exactly_when_finish_reason_is_error():
    GenerateChunk(finish_reason="error", error=WorkerError(type="overloaded", message="busy"))
    GenerateChunk(token_ids=[1], finish_reason="stop")
    with pytest.raises(ValidationError):
        GenerateChunk(finish_reason="error")
    with pytest.raises(ValidationError):
        GenerateChunk(finish_reason="stop", error=WorkerError(type="engine_error", message="x"))
    with pytest.raises(ValidationError):
        WorkerError(type="not_a_type", message="x")


def test_instance_record_requires_a_16_hex_id():
    fields = {
        "namespace": "n",
        "component": "c",
        "role": "decode",
        "model": "m",
        "address": "127.0.0.1:1",
        "page_size": 16,
        "total_kv_blocks": 10,
    }
    InstanceRecord(instance_id="0123456789abcdef", **fields)
    with pytest.raises(ValidationError):
        InstanceRecord(instance_id="xyz", **fields)
    with pytest.raises(ValidationError):
        InstanceRecord(instance_id="0123456789abcdef", **{**fields, "role": "both"})


def test_kv_events_are_a_discriminated_union():
    batch = KvEventBatch.model_validate_json(
        '{"instance_id": "a", "seq": 3, "events": ['
        '{"type": "stored", "parent_hash": null, "block_hashes": [1], "token_ids": [5, 6]},'
        '{"type": "removed", "block_hashes": [1]}, {"type": "cleared"}]}'
    )
    assert [e.type for e in batch.events] == ["stored", "removed", "cleared"]
    with pytest.raises(ValidationError):
        TypeAdapter(KvEvent).validate_python({"type": "evicted", "block_hashes": []})
    with pytest.raises(ValidationError):
        KvEventBatch(instance_id="a", seq=-1, events=[])
    assert isinstance(batch.events[0], BlockStored)
    assert batch.dp_rank == 0  # a publisher that predates dp ranks still parses: rank 0
    assert KvEventBatch(instance_id="a", seq=0, events=[], dp_rank=3).dp_rank == 3
    with pytest.raises(ValidationError):
        KvEventBatch(instance_id="a", seq=0, events=[], dp_rank=-1)


def test_stop_conditions_default_to_no_stop_ids():
    assert StopConditions(max_tokens=1).stop_token_ids == []
    assert BootstrapInfo(bootstrap_host="h", bootstrap_port=1, bootstrap_room=0).bootstrap_room == 0


# --- block hashing -------------------------------------------------------------------------------

HASHES_1_TO_8 = [658132497017838498, 7641984106258271874]


def test_hashing_ignores_a_trailing_partial_block():
    assert len(hash_token_blocks(list(range(10)), 4)) == 2
    assert hash_token_blocks([1, 2, 3], 4) == []
    assert hash_token_blocks(list(range(8)), 4) == hash_token_blocks(list(range(10)), 4)


def test_hashes_are_stable_across_processes_and_versions():
    # Fixed values: a change to the hashing would break routers talking to workers of another version.
    assert hash_token_blocks([1, 2, 3, 4, 5, 6, 7, 8], 4) == HASHES_1_TO_8
    assert all(0 <= h <= MAX_ROOM for h in HASHES_1_TO_8)


def test_block_hash_depends_on_the_whole_prefix():
    a = hash_token_blocks([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = hash_token_blocks([9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[0] != b[0] and a[1] != b[1]  # same second block, different prefix


@given(
    tokens=st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=80),
    page=st.integers(min_value=1, max_value=9),
    split=st.integers(min_value=0, max_value=10),
)
def test_hashing_in_pieces_with_parent_equals_hashing_at_once(tokens, page, split):
    whole = hash_token_blocks(tokens, page)
    cut = min(split, len(tokens) // page) * page
    head = hash_token_blocks(tokens[:cut], page)
    tail = hash_token_blocks(tokens[cut:], page, head[-1] if head else None)
    assert head + tail == whole
    assert len(whole) == len(tokens) // page
