"""dynamo-run --restart always starts an exited worker again as the kubelet does: at once, then after
10 s, 20 s, 40 s ... up to 300 s while it keeps exiting soon after starting, and afresh once it ran ten
minutes."""

from __future__ import annotations

from dynamo_worker.local.restart_backoff import RestartBackoff


def test_first_restart_is_at_once_then_the_wait_doubles_up_to_five_minutes():
    backoff = RestartBackoff()
    assert [backoff.delay(ran_s=5) for _ in range(8)] == [0, 10, 20, 40, 80, 160, 300, 300]


def test_a_process_that_ran_ten_minutes_starts_the_backoff_afresh():
    backoff = RestartBackoff()
    assert [backoff.delay(ran_s=5) for _ in range(3)] == [0, 10, 20]
    assert backoff.delay(ran_s=600) == 0
    assert backoff.delay(ran_s=5) == 10
