"""The planner's pure decisions: SLA sizing from a profile, the GPU budget rule, dampening, load mode,
forecasts, the frontends' counters turned into an interval, and Dynamo's --config fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dynamo_worker.planner.decide import (
    BudgetError,
    DampenState,
    Load,
    apply_budget,
    check_budget,
    dampen,
    load_replicas,
    sla_replicas,
)
from dynamo_worker.planner.forecast import Forecaster
from dynamo_worker.planner.observe import Totals, interval, parse_frontend_metrics
from dynamo_worker.planner.settings import parse_args, read_dynamo_config
from dynamo_worker.profile.model import ProfileError, load_profile
from dynamo_worker.runtime.settings import SettingsError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "profiles"
H100 = load_profile(FIXTURES / "sglang-8b-derived.json")  # formula-made figures the tests can pin


def test_profile_interpolates_and_extrapolates_upwards():
    assert H100.ttft_s(2048) == pytest.approx(0.05673)
    assert H100.ttft_s(1536) == pytest.approx((0.03295 + 0.05673) / 2)
    assert H100.ttft_s(32768) > H100.ttft_s(16384)  # longer than the sweep: slower, never free
    assert H100.itl_s(1, 256) == pytest.approx(0.00791)
    assert H100.itl_s(512, 16384) > H100.itl_s(256, 8192)
    assert H100.max_batch_within(0.010, 2048) == 54  # 9.14 ms at 32, 10.38 ms at 64: linear in between
    assert H100.max_batch_within(0.005, 2048) == 0  # one sequence alone is slower than 5 ms


def test_a_bad_profile_names_the_field_and_the_fix(tmp_path):
    bad = json.loads(json.dumps(H100.model_dump()))
    bad["decode"]["itl_ms"] = bad["decode"]["itl_ms"][:-1]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match=r"p.json is not valid: decode.*one row per batch size"):
        load_profile(path)
    with pytest.raises(ProfileError, match="available: sglang-1b-h200, sglang-8b-h100"):
        load_profile("builtin:nope")


def test_sla_sizing_grows_prefill_with_long_prompts_and_decode_with_long_outputs():
    long_prompts = sla_replicas(Load(20, 4096, 64), H100, ttft_target_s=0.5, itl_target_s=0.012)
    short_prompts = sla_replicas(Load(20, 256, 1024), H100, ttft_target_s=0.5, itl_target_s=0.012)
    assert long_prompts.prefill.replicas > short_prompts.prefill.replicas
    assert short_prompts.decode.replicas > long_prompts.decode.replicas
    # the replicas chosen hold the target by the model's own prediction
    assert long_prompts.prefill.predicted_s <= 0.5
    assert short_prompts.decode.predicted_s <= 0.012
    # one replica fewer would not: the sizing is tight, not padded
    s = H100.ttft_s(4096)
    n = long_prompts.prefill.replicas - 1
    rho = 20 * s / n
    assert rho >= 1 or s + rho * s / (2 * (1 - rho)) > 0.5


def test_sla_sizing_says_when_a_target_cannot_be_met():
    plan = sla_replicas(Load(5, 16384, 10), H100, ttft_target_s=0.2, itl_target_s=0.005)
    assert not plan.prefill.reachable and "unreachable" in plan.prefill.why
    assert not plan.decode.reachable and "unreachable" in plan.decode.why
    assert plan.prefill.replicas >= 1 and plan.decode.replicas >= 1


def test_no_traffic_wants_no_replicas_and_the_minimum_keeps_one():
    plan = sla_replicas(Load(0, 0, 0), H100, 0.5, 0.05)
    assert (plan.prefill.replicas, plan.decode.replicas) == (0, 0)
    out, note = apply_budget({"prefill": 0, "decode": 0}, {"prefill": 1, "decode": 1}, {}, None)
    assert out == {"prefill": 1, "decode": 1} and note is None


def test_budget_scales_prefill_proportionally_and_gives_decode_the_rest():
    gpus = {"prefill": 2, "decode": 1}
    out, note = apply_budget({"prefill": 6, "decode": 8}, gpus, {"prefill": 1, "decode": 1}, 12)
    # wanted 20 GPUs; scale 0.6: prefill floor(3.6) = 3 (6 GPUs), decode gets the other 6
    assert out == {"prefill": 3, "decode": 6}
    assert sum(out[r] * gpus[r] for r in out) <= 12
    assert "budget 12 GPUs < 20 wanted" in note
    out, _ = apply_budget({"prefill": 10, "decode": 1}, gpus, {"prefill": 1, "decode": 2}, 8)
    assert out["decode"] == 2 and out["prefill"] * 2 + 2 <= 8  # minimums hold
    with pytest.raises(BudgetError, match="raise max_gpu_budget or lower min_endpoint"):
        check_budget(2, gpus, {"prefill": 1, "decode": 1})


def test_dampening_scales_up_at_once_and_down_only_after_holding():
    kw = dict(cooldown_s=10, down_stable_intervals=2, busy=True)
    n, st, _ = dampen(DampenState(), current=2, desired=5, now=0, **kw)
    assert n == 5
    n, st, why = dampen(st, current=5, desired=2, now=20, **kw)
    assert n == 5 and "1/2 intervals" in why
    n, st, _ = dampen(st, current=5, desired=3, now=30, **kw)
    assert n == 3  # the higher of the two lower figures (hysteresis)
    n, st, why = dampen(st, current=3, desired=1, now=31, **kw)
    n, st, why = dampen(st, current=3, desired=1, now=32, **kw)
    assert n == 3 and "cool-down" in why  # held, but the last change was 2 s ago
    n, _, _ = dampen(
        DampenState(), current=1, desired=0, now=0, cooldown_s=0, down_stable_intervals=1, busy=True
    )
    assert n == 1  # never to zero while requests need it
    n, _, _ = dampen(
        DampenState(), current=1, desired=0, now=0, cooldown_s=0, down_stable_intervals=1, busy=False
    )
    assert n == 0


def test_load_mode_steps_by_one():
    assert load_replicas(2, queue_per_worker=3.0, kv_usage=0.1)[0] == 3
    assert load_replicas(2, queue_per_worker=0.0, kv_usage=0.95)[0] == 3
    assert load_replicas(2, queue_per_worker=0.0, kv_usage=0.1)[0] == 1
    assert load_replicas(2, queue_per_worker=0.5, kv_usage=0.5)[0] == 2
    n, why = load_replicas(2, queue_per_worker=None, kv_usage=None)
    assert n == 2 and "no load reports" in why


def test_forecasters():
    c = Forecaster("constant")
    for rate in (2, 20):
        c.observe(Load(rate, 1000, 100))
    c.observe(Load(0, 0, 0))  # an idle interval does not read as length 0
    assert c.predict() == Load(0, 1000, 100)
    t = Forecaster("trend")
    for rate in (2, 4, 6, 8):
        t.observe(Load(rate, 100, 10))
    assert 9 < t.predict().request_rate <= 10  # follows the slope (constant would say 8)
    with pytest.raises(ValueError, match="use one of constant, trend"):
        Forecaster("arima")  # type: ignore[arg-type]


METRICS = """\
# TYPE dynamo_frontend_requests counter
dynamo_frontend_requests_total{{model="m",endpoint="chat",status="200"}} {req}
dynamo_frontend_requests_total{{model="other",endpoint="chat",status="200"}} 1000
# TYPE dynamo_frontend_input_tokens counter
dynamo_frontend_input_tokens_total{{model="m"}} {inp}
# TYPE dynamo_frontend_output_tokens counter
dynamo_frontend_output_tokens_total{{model="m"}} {out}
# TYPE dynamo_frontend_time_to_first_token_seconds histogram
dynamo_frontend_time_to_first_token_seconds_sum{{model="m"}} {tsum}
dynamo_frontend_time_to_first_token_seconds_count{{model="m"}} {req}
# TYPE dynamo_frontend_inflight_requests gauge
dynamo_frontend_inflight_requests{{model="m"}} 3
"""


def test_interval_from_two_scrapes_of_the_frontend_metrics():
    a = parse_frontend_metrics(METRICS.format(req=10, inp=10_000, out=1000, tsum=1.0), "m")
    b = parse_frontend_metrics(METRICS.format(req=30, inp=50_000, out=3000, tsum=5.0), "m")
    obs = interval({"u": a}, {"u": b}, 10.0)
    assert obs.load == Load(2.0, 2000.0, 100.0)
    assert obs.ttft_s == pytest.approx(0.2) and obs.itl_s is None and obs.inflight == 3
    # a restarted frontend (counters went down) is left out of that interval
    obs = interval({"u": b, "v": b}, {"u": a, "v": b}, 10.0)
    assert obs.load.request_rate == 0
    assert parse_frontend_metrics(METRICS.format(req=1, inp=1, out=1, tsum=1), None).requests == 1001
    # overloaded: nothing finished, but 12 requests arrived and are streaming long outputs
    before = Totals(requests=5, input_tokens=500, inflight=0, ttft_count=5, itl_count=100)
    after = Totals(requests=5, input_tokens=1700, inflight=12, ttft_count=17, itl_count=700)
    obs = interval({"u": before}, {"u": after}, 4.0)
    assert obs.load == Load(3.0, 100.0, 51.0)  # 12 arrivals / 4 s, 1200 prompt tokens, 612 tokens streamed
    assert obs.isl_known and obs.osl_known
    idle = interval({"u": after}, {"u": after}, 4.0)
    assert idle.load.request_rate == 0 and not idle.isl_known and not idle.osl_known
    assert interval({}, {"u": Totals()}, 5).load == Load(0, 0, 0)


def test_dynamo_config_fields_are_mapped_checked_or_named(tmp_path):
    cfg = {
        "environment": "kubernetes",
        "backend": "sglang",
        "optimization_target": "sla",
        "ttft": 200,
        "itl": 20,
        "adjustment_interval": 30,
        "max_gpu_budget": 8,
        "min_endpoint": 1,
        "load_predictor": "constant",
        "profile_results_dir": "/data/profiling",
        "no_correction": True,
    }
    path = tmp_path / "planner.json"
    path.write_text(json.dumps(cfg))
    settings, ignored = parse_args(
        ["--config", str(path), "--graph", "g", "--namespace", "ns", "--itl-ms", "25"], env={}
    )
    assert (settings.ttft_ms, settings.itl_ms, settings.adjustment_interval_s) == (200, 25, 30)  # flag wins
    assert (settings.max_gpu_budget, settings.mode) == (8, "sla")
    assert ignored == ["no_correction", "profile_results_dir"]
    assert read_dynamo_config('{"optimization_target": "throughput"}')[0] == {"mode": "load"}
    with pytest.raises(SettingsError, match="backend='vllm' is not supported here; use one of sglang"):
        read_dynamo_config('{"backend": "vllm"}')
    with pytest.raises(SettingsError, match="load_predictor='prophet' is not implemented here"):
        read_dynamo_config('{"load_predictor": "prophet"}')
    with pytest.raises(SettingsError, match="--graph / DYN_PARENT_DGD_K8S_NAME is required"):
        parse_args(["--namespace", "ns"], env={})


def test_load_reports_are_summarised_per_role_of_live_workers():
    from dynamo_worker.planner.loadfeed import summarise
    from dynamo_worker.protocol import LoadMetrics

    def m(i: str, waiting: int, active: int) -> LoadMetrics:
        return LoadMetrics(instance_id=i, active_blocks=active, total_blocks=100, waiting=waiting, running=1)

    roles = {"a" * 16: "prefill", "b" * 16: "prefill", "c" * 16: "decode", "d" * 16: "decode"}
    reports = {"a" * 16: m("a" * 16, 4, 10), "b" * 16: m("b" * 16, 0, 30), "e" * 16: m("e" * 16, 99, 99)}
    out = summarise(roles, reports)
    assert out["prefill"] == (2.0, pytest.approx(0.2))
    assert out["decode"] == (None, None)  # alive but silent: the planner leaves decode as it is
