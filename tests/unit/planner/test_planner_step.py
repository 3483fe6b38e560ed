"""One planner decision over a real graph manifest: which services it scales, GPUs per replica from the
graph, the budget and the explanation."""

from __future__ import annotations

import pytest
import yaml
from dynamo_worker.planner.decide import Load
from dynamo_worker.planner.observe import Observation, Totals, interval, parse_frontend_metrics
from dynamo_worker.planner.settings import PlannerSettings
from dynamo_worker.planner.step import GraphError, decide, scaled_services
from dynamo_worker.profile.model import builtin_profile

from tests.integration.operator.conftest import EXAMPLES

GRAPH = yaml.safe_load((EXAMPLES / "disagg-planner.yaml").read_text())
GRAPH["metadata"]["namespace"] = "ns"


def test_services_of_the_example_graph():
    services, urls = scaled_services(GRAPH, ("prefill", "decode"))
    assert {r: (s.name, s.gpus) for r, s in services.items()} == {
        "prefill": ("prefill", 1),
        "decode": ("decode", 1),
    }
    assert urls == ["http://sglang-disagg-planner-frontend.ns.svc:8000/metrics"]
    broken = {
        **GRAPH,
        "spec": {"services": {k: v for k, v in GRAPH["spec"]["services"].items() if k != "decode"}},
    }
    with pytest.raises(
        GraphError, match="found none; give the graph exactly one service with subComponentType: decode"
    ):
        scaled_services(broken, ("prefill", "decode"))


def test_a_decision_explains_itself_and_keeps_the_budget():
    services, _ = scaled_services(GRAPH, ("prefill", "decode"))
    settings = PlannerSettings(graph="g", namespace="ns", ttft_ms=300, itl_ms=12, max_gpu_budget=6)
    load = Load(40, 4096, 64)
    obs = Observation(load, ttft_s=0.9, itl_s=0.01, inflight=12, interval_s=10)
    d = decide(
        settings,
        services=services,
        forecast=load,
        observation=obs,
        profile=builtin_profile("sglang-8b-h100"),
        load_reports={},
        states={},
        now=100.0,
    )
    p, dec = d.roles["prefill"], d.roles["decode"]
    assert p.wanted > 5 and p.replicas + dec.replicas <= 6 and dec.replicas >= 1
    assert d.changes == {"prefill": p.replicas, "decode": dec.replicas} or d.changes
    text = d.message()
    assert "prefill prefill 1 ->" in text and "budget 6 GPUs" in text and "TTFT 300 ms" in text
    assert p.predicted_s is not None


def test_held_requests_scale_every_role_from_zero_at_once():
    """A graph at 0 replicas: a frontend holding requests (dynamo_frontend_queued_requests) is demand,
    before any interval was observed, and every role gets one replica at once; with no demand, zero
    stays zero."""
    at_zero = {**GRAPH, "spec": {"services": {k: dict(v) for k, v in GRAPH["spec"]["services"].items()}}}
    for role in ("prefill", "decode"):
        at_zero["spec"]["services"][role]["replicas"] = 0
    services, _ = scaled_services(at_zero, ("prefill", "decode"))
    settings = PlannerSettings(graph="g", namespace="ns", ttft_ms=300, itl_ms=12, min_replicas=0)
    common = dict(
        services=services,
        forecast=None,
        observation=None,
        profile=builtin_profile("sglang-8b-h100"),
        load_reports={},
        states={},
        now=5.0,
    )
    assert decide(settings, **common).changes == {}
    d = decide(settings, **common, demand=True)
    assert d.changes == {"prefill": 1, "decode": 1}
    assert "0 -> 1" in d.message()


def test_queued_requests_are_read_and_count_as_arrivals():
    text = (
        "# TYPE dynamo_frontend_queued_requests gauge\n"
        'dynamo_frontend_queued_requests{model="m"} 4.0\n'
        'dynamo_frontend_queued_requests{model="other"} 9.0\n'
    )
    totals = parse_frontend_metrics(text, "m")
    assert totals.queued == 4
    obs = interval({"u": Totals()}, {"u": totals}, 2.0)
    assert obs.load.request_rate == 2.0 and obs.inflight == 4  # 4 arrivals waiting, over 2 s
