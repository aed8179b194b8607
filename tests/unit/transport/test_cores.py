"""transport/cores.py: every thread of the process is bound, unusable cores are left out."""

import os
import threading

import pytest

from transport.cores import bind_cores

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")


@pytest.fixture
def restore_affinity():
    before = os.sched_getaffinity(0)
    yield before
    bind_cores(before)


def test_every_thread_is_bound_and_new_threads_inherit(restore_affinity):
    first = min(restore_affinity)
    started, stop = threading.Event(), threading.Event()
    seen = {}

    def worker():
        seen["tid"] = threading.get_native_id()
        started.set()
        stop.wait()

    t = threading.Thread(target=worker)
    t.start()
    started.wait()
    try:
        assert bind_cores([first]) == (first,)
        assert os.sched_getaffinity(seen["tid"]) == {first}  # a thread that was already running
        assert os.sched_getaffinity(0) == {first}
        later = {}
        t2 = threading.Thread(target=lambda: later.update(cores=os.sched_getaffinity(0)))
        t2.start()
        t2.join()
        assert later["cores"] == {first}  # and one started after
    finally:
        stop.set()
        t.join()


def test_a_core_the_process_may_not_use_binds_nothing(restore_affinity):
    assert bind_cores([min(restore_affinity), 100_000]) == ()
    assert bind_cores([100_000]) == () and bind_cores([]) == ()
    assert os.sched_getaffinity(0) == restore_affinity
