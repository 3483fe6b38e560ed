"""The one way a child process dies with its parent: a command prefix, util-linux ``setpriv
--pdeathsig SIG --``, so the kernel signals the child when the process that started it dies.

It is set by ``setpriv`` itself before it execs the command: no Python runs between fork and exec
(``preexec_fn`` is unsafe in a process with threads, and asyncio has them). The signal follows the
thread that spawned the child: spawn from the thread that lives as long as the child should.
"""

from __future__ import annotations

import functools
import logging
import shutil
import signal
import sys

__all__ = ["die_with_parent"]

log = logging.getLogger(__name__)


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> tuple[str, ...]:
    """``("/usr/bin/setpriv", "--pdeathsig", "TERM", "--")`` to put before a command's argv; ``()``
    where there is no ``setpriv`` (said once, as a warning on Linux: children may then outlive us)."""
    setpriv = _setpriv()
    return (setpriv, "--pdeathsig", sig.name.removeprefix("SIG"), "--") if setpriv else ()


@functools.cache
def _setpriv() -> str | None:
    if not sys.platform.startswith("linux"):
        return None
    found = shutil.which("setpriv")
    if found is None:
        log.warning(
            "No setpriv on PATH (util-linux): child processes will not die with this one; install "
            "util-linux so that a killed parent leaves no orphans"
        )
    return found
