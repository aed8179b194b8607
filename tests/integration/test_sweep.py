"""The real command line: ``python -m launch.train --multirun`` over two seeds, as a user types
it, each run in its own directory under ``storage`` with its own summary, and the sweep's table
of final metrics written next to them (launch/run/sweep.py)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHORT = ["env=action_words", "algorithm=grpo", "warm_start.enabled=false", "train.steps=1",
         "train.batch_size=4", "train.eval_every=0", "train.eval_seeds=4", "train.save_samples=0",
         "learner.ranks=1", "actors.concurrency=4", "actors.group_size=4", "actors.max_tokens=8",
         "actors.envs_per_worker=4", "logger.wandb=false", "ray.num_cpus=2"]


@pytest.mark.slow  # two whole runs, each starting Ray and a vLLM engine: about two minutes
def test_a_multirun_sweep_writes_each_run_and_the_table(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "launch.train", "--multirun", "seed=0,1",
                           f"storage={tmp_path}", *SHORT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep,) = (tmp_path / "multirun").iterdir()
    runs = sorted(d for d in sweep.iterdir() if d.is_dir())
    assert [d.name.split("-")[0] for d in runs] == ["0", "1"]
    summaries = [json.loads((d / "summary.json").read_text()) for d in runs]
    assert [s["steps"] for s in summaries] == [1, 1]
    with open(sweep / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["overrides"].split()[0] for r in rows] == ["seed=0", "seed=1"]
    assert [float(r["eval_after"]) for r in rows] == [s["eval_after"] for s in summaries]
    assert all(r["status"] == "done" for r in rows)
    assert "| run | overrides |" in (sweep / "sweep.md").read_text()
    assert proc.stdout.count("run directory: ") == 4  # each run's, at its start and end
