"""The fault suite (``make faults``): each test breaks one thing on purpose, asserts a clear answer
within the bound it promises users, and records one row of the table printed at the end:

    fault | what was done | bound | observed (time to a clear answer) | requests lost

``fault_row(name, done, bound_s)`` returns a ``Row``; the test times the clear answer with
``row.answered(seconds)`` (or ``with row.timing(): ...``), counts ``row.lost``, and asserts
``row.within_bound()``. The table is also written as JSON to ``$FAULTS_TABLE`` (``make faults`` sets
``.faults/table.json``). Real parts throughout: nats-server, mocker worker processes, the frontend, the
operator and the local kube-apiserver, with the fixtures of the integration tier (imported below).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from tests.integration.frontend.conftest import (  # noqa: F401 - fixtures, registered by import
    frontend_factory,
    mockers,
    namespace,
    tiny_model,
    wait_workers,
)
from tests.integration.operator.conftest import (  # noqa: F401 - fixtures, registered by import
    dgd_crd,
    kc,
    operator,
    operator_factory,
)

_ROWS: list[Row] = []


@dataclass
class Row:
    fault: str
    done: str
    bound_s: float
    observed_s: float | None = None
    lost: int = 0
    passed: bool | None = None
    unit: str = "s"  # "s": bound and observed are seconds; otherwise a count of this unit (e.g. "leaks")

    def answered(self, seconds: float) -> float:
        self.observed_s = seconds if self.observed_s is None else max(self.observed_s, seconds)
        return seconds

    @contextmanager
    def timing(self) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.answered(time.monotonic() - started)

    def within_bound(self) -> bool:
        return self.observed_s is not None and self.observed_s <= self.bound_s


@pytest.fixture
def fault_row(request: pytest.FixtureRequest) -> Iterator:
    rows: list[Row] = []

    def make(fault: str, done: str, bound_s: float) -> Row:
        row = Row(fault, done, bound_s)
        rows.append(row)
        _ROWS.append(row)
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


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}s" if unit == "s" else f"{value:g} {unit}"


def pytest_terminal_summary(terminalreporter) -> None:
    if not _ROWS:
        return
    header = ("fault", "what was done", "bound", "observed", "lost", "ok")
    table = [
        (
            r.fault,
            r.done,
            _fmt(r.bound_s, r.unit),
            _fmt(r.observed_s, r.unit),
            str(r.lost),
            "yes" if r.passed else "NO",
        )
        for r in _ROWS
    ]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(header)]
    tr = terminalreporter
    tr.section("fault table: a clear answer within the bound, and requests lost")
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    tr.write_line(line)
    tr.write_line("-+-".join("-" * w for w in widths))
    for t in table:
        tr.write_line(" | ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)))
    out = os.environ.get("FAULTS_TABLE")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps([asdict(r) for r in _ROWS], indent=2) + "\n")
