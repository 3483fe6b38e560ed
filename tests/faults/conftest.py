"""The fault suite (``make faults``): each test breaks one thing on purpose, asserts a clear answer
within the bound it promises users, and records one row of the table printed at the end:

    fault | what was done | bound | observed (time to a clear answer) | requests lost

``fault_row(name, done, bound_s)`` returns a ``Row``; the test times the clear answer with
``row.answered(seconds)`` (or ``with row.timing(): ...``), counts ``row.lost``, and asserts
``row.within_bound()``. The table is printed (and written as JSON to ``$FAULTS_TABLE``) by
``tests/support/faults_table.py``, whole under pytest-xdist too. Real parts throughout: nats-server, mocker
worker processes, the frontend, the operator and the local kube-apiserver, with the fixtures of the
integration tier (imported below).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict

import pytest

from tests.integration.frontend.conftest import (  # noqa: F401 - fixtures, registered by import
    frontend_factory,
    mockers,
    namespace,
    tiny_model,
    wait_warm,
    wait_workers,
)
from tests.integration.operator.conftest import (  # noqa: F401 - fixtures, registered by import
    dgd_crd,
    kc,
    operator,
    operator_factory,
)
from tests.support.faults_table import FAULT_ROWS, Row


@pytest.fixture
def fault_row(request: pytest.FixtureRequest) -> Iterator:
    rows: list[Row] = []
    request.node.fault_rows = rows  # reported with the test's teardown (faults_table.py)

    def make(fault: str, done: str, bound_s: float) -> Row:
        row = Row(fault, done, bound_s)
        rows.append(row)
        return row

    yield make
    failed = getattr(request.node, "rep_call", None)
    for row in rows:
        row.passed = bool(failed is not None and failed.passed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    elif report.when == "teardown" and getattr(item, "fault_rows", None):
        report.user_properties.append((FAULT_ROWS, [asdict(r) for r in item.fault_rows]))  # type: ignore[attr-defined]
