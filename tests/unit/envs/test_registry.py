"""Tests of envs/registry.py: make by name, the YAML configs, overrides and errors."""

from __future__ import annotations

import functools
import importlib
import inspect

import pytest

import envs
from envs.grid_env import GridEnv
from envs.protocol import Env
from envs.registry import NAMES, load_config, make
from tests.envs_api import env_reset, env_step


def defaults(name: str) -> dict:
    """Every keyword default of the env's factory and of GridEnv."""
    factory = importlib.import_module(f"envs.{name}").make_env
    params = [
        *inspect.signature(factory).parameters.values(),
        *inspect.signature(GridEnv).parameters.values(),
    ]
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def test_names_and_reexport():
    assert NAMES == ("frozenlake", "sokoban", "action_words", "gym", "primitive_skill", "svg",
                     "navigation", "textarena", "reasoning_gym", "openenv")
    assert envs.make is make


@pytest.mark.parametrize("name", ["frozenlake", "sokoban"])
def test_yaml_mirrors_the_code_defaults_and_builds_the_env(name):
    config = load_config(name)
    code = defaults(name)
    assert config == {key: code[key] for key in config}
    assert set(code) - set(config) <= {"action_example", "render_mode"}  # all else is in the YAML
    env = make(name, **config)
    assert isinstance(env, Env)
    obs = env_reset(env, 0)
    assert env.game.text() in obs.text


def test_overrides_win_over_the_yaml():
    env = make("frozenlake", **{**load_config("frozenlake"), "size": 6, "render": "image"})
    obs = env_reset(env, 0)
    assert env.game.shape == (6, 6) and len(obs.images) == 1
    env = make("sokoban", **{**load_config("sokoban"), "num_boxes": 2, "size": 7})
    env_reset(env, 0)
    assert len(env.game.boxes) == 2 and env.game.shape == (7, 7)


def test_unknown_name_or_key_is_an_error():
    with pytest.raises(ValueError, match="frozenlake.*sokoban"):
        make("chess")
    with pytest.raises(ValueError, match="unknown env"):
        load_config("chess")
    with pytest.raises(TypeError):
        make("sokoban", dim_room=6)


def test_step_delay_slows_reset_and_step_and_keeps_the_episode():
    import time

    from envs.registry import load_config, make

    plain = make("frozenlake", **load_config("frozenlake"))
    slow = make("frozenlake", step_delay_s=0.05, **load_config("frozenlake"))
    t0 = time.perf_counter()
    obs = env_reset(slow, 7)
    result = env_step(slow, "<answer>Up</answer>")
    elapsed = time.perf_counter() - t0
    assert elapsed >= 0.1
    assert obs.text == env_reset(plain, 7).text
    assert result.reward == env_step(plain, "<answer>Up</answer>").reward
    assert slow.system_prompt() == plain.system_prompt()


def test_negative_step_delay_is_refused():
    import pytest

    from envs.registry import load_config, make

    with pytest.raises(ValueError, match="step_delay_s"):
        make("frozenlake", step_delay_s=-1, **load_config("frozenlake"))


def test_resolve_config_puts_overrides_over_the_yaml_and_leaves_importables_alone():
    from envs.registry import resolve_config

    overrides = {"size": 6, "extra": 1}
    merged = resolve_config("frozenlake", overrides)
    assert load_config("frozenlake")["size"] == 4
    assert merged == {**load_config("frozenlake"), "size": 6, "extra": 1}
    assert resolve_config("tests.unit.envs.fake_envs:CounterEnv", overrides) == overrides
    assert overrides == {"size": 6, "extra": 1}  # not modified


@pytest.mark.parametrize("name", NAMES)
def test_checking_a_config_builds_no_env_and_names_an_unknown_key(monkeypatch, name):
    """check_config binds the keys to the factory's signature: a factory that refuses to build
    (its signature kept) passes every env's YAML, even a simulator's, and an unknown key fails."""
    from envs import registry

    module, attr = registry._FACTORIES[name].split(":")
    real = getattr(importlib.import_module(module), attr)

    @functools.wraps(real)
    def refuse(**config):
        raise AssertionError(f"check_config built the {name} env")

    monkeypatch.setattr(importlib.import_module(module), attr, refuse)
    registry.check_config(name, load_config(name))
    with pytest.raises(ValueError, match=f"env '{name}'.*'colour'"):
        registry.check_config(name, {**load_config(name), "colour": "red"})


def test_an_importable_factory_is_checked_by_its_signature_unbuilt():
    from envs.registry import check_config
    from tests.unit.envs.fake_envs import CounterEnv

    factory = "tests.unit.envs.fake_envs:CounterEnv"
    built = CounterEnv.built
    check_config(factory, {"max_steps": 5})
    with pytest.raises(ValueError, match="max_step"):
        check_config(factory, {"max_step": 5})
    assert CounterEnv.built == built


def test_a_value_only_the_env_can_judge_fails_where_the_actors_build_it():
    """check_config passes a bad value (its key is right); the actor's env pool, building the
    env, fails to start with the env's own message."""
    from envs.pool import EnvPool, EnvPoolError
    from envs.registry import check_config

    config = {**load_config("frozenlake"), "format": "nonsense"}
    check_config("frozenlake", config)
    with pytest.raises(EnvPoolError, match="'frozenlake' failed: ValueError: unknown format 'nonsense'"):
        EnvPool(("frozenlake", config), num_workers=1, envs_per_worker=1, start_timeout_s=60)


def test_has_solver_is_declared_for_every_env_and_agrees_with_the_built_env():
    from envs.registry import _SOLVERS, has_solver

    assert set(_SOLVERS) == set(NAMES)
    for name in ("frozenlake", "sokoban", "action_words", "svg", "gym"):  # no simulator
        config = load_config(name)
        env = make(name, **config)
        assert has_solver(name, config) is bool(getattr(env, "has_solver", False)), name
        env.close()
    assert not has_solver("tests.unit.envs.fake_envs:CounterEnv", {})  # demonstrations: registry envs


def test_command_line_env_settings_are_yaml_values():
    from envs.registry import parse_overrides

    assert parse_overrides(["max_turns=2", "held_out=false", "targets=shapes", "kwargs={a: 1}"]) == {
        "max_turns": 2, "held_out": False, "targets": "shapes", "kwargs": {"a": 1}}
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["max_turns"])
