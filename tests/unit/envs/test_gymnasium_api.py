"""Every env is a gymnasium env: registered under a vagen/ id, made by gymnasium.make, passing
gymnasium's own env checker, with terminated and truncated meaning what gymnasium says."""

import dataclasses

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401 - registers the vagen/ ids
from envs.registry import IDS, NAMES, resolve_config
from tests.maniskill import requires_maniskill
from tests.openenv_template import ENTRY_POINT, write_template

SETTINGS = {"frozenlake": {}, "sokoban": {"size": 6, "num_boxes": 1}, "action_words": {},
            "gym": {}, "primitive_skill": {"image_size": 32}, "svg": {"image_size": 32},
            "navigation": {"image_size": 32}, "textarena": {},
            "reasoning_gym": {"max_turns": 2}}  # one turn ends in truncation, which the checker takes for a bug
SIMULATED = {"primitive_skill"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=requires_maniskill()) if n in SIMULATED
                                  else n for n in NAMES])
def test_each_env_is_made_by_gymnasium_and_passes_its_checker(name, tmp_path):
    settings = ({"import_path": str(write_template(tmp_path)), "entry_point": ENTRY_POINT}
                if name == "openenv" else SETTINGS[name])  # OpenEnv's template, as its CLI writes it
    # The settings ride on the spec: gymnasium.make's own ``id`` parameter would take gym's.
    env = gym.make(dataclasses.replace(gym.spec(IDS[name]), kwargs=resolve_config(name, settings)))
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=4)
    assert env.observation_space.contains(obs) and isinstance(info, dict)
    assert env.action_space.contains("<answer>any text at all: √ 答</answer>")
    env.close()


def test_images_are_declared_in_the_observation_space():
    env = gym.make(IDS["frozenlake"], render="image", image_size=48)
    obs, _ = env.reset(seed=1)
    assert env.observation_space.contains(obs) and obs["images"][0].shape == (48, 48, 3)
    assert obs["text"].count("<image>") == 1
    env.close()


def test_the_goal_terminates_and_the_turn_limit_truncates():
    env = gym.make(IDS["frozenlake"], max_turns=2, reasoning_reward=None, format="no_think")
    env.reset(seed=0)
    plan = env.unwrapped.solve()
    *_, terminated, truncated, info = env.step(f"<answer>{','.join(plan[:3])}</answer>")
    if len(plan) > 3:
        *_, terminated, truncated, info = env.step(f"<answer>{','.join(plan[3:])}</answer>")
    assert (terminated, truncated, info["success"]) == (True, False, True)
    env.reset(seed=0)
    results = [env.step("no answer here") for _ in range(2)]
    assert [(r[2], r[3]) for r in results] == [(False, False), (False, True)]
    env.close()


def test_the_same_seed_gives_the_same_episode_and_none_draws_one():
    env = gym.make(IDS["sokoban"], size=6, num_boxes=1)
    assert env.reset(seed=9)[0]["text"] == env.reset(seed=9)[0]["text"]
    drawn = {env.reset()[0]["text"] for _ in range(5)}
    assert len(drawn) > 1
    env.close()
