"""dynamo-run stops on a SIGTERM whenever it arrives, also in the middle of a line it is writing to its
console: the case that once left it running until killed (a handler that logged in the interrupted
thread waited for the console's lock that thread held). The scenario runs in a Python process of its
own, bounded, so that a deadlock fails the test instead of hanging the suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

SCENARIO = textwrap.dedent(
    """
    import io, logging, signal, threading

    from dynamo_worker.local.signals import handled
    from dynamo_worker.local.supervisor import Console, ConsoleLogHandler

    class SignalledMidLine(io.StringIO):
        '''A terminal on which the SIGTERM arrives while the main thread writes its first line.'''
        armed = True

        def write(self, text):
            if self.armed:
                self.armed = False
                signal.raise_signal(signal.SIGTERM)
            return super().write(text)

    stream = SignalledMidLine()
    log = logging.getLogger("dynamo-run-test")
    log.addHandler(ConsoleLogHandler(Console(stream)))
    log.setLevel(logging.INFO)
    stopping = threading.Event()

    def react(sig):
        log.info("Stopping on %s", sig.name)
        stopping.set()

    with handled([signal.SIGTERM], react):
        log.info("Serving")
        assert stopping.wait(10), "the SIGTERM was not acted on"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the previous handler is back
    print(stream.getvalue(), end="")
    """
)


def test_a_sigterm_that_arrives_mid_console_line_stops_the_run():
    proc = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["dynamo-run | Serving", "dynamo-run | Stopping on SIGTERM"]
