"""dynamo-run's command line lists its engines in --help (the exits of the real command are tested in
tests/integration/local/test_main.py)."""

from __future__ import annotations

import pytest


def test_help_lists_the_engine_choices(capsys):
    from dynamo_worker.local.settings import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "--engine {auto,mocker,sglang}" in capsys.readouterr().out
