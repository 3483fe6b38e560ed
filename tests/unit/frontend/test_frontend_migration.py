"""Migration's continuation request: the prompt grows by the tokens already streamed, the token
budget shrinks by as many, and the request gets its own id, so the next worker continues the stream
with no repeat and no gap."""

from dynamo_worker.frontend.serving.migration import DEFAULT_MIGRATION_LIMIT, continuation
from dynamo_worker.frontend.settings import FrontendSettings
from dynamo_worker.protocol import GenerateRequest, SamplingOptions, StopConditions


def request() -> GenerateRequest:
    return GenerateRequest(
        request_id="r1",
        model="m",
        token_ids=[1, 2, 3],
        sampling=SamplingOptions(temperature=0.0, seed=7),
        stop=StopConditions(max_tokens=10, min_tokens=4, stop_token_ids=[99], ignore_eos=True),
        eos_token_ids=[2],
    )


def test_continuation_extends_the_prompt_and_shrinks_the_budget():
    r = continuation(request(), [5, 6, 7], migration=1)
    assert r.token_ids == [1, 2, 3, 5, 6, 7]
    assert (r.stop.max_tokens, r.stop.min_tokens) == (7, 1)
    assert r.stop.stop_token_ids == [99] and r.stop.ignore_eos
    assert r.sampling == request().sampling and r.eos_token_ids == [2]
    assert r.request_id == "r1-m1"


def test_min_tokens_never_goes_below_zero():
    r = continuation(request(), [5, 6, 7, 8, 9], migration=2)
    assert (r.stop.max_tokens, r.stop.min_tokens, r.request_id) == (5, 0, "r1-m2")


def test_migration_limit_flag_and_default():
    assert FrontendSettings.parse([]).migration_limit == DEFAULT_MIGRATION_LIMIT == 1
    assert FrontendSettings.parse(["--migration-limit", "0"]).migration_limit == 0
