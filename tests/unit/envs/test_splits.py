"""Held-out maps (envs/splits.py): the split of a key, of a seed, the draw, and in real envs no
evaluation seed ever plays a map a training seed plays, while without the split many do."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from actors.config import ActorConfig
from envs import splits
from envs.registry import make, resolve_config


def test_each_held_out_split_takes_its_share_of_random_keys():
    rng = np.random.default_rng(0)
    n = 20000
    keys = [splits.map_key(str(v)) for v in rng.integers(2**62, size=n)]
    counts = {s: sum(splits.split_of(k) == s for k in keys) for s in splits.SPLITS}
    sd = (n * splits.SHARE * (1 - splits.SHARE)) ** 0.5
    for split in splits.HELD_OUT:
        assert abs(counts[split] - n * splits.SHARE) < 4 * sd, counts
    assert counts["train"] == n - counts["validation"] - counts["test"]


def test_seeds_name_their_split_by_range():
    assert splits.seed_split(0) == splits.seed_split(999_999) == "train"
    assert splits.seed_split(1_000_000) == splits.seed_split(1_999_999) == "validation"
    assert splits.seed_split(2_000_000) == "test"
    assert splits.seed_split(3_000_000) == "train"
    assert splits.seeds_of("test", 3) == [2_000_000, 2_000_001, 2_000_002]
    with pytest.raises(ValueError, match="evaluation seeds come from"):
        splits.seeds_of("train", 3)
    assert splits.meets_held_out(0, 1_000_001) and splits.meets_held_out(2_999_999, 4_000_000)
    assert not splits.meets_held_out(0, 1_000_000) and not splits.meets_held_out(3_000_000, 5_000_000)
    assert splits.wanted(5, held_out=False) is None and splits.wanted(None, held_out=True) == "train"


def _texts_of(split: str, n: int) -> list[str]:
    """The first ``n`` layout texts "map <i>" whose key is of ``split``."""
    return list(itertools.islice((t for t in (f"map {i}" for i in itertools.count())
                                  if splits.split_of(splits.map_key(t)) == split), n))


def test_draw_takes_the_first_map_of_the_split_asked_for():
    val = _texts_of("validation", 1)[0]
    train = _texts_of("train", 3)
    maps = iter([*train, val, "never drawn"])
    assert splits.draw(lambda: next(maps), "validation") == splits.map_key(val)
    maps = iter([*train])
    assert splits.draw(lambda: next(maps), None) == splits.map_key(train[0])  # no split: the first


def test_draw_fails_clearly_where_the_maps_never_vary():
    only = _texts_of("train", 1)[0]
    calls = []
    with pytest.raises(RuntimeError, match=r"CliffWalking: no validation map in 1000 draws \(1 distinct"):
        splits.draw(lambda: calls.append(1) or only, "validation", "CliffWalking")
    assert len(calls) == splits.MAX_DRAWS


@pytest.mark.parametrize("name", ["frozenlake", "sokoban"])
def test_no_evaluation_seed_plays_a_training_map(name):
    env = make(name, **resolve_config(name, {}))
    train = set(splits.keys(env, range(3000)))
    for split in splits.HELD_OUT:
        seeds = splits.seeds_of(split, 64)
        keys = splits.keys(env, seeds)
        assert all(splits.split_of(k) == split for k in keys)
        assert not train & set(keys)
        # the same seed, the same episode
        assert env.reset(seed=seeds[3])[0]["text"] == env.reset(seed=seeds[3])[0]["text"]
    assert all(splits.split_of(k) == "train" for k in train)
    # without the split, evaluation seeds play training maps: what the split is for
    open_env = make(name, **resolve_config(name, {"held_out": False}))
    assert set(splits.keys(open_env, splits.seeds_of("validation", 64))) & set(splits.keys(open_env, range(3000)))


def test_svg_holds_whole_icons_out():
    env = make("svg", **resolve_config("svg", {}))
    try:
        def icons(seeds):
            names = []
            for seed in seeds:
                env.reset(seed=seed)
                names.append(env.target_name)
            return set(names)
        train, test = icons(range(400)), icons(splits.seeds_of("test", 40))
    finally:
        env.close()
    assert test and not train & test


def test_report_counts_what_evaluations_share_with_training():
    config = resolve_config("frozenlake", {})
    seeds = splits.seeds_of("validation", 128)
    held = splits.report(lambda **c: make("frozenlake", **c), config, seeds, 2000)
    assert held["shared"] == 0 and held["eval_seeds"] == 128 and held["held_out"]
    assert 0 < held["eval_maps"] <= 128 and 0 < held["train_maps"] <= 2000
    opened = splits.report(lambda **c: make("frozenlake", **c), {**config, "held_out": False}, seeds, 2000)
    assert opened["shared"] > 0 and not opened["held_out"]
    assert "0 of them among 2000 training seeds'" in splits.report_text("validation", held)
    assert "may play training maps" in splits.report_text("validation", opened)
    words = splits.report(lambda **c: make("action_words", **c), resolve_config("action_words", {}), seeds, 10)
    assert words == {} and "no maps to hold out" in splits.report_text("test", words)


def test_one_map_env_refuses_to_hold_out_and_plays_with_it_off():
    env = make("gym", **resolve_config("gym", {}))  # CliffWalking, held_out off by default
    try:
        key = env.reset(seed=0)[1]["map"]
        assert env.reset(seed=splits.seeds_of("test", 1)[0])[1] == {"map": key, "split": None}
    finally:
        env.close()
    other = next(s for s in splits.HELD_OUT if s != splits.split_of(key))
    env = make("gym", **resolve_config("gym", {"held_out": True}))
    try:
        with pytest.raises(RuntimeError, match="vary too little to hold any out; set held_out=false"):
            env.reset(seed=splits.seeds_of(other, 1)[0])
    finally:
        env.close()


def test_actors_refuse_training_seeds_that_reach_held_out_ones():
    with pytest.raises(ValueError, match="reach the held-out seeds"):
        ActorConfig(model_path="m", train_seeds=(0, 1_500_000))
    assert ActorConfig(model_path="m", train_seeds=(3_000_000, 4_000_000)).train_seeds == (3_000_000, 4_000_000)


def test_a_run_checks_its_evaluation_maps_at_the_start(capsys):
    from launch.config.compose import compose
    from launch.run.loop import _check_held_out

    figures = _check_held_out(compose(["train.eval_seeds=64", "train.held_out_check=500", "logger.wandb=false"]))
    assert figures["shared"] == 0 and figures["eval_seeds"] == 64 and figures["train_seeds"] == 500
    assert "held-out maps (validation): 64 seeds play" in capsys.readouterr().out
    test = _check_held_out(compose(["train.eval_split=test", "train.eval_seeds=8", "logger.wandb=false"]))
    assert test["shared"] == 0 and test["train_seeds"] == 1024
    # an env that cannot hold maps out stops the run before its warm start, saying what to set
    with pytest.raises(RuntimeError, match="set held_out=false"):
        _check_held_out(compose(["env=gym", "env.held_out=true", "train.eval_seeds=4", "logger.wandb=false"]))
