"""Every process a test run starts dies with it, even when pytest itself is SIGKILLed.

Two mechanisms, as ``dynamo-run`` uses for its children:

- ``die_with_parent()``: a command prefix (util-linux ``setpriv --pdeathsig KILL --``) that makes the
  kernel SIGKILL the child when the process that started it dies, set before ``exec`` with no Python
  code running in between. This is what cleans up after a SIGKILL of pytest, when no ``finally`` runs.
- ``start_new_session=True`` on ``Popen``: each child leads its own process group, so teardown stops
  the child and whatever it forked with one ``os.killpg``.

``popen`` does both. Used by ``tests/support/cluster.py`` (when a test session owns the cluster), the
nats-server fixture, and the mocker, operator and dynamo-run fixtures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

__all__ = ["die_with_parent", "popen"]


def die_with_parent() -> tuple[str, ...]:
    """``("setpriv", "--pdeathsig", "KILL", "--")`` on Linux with util-linux, else ``()``."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return (setpriv, "--pdeathsig", "KILL", "--") if setpriv else ()


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
