"""runtime.children.die_with_parent: the ``setpriv --pdeathsig`` prefix with the signal asked for, and,
where there is no setpriv, no prefix and one warning that children may outlive the process (the
process side is tested in tests/integration/runtime/test_children.py)."""

from __future__ import annotations

import logging
import signal

import pytest
from dynamo_worker.runtime import children


@pytest.fixture(autouse=True)
def _fresh_lookup():
    children._setpriv.cache_clear()
    yield
    children._setpriv.cache_clear()


def test_the_prefix_names_the_signal(monkeypatch, tmp_path):
    setpriv = tmp_path / "setpriv"
    setpriv.write_text("#!/bin/sh\n")
    setpriv.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert children.die_with_parent() == (str(setpriv), "--pdeathsig", "TERM", "--")
    assert children.die_with_parent(signal.SIGKILL) == (str(setpriv), "--pdeathsig", "KILL", "--")


def test_without_setpriv_there_is_no_prefix_and_one_warning(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))
    with caplog.at_level(logging.WARNING):
        assert children.die_with_parent() == ()
        assert children.die_with_parent(signal.SIGKILL) == ()
    assert [r.getMessage() for r in caplog.records].count(
        "No setpriv on PATH (util-linux): child processes will not die with this one; install "
        "util-linux so that a killed parent leaves no orphans"
    ) == 1
