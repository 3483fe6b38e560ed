"""Run a plan's processes: start them, show their logs, wait until ready, watch them, stop them.

Every child runs in its own process group (its own session), so stopping it reaches whatever it
started too: SIGTERM to the group, a grace period, then SIGKILL to the group. On Linux each child also
gets SIGTERM when dynamo-run itself dies (``runtime.children.die_with_parent``), so a
killed dynamo-run leaves no orphaned workers (the signal follows the thread that spawned the child:
call ``start`` from the main thread). Each child's stdout and stderr go to ``<log-dir>/<name>.log``
and, prefixed with its name, to the terminal. A child's environment is dynamo-run's own (as a pod's
starts from its image's) with the plan's variables on top.

Exceptions (all ``SupervisorError``): ``ProcessDied`` (a child exited while it was needed; carries its
last log lines), ``StartupTimeout`` (not ready within the bound; names what each is waiting for).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from dynamo_api.errors import DynamoError

from dynamo_worker.local.plan import ProcessSpec
from dynamo_worker.runtime.children import die_with_parent

__all__ = [
    "Child",
    "Console",
    "ProcessDied",
    "StartupTimeout",
    "Supervisor",
    "SupervisorError",
]

log = logging.getLogger(__name__)

TAIL_LINES = 40
PROGRESS_EVERY_S = 5.0
KILL_WAIT_S = 5.0


class SupervisorError(DynamoError, RuntimeError):
    pass


class ProcessDied(SupervisorError):
    def __init__(self, child: Child) -> None:
        self.child = child
        super().__init__(
            f"{child.spec.name} exited with {child.describe_exit()}; its last log lines "
            f"({child.log_path}):\n{child.tail_text()}"
        )


class StartupTimeout(SupervisorError):
    def __init__(self, timeout: float, pending: Sequence[Child]) -> None:
        self.pending = tuple(pending)
        waiting = "; ".join(f"{c.spec.name} waits for {c.spec.waiting_for}" for c in pending)
        super().__init__(
            f"not ready after {timeout:.0f}s: {waiting}. Look at the logs above, or give it longer "
            "with --startup-timeout"
        )


class Console:
    """Writes whole lines to the terminal from many threads, each prefixed with its source."""

    def __init__(self, stream: IO[str] | None = None, width: int = 10) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self.width = width

    def write(self, source: str, text: str) -> None:
        stream = self._stream or sys.stdout
        with self._lock:
            try:
                stream.write(f"{source:<{self.width}} | {text}\n")
                stream.flush()
            except (OSError, ValueError):  # the terminal went away; the log files still get everything
                pass


class ConsoleLogHandler(logging.Handler):
    """dynamo-run's own log records on the same console as its children, prefixed ``dynamo-run``."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = self.format(record)
        except Exception:  # logging's own contract: a bad record must not kill the caller
            self.handleError(record)
            return
        level = "" if record.levelno < logging.WARNING else f"{record.levelname}: "
        for i, line in enumerate(msg.splitlines() or [""]):
            self.console.write("dynamo-run", (level if i == 0 else "") + line)


@dataclass
class Child:
    spec: ProcessSpec
    log_path: Path
    proc: subprocess.Popen[bytes]
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    ready: bool = False
    reported_exit: bool = False
    started: float = field(default_factory=time.monotonic)
    _pump: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def describe_exit(self) -> str:
        rc = self.proc.returncode
        if rc is None:
            return "no exit yet"
        if rc < 0:
            try:
                return f"signal {signal.Signals(-rc).name}"
            except ValueError:
                return f"signal {-rc}"
        return f"exit code {rc}"

    def tail_text(self, lines: int = 20) -> str:
        if self._pump is not None:
            self._pump.join(timeout=2.0)  # let the last lines arrive
        shown = list(self.tail)[-lines:]
        return "\n".join(f"    {line}" for line in shown) if shown else "    (no output)"


