"""A performance profile of one engine on one GPU shape, and the interpolation over it. Pure.

The file (JSON) holds two tables, measured by ``python -m dynamo_worker.profile`` or derived by hand:

- ``prefill``: time to first token of a lone request (no queue, no other work) over input lengths;
- ``decode``: inter-token latency over batch size (sequences decoding at once) x context (tokens of
  KV each sequence attends to).

Between points both tables are interpolated linearly (bilinearly for decode); beyond the last point
they are extrapolated linearly from the last two (clamped at the first point below it), so a workload
longer than the sweep is predicted as slower, never as free.

Who reads it: the mocker (``--profile``: its step durations come from these tables, so a simulated
worker is as fast as the profiled engine) and the planner (per-replica capacity within a latency
target).
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from dynamo_api.errors import DynamoError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["DecodeTable", "PrefillTable", "Profile", "ProfileError", "builtin_profile", "load_profile"]

BUILTIN_DIR = Path(__file__).with_name("data")


class ProfileError(DynamoError, ValueError):
    """A profile file that cannot be used; the message names the file, the problem and the fix."""


def _increasing(values: Sequence[float], what: str) -> None:
    if len(values) < 2 or any(b <= a for a, b in itertools.pairwise(values)):
        raise ValueError(f"{what} needs at least 2 strictly increasing points, got {list(values)}")


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys); linear extrapolation beyond the ends from the outer segments."""
    i = bisect.bisect_right(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if x < xs[0]:
        return max(min(y, ys[0]), 0.0)
    return max(y, 0.0)


class PrefillTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    isl: list[int] = Field(description="Input lengths (tokens), increasing.")
    ttft_ms: list[float] = Field(description="Time to first token of a lone request at each input length.")

    @model_validator(mode="after")
    def _check(self) -> PrefillTable:
        _increasing(self.isl, "prefill.isl")
        if len(self.ttft_ms) != len(self.isl) or any(t <= 0 for t in self.ttft_ms):
            raise ValueError("prefill.ttft_ms needs one positive value per prefill.isl point")
        return self


class DecodeTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: list[int] = Field(description="Sequences decoding at once, increasing.")
    context: list[int] = Field(description="KV tokens per sequence, increasing.")
    itl_ms: list[list[float]] = Field(description="itl_ms[i][j]: ITL at batch_size[i] and context[j].")

    @model_validator(mode="after")
    def _check(self) -> DecodeTable:
        _increasing(self.batch_size, "decode.batch_size")
        _increasing(self.context, "decode.context")
        if len(self.itl_ms) != len(self.batch_size) or any(
            len(row) != len(self.context) or any(v <= 0 for v in row) for row in self.itl_ms
        ):
            raise ValueError("decode.itl_ms needs one row per batch size, one positive value per context")
        return self


class Profile(BaseModel):
    """What an engine does on one replica (``gpus_per_replica`` GPUs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="The profiled model (or its shape).")
    engine: str = Field("sglang", description="The profiled engine and version.")
    gpu: str = Field(description="The GPU model, e.g. H100-SXM-80GB.")
    gpus_per_replica: int = Field(1, ge=1, description="GPUs of one profiled replica (tensor parallel).")
    source: Literal["measured", "derived", "mocker"] = Field(
        description="measured: swept on the engine; derived: computed from other figures (see note); "
        "mocker: swept on the simulated engine (a test fixture, not a performance claim)."
    )
    note: str = Field("", description="How the figures were obtained, by whom, when.")
    prefill: PrefillTable
    decode: DecodeTable

    def ttft_s(self, isl: float) -> float:
        """Time to first token of a lone request of ``isl`` input tokens."""
        return _interp(self.prefill.isl, self.prefill.ttft_ms, isl) / 1e3

    def attention_s(self) -> float:
        """Seconds per (new token x context token) of prefill attention: the TTFT table's curvature
        over its three longest points (a lone request's attention grows with the square of its
        length, the rest of a forward pass linearly); 0 when the table does not bend upwards."""
        if len(self.prefill.isl) < 3:
            return 0.0
        (x0, x1, x2), (y0, y1, y2) = self.prefill.isl[-3:], self.prefill.ttft_ms[-3:]
        curvature = ((y2 - y1) / (x2 - x1) - (y1 - y0) / (x1 - x0)) / (x2 - x0)
        return max(curvature, 0.0) / 1e3

    def pass_s(self, tokens: float) -> float:
        """A prefill forward pass over ``tokens`` new tokens without its attention: the TTFT table less
        ``attention_s() * isl**2``, interpolated (linear beyond the table, as such work grows)."""
        a = self.attention_s() * 1e3
        rest = [t - a * n * n for n, t in zip(self.prefill.isl, self.prefill.ttft_ms, strict=True)]
        return _interp(self.prefill.isl, rest, tokens) / 1e3

    def itl_s(self, batch_size: float, context: float) -> float:
        """Inter-token latency with ``batch_size`` sequences of ``context`` KV tokens each decoding."""
        d = self.decode
        per_row = [_interp(d.context, row, context) for row in d.itl_ms]
        return _interp(d.batch_size, per_row, batch_size) / 1e3

    def max_batch_within(self, itl_target_s: float, context: float, limit: int = 4096) -> int:
        """The largest batch size whose ITL at ``context`` is within the target; 0 when even one
        sequence is slower than the target."""
        if self.itl_s(1, context) > itl_target_s:
            return 0
        lo, hi = 1, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.itl_s(mid, context) <= itl_target_s:
                lo = mid
            else:
                hi = mid - 1
        return lo


def load_profile(path: str | Path) -> Profile:
    """Read a profile file; ``builtin:<name>`` names one shipped in ``dynamo_worker/profile/data``."""
    text_path = str(path)
    if text_path.startswith("builtin:"):
        return builtin_profile(text_path.removeprefix("builtin:"))
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise ProfileError(f"Could not read profile {p}: {e.strerror}; pass an existing file") from e
    except ValueError as e:
        raise ProfileError(
            f"Profile {p} is not JSON ({e}); write it with python -m dynamo_worker.profile"
        ) from e
    try:
        return Profile.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or '<root>'}: {err['msg']}" for err in e.errors()
        )
        raise ProfileError(f"Profile {p} is not valid: {problems}; fix these fields") from e


def builtin_profile(name: str) -> Profile:
    available = sorted(f.stem for f in BUILTIN_DIR.glob("*.json"))
    path = BUILTIN_DIR / f"{name}.json"
    if not path.is_file():
        raise ProfileError(f"No built-in profile {name!r}; available: {', '.join(available)}")
    return load_profile(path)
