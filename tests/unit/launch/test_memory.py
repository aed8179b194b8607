"""launch.memory.MemoryMonitor sees a child process's memory grow."""

import os
import subprocess
import sys
import time

from launch.memory import MemoryMonitor


def test_monitor_counts_a_child_that_allocates():
    monitor = MemoryMonitor(os.getpid(), interval_s=60)  # sampled by hand below
    base = monitor.sample()
    child = subprocess.Popen([sys.executable, "-c",
                              "b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096]); "
                              "import time; time.sleep(30)"])
    try:
        deadline = time.time() + 20
        while monitor.sample() < base + (250 << 20) and time.time() < deadline:
            time.sleep(0.2)
        report = monitor.report()
    finally:
        child.kill()
        child.wait()
        monitor.close()
    assert report["memory/peak_total_gib"] * 2**30 >= base + (250 << 20)
    assert max(v for k, v in report.items() if k != "memory/peak_total_gib") >= 250 / 1024
