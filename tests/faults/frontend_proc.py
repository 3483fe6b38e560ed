"""``python -m dynamo_worker.frontend`` as a child process (for what only a process shows: its
resident memory, its log), started in its own process group and killed with the test run."""

from __future__ import annotations

import functools
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import listening_port, popen
from tests.support.wait import wait_until


@dataclass
class FrontendProc:
    proc: subprocess.Popen
    log_path: Path

    @functools.cached_property
    def port(self) -> int:
        """The port it bound (it was given 0), from its log."""
        return listening_port(self.proc, self.log_path, "frontend")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return 0, ""

    def wait_serving(self, within_s: float = 60.0) -> None:
        def serving() -> bool:
            if self.get("/health")[0] == 200:
                return True
            assert self.proc.poll() is None, f"frontend exited:\n{self.log()[-3000:]}"
            return False

        what = "the frontend to serve (/health 200)"
        wait_until(serving, what, timeout_s=within_s, interval_s=0.1, explain=lambda: self.log()[-3000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_frontend(log_path: Path, namespace: str, nats_url: str, *args: str, env=None) -> FrontendProc:
    cmd = [
        sys.executable, "-m", "dynamo_worker.frontend", "--http-host", "127.0.0.1", "--http-port", "0",
        "--namespace", namespace, "--nats-server", nats_url, *args,
    ]  # fmt: skip
    with open(log_path, "wb") as out:
        proc = popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    return FrontendProc(proc, log_path)
