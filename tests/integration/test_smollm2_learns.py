"""A real pretrained model learns: SmolLM2-135M-Instruct (model=smollm2_135m, converted from the
package index by the install) on FrozenLake by text with the recipe of
``experiment=smollm2_frozenlake``: five SFT steps that start the answer's shape, then GRPO
through the whole asynchronous loop (vLLM actor, env workers, learner, weight pushes); and the
same with LoRA for the RL steps (``experiment=smollm2_frozenlake_lora``: adapter pushes).
On held-out maps (envs/splits.py) the share of episodes whose every answer earned the format
reward (well-formed, and every action a move) must rise beyond its 95% interval, greedy and
sampled, and the paired test on the same seeds (launch/run/evaluation.py's ``compare``:
McNemar's for greedy, sign-flip for sampled) must call each rise real. What the recipe teaches
in its 20 steps is the format; success stays below the floor of random moves (docs/smollm2.md),
so no rise of success is asserted.

Slow (35 minutes on a 2-core machine): docs/smollm2.md gives the run, its curve and the
model's answers before and after."""

from __future__ import annotations

import functools
import os
import shlex

import pytest

from launch.config.compose import compose
from launch.run import evaluation
from launch.run.loop import train

RECIPE = ["train.checkpoint_every=0", "logger.wandb=false", *shlex.split(os.environ.get("LEARN_OVERRIDES", ""))]
"""Beside the preset as it is (its evals are the curves of docs/smollm2.md and docs/lora.md);
LEARN_OVERRIDES adds overrides, e.g. ``train.eval_split=test``."""


def well_formed(outcome: dict, format_reward: float) -> bool:
    """Whether every answer of an episode earned the format reward (well-formed, and every action
    a move); a failed episode did not."""
    return outcome["failure"] is None and outcome["reward_format"] >= format_reward * outcome["turns"] - 1e-6


@pytest.mark.slow
@pytest.mark.timeout(4800)
@pytest.mark.parametrize("preset", ["smollm2_frozenlake", "smollm2_frozenlake_lora"],
                         ids=["full", "lora"])
def test_grpo_raises_the_real_models_format_rate_beyond_the_noise(tmp_path, preset):
    """Full fine-tuning, and LoRA adapters (rank 8) with the same budget."""
    cfg = compose([f"experiment={preset}", *RECIPE])
    summary = train(cfg, tmp_path)
    assert summary["steps"] == cfg.train.steps
    check_format_rises(tmp_path, cfg.env["format_reward"], cfg.train.steps)


def check_format_rises(run_dir, format_reward: float, last_step: int) -> None:
    """The run's first evaluation (step 0) against its last (``last_step``), paired on the seeds
    both played (``evaluation.compare``): the well-formed share beyond its interval and the
    paired test real, greedy and sampled."""
    steps = evaluation.eval_steps(run_dir)
    assert steps[0] == 0 and steps[-1] == last_step, steps
    first, last = (evaluation.read_outcomes(run_dir, steps[i]) for i in (0, -1))
    result = evaluation.compare(first, last, score=functools.partial(well_formed, format_reward=format_reward))
    assert set(result) == {"greedy", "sampled"}, result
    for mode, r in result.items():
        n = sum((o["sample"] < 0) == (mode == "greedy") for o in first)  # the same seeds and samples
        (_, hi_before), (lo_after, _) = (evaluation.wilson(rate * n, n) for rate in (r["a"], r["b"]))
        assert lo_after > hi_before, (mode, r, n)
        assert r["real"] and r["diff"] > 0, (mode, r)
