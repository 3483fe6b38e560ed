"""The listening line: what ``log_listening`` writes is what ``bound_ports`` reads back, in text and in
JSON logs, for IPv4 and IPv6 hosts, even from a process that logs only errors; other lines, and later
lines of a listener already seen, do not change the answer. A listener that cannot bind names the flag
that sets its port and the fix for the reason it failed."""

from __future__ import annotations

import errno
import io
import logging

import orjson
import pytest
from dynamo_worker.runtime.listening import PortUnavailable, binding, bound_ports, log_listening

TEXT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def test_logged_ports_read_back_by_listener(caplog):
    with caplog.at_level(logging.INFO):
        assert log_listening("frontend", "http", "127.0.0.1", 43121) == "http://127.0.0.1:43121"
        assert log_listening("system", "http", "::", 9090) == "http://[::]:9090"
        logging.getLogger("dynamo_worker").warning("Started request plane host=127.0.0.1 port=1")  # not one
        log_listening("request-plane", "http", "0.0.0.0", 40001)
        log_listening("frontend", "http", "127.0.0.1", 5)  # a second serving process: the first one wins
    text = "\n".join(TEXT.format(r) for r in caplog.records)
    assert bound_ports(text) == {"frontend": 43121, "system": 9090, "request-plane": 40001}
    as_json = "\n".join(orjson.dumps({"message": r.getMessage()}).decode() for r in caplog.records)
    assert bound_ports(as_json) == bound_ports(text)


def test_written_however_quiet_the_process_is():
    root, out = logging.getLogger(), io.StringIO()
    handler, level = logging.StreamHandler(out), root.level
    root.addHandler(handler)
    root.setLevel(logging.ERROR)  # DYN_LOG_LEVEL=ERROR
    try:
        log_listening("system", "http", "127.0.0.1", 9)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    assert bound_ports(out.getvalue()) == {"system": 9}


def test_no_listening_line_no_ports():
    assert bound_ports("INFO x: Worker ready address=127.0.0.1:4000\nfrontend listening on :80") == {}


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (errno.EADDRINUSE, "the port is in use by another process (several workers or frontends on one "
         "host need a port each): pass another --system-port, or --system-port 0 for any free port"),
        (errno.EACCES, "ports below 1024 need privileges: pass --system-port 1024 or above, or "
         "--system-port 0"),
        (errno.EADDRNOTAVAIL, "10.9.9.9 is not an address of this machine: listen on one of its addresses "
         "or 0.0.0.0"),
        (errno.EMFILE, "Too many open files: check the listen address and --system-port"),
    ],
)  # fmt: skip
def test_a_failed_bind_names_the_flag_and_the_fix(code, says):
    with pytest.raises(PortUnavailable) as e, binding("the system server", "--system-port", "10.9.9.9", 80):
        raise OSError(code, "Too many open files" if code == errno.EMFILE else "unused")
    assert str(e.value) == f"the system server cannot listen on 10.9.9.9:80: {says}"
    assert isinstance(e.value, OSError)  # callers that handle OSError still do
