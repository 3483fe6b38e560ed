"""Noticing at once that one of an engine's processes exited: a pidfd per process on the event loop.

``ProcessWatch.watch(processes, on_exit)`` opens a pidfd for each process (``os.pidfd_open``, Linux
5.3+) and registers it with the loop as a reader: the kernel makes it readable when the process exits,
so ``on_exit`` runs in the next loop turn, with no polling and no confusion with a later process that
reuses the pid. An exit is described (``signal SIGKILL``, ``exit code 1``) when the process is a child of
this one, without reaping it (``waitid`` with ``WNOWAIT``: whoever started it, e.g. SGLang's
``multiprocessing``, still reaps it); a grandchild's exit is just "exited". Where pidfds are not available
the processes are polled every ``POLL_S`` instead (said once in the log). ``on_exit`` is called once,
for the first process that exits; the watch then ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from dynamo_worker.runtime.engine import EngineProcess

__all__ = ["POLL_S", "ProcessWatch", "describe_status"]

log = logging.getLogger(__name__)

POLL_S = 0.2  # the fallback's polling interval: an exit is still noticed well within a second


def describe_status(si_code: int, si_status: int) -> str:
    """How a process ended, from ``waitid``'s ``si_code`` and ``si_status``. Pure."""
    if si_code == os.CLD_EXITED:
        return f"exit code {si_status}"
    try:
        return f"signal {signal.Signals(si_status).name}"
    except ValueError:
        return f"signal {si_status}"


def _how_it_ended(pidfd: int) -> str:
    try:
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError, AttributeError):  # not our child, or already reaped
        return "exited"
    return "exited" if info is None else describe_status(info.si_code, info.si_status)


def _gone(pid: int) -> bool:
    """The fallback's test: no such process, or a zombie (exited, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


class ProcessWatch:
    """Calls ``on_exit(process, how)`` once, in the loop, when the first of ``processes`` exits."""

    def __init__(self) -> None:
        self._fds: dict[int, EngineProcess] = {}
        self._poller: asyncio.Task[None] | None = None
        self._on_exit: Callable[[EngineProcess, str], None] | None = None
        self._said_polling = False

    @property
    def watching(self) -> bool:
        return bool(self._fds) or self._poller is not None

    def watch(
        self, processes: Sequence[EngineProcess], on_exit: Callable[[EngineProcess, str], None]
    ) -> None:
        self.close()
        self._on_exit = on_exit
        loop = asyncio.get_running_loop()
        polled: list[EngineProcess] = []
        for process in processes:
            try:
                fd = os.pidfd_open(process.pid)
            except ProcessLookupError:  # gone before we looked: dead already
                loop.call_soon(self._fire, process, "exited before it was watched")
                continue
            except (OSError, AttributeError):  # no pidfd on this kernel or platform
                polled.append(process)
                continue
            self._fds[fd] = process
            loop.add_reader(fd, self._readable, fd)
        if polled:
            if not self._said_polling:
                self._said_polling = True
                log.warning("No pidfd here; polling the engine's processes every %ss instead", POLL_S)
            self._poller = loop.create_task(self._poll(polled), name="engine-process-poll")

    def _readable(self, fd: int) -> None:
        process = self._fds.get(fd)
        if process is not None:
            self._fire(process, _how_it_ended(fd))

    async def _poll(self, processes: list[EngineProcess]) -> None:
        while True:
            for process in processes:
                if _gone(process.pid):
                    self._fire(process, "exited")
                    return
            await asyncio.sleep(POLL_S)

    def _fire(self, process: EngineProcess, how: str) -> None:
        on_exit, self._on_exit = self._on_exit, None
        self.close()
        if on_exit is not None:
            on_exit(process, how)

    def close(self) -> None:
        """Stop watching (safe to call at any time, again, and from ``on_exit``)."""
        loop = asyncio.get_running_loop()
        for fd in list(self._fds):
            loop.remove_reader(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        if self._poller is not None and self._poller is not asyncio.current_task():
            self._poller.cancel()
        self._poller = None
