"""Migration's continuation request: the prompt grows by the tokens already streamed, the token
budget shrinks by as many, and the request gets its own id, so the next worker continues the stream
with no repeat and no gap."""

from dynamo_worker.frontend.serving.migration import continuation
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
    assert FrontendSettings.parse([]).migration_limit == 1
    assert FrontendSettings.parse(["--migration-limit", "0"]).migration_limit == 0


def test_engine_died_is_a_lost_worker_the_request_may_migrate_from():
    from dynamo_worker.frontend.errors import WorkerLost
    from dynamo_worker.frontend.serving.dispatch import _from_worker_error
    from dynamo_worker.frontend.serving.migration import _migratable
    from dynamo_worker.protocol import WorkerError

    error = _from_worker_error(
        WorkerError(type="engine_died", message="scheduler ended"), "10.0.0.1:9100", "decode", "abc"
    )
    assert isinstance(error, WorkerLost) and error.code == "engine_died"
    assert (error.role, error.instance_id) == ("decode", "abc") and _migratable(error)


async def test_a_quarantined_worker_that_registers_again_is_released():
    from dynamo_worker.frontend.serving.quarantine import Quarantine
    from dynamo_worker.protocol import InstanceRecord
    from dynamo_worker.runtime.discovery import InstanceAdded

    quarantine = Quarantine(probe_interval_s=3600)
    quarantine.add("0123456789abcdef", "127.0.0.1:1", "decode", "engine died")
    record = InstanceRecord(
        instance_id="0123456789abcdef",
        namespace="n",
        component="decode",
        role="decode",
        model="m",
        address="127.0.0.1:1",
        page_size=16,
        total_kv_blocks=8,
    )

    async def events():
        yield InstanceAdded(record)

    passed = [e async for e in quarantine.releasing(events())]
    assert passed == [InstanceAdded(record)] and "0123456789abcdef" not in quarantine
    await quarantine.close()
