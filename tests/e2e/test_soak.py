"""The soak, CI-sized: ``python -m tests.soak`` (what ``make soak`` runs) for 2 minutes with a fault every
12-20 s instead of 30-60 s, so that every kind comes at least once: dynamo-run --restart always of the soak
graph (2 prefill + 2 decode + 1 embedding mocker, an API key from its environment), mixed traffic, the
frontend restarted, workers SIGKILLed, a prefill worker stopped mid-transfer, NATS restarted. None of
its requests may hang or be lost, the frontend's memory may not grow 10% after its warm-up, and the
key must be required; the table is printed."""

from __future__ import annotations

import json

import pytest

from tests.soak.__main__ import main
from tests.soak.faults import FIRST, ROTATION

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def test_two_minute_soak(tmp_path, capsys):
    report = tmp_path / "report.json"
    argv = [
        "--minutes",
        "2",
        "--fault-interval",
        "12:20",
        "--dir",
        str(tmp_path / "run"),
        "--json-out",
        str(report),
    ]
    status = main(argv)
    out = capsys.readouterr().out
    body = json.loads(report.read_text())
    print(out)
    assert status == 0, body["failures"]
    assert body["hung"] == body["lost"] == 0 and body["failures"] == []
    assert body["answered"] > 0 and body["sent"] == body["answered"] + body["errored"]
    assert {f["kind"] for f in body["faults"]} == {FIRST, *ROTATION}
    assert body["key_checks"] == {"no key": 401, "wrong key": 401, "/health without a key": 200}
    assert "| hung (must be 0)" in body["table"] and "| verdict" in body["table"] and "PASS" in out
