"""The fault table of ``tests/faults`` (a pytest plugin, registered by ``tests/conftest.py``): each fault
test's rows (``fault_row`` in ``tests/faults/conftest.py``) ride on its teardown report, so the table is
printed whole also when pytest-xdist runs the tests in several worker processes, and written as JSON to
``$FAULTS_TABLE`` when that is set (``make faults``: ``.faults/table.json``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

__all__ = ["FAULT_ROWS", "Row"]

FAULT_ROWS = "fault_rows"  # the user property that carries a test's rows


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


_ROWS: list[Row] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    for name, rows in report.user_properties:
        if name == FAULT_ROWS:
            _ROWS.extend(Row(**row) for row in rows)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}s" if unit == "s" else f"{value:g} {unit}"


def pytest_terminal_summary(terminalreporter) -> None:
    if not _ROWS or hasattr(terminalreporter.config, "workerinput"):  # an xdist worker: the controller prints
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
