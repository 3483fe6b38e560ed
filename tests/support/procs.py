"""Every process a test run starts dies with it, even when pytest itself is SIGKILLed.

Two mechanisms, as ``dynamo-run`` uses for its children:

- ``die_with_parent()``: a command prefix (util-linux ``setpriv --pdeathsig KILL --``) that makes the
  kernel SIGKILL the child when the process that started it dies, set before ``exec`` with no Python
  code running in between. This is what cleans up after a SIGKILL of pytest, when no ``finally`` runs.
- ``start_new_session=True`` on ``Popen``: each child leads its own process group, so teardown stops
  the child and whatever it forked with one ``os.killpg``.

``popen`` does both. Used by ``tests/support/cluster.py`` (when a test session owns the cluster), the
nats-server fixture, and the mocker, operator and dynamo-run fixtures.

``listening_ports`` reads back the ports that a component started with port 0 bound, from the line it
logs once bound (``dynamo_worker.runtime.listening``): tests pick no port for our own components.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from dynamo_worker.runtime import children
from dynamo_worker.runtime.listening import bound_ports

from tests.support.wait import wait_until

__all__ = ["die_with_parent", "group_members", "listening_port", "listening_ports", "popen"]


def die_with_parent() -> tuple[str, ...]:
    """dynamo-run's prefix (``runtime.children``) with SIGKILL: a test's process need not drain."""
    return children.die_with_parent(signal.SIGKILL)


def popen(cmd: list[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` in a new process group, killed by the kernel when this process dies."""
    kwargs.setdefault("start_new_session", True)
    return subprocess.Popen([*die_with_parent(), *cmd], **kwargs)


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry))
    return members


def listening_ports(
    proc: subprocess.Popen, log_path: Path, *names: str, timeout_s: float = 60.0
) -> dict[str, int]:
    """The ports that listeners ``names`` of ``proc`` (started with port 0, its output in ``log_path``)
    bound, read from their listening lines within ``timeout_s``; fails with the log when ``proc`` exits
    first or the lines do not come."""

    def log() -> str:
        return log_path.read_text(errors="replace") if log_path.exists() else ""

    def found() -> dict[str, int] | None:
        exited = proc.poll()  # before reading: a line written just before exiting is still seen
        ports = bound_ports(log())
        if all(name in ports for name in names):
            return {name: ports[name] for name in names}
        if exited is not None:
            raise AssertionError(
                f"{proc.args!r} exited with {exited} before listening ({', '.join(names)}):\n{log()}"
            )
        return None

    what = f"{', '.join(names)} of pid {proc.pid} to listen (listening lines in {log_path})"
    return wait_until(found, what, timeout_s=timeout_s, interval_s=0.05, explain=log)


def listening_port(proc: subprocess.Popen, log_path: Path, name: str, timeout_s: float = 60.0) -> int:
    """``listening_ports`` of one listener."""
    return listening_ports(proc, log_path, name, timeout_s=timeout_s)[name]
