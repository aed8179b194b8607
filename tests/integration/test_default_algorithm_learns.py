"""The default algorithm learns: the default job (VAGEN-Full on FrozenLake: critic, bi-level
GAE, the reasoning reward, asynchronous) made small, a shorter warm start and ``LEARN_STEPS``
RL steps, must raise greedy and sampled success on validation maps (held out of the warm start
and of training: envs/splits.py) beyond their 95% intervals,
and the paired test on the same seeds must call both rises real
(launch/run/evaluation.py). A learner that is broken (an advantage's sign flipped, a loss that
does not reach the weights) fails it: docs/results.md gives the run with a planted sign error.

Slow: see docs/results.md for its time on a 2-core machine."""

from __future__ import annotations

import os

import pytest

from launch.config.compose import compose
from launch.run import evaluation
from launch.run.loop import train
from launch.run.metrics import read_records

LEARN_STEPS = int(os.environ.get("LEARN_STEPS", "40"))
SMALL = ["warm_start.seeds=16000", "warm_start.steps=1000", f"train.steps={LEARN_STEPS}", "train.eval_every=0",
         "train.eval_seeds=128", "train.eval_samples=4", "train.eval_pages=0", "train.checkpoint_every=0",
         "logger.wandb=false"]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_vagen_full_raises_greedy_and_sampled_success_beyond_their_intervals(tmp_path):
    summary = train(compose(SMALL), tmp_path)
    evals = [r for r in read_records(tmp_path) if r["kind"] == "eval"]
    before, after = evals[0], evals[-1]
    assert before["step"] == 0 and after["step"] == LEARN_STEPS and summary["steps"] == LEARN_STEPS
    for prefix in ("", "sampled/"):
        assert after[f"{prefix}success_lo"] > before[f"{prefix}success_hi"], (prefix, before, after)
    steps = evaluation.eval_steps(tmp_path)
    result = evaluation.compare(evaluation.read_outcomes(tmp_path, steps[0]),
                                evaluation.read_outcomes(tmp_path, steps[-1]))
    assert result["greedy"]["real"] and result["greedy"]["diff"] > 0, result
    assert result["sampled"]["real"] and result["sampled"]["diff"] > 0, result
