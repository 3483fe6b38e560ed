"""Reading ServerArgs after start: the resolved values through ``resolved_dict()`` where SGLang has it
(0.5.19+: the fields keep the raw command line), the fields otherwise (0.5.17); both dp-attention
spellings give the engine's number of dp ranks; and what the worker registers and where it listens for
KV events follow the resolved values, not the raw ones.

SGLang's ``ServerArgs`` cannot be imported without torch: ``FakeServerArgs`` (0.5.17's shape: resolved
fields, no ``resolved_dict``) and ``RawServerArgs`` below (0.5.19+'s shape) stand in for it, and
``FakeSglangEngine`` for the engine.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from dynamo_worker.runtime.settings import RuntimeSettings
from dynamo_worker.sglang.args import SglangSettings, WorkerPlan
from dynamo_worker.sglang.engine import SglangEngine
from dynamo_worker.sglang.resolved import resolve, resolved_args, server_args_values

from tests.support.sglang_fake import FAKE_BOOTSTRAP_HOST, FakeLoad, FakeServerArgs, FakeSglangEngine


@dataclasses.dataclass(frozen=True)
class RawServerArgs(FakeServerArgs):
    """SGLang 0.5.19+: the fields are the command line as given; ``resolved_dict()`` has what the
    engine resolved (here: ``resolved``), and 0.5.22+ has ``attn_dp_size`` as a field of its own."""

    attn_dp_size: int = 1
    resolved: dict[str, Any] = dataclasses.field(default_factory=dict)

    def resolved_dict(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "resolved"}
        return {**fields, **self.resolved}


def test_resolved_values_come_from_resolved_dict_not_the_raw_fields():
    raw = RawServerArgs(
        model_path="/models/deepseek",
        served_model_name=None,
        page_size=1,
        resolved={"served_model_name": "deepseek-ai/DeepSeek-V3", "page_size": 64},
    )
    got = resolved_args(raw)
    assert (got.served_model_name, got.page_size) == ("deepseek-ai/DeepSeek-V3", 64)
    assert (raw.served_model_name, raw.page_size) == (None, 1)  # what a worker reading fields got


def test_without_resolved_dict_the_fields_are_the_resolved_values():
    args = FakeServerArgs(model_path="/models/qwen", served_model_name="qwen", page_size=32)
    assert not hasattr(args, "resolved_dict")
    got = resolved_args(args)
    assert (got.served_model_name, got.page_size, got.tokenizer_path) == ("qwen", 32, "/models/qwen")


def test_the_served_model_name_defaults_to_the_model_path():
    assert (
        resolve({"model_path": "/models/qwen", "served_model_name": None}).served_model_name == "/models/qwen"
    )


@pytest.mark.parametrize(
    ("values", "dp_size", "attn_dp_size"),
    [
        ({}, 1, 1),
        ({"dp_size": 2}, 2, 1),  # two replicas
        ({"dp_size": 4, "enable_dp_attention": True}, 1, 4),  # the old spelling, raw or 0.5.17
        ({"dp_size": 1, "attn_dp_size": 4}, 1, 4),  # --attn-dp-size 4 (0.5.22+)
        # 0.5.23's resolved_dict of the old spelling: resolved to attn_dp_size, and it reports
        # enable_dp_attention for old clients
        ({"dp_size": 1, "attn_dp_size": 4, "enable_dp_attention": True}, 1, 4),
        ({"dp_size": 2, "attn_dp_size": 1}, 2, 1),
    ],
)
def test_both_dp_attention_spellings_give_the_dp_ranks(values, dp_size, attn_dp_size):
    got = resolve({"model_path": "m", **values})
    assert (got.dp_size, got.attn_dp_size, got.dp_ranks) == (dp_size, attn_dp_size, dp_size * attn_dp_size)


def test_server_args_values_reads_the_optional_field_where_it_exists():
    assert "attn_dp_size" not in server_args_values(FakeServerArgs())
    assert server_args_values(RawServerArgs(attn_dp_size=2))["attn_dp_size"] == 2


def plan(server_args: Any) -> WorkerPlan:
    return WorkerPlan(
        server_args=server_args,
        runtime=RuntimeSettings(listen_host="127.0.0.1", advertise_host="10.0.0.9"),
        settings=SglangSettings(capacity_timeout_s=5, canary_interval_s=60),
        fake_bootstrap_host=FAKE_BOOTSTRAP_HOST,
    )


def two_rank_engine(server_args: Any) -> FakeSglangEngine:
    fake = FakeSglangEngine(server_args)
    fake.tokenizer_manager.loads = [FakeLoad(dp_rank=0), FakeLoad(dp_rank=1)]
    return fake


KV_CONFIG = '{"publisher": "zmq", "endpoint": "tcp://*:25557"}'


@pytest.mark.parametrize(
    "server_args",
    [
        RawServerArgs(
            model_path="/m",
            served_model_name=None,
            page_size=1,
            attn_dp_size=2,
            kv_events_config=KV_CONFIG,
            resolved={"served_model_name": "org/model", "page_size": 64},
        ),
        FakeServerArgs(
            model_path="/m",
            served_model_name="org/model",
            page_size=64,
            dp_size=2,
            enable_dp_attention=True,
            kv_events_config=KV_CONFIG,
        ),
    ],
    ids=["attn-dp-size-0.5.23", "enable-dp-attention-0.5.17"],
)
async def test_the_worker_registers_resolved_values_and_listens_to_every_dp_rank(server_args):
    engine = SglangEngine(plan(server_args), engine_factory=two_rank_engine)
    try:
        info = await engine.start()
        assert (info.model_name, info.page_size, info.dp_size) == ("org/model", 64, 2)
        assert info.total_kv_blocks == 2 * 4096 // 64
        assert engine._relay is not None
        assert engine._relay.endpoints == ["tcp://127.0.0.1:25557", "tcp://127.0.0.1:25558"]
    finally:
        await engine.stop()
