"""The KV transport observed from UCX's protocol description (``dynamo_worker.sglang.transport``).

``tests/fixtures/ucx-proto-info-cuda-ipc.log`` is what UCX wrote (``UCX_PROTO_INFO=y``) in a prefill
worker's scheduler during its first KV transfer on 2 x H100, each engine seeing only its own GPU
(tests/gpu/run_examples.py, 2026-11-27): the KV write goes over ``cuda_ipc``; the host-memory tables
after it (metadata, active messages over ``tcp/lo``) are not KV and must not count.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dynamo_worker.sglang.transport import (
    KvTransport,
    TransportWatch,
    describe,
    kv_transports,
    observation_env,
)
from prometheus_client import CollectorRegistry

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "ucx-proto-info-cuda-ipc.log"

TCP_TABLE = """\
[1795767000.1] [node:7 :2]   +--------+-------------+------------------------------------------+
[1795767000.1] [node:7 :2]   | 1a2b inter-node cfg#3                                            |
[1795767000.1] [node:7 :2]   | remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda/dev[1] |
[1795767000.1] [node:7 :2]   +--------+-------------+------------------------------------------+
[1795767000.1] [node:7 :2]   | Range  | Description |                  Config                  |
[1795767000.1] [node:7 :2]   +--------+-------------+------------------------------------------+
[1795767000.1] [node:7 :2]   | 0..inf | multi-frag copy-in | tcp/eth0                          |
"""


def test_the_cuda_ipc_kv_write_is_found_and_host_tables_are_not_kv():
    found = kv_transports(FIXTURE.read_text().splitlines())
    assert found == [KvTransport("cuda_ipc", "cuda/GPU0", "cuda/dev[2]")]
    assert "NVLink" in describe("cuda_ipc") and "RDMA" in describe("rc_mlx5") and "TCP" in describe("tcp")


def test_the_users_ucx_logging_settings_stand(tmp_path):
    assert observation_env({}, tmp_path) == {
        "UCX_PROTO_INFO": "y",
        "UCX_LOG_FILE": str(tmp_path / "ucx.%p.log"),
    }
    assert observation_env({"UCX_LOG_FILE": "/var/log/ucx"}, tmp_path) == {}
    assert observation_env({"UCX_PROTO_INFO": "n"}, tmp_path) == {}


def test_the_watch_reports_each_transport_once_warns_on_tcp_and_passes_ucx_warnings_on(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="dynamo_worker.sglang.transport")
    registry = CollectorRegistry()
    watch = TransportWatch(tmp_path, registry)
    lines = FIXTURE.read_text().splitlines(keepends=True)
    log_file = tmp_path / "ucx.1234.log"
    with log_file.open("w") as f:  # a table cut by a read in the middle is completed by the next one
        f.writelines(lines[:4])
    watch.poll()
    assert not watch.seen
    with log_file.open("a") as f:
        f.writelines(lines[4:])
        f.write("[1795767372.3] [vm:1972 :2] ucp_ep.c:1507 UCX  WARN  endpoint timed out\n")
    watch.poll()
    assert watch.seen == {"cuda_ipc"}
    assert registry.get_sample_value("dynamo_worker_kv_transport", {"transport": "cuda_ipc"}) == 1
    assert (
        "transport=cuda_ipc" in caplog.text
        and "UCX: ucp_ep.c:1507 UCX  WARN  endpoint timed out" in caplog.text
    )
    (tmp_path / "ucx.99.log").write_text(TCP_TABLE + TCP_TABLE)
    watch.poll()
    assert watch.seen == {"cuda_ipc", "tcp"}
    assert caplog.text.count("fall back to TCP") == 1
    assert any(r.levelno == logging.WARNING and "fall back to TCP" in r.message for r in caplog.records)
