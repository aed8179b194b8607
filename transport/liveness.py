"""What a process says when the driver asks whether it is alive: what it is doing, for how
long, and on request the stacks of all its threads.

Held by learner/worker.py's ``LearnerWorker`` (each call the driver makes is an ``Activity``
op) and answered by its ``liveness``; launch/topology/ray_cluster.py asks it on a separate
concurrency group, so a rank stuck in a collective still answers, and puts the answer in the
error that stops the run. No Ray here.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Activity:
    """The op this process is in (``idle`` between ops) and when it began."""

    def __init__(self) -> None:
        self.op, self.since = "idle", time.monotonic()

    @contextmanager
    def doing(self, op: str) -> Iterator[None]:
        self.op, self.since = op, time.monotonic()
        try:
            yield
        finally:
            self.op, self.since = "idle", time.monotonic()

    def report(self, stacks: bool = False) -> dict[str, Any]:
        """``{"pid", "doing", "for_s"}``, and ``"stacks"`` (every thread's) if asked."""
        out: dict[str, Any] = {"pid": os.getpid(), "doing": self.op,
                               "for_s": round(time.monotonic() - self.since, 1)}
        if stacks:
            out["stacks"] = thread_stacks()
        return out


def thread_stacks() -> str:
    """Every thread's stack, innermost call last, as ``traceback`` prints them."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"thread {names.get(ident, ident)}:\n{stack}")
    return "\n".join(parts)
