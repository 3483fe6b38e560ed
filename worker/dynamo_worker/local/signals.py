"""SIGINT and SIGTERM, handled on a thread of their own instead of wherever they interrupt the main one.

Python runs a signal handler in the main thread between two bytecodes, wherever that thread was: in
``Console.write`` holding the console's lock, in ``Event.wait`` holding the event's lock. A handler
that logs or sets an event there waits for a lock its own thread holds, forever: dynamo-run once sat
on a SIGTERM that way until it was killed. So the handler here only writes the signal's number into a
pipe, and a thread reads it and calls ``react``, where taking locks is safe.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType

__all__ = ["handled"]


@contextlib.contextmanager
def handled(signals: Iterable[signal.Signals], react: Callable[[signal.Signals], None]) -> Iterator[None]:
    """Within the block, each of ``signals`` calls ``react(signal)`` on the signal thread, in the order
    they came; the previous handlers are back after it."""
    read_fd, write_fd = os.pipe()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        os.write(write_fd, bytes([signum]))  # no lock, no allocation that could wait: see the docstring

    def pump() -> None:
        while data := os.read(read_fd, 64):
            for signum in data:
                react(signal.Signals(signum))

    thread = threading.Thread(target=pump, name="signals", daemon=True)
    thread.start()
    previous = {s: signal.signal(s, on_signal) for s in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(write_fd)  # the pump reads the pipe's end and returns
        thread.join(timeout=5.0)
        if not thread.is_alive():  # a react still running keeps its pipe open
            os.close(read_fd)
