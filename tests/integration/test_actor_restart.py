"""A crashed actor mid-run (its process killed with SIGKILL): the supervisor replaces it, the cluster re-forms
the weight group, and the run completes every step on the replacement's trajectories. Also: the
killed actor's own processes (its vLLM engine, its env workers) do not outlive it."""

import json
import os
import signal
import threading
import time

import psutil
import pytest

from launch.run.metrics import read_records
from tests.integration.test_train_loop import _run

STEPS = 6
KILL_AFTER_STEP = 2


def _actor_process() -> psutil.Process | None:
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if "InferenceActor" in " ".join(p.cmdline()) or p.name().startswith("ray::InferenceA"):
                return p
        except psutil.Error:
            continue
    return None


def _kill_actor_after(run_dir, step: int, report: dict) -> None:
    """In a thread: once ``step`` train records are written, SIGKILL the actor and watch its
    descendants go away."""
    deadline = time.monotonic() + 600
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        rows = metrics.read_text().splitlines() if metrics.exists() else []
        if sum(json.loads(r)["kind"] == "train" for r in rows) >= step:
            break
        time.sleep(0.2)
    actor = _actor_process()
    if actor is None:
        report["error"] = "no actor process found"
        return
    family = actor.children(recursive=True)
    report["killed"], report["family"] = actor.pid, [p.pid for p in family]
    os.kill(actor.pid, signal.SIGKILL)
    _, alive = psutil.wait_procs(family, timeout=60)
    report["survivors"] = [(p.pid, p.name()) for p in alive if p.is_running()]


@pytest.mark.slow
def test_a_killed_actor_is_replaced_and_the_run_completes(tmp_path):
    report: dict = {}
    killer = threading.Thread(target=_kill_actor_after, args=(tmp_path, KILL_AFTER_STEP, report),
                              daemon=True)
    killer.start()
    summary = _run(tmp_path, f"train.steps={STEPS}", "train.eval_every=0", "learner.ranks=1",
                   "ray.num_cpus=3")
    killer.join(timeout=5)
    assert "error" not in report and report.get("killed")
    assert report["family"] and report["survivors"] == []  # engine and env workers went with it
    rows = read_records(tmp_path)
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, STEPS + 1))
    assert summary["actor_restarts"] == [1] and train_rows[-1]["actors/restarts"] == 1
    # The replacement got every version pushed after it joined, and its tokens were trained on.
    (actor,) = summary["actors"]
    assert actor["version"] == STEPS and actor["weight_updates"] >= 1
    assert max(r["policy/version_max"] for r in train_rows[-2:]) > KILL_AFTER_STEP
    assert all(r["policy/staleness_max"] <= 1 for r in train_rows)
    # the killed incarnation's episodes in flight at its last reading are counted lost
    ep = summary["episodes"]
    assert ep["faults/actors_replaced"] == 1 and 0 <= ep["episodes/lost"] <= 2 * 8  # concurrency 8
    assert ep["episodes/in_flight"] == 0
