"""The listening line: what ``log_listening`` writes is what ``bound_ports`` reads back, in text and in
JSON logs, for IPv4 and IPv6 hosts; other lines, and later lines of a listener already seen, do not
change the answer."""

from __future__ import annotations

import logging

import orjson
from dynamo_worker.runtime.listening import bound_ports, log_listening

TEXT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def test_logged_ports_read_back_by_listener(caplog):
    log = logging.getLogger("dynamo_worker.test")
    with caplog.at_level(logging.INFO, logger="dynamo_worker.test"):
        assert log_listening(log, "frontend", "http", "127.0.0.1", 43121) == "http://127.0.0.1:43121"
        assert log_listening(log, "system", "http", "::", 9090) == "http://[::]:9090"
        log.info("Started request plane host=127.0.0.1 port=1")  # not a listening line
        log_listening(log, "request-plane", "http", "0.0.0.0", 40001)
        log_listening(log, "frontend", "http", "127.0.0.1", 5)  # a second serving process: first one wins
    text = "\n".join(TEXT.format(r) for r in caplog.records)
    assert bound_ports(text) == {"frontend": 43121, "system": 9090, "request-plane": 40001}
    as_json = "\n".join(orjson.dumps({"message": r.getMessage()}).decode() for r in caplog.records)
    assert bound_ports(as_json) == bound_ports(text)


def test_no_listening_line_no_ports():
    assert bound_ports("INFO x: Worker ready address=127.0.0.1:4000\nfrontend listening on :80") == {}
