"""The kv policy's defaults on the case that set them: a conversation's next turn under load.

Multi-turn traffic at concurrency keeps every worker a few requests and a prompt or two of prefill
apart at any moment. With the policy before 28 November (overlap weight 1.5, a balance guard at 2
requests more than the idlest worker whatever the load) that noise moved a returning turn off the
worker holding its conversation about one time in three at concurrency 128 (tests/gpu/run_peers.py on
the mocker with the 8B profile: 0.62 of prompt tokens cached, against 0.70 now, at a lower TTFT p90;
figures and commands in docs/benchmarks.md)."""

from __future__ import annotations

import random

from dynamo_worker.router.policy import KvCandidate, KvWeights, kv_choose

DEFAULTS = KvWeights()
ROOMY = {"free_blocks": 10_000, "capacity_blocks": 16_384}

# Turn 2 of a conversation in 16-token blocks: 136 blocks, of which its holder has 96 (the system prompt
# and turn 1) and every worker 64 (the shared system prompt).
PROMPT = 136


def test_a_returning_turn_stays_with_its_conversation_through_ordinary_load_noise():
    holder = KvCandidate("holder", overlap_blocks=96, prefill_blocks=80, requests=10, **ROOMY)
    other = KvCandidate("other", overlap_blocks=64, requests=6, **ROOMY)
    assert kv_choose([holder, other], PROMPT, DEFAULTS, random.Random(0))[0].worker_id == "holder"
    # before: one turn queued on the holder outweighed recomputing 32 blocks elsewhere (weight 1.5), and
    # 4 requests more than the idlest tripped the guard
    before = KvWeights(overlap_weight=1.5)
    assert kv_choose([holder, other], PROMPT, before, random.Random(0))[0].worker_id == "other"


def test_a_real_backlog_or_imbalance_still_moves_it():
    other = KvCandidate("other", overlap_blocks=64, requests=10, **ROOMY)
    rng = random.Random(0)
    backlog = KvCandidate("holder", overlap_blocks=96, prefill_blocks=400, requests=12, **ROOMY)
    assert kv_choose([backlog, other], PROMPT, DEFAULTS, rng)[0].worker_id == "other"
    # 7 more at a mean of 13.5 requests is within the natural swing (2 * sqrt(13.5) = 7.3); 8 is not
    within = KvCandidate("holder", overlap_blocks=96, requests=17, **ROOMY)
    assert kv_choose([within, other], PROMPT, DEFAULTS, rng)[0].worker_id == "holder"
    crowded = KvCandidate("holder", overlap_blocks=96, requests=18, **ROOMY)
    assert kv_choose([crowded, other], PROMPT, DEFAULTS, rng)[0].worker_id == "other"
