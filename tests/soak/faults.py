"""The soak's faults: the kinds of the fault table (``make faults``), done to the live processes of the
graph under ``dynamo-run --restart``, one every 30-60 s (seeded, so a run can be repeated).

- frontend restarted: SIGTERM to the frontend (a rollout's restart), which dynamo-run starts again; it
  drains what is in flight, and new requests are refused (connection) while it is down;
- worker SIGKILL: of a decode, then of a prefill worker, in turn; the decode streams migrate, a lost
  prefill leg ends with an error;
- stuck transfer: SIGSTOP of a prefill worker for ``STUCK_S``, then SIGCONT; its KV handoffs end at
  --kv-transfer-timeout-s and are retried on another pair;
- NATS restart: SIGKILL of nats-server, which dynamo-run starts again on its port; serving goes on (the
  request plane needs no NATS) and the frontend finds the workers again.

The frontend is restarted once, as the first fault: the memory check then follows one frontend process
from its warm-up to the end of the run, under every other fault (a restart would reset its memory).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.soak.graph import Graph

__all__ = ["FIRST", "ROTATION", "Fault", "Faults", "schedule"]

STUCK_S = 8.0  # longer than the graph's --kv-transfer-timeout-s (5 s)
FIRST = "frontend restarted"
ROTATION = ["worker SIGKILL (decode)", "stuck transfer", "NATS restart", "worker SIGKILL (prefill)"]


def schedule(seconds: float, interval: tuple[float, float], seed: int) -> list[tuple[float, str]]:
    """(time, kind) of each fault of a run of ``seconds``: the first after one interval, the next ones
    an interval apart (uniform in ``interval``), none in the last interval (the graph recovers before
    the run ends); the frontend restart first, then ``ROTATION`` in turn."""
    rng = random.Random(seed)
    at, out = 0.0, []
    while True:
        at += rng.uniform(*interval)
        if at > seconds - interval[0]:
            return out
        out.append((at, FIRST if not out else ROTATION[(len(out) - 1) % len(ROTATION)]))


@dataclass
class Fault:
    at_s: float  # seconds since the soak started
    kind: str
    target: str
    recovered_s: float | None = None  # until the frontend served every worker again


@dataclass
class Faults:
    """Does the faults of ``schedule`` to ``graph``."""

    graph: Graph
    done: list[Fault] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)  # SIGSTOPped pids still to continue

    def do(self, kind: str, at_s: float) -> Fault:
        action: dict[str, Callable[[], str]] = {
            FIRST: lambda: self._signal("Frontend", signal.SIGTERM),
            "worker SIGKILL (decode)": lambda: self._signal("decode", signal.SIGKILL),
            "worker SIGKILL (prefill)": lambda: self._signal("prefill", signal.SIGKILL),
            "stuck transfer": self._stop_prefill,
            "NATS restart": lambda: self._signal("nats-server", signal.SIGKILL),
        }
        fault = Fault(at_s, kind, action[kind]())
        self.done.append(fault)
        return fault

    def _signal(self, prefix: str, sig: signal.Signals) -> str:
        live = self.graph.live(prefix)
        if not live:
            return f"none ({prefix} not running)"
        name, pid = live[len(self.done) % len(live)]
        os.kill(pid, sig)
        return f"{name} pid={pid}"

    def _stop_prefill(self) -> str:
        target = self._signal("prefill", signal.SIGSTOP)
        if "pid=" in target:
            self.stopped.append(int(target.rsplit("=", 1)[1]))
        return f"{target} for {STUCK_S:g}s"

    def resume(self) -> None:
        """SIGCONT every stopped process (also when the soak ends early)."""
        while self.stopped:
            pid = self.stopped.pop()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def sleep_until(deadline: float) -> None:
    time.sleep(max(0.0, deadline - time.monotonic()))
