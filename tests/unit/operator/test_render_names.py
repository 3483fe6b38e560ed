"""Child names: deterministic, within Kubernetes limits, valid DNS labels, and distinct for distinct
graphs/services even when truncated (property-based)."""

from __future__ import annotations

from dynamo_api.validation import is_dns_label
from dynamo_operator.render.names import (
    MAX_WORKLOAD_NAME,
    child_name,
    fit,
    group_name,
    label_value,
)
from hypothesis import given
from hypothesis import strategies as st

graphs = st.from_regex(r"[a-z]([-a-z0-9]{0,200}[a-z0-9])?", fullmatch=True)
services = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?", fullmatch=True)


@given(graphs, services)
def test_child_names_fit_and_are_dns_labels(graph, service):
    name = child_name(graph, service)
    assert len(name) <= MAX_WORKLOAD_NAME and is_dns_label(name)
    assert name == child_name(graph, service)
    assert len(label_value(graph)) <= 63


@given(graphs, services, st.integers(min_value=0, max_value=999))
def test_group_names_leave_room_for_suffixes(graph, service, index):
    name = group_name(graph, service, index, reserve=2)
    assert len(name + "-w") <= MAX_WORKLOAD_NAME and is_dns_label(name + "-w")
    assert name.endswith(f"-{index}")


@given(graphs, graphs)
def test_truncated_names_stay_distinct(a, b):
    if a != b:
        assert fit(a, 20) != fit(b, 20)


def test_fit_examples():
    assert fit("short", 10) == "short"
    long = "a" * 30 + "-" + "b" * 30
    assert fit(long, 40) == "a" * 30 + "-0d5805a5", "no '--' where the cut falls after a dash"
    assert fit(long, 45) == "a" * 30 + "-bbbbb-0d5805a5"
