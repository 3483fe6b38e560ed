"""The mocker's scheduler process: what SIGKILL hits when a test kills the simulated engine.

SGLang runs its scheduler (one per rank) and its detokenizer as child processes of the worker; when
one of them dies (an OOM kill, a CUDA error), the engine is dead. The mocker simulates in the worker
process itself, so it starts this child as the engine's stand-in: it does nothing but live until it is
killed or its parent ends (its stdin, a pipe from the parent, closes). The worker watches it like
SGLang's processes (``Engine.processes``), and a test or ``tests/gpu/run_chaos.py`` kills it by the pid
the worker exports (``dynamo_worker_engine_process{process="scheduler",pid=...}`` on ``/metrics``, and
the "Watching the engine's processes" log line), the same act as killing SGLang's scheduler.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

__all__ = ["SchedulerProcess"]

# The child's program: block until the parent closes the pipe. ``-c`` starts in milliseconds (no import of
# this package); the words after it name it in ``ps``.
_PROGRAM = "import sys; sys.stdin.buffer.read()"


class SchedulerProcess:
    """One stand-in scheduler child: ``start``, ``pid``, ``stop`` (kill and reap, bounded)."""

    def __init__(self, label: str) -> None:
        self.label = label  # e.g. "mocker-scheduler rank=0"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None, "scheduler process not started"
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> int:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PROGRAM, *self.label.split()],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return self._proc.pid

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        await asyncio.to_thread(proc.wait, 5.0)
        if proc.stdin is not None:
            proc.stdin.close()
