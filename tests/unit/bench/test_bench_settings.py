"""``python -m dynamo_worker.bench --help``: the choices of every enumerated flag are shown."""

from __future__ import annotations

import pytest
from dynamo_worker.bench.settings import BenchSettings


def test_help_lists_the_choices_of_api_mode_and_workload(capsys):
    with pytest.raises(SystemExit):
        BenchSettings.parse(["--help"])
    out = capsys.readouterr().out
    for shown in ("--api {chat,completions}", "--mode {closed,open}", "--workload {random,shared-prefix}"):
        assert shown in out
