"""The KV transport NIXL/UCX actually uses, observed rather than declared.

A disaggregated worker asks UCX to describe every protocol it selects (``UCX_PROTO_INFO=y``) into log
files of its own (``UCX_LOG_FILE``), set before SGLang starts its scheduler processes. ``TransportWatch``
reads those files: the tables for "remote memory write/read ... from cuda/..." are the KV cache moving
GPU memory to a peer, and their Config column names the transports (``cuda_ipc``: GPU to GPU on this node
over NVLink or PCIe; ``rc``/``dc``/``ud`` (mlx5): RDMA; ``tcp``: TCP through host memory). Each transport
is logged once, exported as ``dynamo_worker_kv_transport{transport=...} 1``, and a fallback to TCP is a
warning, said once. UCX's own warnings and errors in those files are passed on to the worker's log, so
the redirection hides nothing. Where the user already set ``UCX_LOG_FILE`` or ``UCX_PROTO_INFO``, their
settings stand and the transport is reported as unknown (said once at startup).

A table appears on the first transfer to each peer, so the report comes with the first disaggregated
request, not at startup.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

from dynamo_worker.runtime.aio import cancel_and_wait

__all__ = ["KvTransport", "TransportWatch", "describe", "kv_transports", "observation_env"]

log = logging.getLogger(__name__)

LOG_NAME = "ucx.%p.log"  # UCX replaces %p with the process id (one file per scheduler process)
_PREFIX = re.compile(r"^\[[\d.]+\]\s+\[[^\]]*\]\s*")  # "[1795767372.207410] [vm:1972 :2]"
_TITLE = re.compile(r"remote memory (?:write|read) by \S+ from (\S+) to (\S+)")
_TRANSPORT = re.compile(r"\b([a-z][a-z0-9_]*)/[\w:\[\].\-]+")
_UCX_LEVEL = re.compile(r"\bUCX\s+(WARN|ERROR|FATAL)\b")

_KINDS = {
    "cuda_ipc": "GPU to GPU on this node (NVLink or PCIe peer access)",
    "tcp": "TCP through host memory (slow: no GPU-direct path was found)",
    "cuda_copy": "copied through host memory",
    "sm": "host shared memory",
    "posix": "host shared memory",
    "sysv": "host shared memory",
    "cma": "host memory (cross-memory attach)",
}


def describe(transport: str) -> str:
    if transport.startswith(("rc", "dc", "ud", "gga")):
        return "RDMA (GPUDirect over InfiniBand/RoCE)"
    return _KINDS.get(transport, "another UCX transport")


@dataclass(frozen=True)
class KvTransport:
    transport: str  # UCX's name: cuda_ipc, rc_mlx5, tcp, ...
    source: str  # the memory the KV leaves, e.g. cuda/GPU0
    target: str


def observation_env(environ: Mapping[str, str], folder: Path) -> dict[str, str]:
    """The environment to add so UCX describes its protocols into ``folder``; empty where the user set
    either variable (their choice stands)."""
    if "UCX_LOG_FILE" in environ or "UCX_PROTO_INFO" in environ:
        return {}
    return {"UCX_PROTO_INFO": "y", "UCX_LOG_FILE": str(folder / LOG_NAME)}


def kv_transports(lines: Iterable[str]) -> list[KvTransport]:
    """The transports of every GPU-memory transfer table in UCX's protocol description."""
    found: list[KvTransport] = []
    title: tuple[str, str] | None = None
    for raw in lines:
        line = _PREFIX.sub("", raw).strip()
        if " by ucp_" in line:  # a table's title: which operation, from which memory to which
            match = _TITLE.search(line)
            title = (match[1], match[2]) if match and match[1].startswith("cuda") else None
            continue
        if title is None or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("Range", ""):
            continue
        for transport in _TRANSPORT.findall(cells[-1]):
            one = KvTransport(transport, *title)
            if one not in found:
                found.append(one)
    return found


class TransportWatch:
    """Reads the UCX log files in ``folder`` every ``interval_s``: reports KV transports, passes on
    UCX's warnings and errors."""

    def __init__(self, folder: Path, registry: CollectorRegistry | None, interval_s: float = 1.0) -> None:
        self.folder = folder
        self.interval_s = interval_s
        self.seen: set[str] = set()
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, list[str]] = {}
        self._gauge = (
            Gauge(
                "dynamo_worker_kv_transport",
                "1 for each UCX transport the KV cache was seen moving over (GPU memory to a peer).",
                ["transport"],
                registry=registry,
            )
            if registry is not None
            else None
        )
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kv-transport-watch")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        self.poll()  # what was written last

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.poll()

    def poll(self) -> None:
        for path in sorted(self.folder.glob("ucx.*.log")):
            lines = self._new_lines(path)
            for line in lines:
                if _UCX_LEVEL.search(line):
                    log.warning("UCX: %s", _PREFIX.sub("", line).strip())
            # a table may be cut at the end of a read: parse what came since the last title as a whole
            pending = self._partial.setdefault(path, [])
            pending.extend(lines)
            for kv in kv_transports(pending):
                self._report(kv)
            titles = [i for i, line in enumerate(pending) if "remote memory" in line]
            keep_from = titles[-1] if titles else len(pending)
            del pending[: max(keep_from, len(pending) - 64)]  # a table is a dozen lines

    def _new_lines(self, path: Path) -> list[str]:
        try:
            with path.open("rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # whole lines only
        self._offsets[path] = self._offsets.get(path, 0) + end
        return data[:end].decode(errors="replace").splitlines()

    def _report(self, kv: KvTransport) -> None:
        if kv.transport in self.seen:
            return
        self.seen.add(kv.transport)
        if self._gauge is not None:
            self._gauge.labels(transport=kv.transport).set(1)
        what = describe(kv.transport)
        if kv.transport == "tcp":
            log.warning(
                "KV cache transfers fall back to TCP source=%s target=%s: %s; for GPU-direct transfers "
                "give the pods RDMA devices (graph annotation nvidia.com/rdma) or, on one node, GPU peer "
                "access",
                kv.source,
                kv.target,
                what,
            )
        else:
            log.info(
                "KV cache transfers use transport=%s source=%s target=%s: %s",
                kv.transport,
                kv.source,
                kv.target,
                what,
            )
