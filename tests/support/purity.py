"""The unit tier's rule: a unit test opens no socket and starts no process.

``guard(monkeypatch)`` turns socket creation and process spawning into a failure that names the rule and
where such a test belongs; tests/unit/conftest.py applies it to every unit test. The one socket allowed
is the AF_UNIX ``socketpair`` an asyncio event loop opens to wake itself up. What it sees is Python's
``socket`` and process APIs: a C library that opens its own sockets (libzmq) goes unseen.
``fetching_test_data()`` lifts the guard for a fixture that fills a cache once (a download, like the
SGLang sources); it changes nothing where no guard is on.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import multiprocessing.util
import os
import socket
import subprocess
from collections.abc import Iterator

import pytest

RULE = (
    "tests/unit is pure: a unit test opens no socket and starts no process, but this one {what}. "
    "Move the test to tests/integration/<area>/ (with `pytestmark = pytest.mark.integration`), "
    "or test the pure function behind it instead."
)

_OS_SPAWNS = [
    name for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system") if hasattr(os, name)
]
# (owner, attribute) of everything guard() replaces; os.spawn* go through os.fork.
_GUARDED = [
    (socket.socket, "__init__"),
    (subprocess.Popen, "_execute_child"),  # subprocess and asyncio's subprocesses
    (_posixsubprocess, "fork_exec"),  # multiprocessing's spawn and forkserver
    (multiprocessing.util, "spawnv_passfds"),
    *((os, name) for name in _OS_SPAWNS),
]
_ORIGINAL = {(owner, name): getattr(owner, name) for owner, name in _GUARDED}


class ImpureUnitTest(pytest.fail.Exception):
    """A unit test reached for a socket or a process. Derived from pytest's own failure, a
    ``BaseException``, so that no ``except Exception`` in the code under test can swallow it."""


def _refuse_spawn(*args, **kwargs):
    raise ImpureUnitTest(RULE.format(what="started a process"), pytrace=True)


_socket_init = socket.socket.__init__


def _guarded_socket_init(self, family=-1, type=-1, proto=-1, fileno=None):
    # socket.socketpair() wraps the two fds it got from the OS in socket(AF_UNIX, ..., fileno);
    # asyncio's event loop does exactly this for its self-pipe.
    if family == socket.AF_UNIX and fileno is not None:
        return _socket_init(self, family, type, proto, fileno)
    raise ImpureUnitTest(RULE.format(what=f"created a socket (family {family!r})"), pytrace=True)


def guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse sockets and processes until ``monkeypatch`` is undone."""
    for owner, name in _GUARDED:
        monkeypatch.setattr(owner, name, _guarded_socket_init if owner is socket.socket else _refuse_spawn)


@contextlib.contextmanager
def fetching_test_data() -> Iterator[None]:
    """Lift the guard while a fixture fills a cache of test data (a download, a build), then put back
    whatever was there: the data is the tests' input, not the behaviour under test."""
    current = {(owner, name): getattr(owner, name) for owner, name in _GUARDED}
    for (owner, name), original in _ORIGINAL.items():
        setattr(owner, name, original)
    try:
        yield
    finally:
        for (owner, name), value in current.items():
            setattr(owner, name, value)
