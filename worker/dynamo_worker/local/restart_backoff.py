"""When ``dynamo-run --restart always`` starts an exited worker again: as the kubelet restarts the
container of a pod whose restartPolicy is Always. Pure.

The first restart comes at once; while the process keeps exiting within ``RESET_AFTER_S`` of its start,
each next one waits twice as long, from ``BACKOFF_START_S`` up to ``BACKOFF_MAX_S`` (the kubelet's
CrashLoopBackOff: 10 s, 20 s, 40s, ... 5 minutes). The pods of a multinode group restart together, as
the operator restarts a group, so they share one back-off (keyed by the group).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BACKOFF_MAX_S", "BACKOFF_START_S", "RESET_AFTER_S", "RestartBackoff"]

BACKOFF_START_S = 10.0
BACKOFF_MAX_S = 300.0
RESET_AFTER_S = 600.0  # a process that ran this long before exiting starts the back-off afresh


@dataclass
class RestartBackoff:
    restarts: int = 0  # since the back-off last started afresh

    def delay(self, ran_s: float) -> float:
        """Seconds to wait before starting again something that exited after running ``ran_s``."""
        if ran_s >= RESET_AFTER_S:
            self.restarts = 0
        self.restarts += 1
        if self.restarts == 1:
            return 0.0
        return min(BACKOFF_START_S * 2.0 ** (self.restarts - 2), BACKOFF_MAX_S)
