"""Resuming a run after a crash, with the real system (Ray, vLLM actors, ZeroMQ, 2 FSDP learner
ranks) started by the real command line: kill -9 learner rank 0 (and, separately, the driver)
mid-run, then ``python -m launch.train train.resume=<run dir>``. The run continues from its newest
checkpoint's step and version with the checkpoint's optimizer state, finishes, and counts no step
twice in metrics.jsonl. In sync mode the resumed run's steps equal an uninterrupted run's, every
metric but the timings. Every process the test started is gone at the end, also on failure."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from launch.run import checkpoints
from launch.run.metrics import read_records

ROOT = Path(__file__).resolve().parents[2]
STEPS = 10
ARGS = [
    "env=action_words", "algorithm=grpo", "warm_start.enabled=false", f"train.steps={STEPS}",
    "train.batch_size=32", "train.eval_every=0", "train.eval_seeds=8", "train.checkpoint_every=2",
    "train.keep_checkpoints=2", "learner.ranks=2", "learner.max_staleness=1", "learner.lr=5e-3",
    "actors.concurrency=16", "actors.group_size=8", "actors.max_tokens=12",
    "actors.envs_per_worker=16", "logger.wandb=false", "ray.num_cpus=4",
]


def _launch(run_dir: Path, *extra: str) -> subprocess.Popen:
    path = run_dir.parent / f"driver-{time.monotonic_ns()}.log"
    with open(path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "launch.train", *ARGS, *extra,
                                 f"hydra.run.dir={run_dir}"],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = path
    return proc


def _train_steps(run_dir: Path) -> list[int]:
    if not (run_dir / "metrics.jsonl").exists():
        return []
    return [r["step"] for r in read_records(run_dir) if r["kind"] == "train"]


def _wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while max(_train_steps(run_dir), default=0) < step:
        assert proc.poll() is None, proc.log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no step {step} in {timeout_s} s"
        time.sleep(0.2)


def _descendants(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _learner_rank0(proc: subprocess.Popen) -> psutil.Process:
    for p in _descendants(proc):
        try:
            title = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "LearnerWorker" in title:
            ranks = [q for q in _descendants(proc) if "LearnerWorker" in " ".join(q.cmdline())]
            return min(ranks, key=lambda q: q.create_time())  # rank 0 is created first
    raise AssertionError("no learner process found")


def _stop_all(proc: subprocess.Popen, known: list[psutil.Process]) -> None:
    """Kill the driver and whatever of its process tree is left (and ``known`` processes of it
    seen earlier), by pid; wait for them all."""
    family = [*known, *_descendants(proc)]
    for p in family:
        try:
            p.kill()
        except psutil.Error:
            pass
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    psutil.wait_procs(family, timeout=30)


def _crash_then_resume(tmp_path: Path, crash, *extra: str) -> tuple[dict, Path, list]:
    run_dir = tmp_path / "run"
    first = _launch(run_dir, *extra)
    known: list[psutil.Process] = []
    try:
        _wait_for_step(first, run_dir, 5)
        known = _descendants(first)
        crash(first)
        first.wait(timeout=180)
    finally:
        _stop_all(first, known)
    assert first.returncode != 0
    newest = checkpoints.latest(run_dir)
    assert newest is not None and len(checkpoints.all_steps(run_dir)) <= 2
    saved = json.loads((newest / "extra.json").read_text())  # with the trainer's own part (_trainer)
    assert max(_train_steps(run_dir)) >= saved["step"] >= 4

    second = _launch(run_dir, *extra, f"train.resume={run_dir}")
    known = []
    try:
        deadline = time.monotonic() + 300
        while second.poll() is None and time.monotonic() < deadline:
            known = _descendants(second) or known
            time.sleep(0.5)
        assert second.poll() == 0, second.log_path.read_text()[-3000:]
    finally:
        _stop_all(second, known)
    return saved, run_dir, read_records(run_dir)


def _check_continued(saved: dict, run_dir: Path, records: list) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    step = saved["step"]
    resumed = summary["resumed_from"]
    assert resumed["step"] == step and resumed["version"] == saved["version"] == step
    assert summary["resumed_from"]["optimizer_fingerprint"] == saved["_trainer"]["optimizer_fingerprint"]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))  # each step once
    after = {r["step"]: r for r in train}[step + 1]
    assert after["learner/version"] == step + 1  # the version continues from the checkpoint's
    evals = [r["step"] for r in records if r["kind"] == "eval"]
    assert evals == sorted(set(evals)) and evals[0] == 0 and evals[-1] == STEPS
    assert summary["steps"] == STEPS and checkpoints.latest(run_dir).name == f"step-{STEPS:06d}"


@pytest.mark.slow
def test_kill_the_learner_then_resume(tmp_path):
    def kill_learner(driver):
        _learner_rank0(driver).send_signal(signal.SIGKILL)

    _check_continued(*_crash_then_resume(tmp_path, kill_learner))


@pytest.mark.slow
def test_kill_the_driver_then_resume(tmp_path):
    def kill_driver(driver):
        os.kill(driver.pid, signal.SIGKILL)

    _check_continued(*_crash_then_resume(tmp_path, kill_driver))


def _timing(key: str) -> bool:
    return key in ("time_s", "step") or key.endswith("_s") or key.startswith(("throughput/", "memory/", "cpu/"))


@pytest.mark.slow
def test_a_sync_run_killed_and_resumed_equals_the_uninterrupted_run(tmp_path):
    """Sampling is seeded per episode and turn, the seed streams, RNG states, optimizers and the
    counters (buffer, episode ledger) come back: after the resume point every metric of every step
    equals the uninterrupted run's (timings aside), the counters included."""
    whole_dir = tmp_path / "whole"
    whole = _launch(whole_dir, "train.mode=sync")
    try:
        assert whole.wait(timeout=900) == 0, whole.log_path.read_text()[-3000:]
    finally:
        _stop_all(whole, [])

    def kill_learner(driver):
        _learner_rank0(driver).send_signal(signal.SIGKILL)

    saved, run_dir, records = _crash_then_resume(tmp_path, kill_learner, "train.mode=sync")
    _check_continued(saved, run_dir, records)
    expected = {r["step"]: r for r in read_records(whole_dir) if r["kind"] == "train"}
    got = {r["step"]: r for r in records if r["kind"] == "train"}
    for step in range(saved["step"] + 1, STEPS + 1):
        differ = {k: (expected[step].get(k), v) for k, v in got[step].items()
                  if not _timing(k) and expected[step].get(k) != v}
        assert not differ, (step, differ)
