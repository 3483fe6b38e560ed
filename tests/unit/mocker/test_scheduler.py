"""The mocker's scheduler step, pure: which waiting requests join the batch (in order, within the
prefill budget and the KV cache, an adapter without a batch slot passed over), the token a sequence
generates next (a decode leg's transferred token first, a script, a stop), and what a step advances."""

from __future__ import annotations

from collections import deque

from dynamo_worker.mocker.kv_manager import BlockManager
from dynamo_worker.mocker.scheduler import Join, Refuse, Seq, admit, batch_step, next_token
from dynamo_worker.mocker.tokens import TokenSampler
from dynamo_worker.protocol import GenerateRequest, StopConditions

PAGE = 4


def seq(key: str, prompt: int, **fields: object) -> Seq:
    tokens = list(range(1000 * ord(key[0]), 1000 * ord(key[0]) + prompt))  # no prefix shared
    req = GenerateRequest(request_id=key, model="m", token_ids=tokens, stop=StopConditions(max_tokens=8))
    return Seq(key=key, request=req, tokens=tokens, max_new=8, digest=1, **fields)  # type: ignore[arg-type]


def run(
    waiting: deque[Seq], running: list[Seq], kvs: list[BlockManager], **limits: int
) -> list[Join | Refuse]:
    decisions = []
    for d in admit(waiting, running, kvs, None, **{"prefill_budget": 64, "max_running": 8, **limits}):
        decisions.append(d)
        if isinstance(d, Join):
            running.append(d.seq)  # as the engine does before the next decision
    return decisions


def test_requests_join_in_order_within_the_prefill_budget_and_the_batch():
    kvs = [BlockManager(total_blocks=100, page_size=PAGE)]
    a, b, c = seq("a", 40), seq("b", 20), seq("c", 30)
    waiting, running = deque([a, b, c]), []
    decisions = run(waiting, running, kvs)
    assert [(d.seq.key, d.prefill) for d in decisions if isinstance(d, Join)] == [
        ("a", (40, 0)),
        ("b", (20, 0)),
    ]
    assert list(waiting) == [c] and a.cached_tokens == 0
    assert run(waiting, running, kvs, max_running=2) == [] and list(waiting) == [c]


def test_the_first_request_always_goes_and_a_cache_that_can_never_hold_one_refuses_it():
    kvs = [BlockManager(total_blocks=4, page_size=PAGE)]
    big, small = seq("big", 100), seq("small", 8)
    decisions = run(deque([big, small]), [], kvs, prefill_budget=1)
    assert isinstance(decisions[0], Refuse) and decisions[0].seq is big
    assert isinstance(decisions[1], Join) and decisions[1].seq is small and decisions[1].prefill == (8, 0)


def test_a_decode_leg_whose_kv_arrived_joins_without_a_prefill():
    kvs = [BlockManager(total_blocks=100, page_size=PAGE)]
    leg = seq("d", 16, kv_ready=True, preset_first=7)
    assert kvs[0].allocate("d", leg.tokens) is not None  # reserved when its transfer began
    (decision,) = run(deque([leg]), [], kvs)
    assert isinstance(decision, Join) and decision.prefill is None
    assert next_token(leg, 1, TokenSampler.from_vocab_size(1000), 0.0) == 7


def test_a_script_runs_out_into_a_stop_and_a_stop_token_ends_a_sequence():
    sampler = TokenSampler.from_vocab_size(1000)
    scripted = seq("s", 4, script=[11, 12])
    assert next_token(scripted, 1, sampler, 0.0) == 11
    scripted.generated += [11, 12]
    assert next_token(scripted, 1, sampler, 0.0) is None
    token = next_token(seq("t", 4), 5, sampler, 0.0)
    assert token is not None
    stopped = seq("u", 4)
    stopped.request.stop.stop_token_ids.append(token)
    assert next_token(stopped, 5, sampler, 0.0) is None


def test_a_prefill_step_runs_alone_unless_mixed_chunk():
    running, new = [seq("a", 4), seq("b", 4)], [seq("c", 4)]
    assert batch_step(running, new, 0.5, mixed_chunk=False, decode_s=0.1) == (new, 0.5)
    assert batch_step(running, new, 0.5, mixed_chunk=True, decode_s=0.1) == (running, 0.6)
    assert batch_step(running, [], 0.0, mixed_chunk=False, decode_s=0.1) == (running, 0.1)
