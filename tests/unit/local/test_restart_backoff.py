"""dynamo-run --restart waits like Kubernetes' CrashLoopBackOff, shortened: 1 s, doubling for each
short-lived exit in a row, at most 30 s (the restarts themselves: tests/e2e/test_soak.py)."""

from __future__ import annotations

from dynamo_worker.local.supervisor import RESTART_DELAY_MAX_S, restart_delay


def test_backoff_doubles_up_to_its_cap():
    assert [restart_delay(n) for n in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert restart_delay(10_000) == RESTART_DELAY_MAX_S
