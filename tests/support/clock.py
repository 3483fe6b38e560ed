"""A fake :class:`dynamo_operator.reconcile.workqueue.Clock`: time moves only when a test says so."""

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class FakeTimer:
    due: float
    callback: Callable[..., object]
    args: tuple
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True

    def when(self) -> float:
        return self.due


@dataclass
class FakeClock:
    """Time that moves only when the test says so; due timers fire on ``advance``."""

    now: float = 100.0
    timers: list[FakeTimer] = field(default_factory=list)

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., object], *args: object) -> FakeTimer:
        timer = FakeTimer(when, callback, args)
        self.timers.append(timer)
        return timer

    def scheduled(self) -> list[float]:
        return sorted(t.due for t in self.timers if not t.cancelled)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for timer in sorted(self.timers, key=lambda t: t.due):
            if not timer.cancelled and timer.due <= self.now:
                self.timers.remove(timer)
                timer.callback(*timer.args)
