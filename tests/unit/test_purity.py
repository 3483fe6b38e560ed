"""The unit tier's guard (tests/support/purity.py): every way a test could open a socket or start a
process fails with the rule and where such a test belongs, even under ``except Exception``; an asyncio
event loop still works; ``fetching_test_data`` lifts the guard and puts it back."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import subprocess
import sys

import pytest

from tests.support.purity import ImpureUnitTest, fetching_test_data


def refused(action) -> str:
    with pytest.raises(ImpureUnitTest) as e:
        try:
            action()
        except Exception:  # code under test that swallows errors does not hide the rule
            pytest.fail("the guard's failure was caught by `except Exception`")
    message = str(e.value)
    assert "tests/unit is pure" in message and "tests/integration/<area>/" in message
    return message


def test_sockets_are_refused():
    assert "created a socket" in refused(lambda: socket.socket())
    refused(lambda: socket.create_connection(("127.0.0.1", 9), timeout=1))
    refused(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))


def test_processes_are_refused():
    assert "started a process" in refused(lambda: subprocess.run([sys.executable, "-c", "pass"]))
    refused(lambda: os.system("true"))
    refused(lambda: os.fork())
    refused(lambda: os.spawnl(os.P_WAIT, sys.executable, sys.executable, "-c", "pass"))
    for method in multiprocessing.get_all_start_methods():
        process = multiprocessing.get_context(method).Process(target=print)
        refused(process.start)


async def test_an_event_loop_runs_but_its_connections_and_subprocesses_are_refused():
    await asyncio.sleep(0)  # the loop's own socketpair is allowed
    with pytest.raises(ImpureUnitTest):
        await asyncio.open_connection("127.0.0.1", 9)
    with pytest.raises(ImpureUnitTest):
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    with pytest.raises(ImpureUnitTest):
        await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)


def test_fetching_test_data_lifts_the_guard_and_puts_it_back():
    with fetching_test_data():
        assert subprocess.run([sys.executable, "-c", "pass"], check=True).returncode == 0
    refused(lambda: subprocess.run([sys.executable, "-c", "pass"]))
