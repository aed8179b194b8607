"""launch/run/evaluation.py and launch/run/compare.py: an evaluation's figures with their
intervals, failed episodes counted as failures, and paired comparisons, on hand-computed cases
and against naive implementations."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from launch.run import compare as compare_cli
from launch.run import evaluation as ev


def _o(seed, sample=-1, success=0.0, failure=None, **extra):
    return {"seed": seed, "sample": sample, "failure": failure, "success": success,
            "reward": extra.pop("reward", success), "format_correct": 1.0, "turns": 2.0, **extra}


def test_wilson_by_hand():
    assert ev.wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    lo, hi = ev.wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert ev.wilson(10, 10)[1] == 1.0 and ev.wilson(10, 10)[0] == pytest.approx(0.7225, abs=1e-4)
    assert ev.wilson(0, 0) == (0.0, 1.0)


def test_wilson_covers_the_true_rate_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    for p, n in ((0.1, 40), (0.5, 100), (0.8, 256)):
        draws = rng.binomial(n, p, size=4000)
        covered = np.mean([lo <= p <= hi for lo, hi in (ev.wilson(k, n) for k in draws)])
        assert 0.93 <= covered <= 0.975, (p, n, covered)


def test_summarize_counts_failed_episodes_as_failures_with_their_reasons():
    outcomes = [_o(1, success=1.0, reward=2.0), _o(2, success=0.0, reward=-1.0),
                _o(3, failure="env_timeout"), _o(4, failure="vision_token_generated"),
                _o(1, 0, success=1.0), _o(1, 1, success=1.0), _o(2, 0, failure="env_timeout"),
                _o(2, 1, success=0.0, observation_score=0.5)]
    got = ev.summarize(outcomes)
    assert got["success"] == 0.25 and got["n"] == 4 and got["n_failed"] == 2
    assert (got["success_lo"], got["success_hi"]) == ev.wilson(1, 4)
    assert got["failed/env_timeout"] == 1 and got["failed/vision_token_generated"] == 1
    assert got["reward"] == 0.5  # over the two episodes that ended
    assert got["sampled/success"] == 0.5 and got["sampled/n"] == 4 and got["sampled/n_failed"] == 1
    assert got["sampled/failed/env_timeout"] == 1
    assert got["sampled/observation_score"] == pytest.approx(0.5 / 3)  # absent counts 0
    assert "sampled/success" not in ev.summarize(outcomes[:4])


def test_mcnemar_by_hand_and_against_the_binomial():
    assert ev.mcnemar(0, 0) == 1.0
    assert ev.mcnemar(0, 6) == pytest.approx(2 / 64)
    assert ev.mcnemar(3, 3) == 1.0
    # 2 of 10 discordant pairs one way: 2 * P(X <= 2), X ~ Bin(10, 1/2)
    assert ev.mcnemar(2, 8) == pytest.approx(2 * (1 + 10 + 45) / 1024)


def _naive_sign_flip(diffs):
    d = [x for x in diffs if x != 0]
    total = abs(sum(d))
    hits = sum(abs(sum(s * x for s, x in zip(signs, d))) >= total - 1e-12
               for signs in itertools.product((-1, 1), repeat=len(d)))
    return hits / 2 ** len(d) if d else 1.0


def test_the_sign_flip_test_equals_a_naive_enumeration_and_its_monte_carlo_is_close():
    rng = random.Random(0)
    for _ in range(20):
        diffs = [rng.choice((-1.0, -0.5, 0.0, 0.5, 1.0)) for _ in range(rng.randrange(1, 12))]
        assert ev.sign_flip(diffs) == pytest.approx(_naive_sign_flip(diffs))
    many = [rng.choice((-0.5, 0.0, 0.5, 1.0)) for _ in range(40)]
    exact_like = ev.sign_flip(many, rounds=200000, seed=1)
    assert ev.sign_flip(many) == pytest.approx(exact_like, abs=0.01)


def test_compare_pairs_on_shared_seeds_and_tells_a_real_difference_from_noise():
    before = [_o(s, success=float(s % 4 == 0)) for s in range(200)]
    before += [_o(s, j, success=float((s + j) % 3 == 0)) for s in range(200) for j in range(2)]
    after = [_o(s, success=float(s % 4 == 0 or s % 4 == 1)) for s in range(200)]  # 50 seeds won
    after += [_o(s, j, success=float((s + j) % 3 == 0)) for s in range(200) for j in range(2)]  # the same
    after.append(_o(999, success=1.0))  # a seed the other lacks is left out
    got = ev.compare(before, after)
    assert got["greedy"]["seeds"] == 200
    assert got["greedy"]["a"] == 0.25 and got["greedy"]["b"] == 0.5
    assert got["greedy"]["p"] == pytest.approx(2 / 2 ** 50) and got["greedy"]["real"]
    assert got["sampled"]["diff"] == 0 and got["sampled"]["p"] == 1.0 and not got["sampled"]["real"]
    # a failed episode is a failure: the same seeds, one failing instead of succeeding
    worse = [dict(o, failure="env_timeout") if o["seed"] == 0 and o["sample"] < 0 else o for o in before]
    assert ev.compare(before, worse)["greedy"]["diff"] == pytest.approx(-1 / 200)


def test_compare_pairs_any_per_episode_score_and_fails_a_failed_episode():
    ok = lambda o: float(o["reward_format"] >= 1.0)  # noqa: E731
    before = [_o(s, success=1.0, reward_format=float(s < 10)) for s in range(40)]
    after = [_o(s, success=0.0, reward_format=float(s < 30)) for s in range(40)]
    after[0]["failure"] = "env_timeout"  # scores 0 whatever its fields say
    got = ev.compare(before, after, score=ok)["greedy"]
    assert (got["a"], got["b"]) == (10 / 40, 29 / 40)
    assert got["p"] == pytest.approx(ev.mcnemar(1, 20)) and got["real"]
    assert ev.compare(before, after)["greedy"]["b"] == 0.0  # success by default


def test_the_compare_command_reads_a_runs_evaluations(tmp_path, capsys):
    ev.write_outcomes(tmp_path, 0, [_o(s, success=0.0) for s in range(30)])
    ev.write_outcomes(tmp_path, 20, [_o(s, success=float(s < 20)) for s in range(30)])
    assert ev.eval_steps(tmp_path) == [0, 20]
    assert compare_cli.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"A = {tmp_path}@0" in out and f"B = {tmp_path}@20" in out
    assert "greedy     30 seeds  0.000 -> 0.667  +0.667" in out and out.rstrip().endswith("real")
    p = 2 / 2 ** 20
    assert f"p {p:.4f}" in out
    assert compare_cli.main([f"{tmp_path}@20", f"{tmp_path}@20"]) == 0
    assert "no difference" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="no evaluation at step 5"):
        compare_cli.main([f"{tmp_path}@5"])
    assert math.isclose(ev.read_outcomes(tmp_path, 20)[0]["success"], 1.0)
