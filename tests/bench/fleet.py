"""Local processes for benchmark scenarios: a nats-server, mocker workers and frontends on 127.0.0.1.

Our processes bind port 0 and their ports are read back from their logs (a peer's process is given
free ports), each gets its own process group and a log file under the fleet's folder; waits are
bounded and a process that dies while awaited raises with its log tail. ``Fleet`` is a context manager:
leaving it (normally, on an error or on Ctrl-C) stops every process it started, SIGTERM to the group,
then SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from dynamo_worker.runtime.nats_server import NatsServer
from dynamo_worker.tinymodel import ensure_tiny_model

from tests.support.procs import listening_ports
from tests.support.procs import popen as start_process

MODEL = "tiny"


class FleetError(RuntimeError):
    pass


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path
    given: dict[str, int] = field(default_factory=dict)  # ports picked for it (a peer's process)
    listeners: dict[str, str] = field(default_factory=dict)  # port key -> the listener's name in its log

    @functools.cached_property
    def ports(self) -> dict[str, int]:
        """The given ports and those its listeners bound (they were given 0), read from its log."""
        if not self.listeners:
            return dict(self.given)
        bound = listening_ports(self.popen, self.log_path, *self.listeners.values())
        return self.given | {key: bound[name] for key, name in self.listeners.items()}

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise FleetError(
                f"{self.name} exited with {self.popen.returncode}; log {self.log_path}:\n{self.tail()}"
            )

    def cpu_s(self) -> float:
        """CPU time (user + system, seconds) of the live processes of this process's group: the process
        and any it started (a frontend's extra serving processes)."""
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # exited meanwhile
            if int(fields[2]) == self.popen.pid:  # fields[2]: the process group id
                total += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
        return total / os.sysconf("SC_CLK_TCK")

    def stop(self, grace_s: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(grace_s)


def _get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


class Fleet:
    """Start with ``with Fleet(workdir) as fleet:``; add processes with ``mocker()`` / ``frontend()``."""

    def __init__(
        self,
        workdir: Path,
        model_dir: Path | None = None,
        model: str = MODEL,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.env = env or {}  # for every process started
        self.nats = NatsServer()
        self.procs: list[Proc] = []
        self.model_dir = model_dir or ensure_tiny_model(workdir / "tiny-model")
        self.model = model

    def __enter__(self) -> Fleet:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nats.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()
        self.nats.stop()

    def retire(self, procs: list[Proc]) -> None:
        """Stop these processes now (the rest of the fleet keeps running)."""
        for proc in procs:
            proc.stop()
            if proc in self.procs:
                self.procs.remove(proc)

    def spawn(
        self,
        name: str,
        args: list[str],
        ports: dict[str, int],
        *,
        listeners: dict[str, str] | None = None,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
    ) -> Proc:
        """``python -m *args`` in its own process group, logging to ``<workdir>/<name>.log``; ``ports`` are
        those given to it, ``listeners`` name (by port key) the listeners of ours it starts on port 0."""
        log_path = self.workdir / f"{name}.log"
        env = {
            **os.environ,
            "DYN_LOG_LEVEL": os.environ.get("BENCH_CHILD_LOG_LEVEL", "WARNING"),
            **self.env,
            **(env or {}),
        }
        with open(log_path, "wb") as out:
            popen = start_process(
                [python, "-m", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        proc = Proc(name, popen, log_path, ports, listeners or {})
        self.procs.append(proc)
        return proc

    def mocker(self, namespace: str, mode: str = "null", *extra: str, speedup: float = 50.0) -> Proc:
        """A mocker worker (``mode`` null = aggregated, prefill or decode) serving the fleet's model."""
        listeners = {"system": "system", "request": "request-plane"}
        args = [
            "dynamo_worker.mocker", "--model-path", str(self.model_dir), "--served-model-name", self.model,
            "--page-size", "16", "--disaggregation-mode", mode, "--speedup", str(speedup),
            "--namespace", namespace, "--component", "backend" if mode == "null" else mode,
            "--nats-server", self.nats.url, "--system-port", "0",
            "--request-port", "0", "--listen-host", "127.0.0.1",
            "--advertise-host", "127.0.0.1", "--graceful-shutdown-s", "1",
        ]  # fmt: skip
        if mode == "prefill":
            listeners["bootstrap"] = "bootstrap"
            args += ["--disaggregation-bootstrap-port", "0"]
        n = sum(p.name.startswith(f"{namespace}-mocker") for p in self.procs)
        return self.spawn(f"{namespace}-mocker-{mode}-{n}", [*args, *extra], {}, listeners=listeners)

    def frontend(
        self, namespace: str, router_mode: str = "round-robin", *extra: str, http_port: int = 0
    ) -> Proc:
        """Our frontend; on port 0 (read back from its log) unless ``http_port`` is given (a tree from
        before the frontend said where it listens)."""
        args = [
            "dynamo_worker.frontend", "--http-host", "127.0.0.1", "--http-port", str(http_port),
            "--namespace", namespace, "--nats-server", self.nats.url, "--router-mode", router_mode,
        ]  # fmt: skip
        if http_port:
            return self.spawn(f"{namespace}-frontend", [*args, *extra], {"http": http_port})
        return self.spawn(f"{namespace}-frontend", [*args, *extra], {}, listeners={"http": "frontend"})

    def wait_healthy(self, proc: Proc, url: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while _get(url)[0] != 200:
            proc.check_alive()
            if time.monotonic() > deadline:
                raise FleetError(
                    f"{proc.name} not healthy at {url} after {timeout:.0f}s; log:\n{proc.tail()}"
                )
            time.sleep(0.1)

    def wait_workers(self, frontend: Proc, expected: dict[str, int], timeout: float = 60.0) -> None:
        """Until the frontend's ``dynamo_frontend_workers`` gauge shows ``expected`` workers per role."""
        url = f"http://127.0.0.1:{frontend.ports['http']}/metrics"
        deadline = time.monotonic() + timeout
        seen: dict[str, int] = {}
        while True:
            frontend.check_alive()
            for p in self.procs:
                p.check_alive()
            status, text = _get(url)
            if status == 200:
                seen = {
                    role: int(float(value))
                    for role, value in re.findall(
                        r'^dynamo_frontend_workers\{[^}]*role="([a-z]+)"[^}]*\} ([0-9.e+]+)$', text, re.M
                    )
                }
                if (
                    all(seen.get(role, 0) >= n for role, n in expected.items())
                    and _get(f"http://127.0.0.1:{frontend.ports['http']}/health")[0] == 200
                ):
                    return
            if time.monotonic() > deadline:
                raise FleetError(
                    f"{frontend.name} sees workers {seen}, expected {expected} within {timeout:.0f}s"
                )
            time.sleep(0.1)
