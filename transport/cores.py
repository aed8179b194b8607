"""Pin this process to CPU cores (Linux ``sched_setaffinity``).

On a CPU-only node the learner's torch threads and the vLLM worker's OpenMP threads would
otherwise share cores: vLLM binds its worker to core 0 of its own accord, the learner spreads
its threads over every core, and its thread on core 0 then holds every parallel region back
(docs/results.md has the default job's steps both ways).
The placement (launch/topology/placement.py) hands each CPU-only learner rank and actor its own cores;
the learner worker and the actor call ``bind_cores`` with them before they start threads or
child processes, which inherit the binding (the actor's vLLM engine and env workers).

Every thread of the process is bound, not only the caller: a Ray actor's methods may run on a
thread other than the one that built it. A no-op where affinity is not supported (macOS) and
where any given core is one the process may not use (a Ray node that advertises more CPUs
than the machine has): the process then runs where the operating system puts it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def bind_cores(cores: Iterable[int]) -> tuple[int, ...]:
    """Bind every thread of this process to ``cores``; the cores bound, () when nothing was
    changed (none given, or one of them not usable here)."""
    wanted = set(cores)
    if not hasattr(os, "sched_setaffinity") or not wanted or not wanted <= os.sched_getaffinity(0):
        return ()
    usable = tuple(sorted(wanted))
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, usable)
        except ProcessLookupError:  # the thread ended meanwhile
            pass
    return usable


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except FileNotFoundError:  # no procfs: the calling thread only
        return [0]
