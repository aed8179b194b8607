"""launch/probe.py end to end on the tiny model, through its command line (Hydra)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch.tiny_model import build_tiny_model

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("vision", [False, True], ids=["text", "image"])
def test_probe_samples_trains_and_evaluates_on_policy(tmp_path, vision):
    """image: the tiny Qwen2-VL on FrozenLake rendered as pictures, sampled and trained with them
    (the behaviour and proximal log-probs agree only if both sides saw the same images)."""
    model = build_tiny_model(tmp_path / "tiny", vision=vision)
    out = tmp_path / "run"
    images = ["env.render=image", "env.image_size=56"] if vision else []
    subprocess.run(
        [sys.executable, "-m", "launch.probe", f"model.path={model}", f"hydra.run.dir={out}",
         *images, "train.steps=3", "train.batch_size=4", "actors.group_size=2", "actors.max_tokens=16",
         "train.eval_seeds=2", "train.eval_every=0", "learner.critic_warmup=1",
         "learner.lr=0.01"],
        cwd=REPO, check=True, capture_output=True, timeout=300)
    records = [json.loads(line) for line in (out / "probe.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records] == [
        ("eval", 0), ("train", 1), ("train", 2), ("train", 3), ("eval", 3)]
    steps = records[1:4]
    # Step 1 trains only the critic; step 2 moves the policy (lr 0.01); step 3 samples with the
    # weights copied back. Behaviour log-probs come from the sampling model, proximal ones from
    # the trainer: on-policy they agree (the k1 estimate of their KL is ~0) at every step.
    assert "policy/entropy" not in steps[0] and steps[1]["policy/entropy"] > 0
    for step in steps:
        assert abs(step["policy/behaviour_kl"]) < 1e-4
    assert records[0]["episodes"] == records[4]["episodes"] == 2.0
