"""Wire models of dynamo_worker.protocol: validation of requests, chunks, records and KV events, and the
chained block hashing every worker and router must compute identically."""

from __future__ import annotations

import json

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
    KvSnapshotPart,
    KvSnapshotRequest,
    LoadMetrics,
    SamplingOptions,
    ServingFeatures,
    StopConditions,
    WorkerError,
    hash_token_blocks,
    kv_snapshot_subject,
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


_RECORD_FIELDS = {
    "namespace": "n",
    "component": "c",
    "role": "decode",
    "model": "m",
    "address": "127.0.0.1:1",
    "page_size": 16,
    "total_kv_blocks": 10,
}


def test_instance_record_requires_a_16_hex_id():
    fields = _RECORD_FIELDS
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


def test_kv_event_batches_name_their_dp_rank_and_older_ones_mean_rank_zero():
    old = KvEventBatch.model_validate_json(b'{"instance_id": "a", "seq": 3, "events": []}')
    assert old.dp_rank == 0
    batch = KvEventBatch(instance_id="a", seq=4, events=[], dp_rank=1)
    assert KvEventBatch.model_validate_json(batch.model_dump_json()) == batch


def test_kv_snapshot_parts_round_trip():
    part = KvSnapshotPart(
        instance_id="a",
        next_seq=7,
        part=1,
        last=True,
        dp_rank=1,
        events=[BlockStored(parent_hash=None, block_hashes=[1], token_ids=[1, 2, 3, 4])],
    )
    assert KvSnapshotPart.model_validate_json(part.model_dump_json()) == part
    assert KvSnapshotRequest.model_validate_json(b"{}").requester == ""
    assert kv_snapshot_subject("ns", "a") == "dynamo.ns.kv_snapshot.a"


# A field of a later release, on every message a peer tells (rolling upgrades: see the protocol docstring).
_LATER = {"from_a_later_release": {"any": ["shape"]}}
_TOLD = [
    (InstanceRecord, {**_RECORD_FIELDS, "instance_id": "0123456789abcdef"}),
    (LoadMetrics, {"instance_id": "a", "active_blocks": 1, "total_blocks": 2, "waiting": 0, "running": 1}),
    (
        KvEventBatch,
        {"instance_id": "a", "seq": 1, "events": [{"type": "removed", "block_hashes": [1], **_LATER}]},
    ),
    (
        KvSnapshotPart,
        {
            "instance_id": "a",
            "next_seq": 1,
            "events": [{"parent_hash": None, "block_hashes": [], "token_ids": [], **_LATER}],
        },
    ),
    (KvSnapshotRequest, {}),
    (
        GenerateChunk,
        {
            "token_ids": [1],
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, **_LATER},
        },
    ),
    (ServingFeatures, {"model_type": "generate"}),
]


@pytest.mark.parametrize(("model", "fields"), _TOLD, ids=[m.__name__ for m, _ in _TOLD])
def test_what_a_newer_peer_tells_is_read_without_its_new_fields(model, fields):
    read = model.model_validate_json(json.dumps({**fields, **_LATER}))
    assert read == model.model_validate(fields)
    assert "from_a_later_release" not in read.model_dump_json()


def test_what_a_newer_peer_asks_is_refused_when_a_field_is_unknown():
    """A worker cannot honour a request field it does not know: it refuses the request."""
    with pytest.raises(ValidationError, match="from_a_later_release"):
        _request(**_LATER)
