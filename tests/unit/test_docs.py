"""The documentation machinery: the link check finds a missing file and a missing anchor (GitHub's
heading slugs) and passes the project's own Markdown; the fault table that ``make faults`` writes into
docs/faults.md replaces the rows of the faults that ran and keeps the others, in place."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.support.faults_table import MD_END, MD_START, Row, with_table

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_links", ROOT / "hack" / "check-links.py")
assert _spec is not None and _spec.loader is not None
check_links = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_links)


def test_the_projects_markdown_links_resolve(capsys):
    assert check_links.main([]) == 0, capsys.readouterr().out


def test_a_missing_file_and_a_missing_anchor_are_named(tmp_path, monkeypatch):
    (tmp_path / "other.md").write_text("# Title\n## Two API versions, one `conversion` webhook\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](other.md#two-api-versions-one-conversion-webhook) [gone](nothere.md)\n"
        "[bad anchor](other.md#no-such-heading) [web](https://example.com/x) `[code](nope.md)`\n"
        "```\n[in a fence](nope.md)\n```\n"
    )
    monkeypatch.setattr(check_links, "ROOT", tmp_path)
    problems = check_links.problems(doc)
    assert len(problems) == 2, problems
    assert "nothere.md: no such file" in problems[0]
    assert "#no-such-heading" in problems[1]


def test_the_fault_table_is_updated_in_place():
    doc = (
        "intro\n"
        f"{MD_START} ... -->\n"
        "| fault | what was done | bound | observed | lost |\n|---|---|---|---|---|\n"
        "| old row | kept | 1.00 s | 0.10 s | 0 |\n"
        "| overload | before | 2.00 s | 0.05 s | 0 |\n"
        f"{MD_END}\n"
        "after\n"
    )
    new = with_table(
        doc,
        [
            Row("overload", "80 streams | 8 slots", 2.0, 0.5, 0, True),
            Row("leak", "grep", 0, 0, 0, True, "leaks"),
        ],
    )
    lines = new.splitlines()
    assert lines[0] == "intro" and lines[-1] == "after"
    assert "| old row | kept | 1.00 s | 0.10 s | 0 |" in lines
    assert "| overload | 80 streams / 8 slots | 2.00 s | 0.50 s | 0 |" in lines
    assert "| leak | grep | 0 leaks | 0 leaks | 0 |" in lines
    assert with_table(new, []) == new
