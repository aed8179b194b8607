"""launch.run.loop.Stop: SIGTERM and a first Ctrl-C ask the loop to stop at the next step boundary
(or, while the learner waits for its batch, at the next wait slice); a second Ctrl-C raises
KeyboardInterrupt; the previous handlers come back on exit."""

import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from launch.config.compose import compose
from launch.run.loop import Interrupted, Stop, _train_step


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


class _Learners:
    """A learner that never gets a full batch: each wait returns nothing after ``slice_s``."""

    def __init__(self, slice_s: float) -> None:
        self.slice_s, self.waits = slice_s, 0

    def train_step(self, batch_size, timeout_s):
        self.waits += 1
        time.sleep(self.slice_s)
        return {}


class _Supervisor:
    def __init__(self, learners) -> None:
        self.learners, self.checked = learners, 0

    def check(self, version) -> None:
        self.checked += 1


def test_a_stop_is_honoured_while_the_learner_waits_for_its_batch():
    """With no batch coming (the actors or the env service gone), a stop request ends the
    wait at the next slice instead of after ``train.batch_timeout_s``: no step is taken."""
    cfg = compose(["train.batch_timeout_s=3"])  # without the handling: this error after 3 s
    learners = _Learners(0.05)
    stop = SimpleNamespace(requested=False)
    timer = threading.Timer(0.2, lambda: setattr(stop, "requested", True))
    timer.start()
    t0 = time.monotonic()
    assert _train_step(cfg, _Supervisor(learners), 0, stop) is None
    assert time.monotonic() - t0 < 2 and learners.waits >= 2


def test_without_a_stop_no_batch_within_the_timeout_ends_the_run():
    cfg = compose(["train.batch_timeout_s=0.2"])
    with pytest.raises(RuntimeError, match="no full batch"):
        _train_step(cfg, _Supervisor(_Learners(0.05)), 0, SimpleNamespace(requested=False))


def test_inside_interruptible_a_stop_request_cuts_the_wait_short():
    with Stop() as stop:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        t0 = time.monotonic()
        with pytest.raises(Interrupted, match="the evaluation"):
            with stop.interruptible("the evaluation"):
                time.sleep(5)  # an evaluation that would take long
        assert time.monotonic() - t0 < 2 and stop.requested
        with pytest.raises(Interrupted):  # a request already made: no new long wait starts
            with stop.interruptible("the rollout"):
                raise AssertionError("not entered")


def test_outside_interruptible_a_stop_request_only_marks_the_stop():
    with Stop() as stop:
        with stop.interruptible("the evaluation"):
            pass
        os.kill(os.getpid(), signal.SIGTERM)  # after the wait: nothing is raised
        assert stop.requested


class _SlowRollout(_Supervisor):
    def rollout(self, version) -> None:
        time.sleep(5)


def test_a_stop_during_a_sync_rollout_takes_no_step():
    cfg = compose(["train.mode=sync"])
    learners = _Learners(0.05)
    with Stop() as stop:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        t0 = time.monotonic()
        assert _train_step(cfg, _SlowRollout(learners), 0, stop) is None
    assert time.monotonic() - t0 < 2 and learners.waits == 0
