"""dynamo_worker.local.supervisor's pure part: reading the frontend's worker gauges from /metrics text
(the process handling is tested in tests/integration/local/test_supervisor.py)."""

from __future__ import annotations

from dynamo_worker.local.supervisor import workers_seen


def test_the_frontend_worker_gauges_are_summed_and_absent_means_unknown():
    text = (
        "# HELP dynamo_frontend_workers Workers in discovery by model and role.\n"
        'dynamo_frontend_workers{model="m",role="prefill"} 1.0\n'
        'dynamo_frontend_workers{model="m",role="decode"} 2.0\n'
        "dynamo_frontend_requests_total 3.0\n"
    )
    assert workers_seen(text) == 3
    assert workers_seen("dynamo_frontend_requests_total 3.0\n") is None


def test_a_declared_worker_gauge_without_samples_means_no_worker_seen_yet():
    """A frontend that has seen no worker yet declares the gauge and has no sample: 0, not unknown (the
    frontend must not count as ready then, whatever its /health says for a graph's listed models)."""
    text = (
        "# HELP dynamo_frontend_workers Workers in discovery by model and role.\n"
        "# TYPE dynamo_frontend_workers gauge\n"
        "dynamo_frontend_requests_total 3.0\n"
    )
    assert workers_seen(text) == 0
