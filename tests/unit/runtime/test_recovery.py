"""What a worker does after its engine died: restart in place by default, exit when asked, always exit
as a multinode leader (the group restarts together), and exit once the deaths in the window exceed the
restart limit (a crash loop)."""

from __future__ import annotations

from dynamo_worker.runtime.process_watch import describe_status
from dynamo_worker.runtime.recovery import RestartBudget, decide


def test_restart_in_place_until_the_limit_then_exit():
    budget = RestartBudget(limit=2, window_s=60)
    actions = [decide("restart", nnodes=1, deaths=budget.record(t), budget=budget).action for t in (0, 1, 2)]
    assert actions == ["restart", "restart", "exit"]
    last = decide("restart", nnodes=1, deaths=3, budget=budget)
    assert "crash loop" in last.why and "--engine-restart-limit 2" in last.why


def test_deaths_outside_the_window_are_forgotten():
    budget = RestartBudget(limit=1, window_s=60)
    assert budget.record(0) == 1
    assert budget.record(61) == 1  # the first one is out of the window
    assert decide("restart", nnodes=1, deaths=1, budget=budget).action == "restart"


def test_exit_when_asked_and_always_as_a_multinode_leader():
    budget = RestartBudget(limit=3, window_s=60)
    assert decide("exit", nnodes=1, deaths=1, budget=budget).action == "exit"
    leader = decide("restart", nnodes=2, deaths=1, budget=budget)
    assert leader.action == "exit" and "group of 2 nodes" in leader.why


def test_a_zero_limit_never_restarts_in_place():
    budget = RestartBudget(limit=0, window_s=60)
    assert decide("restart", nnodes=1, deaths=budget.record(0), budget=budget).action == "exit"


def test_exit_statuses_are_described_as_the_shell_would():
    import os
    import signal

    assert describe_status(os.CLD_EXITED, 1) == "exit code 1"
    assert describe_status(os.CLD_KILLED, signal.SIGKILL) == "signal SIGKILL"
    assert describe_status(os.CLD_DUMPED, 200) == "signal 200"
