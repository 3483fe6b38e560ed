"""What a worker does when its engine dies under it: restart the engine in place, or exit. Pure.

The worker notices the death (``runtime.process_watch``: an engine process exited; or the engine
reported it; or a rank of its multinode group left, ``runtime.group``), ends every in-flight stream
with ``engine_died`` (the frontend continues each on another worker) and deregisters. Then
``decide`` says what comes next:

- ``--on-engine-death restart`` (the default): stop what is left of the engine and start it again in
  this process, then register again. Cheaper than a new pod: no new interpreter, no imports of torch
  and SGLang, no kubelet back-off; the model files are in the page cache either way.
- ``--on-engine-death exit``: exit with ``EXIT_ENGINE_DIED`` so that Kubernetes restarts the container
  (in a fresh process, with whatever state the old one had gone).
- A worker that leads a multinode group always exits: its other ranks must start a new engine
  together with it, which is the group restart (LeaderWorkerSet, or the operator for StatefulSets).
- A crash loop exits too: more than ``--engine-restart-limit`` deaths within
  ``--engine-restart-window-s`` (a poison model, a broken GPU) stop the in-place restarts, and the
  container's own restarts (with Kubernetes' back-off) take over, visibly.
- A restart that fails to start the engine exits as well.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["EXIT_ENGINE_DIED", "OnEngineDeath", "Recovery", "RestartBudget", "decide"]

OnEngineDeath = Literal["restart", "exit"]

EXIT_ENGINE_DIED = 3  # the worker's exit status after its engine died (and it did not restart it)


@dataclass(frozen=True)
class Recovery:
    action: Literal["restart", "exit"]
    why: str


@dataclass
class RestartBudget:
    """The engine deaths of the last ``window_s`` seconds (times from any monotonic clock)."""

    limit: int
    window_s: float
    deaths: deque[float] = field(default_factory=deque)

    def record(self, now: float) -> int:
        """Count a death at ``now``; returns the deaths within the window, this one included."""
        self.deaths.append(now)
        while self.deaths and self.deaths[0] <= now - self.window_s:
            self.deaths.popleft()
        return len(self.deaths)


def decide(mode: OnEngineDeath, *, nnodes: int, deaths: int, budget: RestartBudget) -> Recovery:
    """Restart in place or exit, after the ``deaths``-th death within the budget's window."""
    if nnodes > 1:
        return Recovery(
            "exit",
            f"this worker leads a group of {nnodes} nodes, whose ranks must start a new engine together: "
            "exiting so that the whole group restarts",
        )
    if mode == "exit":
        return Recovery("exit", "--on-engine-death exit: exiting so that Kubernetes restarts the container")
    if deaths > budget.limit:
        return Recovery(
            "exit",
            f"the engine died {deaths} times within {budget.window_s:g}s, more than --engine-restart-limit "
            f"{budget.limit}: a crash loop, so not restarting it in place again; exiting so that Kubernetes "
            "restarts the container (with its back-off). Look for the cause in the engine's log above",
        )
    return Recovery(
        "restart",
        f"restarting the engine in place (restart {deaths} of at most {budget.limit} "
        f"within {budget.window_s:g}s)",
    )