class Supervisor:
    """Starts ``ProcessSpec``s as process groups and owns them until ``stop``."""

    def __init__(self, log_dir: Path, console: Console, grace_s: float = 15.0) -> None:
        self.log_dir = log_dir
        self.console = console
        self.grace_s = grace_s
        self.children: list[Child] = []

    def start(self, specs: Sequence[ProcessSpec]) -> None:
        """Spawn each process in its own session, with a thread copying its output."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.console.width = max([self.console.width, *(len(s.name) for s in specs)])
        for spec in specs:
            self.children.append(self._spawn(spec))

    def _spawn(self, spec: ProcessSpec) -> Child:
        proc = subprocess.Popen(
            [*die_with_parent(), *spec.argv],
            env={**os.environ, **spec.env},  # this shell's (PATH, HOME, HF_TOKEN, ...), then the pod's
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        child = Child(spec=spec, log_path=self.log_dir / f"{spec.name}.log", proc=proc)
        gpus = f" gpus={','.join(spec.gpus)}" if spec.gpus else ""
        child._pump = threading.Thread(target=self._pump, args=(child,), name=f"log-{spec.name}", daemon=True)
        child._pump.start()
        log.info("Started %s pid=%s%s log=%s", spec.name, proc.pid, gpus, child.log_path)
        return child

    def restart(self, children: Sequence[Child]) -> None:
        """Stop those of ``children`` still running (SIGTERM to the group, the grace period, SIGKILL),
        then start each again from its spec (its log file goes on)."""
        for child in children:
            if child.alive() or _group_exists(child.pid):
                _signal_group(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for child in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            if _group_exists(child.pid):
                _signal_group(child.pid, signal.SIGKILL)
                child.proc.wait(timeout=KILL_WAIT_S)
        for child in children:
            if child._pump is not None:
                child._pump.join(timeout=2.0)
            self.children[self.children.index(child)] = self._spawn(child.spec)

    def _pump(self, child: Child) -> None:
        assert child.proc.stdout is not None
        with open(child.log_path, "ab") as out:
            for raw in iter(child.proc.stdout.readline, b""):
                out.write(raw)
                out.flush()
                line = raw.decode(errors="replace").rstrip("\r\n")
                child.tail.append(line)
                self.console.write(child.spec.name, line)
        child.proc.stdout.close()

    def dead(self) -> list[Child]:
        return [c for c in self.children if not c.alive()]

    def wait_ready(self, timeout: float, stopping: threading.Event) -> bool:
        """Poll each child's health URL until all answer 200. False when ``stopping`` was set.

        Raises ``ProcessDied`` when one exits first and ``StartupTimeout`` after ``timeout`` seconds.
        """
        start = time.monotonic()
        next_progress = start + PROGRESS_EVERY_S
        order = sorted(self.children, key=lambda c: c.spec.kind == "frontend")  # workers first
        for child in order:
            log.info("Waiting for %s: %s", child.spec.name, child.spec.waiting_for)
        while not stopping.is_set():
            for child in self.children:
                if not child.alive():
                    child.reported_exit = True
                    raise ProcessDied(child)
            for child in order:
                if not child.ready and is_ready(child.spec):
                    child.ready = True
                    log.info("Ready %s after %.1fs", child.spec.name, time.monotonic() - start)
            pending = [c for c in order if not c.ready]
            if not pending:
                return True
            now = time.monotonic()
            if now - start > timeout:
                raise StartupTimeout(timeout, pending)
            if now >= next_progress:
                next_progress = now + PROGRESS_EVERY_S
                for child in pending:
                    log.info(
                        "Waiting for %s: %s (%.0fs of %.0fs)",
                        child.spec.name,
                        child.spec.waiting_for,
                        now - start,
                        timeout,
                    )
            stopping.wait(0.2)
        return False

    def kill(self) -> None:
        """SIGKILL every process group now (a second Ctrl-C)."""
        self.grace_s = 0.0
        for child in self.children:
            _signal_group(child.pid, signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM every process group, wait up to the grace period, then SIGKILL what is left."""
        groups = [c for c in self.children if c.alive() or _group_exists(c.pid)]
        for child in sorted(groups, key=lambda c: c.spec.kind != "frontend"):  # the frontend first
            _signal_group(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for child in self.children:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning(
                    "Killing %s pid=%s: still running %.0fs after SIGTERM",
                    child.spec.name,
                    child.pid,
                    self.grace_s,
                )
        for child in self.children:
            if _group_exists(child.pid):
                _signal_group(child.pid, signal.SIGKILL)
        # SIGKILL is delivered asynchronously: wait (bounded) until every group is gone.
        deadline = time.monotonic() + KILL_WAIT_S
        for child in self.children:
            if child.alive():
                child.proc.wait(timeout=KILL_WAIT_S)
            while _group_exists(child.pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        for child in self.children:
            if child._pump is not None:
                child._pump.join(timeout=2.0)
        log.info("Stopped %d processes", len(self.children))


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


FRONTEND_WORKERS_METRIC = "dynamo_frontend_workers"


def workers_seen(metrics_text: str) -> int | None:
    """The sum of the frontend's per-model, per-role worker gauges; 0 while it declares the gauge with no
    sample yet (it has seen no worker), None when it exports no such gauge."""
    total = 0 if f"# TYPE {FRONTEND_WORKERS_METRIC} gauge" in metrics_text else None
    for line in metrics_text.splitlines():
        if line.startswith(FRONTEND_WORKERS_METRIC + "{"):
            try:
                total = (total or 0) + int(float(line.rsplit(" ", 1)[1]))
            except (IndexError, ValueError):
                continue
    return total


def is_ready(spec: ProcessSpec) -> bool:
    """For a frontend, it sees every worker (when it exports the gauge), and then its readinessProbe
    answers 200 (none: ready once started). The probe is read after the gauge, so it answers for every
    worker counted: a frontend that just saw a new prefill/decode pair is not ready until that pair is
    warm (its /health waits for it), and a /health read before the pair existed does not count."""
    if spec.metrics_url is not None and spec.expected_workers > 0:
        try:
            with urllib.request.urlopen(spec.metrics_url, timeout=1.0) as resp:
                seen = workers_seen(resp.read().decode(errors="replace"))
        except (urllib.error.URLError, OSError, ValueError):
            return False
        if seen is not None and seen < spec.expected_workers:
            return False
    return spec.health_url is None or http_ok(spec.health_url)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """True when GET ``url`` answers 200 within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False
