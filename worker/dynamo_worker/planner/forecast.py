"""Forecasts of the next interval's load from the intervals observed so far. Pure.

The default predictor is ``constant``: the next interval looks like the last one. With adjustment
intervals of tens of seconds, the traffic a planner has to follow is mostly steps (a launch, a batch
job, a region failing over) and plateaus; the last interval is the unbiased forecast of a plateau and
reacts to a step within one interval, where a trend model overshoots after a step up and keeps too
many replicas after a step down (and a model fitted on a long window, like ARIMA or Prophet, lags a
step by half its window). ``trend`` (Holt's linear exponential smoothing) is offered for slow steady
ramps, where following the slope buys one interval of headroom.

Each series (request rate, input length, output length) is forecast on its own; a length is updated
only from intervals that could tell it, so an idle interval does not read as length 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dynamo_worker.planner.decide import Load

__all__ = ["PREDICTORS", "Forecaster"]

PREDICTORS = ("constant", "trend")
Predictor = Literal["constant", "trend"]


@dataclass
class _Holt:
    alpha: float
    beta: float
    level: float | None = None
    slope: float = 0.0

    def update(self, x: float) -> None:
        if self.level is None:
            self.level = x
            return
        previous = self.level
        self.level = self.alpha * x + (1 - self.alpha) * (self.level + self.slope)
        self.slope = self.beta * (self.level - previous) + (1 - self.beta) * self.slope

    def next(self) -> float | None:
        return None if self.level is None else max(self.level + self.slope, 0.0)


class Forecaster:
    """Feed it each interval's observed ``Load``; ``predict`` gives the next interval's."""

    def __init__(self, predictor: Predictor = "constant", alpha: float = 0.8, beta: float = 0.5) -> None:
        if predictor not in PREDICTORS:
            raise ValueError(f"unknown load predictor {predictor!r}; use one of {', '.join(PREDICTORS)}")
        self.predictor = predictor
        a, b = (1.0, 0.0) if predictor == "constant" else (alpha, beta)
        self._rate, self._isl, self._osl = _Holt(a, b), _Holt(a, b), _Holt(a, b)

    def observe(self, load: Load, *, isl_known: bool | None = None, osl_known: bool | None = None) -> None:
        """``*_known``: whether the interval could tell that length (default: it had requests)."""
        busy = load.request_rate > 0
        self._rate.update(load.request_rate)
        if busy if isl_known is None else isl_known:
            self._isl.update(load.isl)
        if busy if osl_known is None else osl_known:
            self._osl.update(load.osl)

    def predict(self) -> Load | None:
        rate = self._rate.next()
        if rate is None:
            return None
        return Load(rate, self._isl.next() or 0.0, self._osl.next() or 0.0)
