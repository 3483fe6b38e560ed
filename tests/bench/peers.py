"""Side by side with NVIDIA Dynamo's frontend (``make bench-peers``): not a test, it prints figures.

``python -m tests.bench.peers --dynamo-venv DIR`` (the Makefile installs Dynamo into ``DIR`` with
``hack/install-dynamo-peer.sh``). Each system is a frontend plus its own simulated workers (Dynamo's
mocker; ours) on 127.0.0.1, serving the same word-level model (``tests.bench.wordmodel``: every token
one word, one streamed chunk) at the same speedup. All stacks are up at once; each load goes through
each system in turn (the others idle), ``--rounds`` times, alternating which goes first, so that a
machine busy with other work weighs on all alike. The report prints the median of each figure and the
ratio ours / Dynamo (and ours / ours before, with ``--baseline``):

- non-streaming completions, concurrency 32, 16 tokens out: requests/s;
- streaming completions, concurrency 32, 256 tokens out: output tokens/s, TTFT p50, ITL p50;
- streaming completions, concurrency 1, 64 tokens out: TTFT p50, ITL p50;
- disaggregated: the streaming workload through 1 prefill + 1 decode worker, tokens/s (and the ratio
  to the aggregated figure of the same system);
- the frontend's own CPU time per request and per output token (its process group's CPU time over
  the measured run).

Dynamo runs with file discovery and the TCP request plane (no etcd, no NATS); ours with its embedded
NATS. ``--baseline DIR`` adds our stack from another source tree (``git archive main | tar -x -C
DIR``) as "ours before", for before/after figures from the same invocation.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dynamo_worker.bench.client import OpenAITarget
from dynamo_worker.bench.runner import IteratorWorkload
from dynamo_worker.bench.stats import Report
from dynamo_worker.bench.workload import LengthDist, random_requests
from dynamo_worker.runtime.nats_server import free_port

from tests.bench.fleet import Fleet, FleetError, Proc
from tests.bench.scenarios import measure
from tests.bench.wordmodel import ensure_word_model

MODEL = "word"
SPEEDUP = 100.0
CACHE = Path.home() / ".cache" / "dynamo-sglang" / "bench"


@dataclass(frozen=True)
class Load:
    name: str
    stream: bool
    concurrency: int
    requests: int
    out_tokens: int
    in_words: int = 64


LOADS = (
    Load("non-streaming c32 16 out", False, 32, 3000, 16),
    Load("streaming c32 256 out", True, 32, 200, 256),
    Load("streaming c1 64 out", True, 1, 60, 64),
)
DISAGG_LOAD = LOADS[1]


@dataclass
class Result:
    report: Report
    cpu_s: float  # the frontend's CPU time over the run
    worker_cpu_s: float  # the simulated workers' CPU time over the run

    @property
    def cpu_us_per_token(self) -> float:
        return 1e6 * self.cpu_s / max(1, self.report.output_tokens)

    @property
    def worker_cpu_us_per_token(self) -> float:
        return 1e6 * self.worker_cpu_s / max(1, self.report.output_tokens)

    @property
    def cpu_us_per_request(self) -> float:
        return 1e6 * self.cpu_s / max(1, self.report.completed)


def _http_ok(url: str, body: bytes | None = None) -> bool:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status == 200
    except OSError:
        return False


def _wait_serving(fleet: Fleet, frontend: Proc, timeout: float = 120.0) -> None:
    """Until 20 completions in a row (new connections, so every serving process of a frontend gets
    some) go through the frontend: every worker it needs is known."""
    url = f"http://127.0.0.1:{frontend.ports['http']}/v1/completions"
    body = b'{"model": "%s", "prompt": "the of and", "max_tokens": 2}' % MODEL.encode()
    deadline = time.monotonic() + timeout
    while not all(_http_ok(url, body) for _ in range(20)):
        for p in fleet.procs:
            p.check_alive()
        if time.monotonic() > deadline:
            raise FleetError(
                f"{frontend.name} served no completion within {timeout:.0f}s:\n{frontend.tail()}"
            )
        time.sleep(0.25)


def _run(frontend: Proc, workers: list[Proc], load: Load, seed: int) -> Result:
    url = f"http://127.0.0.1:{frontend.ports['http']}"

    def target(session):
        return OpenAITarget(session, url, MODEL, api="completions", timeout_s=120, stream=load.stream)

    def workload() -> IteratorWorkload:
        return IteratorWorkload(
            random_requests(
                random.Random(seed),
                LengthDist.parse(f"fixed:{load.in_words}"),
                LengthDist.parse(f"fixed:{load.out_tokens}"),
            )
        )

    # Warm up with the same shape (connections, caches), then measure.
    measure(target, workload, concurrency=load.concurrency, num_requests=2 * load.concurrency, duration_s=60)
    before, workers_before = frontend.cpu_s(), sum(w.cpu_s() for w in workers)
    report = measure(
        target, workload, concurrency=load.concurrency, num_requests=load.requests, duration_s=120
    )
    return Result(report, frontend.cpu_s() - before, sum(w.cpu_s() for w in workers) - workers_before)


def _dynamo(fleet: Fleet, venv: Path, tag: str, modes: tuple[str, ...]) -> Proc:
    """Dynamo's mockers (``agg``, or ``prefill`` and ``decode``) and frontend, discovering each other
    through files under the fleet's folder."""
    python = str(venv / "bin" / "python")
    env = {"DYN_FILE_KV": str(fleet.workdir / f"dynamo-{tag}-discovery"), "DYN_LOG": "warn"}
    common = ["--discovery-backend", "file", "--request-plane", "tcp"]
    for mode in modes:
        args = ["dynamo.mocker", "--model-path", str(fleet.model_dir), "--model-name", MODEL]
        args += ["--speedup-ratio", str(SPEEDUP), *common]
        if mode != "agg":
            args += ["--disaggregation-mode", mode]
        fleet.spawn(f"dynamo-{tag}-mocker-{mode}", args, {}, python=python, env=env)
    ports = {"http": free_port()}
    args = ["dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(ports["http"]), *common]
    return fleet.spawn(
        f"dynamo-{tag}-frontend", [*args, "--router-mode", "round-robin"], ports, python=python, env=env
    )


def _ours(
    fleet: Fleet, tag: str, modes: tuple[str, ...], frontend_args: list[str], http_port: int = 0
) -> Proc:
    ns = f"peers-{tag}"
    for mode in modes:
        fleet.mocker(ns, "null" if mode == "agg" else mode, speedup=SPEEDUP)
    return fleet.frontend(ns, "round-robin", *frontend_args, http_port=http_port)


@dataclass(frozen=True)
class Side:
    name: str
    start: Callable[[Fleet, str, tuple[str, ...]], Proc]  # (fleet, tag, worker modes) -> frontend
    env: dict[str, str]


def _compare(workdir: Path, model_dir: Path, sides: list[Side], rounds: int, seed: int) -> dict:
    """Every system's stack up at once (idle but one), every load through each in turn, ``rounds``
    times, alternating which goes first, so that a machine busy with other work at one moment
    weighs on all of them alike. ``{side: {load: [Result per round]}}``."""
    results: dict[str, dict[str, list[Result]]] = {side.name: {} for side in sides}
    for tag, modes, loads in (("agg", ("agg",), LOADS), ("disagg", ("prefill", "decode"), (DISAGG_LOAD,))):
        with contextlib.ExitStack() as stack:
            stacks = []
            for i, side in enumerate(sides):
                fleet = stack.enter_context(Fleet(workdir / f"{i}-{tag}", model_dir, MODEL, side.env))
                stacks.append((side, fleet, side.start(fleet, tag, modes)))
            for _, fleet, frontend in stacks:
                _wait_serving(fleet, frontend)
            for load in loads:
                for round_ in range(rounds):
                    order = stacks if round_ % 2 == 0 else stacks[::-1]
                    for side, fleet, frontend in order:
                        workers = [p for p in fleet.procs if p is not frontend]
                        result = _run(frontend, workers, load, seed + round_)
                        results[side.name].setdefault(f"{tag}: {load.name}", []).append(result)
                print(f"  {tag}: {load.name}: done", flush=True)
    return results


def _rows(r: Result, load: str) -> list[tuple[str, float | None, bool]]:
    """(figure, value, higher is better)."""
    rep = r.report
    rows: list[tuple[str, float | None, bool]] = []
    if "non-streaming" in load:
        rows.append(("requests/s", rep.requests_per_s, True))
    else:
        rows.append(("output tokens/s", rep.output_tokens_per_s, True))
        rows.append(("TTFT p50 ms", rep.ttft_ms.p50 if rep.ttft_ms else None, False))
        rows.append(("ITL p50 ms", rep.itl_ms.p50 if rep.itl_ms else None, False))
    rows.append(("frontend CPU us/request", r.cpu_us_per_request, False))
    rows.append(("frontend CPU us/token", r.cpu_us_per_token, False))
    rows.append(("worker CPU us/token", r.worker_cpu_us_per_token, False))
    rows.append(("errors", float(sum(rep.errors.values())), False))
    return rows


def _median_rows(results: list[Result], load: str) -> list[tuple[str, float | None, bool]]:
    per_round = [_rows(r, load) for r in results]
    out = []
    for i, (name, _, higher) in enumerate(per_round[0]):
        values = [rows[i][1] for rows in per_round if rows[i][1] is not None]
        out.append((name, statistics.median(values) if values else None, higher))
    return out


def _table(results: dict[str, dict[str, list[Result]]], ours: str, others: list[str]) -> str:
    cell = lambda v: "-" if v is None else f"{v:.1f}" if abs(v) >= 1 else f"{v:.3f}"  # noqa: E731
    names = [*others, ours]
    head = f"{'workload / figure (median of rounds)':<50}" + "".join(f"{n:>16}" for n in names)
    head += "".join(f"{'ours/' + n.removeprefix('ours ').split()[0]:>16}" for n in others)
    lines = [head]
    for load in results[ours]:
        rows = {n: _median_rows(results[n][load], load) for n in names}
        for i, (figure, value, higher) in enumerate(rows[ours]):
            if figure == "errors" and not any(rows[n][i][1] for n in names):
                continue
            line = f"{load + ' / ' + figure:<50}" + "".join(f"{cell(rows[n][i][1]):>16}" for n in names)
            for n in others:
                other = rows[n][i][1]
                line += f"{(f'{value / other:.2f}' if value and other else ''):>16}"
            lines.append(line + ("  (higher is better)" if higher else "  (lower is better)"))
    for n in names:
        agg = _median_rows(results[n][f"agg: {DISAGG_LOAD.name}"], "streaming")[0][1] or 0.0
        dis = _median_rows(results[n][f"disagg: {DISAGG_LOAD.name}"], "streaming")[0][1] or 0.0
        ratio = f"{dis / agg:.2f}" if agg else "-"
        lines.append(f"{n}: disaggregated / aggregated tokens/s = {dis:.0f} / {agg:.0f} = {ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dynamo-venv", type=Path, required=True, help="venv with ai-dynamo 1.6.1")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each load per system (median)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--frontend-args", default="", help="extra flags for our frontend, e.g. '--http-workers 2'"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also run ours from this source tree (e.g. `git archive main`), as 'ours before'",
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="process logs (default: a temporary folder)"
    )
    args = parser.parse_args(argv)
    model_dir = ensure_word_model(CACHE / "word-model")
    frontend_args = args.frontend_args.split()
    sides = [
        Side("Dynamo 1.6.1", lambda f, t, m: _dynamo(f, args.dynamo_venv, t, m), {}),
        Side("ours", lambda f, t, m: _ours(f, t, m, frontend_args), {}),
    ]
    if args.baseline is not None:
        # Its own packages before this tree's (an older tree has no api/: its base is inside the operator).
        roots = [args.baseline.resolve() / d for d in ("api", "operator", "worker")]
        before = {"PYTHONPATH": os.pathsep.join(str(r) for r in roots if r.is_dir())}
        # Given its HTTP port: a tree from before our frontend said where it listens works too.
        sides.append(Side("ours before", lambda f, t, m: _ours(f, t, m, [], free_port()), before))
    with tempfile.TemporaryDirectory(prefix="dynamo-peers-") as tmp:
        workdir = args.workdir or Path(tmp)
        print(
            f"== {', '.join(s.name for s in sides)}: each a frontend + simulated workers at speedup "
            f"{SPEEDUP:g}; completions API, 64 words in; {args.rounds} rounds ==",
            flush=True,
        )
        results = _compare(workdir, model_dir, sides, args.rounds, args.seed)
        others = [s.name for s in sides if s.name != "ours"]
        print("\n" + _table(results, "ours", others), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
