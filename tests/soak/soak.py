"""The soak: the graph under dynamo-run, steady mixed traffic, a fault every 30-60 s, then one table.

``run_soak(config)`` starts the graph (``graph.Graph``) with an API key, checks the key is required,
sends the traffic (``traffic.Traffic``) for ``minutes``, does the faults of ``faults.schedule`` and
samples the memory of the frontend and the workers every few seconds; then it stops sending, lets
the requests in flight end (each within its bound), stops the graph and returns a ``Report``, whose
``table()`` is what ``make soak`` prints and whose ``failures()`` say why it fails: a request hung or
lost, the frontend's memory grown by more than ``MAX_GROWTH`` from its warm-up to the end, or the
API key not required.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import openai

from tests.soak.faults import STUCK_S, Fault, Faults, schedule
from tests.soak.graph import Graph, alive, rss_bytes
from tests.soak.traffic import Outcome, Traffic

__all__ = ["MAX_GROWTH", "Report", "SoakConfig", "run_soak"]

MAX_GROWTH = 0.10  # the frontend's memory from its warm-up to the end
WORKERS = 5  # 2 prefill + 2 decode + 1 embedding
SAMPLE_EVERY_S = 5.0
RECOVERY_BOUND_S = 90.0


@dataclass(frozen=True)
class SoakConfig:
    folder: Path
    minutes: float = 30.0
    rate: float = 4.0  # requests a second
    bound_s: float = 45.0  # every request's answer or clear error comes within this
    interval: tuple[float, float] = (30.0, 60.0)  # seconds between faults
    seed: int = 1
    window_s: float | None = None  # p99 TTFT windows (default: 5 min, or 30 s for runs under 10 min)

    @property
    def seconds(self) -> float:
        return self.minutes * 60

    @property
    def window(self) -> float:
        return self.window_s or (300.0 if self.minutes >= 10 else 30.0)

    @property
    def warmup_s(self) -> float:
        """From a frontend's start to its memory baseline: the first 5-minute window (a quarter of a
        shorter run). Its caches fill for minutes: a 30-minute run measured from 60 s saw it grow 13% in
        the first 10 minutes, then stay within 85-89 MiB for the last 20 (docs/soak.md)."""
        return min(300.0, self.seconds / 4)


@dataclass
class Sample:
    at_s: float
    frontend_pid: int | None
    frontend_rss: int | None
    workers_rss: int  # the live workers', summed
    workers: int


@dataclass
class Report:
    config: SoakConfig
    outcomes: list[Outcome] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    key_checks: dict[str, int] = field(default_factory=dict)  # what was asked -> HTTP status

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    def frontend_memory(self) -> tuple[int, int] | None:
        """(RSS after the last frontend's warm-up, RSS at the end), or None when not measured."""
        if not self.samples or self.samples[-1].frontend_pid is None:
            return None
        last = self.samples[-1].frontend_pid
        mine = [s for s in self.samples if s.frontend_pid == last and s.frontend_rss]
        born = mine[0].at_s if mine else 0.0
        warm = [s for s in mine if s.at_s >= born + self.config.warmup_s]
        if len(warm) < 2:
            return None
        return warm[0].frontend_rss or 0, warm[-1].frontend_rss or 0

    def workers_memory(self) -> tuple[int, int] | None:
        warm = [s for s in self.samples if s.at_s >= self.config.warmup_s and s.workers == WORKERS]
        return (warm[0].workers_rss, warm[-1].workers_rss) if len(warm) >= 2 else None

    def ttft_p99(self) -> list[tuple[float, int, float | None]]:
        """(window start, streamed requests answered, p99 TTFT in seconds) per window."""
        w = self.config.window
        out = []
        for k in range(math.ceil(self.config.seconds / w)):
            ttfts = sorted(
                o.ttft_s for o in self.outcomes if o.ttft_s is not None and k * w <= o.sent_at < (k + 1) * w
            )
            p99 = ttfts[max(math.ceil(0.99 * len(ttfts)) - 1, 0)] if ttfts else None
            out.append((k * w, len(ttfts), p99))
        return out

    def failures(self) -> list[str]:
        problems = []
        for status in ("hung", "lost"):
            if self.count(status):
                problems.append(f"{self.count(status)} requests {status}")
        memory = self.frontend_memory()
        if memory is None:
            problems.append("the frontend's memory was not measured over a warm-up and an end")
        elif memory[1] > memory[0] * (1 + MAX_GROWTH):
            problems.append(
                f"the frontend's memory grew {memory[1] / memory[0] - 1:+.1%} (at most {MAX_GROWTH:.0%})"
            )
        if self.key_checks != {"no key": 401, "wrong key": 401, "/health without a key": 200}:
            problems.append(f"the API key was not required as it should be: {self.key_checks}")
        return problems

    def table(self) -> str:
        c = self.config
        sent = len(self.outcomes)
        kinds = Counter(o.kind for o in self.outcomes)
        causes = Counter(o.detail for o in self.outcomes if o.status == "errored")
        slowest_error = max((o.seconds for o in self.outcomes if o.status == "errored"), default=0.0)
        fault_kinds = Counter(f.kind for f in self.faults)
        recovered = [f.recovered_s for f in self.faults if f.recovered_s is not None]
        unrecovered = sum(1 for f in self.faults if f.recovered_s is None)
        rows = [
            (
                "requests sent",
                f"{sent} ({c.rate:g}/s: " + ", ".join(f"{k} {n}" for k, n in kinds.items()) + ")",
            ),
            ("answered", str(self.count("answered"))),
            (
                f"errored within their bound ({c.bound_s:g} s)",
                f"{self.count('errored')}"
                + (
                    f" (slowest {slowest_error:.1f} s; "
                    + ", ".join(f"{k} {n}" for k, n in causes.most_common())
                    + ")"
                    if causes
                    else ""
                ),
            ),
            ("hung (must be 0)", str(self.count("hung"))),
            ("lost (must be 0)", str(self.count("lost"))),
            (
                "faults",
                f"{len(self.faults)}: "
                + ", ".join(f"{k} {n}" for k, n in fault_kinds.items())
                + (f"; back to all {WORKERS} workers in at most {max(recovered):.1f} s" if recovered else "")
                + (f"; {unrecovered} not recovered within {RECOVERY_BOUND_S:g} s" if unrecovered else ""),
            ),
            ("frontend RSS, warm-up -> end", _memory(self.frontend_memory(), MAX_GROWTH)),
            (f"workers RSS ({WORKERS}), warm-up -> end", _memory(self.workers_memory(), None)),
            *[
                (f"p99 TTFT {_mmss(start)}-{_mmss(min(start + c.window, c.seconds))}", _ms(p99, n))
                for start, n, p99 in self.ttft_p99()
            ],
            ("API key", ", ".join(f"{k}: {v}" for k, v in self.key_checks.items())),
            ("verdict", "PASS" if not self.failures() else "FAIL: " + "; ".join(self.failures())),
        ]
        width = max(len(r[0]) for r in rows)
        lines = [f"| {'':<{width}} | soak, {c.minutes:g} min |", f"|-{'-' * width}-|---|"]
        return "\n".join(lines + [f"| {k:<{width}} | {v} |" for k, v in rows])

    def fault_log(self) -> str:
        return "\n".join(
            f"  {_mmss(f.at_s)} {f.kind}: {f.target}; "
            + (
                f"all workers served again after {f.recovered_s:.1f} s"
                if f.recovered_s is not None
                else "NOT recovered"
            )
            for f in self.faults
        )

    def odd_requests(self, limit: int = 20) -> str:
        odd = [o for o in self.outcomes if o.status in ("hung", "lost")][:limit]
        return "\n".join(
            f"  {_mmss(o.sent_at)} {o.kind}: {o.status} after {o.seconds:.1f}s: {o.detail}" for o in odd
        )


def _mmss(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def _ms(seconds: float | None, n: int) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms (of {n} streams)"


def _memory(pair: tuple[int, int] | None, limit: float | None) -> str:
    if pair is None:
        return "not measured"
    start, end = pair
    text = f"{start / 2**20:.0f} MiB -> {end / 2**20:.0f} MiB ({end / start - 1:+.1%}"
    return text + (f", at most {limit:+.0%})" if limit is not None else ")")


# --- the run ------------------------------------------------------------------------------------------


def _sample(graph: Graph, started: float) -> Sample:
    pids = graph.pids()
    frontend = pids.get("Frontend-0")
    workers = [p for n, p in pids.items() if n.split("-")[0] in ("prefill", "decode", "embed") and alive(p)]
    rss = [rss_bytes(p) or 0 for p in workers]
    return Sample(
        time.monotonic() - started,
        frontend if frontend and alive(frontend) else None,
        rss_bytes(frontend) if frontend else None,
        sum(rss),
        len(workers),
    )


def _recovery(graph: Graph, fault: Fault, since: float) -> float | None:
    """Seconds from ``since`` until the faulted process runs again and the frontend serves with every
    worker; None past ``RECOVERY_BOUND_S``."""
    while time.monotonic() - since < RECOVERY_BOUND_S:
        if fault.back() and graph.workers_seen() >= WORKERS and graph.get("/health")[0] == 200:
            return time.monotonic() - since
        time.sleep(0.25)
    return None


async def _check_key(graph: Graph) -> dict[str, int]:
    """What the frontend answers without the key, with a wrong one, and on /health."""
    checks = {}
    for name, api_key, headers in (
        ("no key", "-", {"Authorization": openai.Omit()}),
        ("wrong key", "sk-" + secrets.token_hex(8), {}),
    ):
        async with openai.AsyncOpenAI(
            base_url=graph.url + "/v1", api_key=api_key, max_retries=0, timeout=30
        ) as c:
            try:
                await c.models.list(extra_headers=headers)
                checks[name] = 200
            except openai.APIStatusError as e:
                checks[name] = e.status_code
    checks["/health without a key"] = (await asyncio.to_thread(graph.get, "/health"))[0]
    return checks


async def _faults(graph: Graph, report: Report, config: SoakConfig, started: float) -> None:
    faults = Faults(graph)
    recoveries = []
    try:
        for at, kind in schedule(config.seconds, config.interval, config.seed):
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            fault = faults.do(kind, at)
            report.faults.append(fault)
            print(f"soak {_mmss(at)}: {kind}: {fault.target}", flush=True)
            if kind == "stuck transfer":
                await asyncio.sleep(STUCK_S)
                faults.resume()

            async def recover(f=fault, at_mono=started + at) -> None:
                f.recovered_s = await asyncio.to_thread(_recovery, graph, f, at_mono)

            recoveries.append(asyncio.create_task(recover()))
    finally:
        faults.resume()
        if recoveries:
            await asyncio.gather(*recoveries)


async def _sampler(graph: Graph, report: Report, started: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        report.samples.append(await asyncio.to_thread(_sample, graph, started))
        try:
            async with asyncio.timeout(SAMPLE_EVERY_S):
                await stop.wait()
        except TimeoutError:
            pass
    report.samples.append(await asyncio.to_thread(_sample, graph, started))


async def run_soak(config: SoakConfig) -> Report:
    key = "sk-soak-" + secrets.token_hex(16)
    report = Report(config)
    graph = Graph(config.folder, key)
    try:
        await asyncio.to_thread(graph.wait_serving)
        report.key_checks = await _check_key(graph)
        async with openai.AsyncOpenAI(
            base_url=graph.url + "/v1", api_key=key, max_retries=0, timeout=config.bound_s
        ) as client:
            started = time.monotonic()
            traffic = Traffic(client, config.rate, config.bound_s, started=started, seed=config.seed)
            report.outcomes = traffic.outcomes
            stop = asyncio.Event()
            tasks = [
                asyncio.create_task(traffic.run(stop)),
                asyncio.create_task(_sampler(graph, report, started, stop)),
            ]
            faults = asyncio.create_task(_faults(graph, report, config, started))
            await asyncio.sleep(config.seconds)
            stop.set()
            await asyncio.gather(*tasks, faults)
    finally:
        await asyncio.to_thread(graph.stop)
    return report
