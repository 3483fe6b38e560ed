"""A port where connections are refused, for tests of what an unreachable peer does; distinct free ports.

``refused_port()`` is bound by this process and never listens, for as long as the process lives: a
connection to it is refused at once, and no other process can take it meanwhile (a port picked free
and left unbound could be). Ports our own components serve on are not picked here: they bind port 0
and the test reads the port back (``tests.support.procs.listening_port``).
"""

from __future__ import annotations

import functools
import socket

__all__ = ["free_ports", "refused_port"]


@functools.cache
def _bound_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # no listen(): connections get a reset (ECONNREFUSED)
    return sock


def refused_port() -> int:
    """A 127.0.0.1 port that refuses connections for the life of this process."""
    return _bound_socket().getsockname()[1]


def free_ports(count: int) -> list[int]:
    """``count`` distinct 127.0.0.1 ports free now, for a process that must be told its ports before it
    starts (picked one at a time, two picks can return the same port: each is free again once picked)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()
