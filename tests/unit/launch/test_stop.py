"""launch.run.loop.Stop: SIGTERM and a first Ctrl-C ask the loop to stop at the next step boundary;
a second Ctrl-C raises KeyboardInterrupt; the previous handlers come back on exit."""

import os
import signal

import pytest

from launch.run.loop import Stop


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_first_signal_requests_a_stop_second_ctrl_c_interrupts(first):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with Stop() as stop:
        assert not stop.requested
        os.kill(os.getpid(), first)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before
