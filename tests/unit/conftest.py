"""The unit tier is pure: a unit test opens no socket and starts no process (tests/support/purity.py).

The guard is on while each unit test's fixtures are set up, while it runs, and while its fixtures are
torn down. A test that needs a server, a connection or a process belongs under
``tests/integration/<area>/`` with ``pytestmark = pytest.mark.integration``.
"""

from __future__ import annotations

import pytest

from tests.support.purity import guard


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with pytest.MonkeyPatch.context() as monkeypatch:
        guard(monkeypatch)
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with pytest.MonkeyPatch.context() as monkeypatch:
        guard(monkeypatch)
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    # The last test of a run also finalizes the session's fixtures, which may belong to other tiers
    # (a nats-server, the local control plane): those are left alone.
    if nextitem is None:
        yield
        return
    with pytest.MonkeyPatch.context() as monkeypatch:
        guard(monkeypatch)
        yield
