"""What the SGLang worker reports of its engine's load (``sglang.load.snapshot``), from SGLang's own
per-rank load snapshots (the fields 0.5.17 publishes): summed over dp ranks; queued prefill tokens are
the uncached waiting ones, a prefill worker's bootstrap queue counted whole; each role's handoff queues."""

from __future__ import annotations

from dynamo_worker.sglang.load import snapshot

from tests.support.sglang_fake import FakeDisaggregation, FakeLoad


def test_an_aggregated_engine_reports_its_queue_in_uncached_tokens_summed_over_ranks():
    loads = [
        FakeLoad(dp_rank=0, num_running_reqs=3, num_waiting_reqs=2, num_waiting_uncached_tokens=100,
                 num_used_tokens=160, num_total_tokens=400, max_total_num_tokens=1600),
        FakeLoad(dp_rank=1, num_running_reqs=1, num_waiting_reqs=1, num_waiting_uncached_tokens=60,
                 num_used_tokens=32, num_total_tokens=96, max_total_num_tokens=1600),
    ]  # fmt: skip
    snap = snapshot(loads, page_size=16, role="agg")
    assert (snap.running, snap.waiting, snap.waiting_prefill_tokens) == (4, 3, 160)
    assert (snap.active_blocks, snap.total_blocks) == (12, 200)
    assert (snap.bootstrap_queue, snap.prealloc_queue, snap.transfer_queue) == (0, 0, 0)


def test_a_prefill_engine_counts_its_bootstrap_queue_whole_and_reports_its_handoff_queues():
    disagg = FakeDisaggregation(prefill_bootstrap_queue_reqs=2, prefill_inflight_queue_reqs=1)
    # 64 uncached tokens wait for compute; 2 requests of 500 tokens wait for their decode leg's handshake
    load = FakeLoad(num_waiting_reqs=3, num_waiting_uncached_tokens=64, num_used_tokens=300,
                    num_total_tokens=300 + 80 + 1000, disaggregation=disagg)  # fmt: skip
    snap = snapshot([load], page_size=16, role="prefill")
    assert snap.waiting_prefill_tokens == 1080
    assert (snap.bootstrap_queue, snap.transfer_queue, snap.prealloc_queue) == (2, 1, 0)


def test_a_decode_engine_reports_no_prefill_and_its_prealloc_and_transfer_queues():
    disagg = FakeDisaggregation(decode_prealloc_queue_reqs=1, decode_transfer_queue_reqs=2)
    load = FakeLoad(num_waiting_reqs=3, num_waiting_uncached_tokens=0, num_used_tokens=800,
                    num_total_tokens=1200, disaggregation=disagg)  # fmt: skip
    snap = snapshot([load], page_size=16, role="decode")
    assert (snap.waiting_prefill_tokens, snap.prealloc_queue, snap.transfer_queue) == (0, 1, 2)
    assert snap.active_blocks == 50
