"""A real pretrained model learns: SmolLM2-135M-Instruct (model=smollm2_135m, converted from the
package index by the install) on FrozenLake by text with the recipe of
``experiment=smollm2_frozenlake`` (a short warm start on demonstrations with a habit of
mistakes, then GRPO through the whole asynchronous loop: vLLM actor, learner, weight pushes).
Greedy and sampled success on validation maps (held out of the demonstrations and of training:
envs/splits.py) must rise beyond their 95% intervals, and the paired test on the same seeds must
call both rises real (launch/run/evaluation.py).

Slow (about 40 minutes on a 2-core machine): docs/smollm2.md gives the run, its curve and the
model's answers before and after."""

from __future__ import annotations

import os
import shlex

import pytest

from launch.config.compose import compose
from launch.run import evaluation
from launch.run.loop import train
from launch.run.metrics import read_records

RECIPE = ["experiment=smollm2_frozenlake", "train.checkpoint_every=0", "logger.wandb=false",
          *shlex.split(os.environ.get("LEARN_OVERRIDES", ""))]
"""The preset as it is (its evals are the curve of docs/smollm2.md); LEARN_OVERRIDES adds
overrides, e.g. ``ray.bind_cores=false`` beside another job."""


@pytest.mark.slow
@pytest.mark.timeout(4800)
def test_grpo_raises_the_real_models_greedy_and_sampled_success(tmp_path):
    cfg = compose(RECIPE)
    summary = train(cfg, tmp_path)
    evals = [r for r in read_records(tmp_path) if r["kind"] == "eval"]
    before, after = evals[0], evals[-1]
    assert before["step"] == 0 and after["step"] == cfg.train.steps == summary["steps"]
    for prefix in ("", "sampled/"):
        assert after[f"{prefix}success_lo"] > before[f"{prefix}success_hi"], (prefix, before, after)
    steps = evaluation.eval_steps(tmp_path)
    result = evaluation.compare(evaluation.read_outcomes(tmp_path, steps[0]),
                                evaluation.read_outcomes(tmp_path, steps[-1]))
    assert result["greedy"]["real"] and result["greedy"]["diff"] > 0, result
    assert result["sampled"]["real"] and result["sampled"]["diff"] > 0, result
