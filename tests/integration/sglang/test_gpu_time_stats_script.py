"""tests/gpu/time_stats.py on log lines in SGLang 0.5.17's ``--enable-request-time-stats-logging`` format
(``ReqTimeStats(...)`` as ``Req.log_time_stats`` writes it): per role, the medians of each stage, and
when the decode leg reached its engine after the prefill leg; dynamo-run's own log, which repeats
every process's lines, counts once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.gpu_scripts import GPU_DIR

pytestmark = pytest.mark.integration

PREFILL = (
    "[2026-11-27 10:00:00 TP0] ReqTimeStats(rid=r{i}-prefill-a1, bootstrap_room={room}, input_len=8192, "
    "cached_input_len=0, output_len=1, attempts=0, type=prefill): bootstrap_duration={boot}ms, "
    "queue_duration=1.00ms, forward_duration=300.00ms, entry_time={entry:.3f}, transfer_speed=40.00 GB/s, "
    "transfer_total=1024.00 MB"
)
DECODE = (
    "[2026-11-27 10:00:00 TP0] ReqTimeStats(rid=r{i}-b2, bootstrap_room={room}, input_len=8192, "
    "cached_input_len=0, output_len=256, attempts=0, type=decode): bootstrap_duration=5.00ms, "
    "alloc_wait_duration=0.10ms, transfer_duration={transfer}ms, queue_duration=2.00ms, "
    "forward_duration=2000.00ms, entry_time={entry:.3f}"
)


def test_stage_medians_per_role_and_the_legs_order(tmp_path):
    stack = tmp_path / "ours"
    stack.mkdir()
    prefill = [PREFILL.format(i=i, room=1000 + i, boot=10 * (i + 1), entry=100.0 + i) for i in range(3)]
    decode = [DECODE.format(i=i, room=1000 + i, transfer=290 + i, entry=100.004 + i) for i in range(3)]
    (stack / "prefill-0.log").write_text("\n".join(["noise", *prefill]) + "\n")
    (stack / "decode-0.log").write_text("\n".join(decode) + "\n")
    (stack / "dynamo-run.log").write_text("\n".join(f"prefill-0  | {line}" for line in prefill) + "\n")
    out = subprocess.run(
        [sys.executable, str(GPU_DIR / "time_stats.py"), str(stack)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "6 requests with SGLang time stats" in out
    assert "prefill  bootstrap 20.0  forward 300.0  queue 1.0  n=3" in out
    assert "decode   alloc_wait 0.1  bootstrap 5.0  forward 2000.0  queue 2.0  transfer 291.0  n=3" in out
    assert "legs     decode - prefill arrival 4.0  n=3" in out
