"""The one log line a component writes once a listener is bound, and its reading back.

Every listener of ours (frontend HTTP, system server, request plane, bootstrap, planner metrics) takes
port 0 for "any free port" and, once bound, logs ``NAME: listening on SCHEME://HOST:PORT`` with the
port it got. Whoever started the process with port 0 (a test, a script) reads the port back from that
line with ``bound_ports``: no port is picked in advance and bound later, which races other processes.
The line is written at every ``DYN_LOG_LEVEL`` (its logger is kept at INFO), as launchers depend on it.
A listener that cannot bind says which flag sets its port and what to do (``binding``); ``serve`` does
all of it for an aiohttp app.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from dynamo_api.errors import DynamoError

__all__ = ["PortUnavailable", "binding", "bound_ports", "log_listening", "serve"]

log = logging.getLogger(__name__)
log.setLevel(logging.INFO)  # not the root's level: a launcher reads this line even from a quiet process

_LINE = re.compile(r"\b(?P<name>[a-z][a-z-]*): listening on [a-z]+://(?:\[[^\]]*\]|[^\s:/\"]+):(?P<port>\d+)")


def log_listening(name: str, scheme: str, host: str, port: int) -> str:
    """Log that listener ``name`` (lower case, dashes) is bound to ``host:port``; returns its URL."""
    url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
    log.info("%s: listening on %s", name, url)
    return url


def bound_ports(text: str) -> dict[str, int]:
    """The ports that the listening lines in ``text`` (a process's log) name, by listener; a listener
    logged twice (a restart, several serving processes) keeps its first port."""
    found: dict[str, int] = {}
    for m in _LINE.finditer(text):
        found.setdefault(m["name"], int(m["port"]))
    return found


class PortUnavailable(DynamoError, OSError):
    """A listener could not bind; the message names the flag that sets its port and the fix."""


def _bind_error(what: str, flag: str, host: str, port: int, error: OSError) -> str:
    where = f"{what} cannot listen on {f'[{host}]' if ':' in host else host}:{port}"
    if error.errno == errno.EADDRINUSE:
        return (
            f"{where}: the port is in use by another process (several workers or frontends on one "
            f"host need a port each): pass another {flag}, or {flag} 0 for any free port"
        )
    if error.errno == errno.EACCES:
        return f"{where}: ports below 1024 need privileges: pass {flag} 1024 or above, or {flag} 0"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"{where}: {host} is not an address of this machine: listen on one of its addresses or 0.0.0.0"
    return f"{where}: {error.strerror or error}: check the listen address and {flag}"


@contextlib.contextmanager
def binding(what: str, flag: str, host: str, port: int) -> Iterator[None]:
    """Around the bind of a listener: an ``OSError`` becomes a ``PortUnavailable`` that names ``flag``."""
    try:
        yield
    except OSError as e:
        raise PortUnavailable(_bind_error(what, flag, host, port, e)) from None


async def serve(
    app: web.Application,
    name: str,
    host: str,
    port: int,
    *,
    what: str,
    flag: str,
    handler_cancellation: bool = False,
    **site_options: Any,
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port`` (0: any free port) and log listener ``name``'s line; returns the
    runner and the bound port. A port it cannot bind is a ``PortUnavailable`` naming ``flag``, with the
    runner cleaned up."""
    runner = web.AppRunner(app, handler_cancellation=handler_cancellation, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, **site_options)
    try:
        with binding(what, flag, host, port):
            await site.start()
    except PortUnavailable:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1]
    log_listening(name, "http", host, bound)
    return runner, bound
