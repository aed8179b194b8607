"""launch/run/baselines.py: the scripted floors answer in the env's format, play the seeds
deterministically, keep the best constant action, count an env's error as a failure; and their
figures come back from a run's records (launch/run/metrics.py)."""

from __future__ import annotations

import pytest

from envs import splits
from envs.formats import parse
from envs.registry import make, resolve_config
from launch.run import baselines, evaluation
from launch.run.metrics import baseline_figures


class _Game:
    """Success exactly when an answer holds ``Up``."""

    action_space = ("Left", "Up")


class UpEnv:
    """A two-turn env of named actions (the shape of envs/grid_env.py's GridEnv that the
    players read): success, and reward 1, on a turn whose answer holds ``Up``."""

    format, action_sep, max_actions, action_names = "no_think", ",", 2, ("Left", "Up")
    game = _Game()

    def __init__(self, fail_seed: int | None = None) -> None:
        self.fail_seed, self.turn, self.answers = fail_seed, 0, []

    def reset(self, *, seed):
        if seed == self.fail_seed:
            raise OSError("the simulator died")
        self.turn = 0
        return {"text": "", "images": ()}, {}

    def step(self, text):
        self.answers.append(text)
        self.turn += 1
        parsed = parse(text, self.format, action_sep=",", max_actions=2)
        up = "Up" in parsed.actions
        return ({"text": "", "images": ()}, float(up), up, self.turn == 2 and not up,
                {"success": up, "format_correct": parsed.format_correct, "metrics": {"format_reward": 0.0}})

    def close(self):
        pass


def test_the_best_constant_action_is_kept_and_random_play_is_in_the_format():
    env = UpEnv()
    results = baselines.run_scripted(lambda: env, {}, list(range(40)))
    assert set(results) == {"random", "constant:Up"}
    figures = baselines.summarize(results)
    assert figures["constant:Up"]["success"] == 1.0 and figures["constant:Up"]["turns"] == 1.0
    assert all(parse(a, "no_think", action_sep=",", max_actions=2).format_correct for a in env.answers)
    # random: each turn 1 or 2 uniform actions; P(no Up in a turn) = 1/2 * 1/2 + 1/2 * 1/4 = 3/8,
    # so P(success in two turns) = 1 - (3/8)^2 = 0.859; 40 seeds: inside a wide band
    assert 0.6 < figures["random"]["success"] < 1.0
    again = baselines.run_scripted(lambda: UpEnv(), {}, list(range(40)))
    assert again == results  # seeded by the episode's seed


def test_an_env_error_counts_as_a_failure():
    results = baselines.run_scripted(lambda: UpEnv(fail_seed=3), {}, [1, 2, 3, 4])
    random = results["random"]
    assert [o["failure"] for o in random] == [None, None, "env_error", None]
    assert "the simulator died" in random[2]["error"]
    record = evaluation.summarize(random)
    assert record["n_failed"] == 1 and record["failed/env_error"] == 1 and record["n"] == 4


def test_frozenlake_floors_are_real_episodes_in_the_env():
    seeds = splits.seeds_of("validation", 32)
    results = baselines.run_scripted(lambda **c: make("frozenlake", **c), resolve_config("frozenlake", {}), seeds)
    assert set(results) == {"random"} | {n for n in results if n.startswith("constant:")} and len(results) == 2
    for outcomes in results.values():
        assert [o["seed"] for o in outcomes] == seeds
        assert all(o["failure"] is None and o["format_correct"] == 1.0 for o in outcomes)
        # the reward is the sum of its parts (env + format + reasoning)
        for o in outcomes:
            assert o["reward"] == pytest.approx(o["reward_env"] + o["reward_format"] + o["reward_reasoning"])


def test_svg_floors_are_the_empty_drawing_and_one_shape():
    config = resolve_config("svg", {"targets": "shapes", "image_size": 64})
    results = baselines.run_scripted(lambda **c: make("svg", **c), config, splits.seeds_of("validation", 4))
    assert set(results) == {"empty", "one_shape"}
    for outcomes in results.values():
        assert all(o["failure"] is None and o["format_correct"] == 1.0 and o["reward"] > 0 for o in outcomes)


def test_baseline_figures_come_back_from_the_records():
    records = [{"kind": "eval", "step": 0, "success": 0.3},
               {"kind": "baseline", "step": 0, "time_s": 1.0, "baseline/random/success": 0.2,
                "baseline/random/failed/env_error": 1.0, "baseline/constant:Up/success": 0.1}]
    assert baseline_figures(records) == {"random": {"success": 0.2, "failed/env_error": 1.0},
                                         "constant:Up": {"success": 0.1}}
    assert baseline_figures(records[:1]) == {}
    text = baselines.baselines_text({"random": {"success": 0.184, "success_lo": 0.14, "success_hi": 0.24,
                                                "reward": 2.57}})
    assert text == "floors: random 0.184 [0.14, 0.24] reward 2.57"


def test_the_command_prints_an_envs_floors(capsys):
    baselines.main(["frozenlake", "max_turns=2", "--split", "test", "--seeds", "16"])
    out = capsys.readouterr().out
    assert out.startswith("frozenlake max_turns=2 on 16 test seeds: floors: random ") and "constant:" in out
    baselines.main(["action_words", "--seeds", "4"])
    assert "no scripted floor fits this env" in capsys.readouterr().out
