"""A port where connections are refused, for tests of what an unreachable peer does; distinct free ports
(``free_ports``, from ``dynamo_worker.runtime.nats_server``: below the ephemeral range, so that no other
process's port-0 bind or outgoing connection takes one before the process told it binds it).

``refused_port()`` is bound by this process and never listens, for as long as the process lives: a
connection to it is refused at once, and no other process can take it meanwhile (a port picked free
and left unbound could be). Ports our own components serve on are not picked here: they bind port 0
and the test reads the port back (``tests.support.procs.listening_port``).
"""

from __future__ import annotations

import functools
import socket

from dynamo_worker.runtime.nats_server import free_ports

__all__ = ["free_ports", "refused_port"]


@functools.cache
def _bound_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # no listen(): connections get a reset (ECONNREFUSED)
    return sock


def refused_port() -> int:
    """A 127.0.0.1 port that refuses connections for the life of this process."""
    return _bound_socket().getsockname()[1]
