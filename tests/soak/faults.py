"""The soak's faults: the kinds of the fault table (``make faults``), done to the live processes of the
graph under ``dynamo-run --restart always``, one every 30-60 s (seeded, so a run can be repeated).

- frontend restarted: SIGTERM to the frontend (a rollout's restart), which dynamo-run starts again; it
  drains what is in flight, and new requests are refused (connection) while it is down;
- worker SIGKILL: of a decode, then of a prefill worker, in turn; the decode streams migrate, a lost
  prefill leg ends with an error;
- stuck transfer: SIGSTOP of a prefill worker for ``STUCK_S``, then SIGCONT; its KV handoffs end at
  --kv-transfer-timeout-s and are retried on another pair;
- NATS restart: SIGKILL of nats-server, which dynamo-run starts again on its port; serving goes on (the
  request plane needs no NATS) and the frontend finds the workers again;
- engine death: SIGKILL of a worker's engine scheduler process (the mocker's stand-in for SGLang's), a
  decode then a prefill worker's in turn; the worker ends its streams with engine_died (the frontend
  continues them elsewhere), deregisters and restarts its engine in place.

The frontend is restarted once, as the first fault: the memory check then follows one frontend process
from its warm-up to the end of the run, under every other fault (a restart would reset its memory).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.soak.graph import Graph, alive

__all__ = ["FIRST", "ROTATION", "Fault", "Faults", "schedule"]

STUCK_S = 8.0  # longer than the graph's --kv-transfer-timeout-s (5 s)
FIRST = "frontend restarted"
ROTATION = [
    "worker SIGKILL (decode)",
    "stuck transfer",
    "engine death",
    "NATS restart",
    "worker SIGKILL (prefill)",
]


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
    back: Callable[[], bool] = field(repr=False, default=lambda: True)  # the faulted process runs again
    recovered_s: float | None = None  # until it runs again and the frontend serves every worker


@dataclass
class Faults:
    """Does the faults of ``schedule`` to ``graph``."""

    graph: Graph
    done: list[Fault] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)  # SIGSTOPped pids still to continue

    def do(self, kind: str, at_s: float) -> Fault:
        action: dict[str, Callable[[], tuple[str, Callable[[], bool]]]] = {
            FIRST: lambda: self._signal("Frontend", signal.SIGTERM),
            "worker SIGKILL (decode)": lambda: self._signal("decode", signal.SIGKILL),
            "worker SIGKILL (prefill)": lambda: self._signal("prefill", signal.SIGKILL),
            "stuck transfer": self._stop_prefill,
            "NATS restart": lambda: self._signal("nats-server", signal.SIGKILL),
            "engine death": self._kill_engine,
        }
        target, back = action[kind]()
        fault = Fault(at_s, kind, target, back)
        self.done.append(fault)
        return fault

    def _pick(self, live: list[tuple[str, int]]) -> tuple[str, int]:
        return live[len(self.done) % len(live)]

    def _signal(self, prefix: str, sig: signal.Signals) -> tuple[str, Callable[[], bool]]:
        """``sig`` to a live process named ``prefix...``; it is back once that name runs a new pid."""
        live = self.graph.live(prefix)
        if not live:
            return f"none ({prefix} not running)", lambda: True
        name, pid = self._pick(live)
        os.kill(pid, sig)
        return f"{name} pid={pid}", lambda: _renewed(self.graph.pids(), name, pid)

    def _stop_prefill(self) -> tuple[str, Callable[[], bool]]:
        live = self.graph.live("prefill")
        if not live:
            return "none (prefill not running)", lambda: True
        name, pid = self._pick(live)
        os.kill(pid, signal.SIGSTOP)
        self.stopped.append(pid)
        return f"{name} pid={pid} for {STUCK_S:g}s", lambda: pid not in self.stopped

    def _kill_engine(self) -> tuple[str, Callable[[], bool]]:
        """SIGKILL the engine scheduler of a decode, then a prefill worker; back once it has a new one."""
        schedulers = self.graph.schedulers()
        role = "decode" if sum(f.kind == "engine death" for f in self.done) % 2 == 0 else "prefill"
        live = [(n, p) for n, p in sorted(schedulers.items()) if n.startswith(role) and alive(p)]
        if not live:
            return f"none (no {role} engine running)", lambda: True
        name, pid = self._pick(live)
        os.kill(pid, signal.SIGKILL)
        return f"{name} scheduler pid={pid}", lambda: _renewed(self.graph.schedulers(), name, pid)

    def resume(self) -> None:
        """SIGCONT every stopped process (also when the soak ends early)."""
        while self.stopped:
            pid = self.stopped.pop()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _renewed(pids: dict[str, int], name: str, old: int) -> bool:
    pid = pids.get(name)
    return pid is not None and pid != old and alive(pid)
