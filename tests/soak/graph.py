"""The soak's graph: ``dynamo-run --restart always`` of ``tests/soak/graph.yaml`` on the mocker, as a child
process whose output names every process it starts (``Started NAME pid=N``, again after each restart),
so the soak can aim its faults at the live ones and read their memory."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from dynamo_worker.local.supervisor import workers_seen
from dynamo_worker.runtime.nats_server import free_port

from tests.soak.traffic import TOOL_PROMPT, TOOL_REPLY
from tests.support.procs import popen
from tests.support.wait import wait_until

__all__ = ["MANIFEST", "Graph", "rss_bytes"]

MANIFEST = Path(__file__).with_name("graph.yaml")
STARTUP_S = 180.0
STOP_S = 60.0
_STARTED = re.compile(r"Started (\S+)(?: url=\S+)? pid=(\d+)", re.M)
# a worker's line (prefixed with its name by dynamo-run) naming its engine's scheduler process
_SCHEDULER = re.compile(r"^(\S+)\s+\| .*Watching the engine's processes .*\bscheduler=(\d+)", re.M)


def rss_bytes(pid: int) -> int | None:
    """Resident memory of ``pid`` (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def write_manifest(folder: Path) -> Path:
    """The soak manifest with the workers' ``--script`` (the tool call) pointing into ``folder``."""
    script = folder / "script.json"
    script.write_text(json.dumps([{"match": TOOL_PROMPT, "reply": TOOL_REPLY}]))
    graph = yaml.safe_load(MANIFEST.read_text())
    for service in ("prefill", "decode"):
        graph["spec"]["services"][service]["extraPodSpec"]["mainContainer"]["args"] += [
            "--script",
            str(script),
        ]
    out = folder / "graph.yaml"
    out.write_text(yaml.safe_dump(graph, sort_keys=False))
    return out


class Graph:
    """``dynamo-run --restart always MANIFEST --engine mocker`` on a free port, its output in ``log_path``."""

    def __init__(self, folder: Path, api_key: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port = free_port()
        self.log_path = folder / "dynamo-run.log"
        self.lines: list[str] = []
        self._lock = threading.Lock()
        argv = [
            str(Path(sys.executable).parent / "dynamo-run"), str(write_manifest(folder)),
            "--engine", "mocker", "--port", str(self.port), "--restart", "always",
            "--log-dir", str(folder / "logs"), "--startup-timeout", str(STARTUP_S), "--grace-period", "5",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "NATS_"))}
        env["DYN_API_KEY"] = api_key  # the frontend inherits it, as from a Secret in a pod
        self.proc = popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout, open(self.log_path, "w") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                with self._lock:
                    self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def wait_serving(self) -> None:
        def serving() -> bool:
            if "Serving namespace=" in self.output():
                return True
            assert self.proc.poll() is None, f"dynamo-run exited ({self.proc.returncode}):\n{self.output()}"
            return False

        wait_until(
            serving, "dynamo-run to serve", timeout_s=STARTUP_S + 30, interval_s=0.2, explain=self.output
        )

    def pids(self) -> dict[str, int]:
        """The latest pid of every process by name (``nats-server``, ``Frontend-0``, ``decode-1``, ...)."""
        return {name: int(pid) for name, pid in _STARTED.findall(self.output())}

    def schedulers(self) -> dict[str, int]:
        """The latest engine scheduler pid of every worker by name (the mocker's stand-in for SGLang's
        scheduler process, which the worker watches: killing it is the engine's death)."""
        return {name: int(pid) for name, pid in _SCHEDULER.findall(self.output())}

    def live(self, prefix: str) -> list[tuple[str, int]]:
        """The live processes whose name starts with ``prefix``."""
        return [(n, p) for n, p in sorted(self.pids().items()) if n.startswith(prefix) and alive(p)]

    def get(self, path: str, timeout: float = 2.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except OSError:
            return 0, ""

    def workers_seen(self) -> int:
        """Workers the frontend serves with now (0 while it is down)."""
        status, text = self.get("/metrics")
        return (workers_seen(text) or 0) if status == 200 else 0

    def stop(self) -> int:
        """SIGTERM (dynamo-run stops every process it started), then SIGKILL of its group if need be."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)
        finally:
            self._reader.join(5)

    def wait_all_workers(self, count: int, within_s: float) -> float | None:
        """Seconds until the frontend serves ``count`` workers again, or None past ``within_s``."""
        started = time.monotonic()
        while time.monotonic() - started < within_s:
            if self.workers_seen() >= count and self.get("/health")[0] == 200:
                return time.monotonic() - started
            time.sleep(0.25)
        return None
