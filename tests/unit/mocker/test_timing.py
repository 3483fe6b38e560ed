"""The mocker's timing model: the documented formulas, monotonic in load, scaled by --speedup."""

from __future__ import annotations

import pytest
from dynamo_worker.mocker.timing import TimingModel


def test_prefill_follows_the_documented_formula():
    t = TimingModel(prefill_base_ms=5, prefill_per_token_us=50, prefill_attention_ns=0.5)
    assert t.prefill_s(1000, 24) == pytest.approx(0.005 + 1000 * 50e-6 + 1000 * 1024 * 0.5e-9)


def test_prefill_grows_with_uncached_tokens_and_cache_hits_save_time():
    t = TimingModel()
    assert t.prefill_s(0) < t.prefill_s(100) < t.prefill_s(1000)
    # The same 1000-token prompt with 900 tokens cached is far cheaper than uncached.
    assert t.prefill_s(100, 900) < t.prefill_s(1000, 0) / 5


def test_decode_step_grows_with_batch_and_kv_load():
    t = TimingModel()
    assert t.decode_step_s(0, 0) == 0.0
    assert t.decode_step_s(1, 100) < t.decode_step_s(8, 100) < t.decode_step_s(8, 100_000)
    assert t.decode_step_s(2, 10) == pytest.approx(0.008 + 2 * 20e-6 + 10 * 10e-9)


def test_kv_transfer_is_bytes_over_bandwidth():
    t = TimingModel(kv_bytes_per_token=1000, kv_transfer_gbps=8, kv_transfer_latency_ms=0)
    assert t.kv_transfer_s(1_000_000) == pytest.approx(1.0)  # 1e9 bytes at 1e9 bytes/s


def test_speedup_divides_every_duration():
    slow, fast = TimingModel(), TimingModel(speedup=10)
    assert fast.prefill_s(500, 20) == pytest.approx(slow.prefill_s(500, 20) / 10)
    assert fast.decode_step_s(4, 4000) == pytest.approx(slow.decode_step_s(4, 4000) / 10)
    assert fast.kv_transfer_s(300) == pytest.approx(slow.kv_transfer_s(300) / 10)


@pytest.mark.parametrize("bad", [{"speedup": 0}, {"kv_transfer_gbps": 0}, {"decode_base_ms": -1}])
def test_invalid_knobs_are_rejected(bad):
    with pytest.raises(ValueError):
        TimingModel(**bad)


def test_a_profile_replaces_the_formulas():
    """With --profile, a lone prefill costs its profiled TTFT; prefills batched in one step cost one
    forward pass over all their new tokens plus each request's own attention (so eight short prompts
    cost far less than eight lone ones, and less than one prompt as long as all eight); a cached
    prefix adds attention only; a decode step costs the profiled ITL at the batch's size and mean
    context; speedup divides."""
    from dynamo_worker.mocker.settings import MockerSettings
    from dynamo_worker.profile.model import builtin_profile

    p = builtin_profile("sglang-8b-h100")
    t = MockerSettings(profile="builtin:sglang-8b-h100").timing(131072)
    for isl in p.prefill.isl:
        assert t.prefill_s(isl) == pytest.approx(p.ttft_s(isl))
    assert p.attention_s() > 0
    assert p.ttft_s(1024) <= t.prefill_s(1024, cached_tokens=4096) < p.ttft_s(1024 + 4096)
    eight = t.prefill_batch_s([(1024, 0)] * 8)
    assert eight == pytest.approx(p.pass_s(8192) + p.attention_s() * 8 * 1024 * 1024)
    assert t.prefill_s(1024) < eight < min(8 * t.prefill_s(1024), p.ttft_s(8192))
    assert t.prefill_batch_s([(128, 0)] * 4) == pytest.approx(p.ttft_s(512), rel=0.05)  # the flat start
    assert t.prefill_batch_s([]) == 0
    assert t.decode_step_s(32, 32 * 2048) == pytest.approx(p.itl_s(32, 2048))
    fast = MockerSettings(profile="builtin:sglang-8b-h100", speedup=10).timing(131072)
    assert fast.decode_step_s(8, 8 * 1024) == pytest.approx(p.itl_s(8, 1024) / 10)


def test_a_host_hit_loads_back_over_pcie_far_faster_than_prefill():
    """Load-back of a HiCache host hit: bytes over the host link, per 16-token block of an 8B model
    42 us at the default 50 GB/s, against 0.8 ms of prefill; speedup divides."""
    t = TimingModel(kv_bytes_per_token=131_072)
    assert t.load_back_s(16) == pytest.approx(16 * 131_072 / 50e9)
    assert t.load_back_s(16) < t.prefill_s(16) / 10
    assert TimingModel(host_load_gb_s=25.0).load_back_s(1024) == pytest.approx(2 * t.load_back_s(1024))
    assert TimingModel(speedup=4).load_back_s(1024) == pytest.approx(t.load_back_s(1024) / 4)
    with pytest.raises(ValueError, match="host_load_gb_s"):
        TimingModel(host_load_gb_s=0)
