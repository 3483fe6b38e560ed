"""Workload generation of the load generator: length distributions, prompts, the seeded Poisson arrival
schedule, and the shared-prefix multi-turn conversation construction."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest
from dynamo_worker.bench.workload import (
    WORDS,
    LengthDist,
    conversation_messages,
    conversation_trace,
    iter_poisson_arrivals,
    poisson_arrivals,
    prefix_pool_requests,
    random_prompt,
    random_requests,
    shared_prefix_turns,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fixed:128", LengthDist("fixed", 128)),
        ("uniform:64,256", LengthDist("uniform", 64, 256)),
        ("normal:128,32", LengthDist("normal", 128, 32)),
        ("normal:128, 32, 16, 512", LengthDist("normal", 128, 32, 16, 512)),
    ],
)
def test_length_dist_parses_each_kind(text, expected):
    assert LengthDist.parse(text) == expected


@pytest.mark.parametrize(
    "text", ["", "fixed:0", "uniform:9,3", "normal:10", "poisson:3", "fixed:a", "normal:5,1,9,2"]
)
def test_length_dist_rejects_bad_specs_naming_the_syntax(text):
    with pytest.raises(ValueError, match="length distribution"):
        LengthDist.parse(text)


def test_length_dist_samples_stay_within_their_bounds():
    rng = random.Random(1)
    assert {LengthDist.parse("fixed:7").sample(rng) for _ in range(20)} == {7}
    uniform = [LengthDist.parse("uniform:3,9").sample(rng) for _ in range(500)]
    assert min(uniform) == 3 and max(uniform) == 9
    normal = [LengthDist.parse("normal:100,80,20,150").sample(rng) for _ in range(2000)]
    assert min(normal) == 20 and max(normal) == 150
    assert 80 < statistics.mean(normal) < 110


def test_length_dist_round_trips_through_its_text():
    for text in ("fixed:5", "uniform:1,4", "normal:10,2,1,30"):
        assert LengthDist.parse(str(LengthDist.parse(text))) == LengthDist.parse(text)


def test_random_prompt_has_the_asked_number_of_common_words():
    prompt = random_prompt(random.Random(0), 50)
    assert len(prompt.split()) == 50
    assert set(prompt.split()) <= set(WORDS)


def test_random_requests_are_reproducible_from_the_seed():
    dist_in, dist_out = LengthDist.parse("uniform:5,50"), LengthDist.parse("uniform:1,9")
    a = [s for _, s in zip(range(10), random_requests(random.Random(3), dist_in, dist_out), strict=False)]
    b = [s for _, s in zip(range(10), random_requests(random.Random(3), dist_in, dist_out), strict=False)]
    assert a == b
    assert [s.index for s in a] == list(range(10))
    assert all(len(s.messages[0]["content"].split()) == s.input_words for s in a)
    assert all(1 <= s.max_tokens <= 9 for s in a)


def test_poisson_arrivals_are_seeded_increasing_and_at_the_rate():
    a = poisson_arrivals(50.0, 5000, random.Random(7))
    assert a == poisson_arrivals(50.0, 5000, random.Random(7))
    assert a[:10] == list(itertools.islice(iter_poisson_arrivals(50.0, random.Random(7)), 10))
    assert a != poisson_arrivals(50.0, 5000, random.Random(8))
    assert all(x < y for x, y in itertools.pairwise(a)) and a[0] > 0
    assert 5000 / a[-1] == pytest.approx(50.0, rel=0.05)
    gaps = [y - x for x, y in zip([0.0, *a], a, strict=False)]
    # Exponential gaps: the standard deviation equals the mean.
    assert statistics.stdev(gaps) == pytest.approx(statistics.mean(gaps), rel=0.1)


def test_poisson_arrivals_reject_a_non_positive_rate():
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(0, 3, random.Random(0))


def test_shared_prefix_plan_gives_each_group_of_users_one_system_prompt_and_orders_turns():
    plan = shared_prefix_turns(
        random.Random(0),
        num_prefixes=3,
        users_per_prefix=4,
        turns=2,
        prefix_words=40,
        input_len=LengthDist.parse("fixed:6"),
        output_len=LengthDist.parse("fixed:5"),
    )
    assert len(plan.system_prompts) == 3 and len(set(plan.system_prompts)) == 3
    assert all(len(p.split()) == 40 for p in plan.system_prompts)
    assert len(plan.turns) == 3 * 4 * 2
    assert [t.index for t in plan.turns] == list(range(24))
    # Every user speaks once per round, rounds in order.
    assert [t.turn for t in plan.turns] == [0] * 12 + [1] * 12
    assert sorted(t.user for t in plan.turns[:12]) == list(range(12))
    assert all(t.prefix == t.user // 4 for t in plan.turns)
    assert all(t.max_tokens == 5 and len(t.message.split()) == 6 for t in plan.turns)


def test_conversation_grows_by_the_previous_turn_and_its_answer():
    first = conversation_messages("sys", [], "hello")
    assert first == ({"role": "system", "content": "sys"}, {"role": "user", "content": "hello"})
    second = conversation_messages("sys", [("hello", "hi there")], "more")
    assert second[: len(first)] == first
    assert second[len(first) :] == (
        {"role": "assistant", "content": "hi there"},
        {"role": "user", "content": "more"},
    )


def test_prefix_pool_requests_share_prefixes_and_end_with_their_own_ids():
    specs = prefix_pool_requests(
        random.Random(1), num_prefixes=3, prefix_tokens=10, suffix_tokens=2, num_requests=30, max_tokens=4
    )
    assert len(specs) == 30 and all(len(s.prompt_ids) == 12 and s.max_tokens == 4 for s in specs)
    assert len({s.prompt_ids[:10] for s in specs}) == 3
    assert len({s.prompt_ids for s in specs}) == 30
    again = prefix_pool_requests(
        random.Random(1), num_prefixes=3, prefix_tokens=10, suffix_tokens=2, num_requests=30, max_tokens=4
    )
    assert again == specs


def test_conversation_trace_turns_extend_the_previous_turn_of_their_conversation():
    specs = conversation_trace(
        random.Random(2),
        conversations=4,
        turns=3,
        system_prompts=2,
        system_tokens=8,
        user_tokens=3,
        answer_tokens=2,
        max_tokens=5,
    )
    assert len(specs) == 12
    assert [s.turn for s in specs] == [0] * 4 + [1] * 4 + [2] * 4  # every conversation speaks, then again
    by_conversation: dict[int, list] = {}
    for s in specs:
        by_conversation.setdefault(s.user, []).append(s.prompt_ids)
    for turns in by_conversation.values():
        assert [len(t) for t in turns] == [11, 16, 21]
        assert all(later[: len(earlier)] == earlier for earlier, later in itertools.pairwise(turns))
    systems = {turns[0][:8] for turns in by_conversation.values()}
    assert len(systems) == 2
