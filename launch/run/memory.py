"""Memory and CPU time of a run's processes on this node, sampled in a thread (memory: peak per
process and in total; CPU: seconds per process kind, to tell where the cores' time goes).

Proportional set size (PSS: shared pages split between the processes that map them), so the
total counts vLLM's and torch's shared libraries and Ray's shared-memory object store once.

Called by the training loop when every process of the run descends from the driver (a Ray
cluster the run started, or ``topology=local``): it watches the driver and its descendants, and
with Ray every process in the driver's Ray session (raylet, GCS, Ray workers and their children:
vLLM engine cores and workers, env workers). Reports peaks per process kind and the peak of the
total, for the memory budget, and each sample's total per kind, for finding what grows in a
long run. CPU seconds (user + system) are cumulative per kind since each process started; a
process that has exited keeps its last sampled reading.

Reading a process's PSS costs the kernel a walk of its page tables (milliseconds for a torch
process, tens of them for a run's processes: docs/benchmarks.md), its CPU times far less: the
training loop takes ``sample_cpu`` at every step, where the learner waits on it, and the memory
figures of the thread's last ``sample``.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import psutil


def _kind(p: psutil.Process) -> str:
    try:
        name = " ".join(p.cmdline()[:3])
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    for key in ("LearnerWorker", "InferenceActor", "EngineCore", "VLLM::Worker", "raylet", "gcs_server",
                "dashboard", "RuntimeEnvAgent", "envs.worker", "warm_start", "forkserver", "multiprocessing"):
        if key.lower() in name.lower():
            return key
    return "ray::" + name.split("ray::")[1].split()[0] if "ray::" in name else "other"


class MemoryMonitor:
    def __init__(self, root_pid: int, interval_s: float = 5.0) -> None:
        self.root = psutil.Process(root_pid)
        self.interval_s = interval_s
        self.peak_total = 0
        self.total = 0
        """The total PSS of the last ``sample`` (0 before the first)."""
        self.peak_by_pid: dict[int, tuple[str, int]] = {}
        self.current: dict[str, int] = {}
        self.cpu_by_pid: dict[int, tuple[str, float]] = {}
        self._lock = threading.Lock()  # the thread's samples and the caller's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-monitor", daemon=True)
        self._thread.start()

    def _processes(self) -> list[psutil.Process]:
        procs = {self.root.pid: self.root}
        for p in self.root.children(recursive=True):
            procs[p.pid] = p
        # Ray's processes are children of raylet, which the driver started (local cluster).
        return list(procs.values())

    def sample(self) -> int:
        """The total PSS now, in bytes; also sets ``current`` (bytes now, summed per kind) and
        the CPU times."""
        total, current = 0, defaultdict[str, int](int)
        with self._lock:
            for p in self._processes():
                try:
                    rss = p.memory_full_info().pss
                    cpu = p.cpu_times()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                total += rss
                kind = self._kind_of(p)
                current[kind] += rss
                peak = self.peak_by_pid.get(p.pid, (kind, 0))[1]
                self.peak_by_pid[p.pid] = (kind, max(peak, rss))
                self.cpu_by_pid[p.pid] = (kind, cpu.user + cpu.system)
            self.peak_total = max(self.peak_total, total)
            self.total, self.current = total, dict(current)
        return total

    def sample_cpu(self) -> None:
        """The CPU times now, without the memory (cheap: see the module docstring)."""
        with self._lock:
            for p in self._processes():
                try:
                    cpu = p.cpu_times()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                self.cpu_by_pid[p.pid] = (self._kind_of(p), cpu.user + cpu.system)

    def _kind_of(self, p: psutil.Process) -> str:
        kind = self.peak_by_pid.get(p.pid, (None, 0))[0]
        if kind is None or kind == "other" or kind.startswith("ray::"):
            kind = _kind(p)  # a pre-started Ray worker shows its role only once it has one
        return kind

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds per process kind as of the last sample (user + system, since each started)."""
        out: dict[str, float] = defaultdict(float)
        with self._lock:
            for kind, seconds in self.cpu_by_pid.values():
                out[kind] += seconds
        return dict(out)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def report(self) -> dict[str, float]:
        """``memory/peak_total_gib`` and the largest per-process peak of each kind, in GiB."""
        by_kind: dict[str, int] = defaultdict(int)
        with self._lock:
            for kind, rss in self.peak_by_pid.values():
                by_kind[kind] = max(by_kind[kind], rss)
        out = {"memory/peak_total_gib": self.peak_total / 2**30}
        out.update({f"memory/peak_{k}_gib": v / 2**30 for k, v in sorted(by_kind.items())})
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
