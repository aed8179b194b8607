"""launch.run.memory.MemoryMonitor sees a child process's memory grow."""

import os
import subprocess
import sys
import time

import pytest

from launch.run.memory import MemoryMonitor


def test_monitor_counts_a_child_that_allocates():
    monitor = MemoryMonitor(os.getpid(), interval_s=60)  # sampled by hand below
    base = monitor.sample()
    child = subprocess.Popen([sys.executable, "-c",
                              "b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096]); "
                              "import time; time.sleep(30)"])
    try:
        deadline = time.time() + 20
        while (total := monitor.sample()) < base + (250 << 20) and time.time() < deadline:
            time.sleep(0.2)
        report, current = monitor.report(), monitor.current
        assert sum(current.values()) == total and max(current.values()) >= 250 << 20
    finally:
        child.kill()
        child.wait()
        monitor.close()
    assert report["memory/peak_total_gib"] * 2**30 >= base + (250 << 20)
    assert max(v for k, v in report.items() if k != "memory/peak_total_gib") >= 250 / 1024


def test_a_process_is_classified_again_once_it_takes_a_role():
    """Ray pre-starts workers under a generic command line and retitles one when it becomes,
    say, a learner: the monitor must follow (it used to keep such a learner under "other")."""
    monitor = MemoryMonitor(os.getpid(), interval_s=60)
    child = subprocess.Popen(["bash", "-c", 'r=ray; n=Learner; sleep 1.5; exec -a "${r}::${n}Worker" sleep 30'])
    try:
        monitor.sample()
        assert monitor.peak_by_pid[child.pid][0] == "other"
        deadline = time.time() + 10
        while monitor.peak_by_pid[child.pid][0] != "LearnerWorker" and time.time() < deadline:
            time.sleep(0.2)
            monitor.sample()
        assert "LearnerWorker" in monitor.current
    finally:
        child.kill()
        child.wait()
        monitor.close()


def test_cpu_seconds_count_a_busy_child_and_keep_it_after_it_exits():
    monitor = MemoryMonitor(os.getpid(), interval_s=60)
    busy = subprocess.Popen(["bash", "-c", 'n=Learner; exec -a "ray::${n}Worker" ' + sys.executable
                             + ' -c "import time; t = time.process_time() + 0.8\nwhile time.process_time() < t: pass"'])
    idle = subprocess.Popen(["bash", "-c", 'n=Inference; exec -a "ray::${n}Actor" sleep 30'])
    try:
        deadline = time.time() + 20
        while busy.poll() is None and time.time() < deadline:
            monitor.sample()
            time.sleep(0.05)
        monitor.sample()  # the busy child is gone: its last reading stays
        cpu = monitor.cpu_seconds()
    finally:
        for child in (busy, idle):
            child.kill()
            child.wait()
        monitor.close()
    assert 0.6 <= cpu["LearnerWorker"] < 3.0
    assert cpu["InferenceActor"] < 0.2


def test_soak_growth_compares_medians_after_warmup_and_at_the_end():
    from tests.benchmarks.soak import growth

    flat = [(t, 100.0) for t in range(0, 1500, 10)]
    assert growth(flat, warmup_s=300)["growth"] == 0.0
    ramp = [(t, 100.0 + (t >= 1200) * 10.0) for t in range(0, 1500, 10)]  # +10% in the last 5 min
    assert growth(ramp, warmup_s=300)["growth"] == pytest.approx(0.10)
    spike = [(t, 100.0 + (t == 700) * 1e6) for t in range(0, 1500, 10)]  # one outlier: medians
    assert growth(spike, warmup_s=300)["growth"] == 0.0
    with pytest.raises(ValueError, match="too short"):
        growth([(t, 1.0) for t in range(0, 600, 10)], warmup_s=300)


def test_sample_cpu_reads_cpu_times_and_leaves_the_memory_to_the_full_sample():
    monitor = MemoryMonitor(os.getpid(), interval_s=60)
    busy = subprocess.Popen(["bash", "-c", 'n=Learner; exec -a "ray::${n}Worker" ' + sys.executable
                             + ' -c "import time; t = time.process_time() + 0.5\nwhile time.process_time() < t: pass"'])
    try:
        deadline = time.time() + 20
        while busy.poll() is None and time.time() < deadline:
            monitor.sample_cpu()
            time.sleep(0.05)
        cpu = monitor.cpu_seconds()
        assert monitor.total == 0 and monitor.current == {}  # no PSS was read
        assert monitor.sample() > 0 and monitor.total > 0
    finally:
        busy.kill()
        busy.wait()
        monitor.close()
    assert 0.4 <= cpu["LearnerWorker"] < 3.0
