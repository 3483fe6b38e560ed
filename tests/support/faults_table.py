"""The fault table of ``tests/faults`` (a pytest plugin, registered by ``tests/conftest.py``): each fault
test's rows (``fault_row`` in ``tests/faults/conftest.py``) ride on its teardown report, so the table is
printed whole also when pytest-xdist runs the tests in several worker processes, written as JSON to
``$FAULTS_TABLE`` when that is set (``make faults``: ``.faults/table.json``), and written into the table of
the Markdown file ``$FAULTS_MARKDOWN`` names (``make faults``: ``docs/faults.md``, between its two marker
comments): a row of a fault that ran replaces the row of that name, rows of faults that did not run stay."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

__all__ = ["FAULT_ROWS", "Row", "fault_row"]

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


@pytest.fixture
def fault_row(request: pytest.FixtureRequest) -> Iterator:
    """``fault_row(fault, done, bound_s)``: a ``Row`` of this test, reported with its teardown."""
    rows: list[Row] = []
    request.node.fault_rows = rows

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
    markdown = os.environ.get("FAULTS_MARKDOWN")
    if markdown:
        path = Path(markdown)
        path.write_text(with_table(path.read_text(), _ROWS))


MD_START = "<!-- make faults writes the table below"
MD_END = "<!-- end of the fault table -->"
MD_HEADER = "| fault | what was done | bound | observed | lost |\n|---|---|---|---|---|\n"


def _md_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} s" if unit == "s" else f"{value:g} {unit}"


def with_table(text: str, rows: list[Row]) -> str:
    """``text`` with the rows of its fault table (between the marker comments) updated from ``rows``."""
    start = text.index("\n", text.index(MD_START)) + 1
    end = text.index(MD_END)
    kept: dict[str, str] = {}
    for line in text[start:end].splitlines()[2:]:
        kept[line.split(" | ")[0].removeprefix("| ")] = line
    for r in rows:
        observed = _md_value(r.observed_s, r.unit) + ("" if r.passed else " (FAILED)")
        cells = (r.fault, r.done, _md_value(r.bound_s, r.unit), observed, str(r.lost))
        kept[r.fault] = "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"
    return text[:start] + MD_HEADER + "".join(line + "\n" for line in kept.values()) + text[end:]
