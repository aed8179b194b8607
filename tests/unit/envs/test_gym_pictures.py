"""envs/gym_game.py with gymnasium envs that draw instead of rendering text: MiniGrid's and
BabyAI's (minigrid 3.2.0), seen as one picture an observation by a vision-language model, their
mission said every turn and their actions named by the env; and a small drawing env of the
test's own, whose frame is not square and whose actions its metadata names.

MiniGrid-Empty-5x5-v0 has one map: the agent at (1, 1) facing right, the goal at (3, 3), so
forward, forward, right, forward, forward reaches it in 5 of its 100 steps (it pays
1 - 0.9 x 5 / 100 = 0.955). MiniGrid-DoorKey-5x5-v0's map varies by seed (its wall, door, key
and start), so seeds can be held out on it."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

from envs import splits
from envs.gym_game import NoTextError, has_solver, make_env
from envs.protocol import IMAGE_PLACEHOLDER
from envs.registry import make, resolve_config
from tests.envs_api import env_reset, env_step

needs_minigrid = pytest.mark.skipif(importlib.util.find_spec("minigrid") is None,
                                    reason="MiniGrid's envs need minigrid (pip install minigrid)")

PICTURES = dict(render="image", image_size=48, format="no_think", prompt="brief",
                success="positive_reward", task="")
MISSION = "Mission: get to the green goal square"


def _env(id: str, **settings):
    """``env=gym env.id=<id>`` as a run builds it, observed as pictures."""
    return make("gym", **resolve_config("gym", {"id": id, **PICTURES, **settings}))


def _answer(*actions: str) -> str:
    return f"<answer>{', '.join(actions)}</answer>"


@needs_minigrid
def test_minigrid_is_one_picture_a_turn_with_its_mission_and_its_own_action_names():
    env = _env("MiniGrid-Empty-5x5-v0")
    first = env_reset(env, 0)
    assert first.text.count(IMAGE_PLACEHOLDER) == 1 and len(first.images) == 1
    (picture,) = first.images
    assert picture.shape == (48, 48, 3) and picture.dtype == np.uint8
    assert len(np.unique(picture.reshape(-1, 3), axis=0)) > 3  # a drawing, not a blank
    from minigrid.core.actions import Actions

    names = tuple(a.name for a in Actions)
    assert env.action_names == names == ("left", "right", "forward", "pickup", "drop", "toggle", "done")
    assert "Actions: left, right, forward, pickup, drop, toggle, done." in env.system_prompt()
    assert MISSION in first.text
    moved = env_step(env, _answer("forward"))
    assert moved.info["actions"] == ["forward"] and moved.info["actions_valid"]
    assert tuple(env.game.env.unwrapped.agent_pos) == (2, 1)
    assert not np.array_equal(moved.observation.images[0], picture)  # the agent moved in the picture
    turned = env_step(env, _answer("Left"))  # names match case-insensitively, as every env's
    assert turned.info["actions"] == ["left"]
    assert not np.array_equal(turned.observation.images[0], moved.observation.images[0])
    for observation in (first, moved.observation, turned.observation):
        assert MISSION in observation.text and observation.text.count(IMAGE_PLACEHOLDER) == 1
    env.close()


@needs_minigrid
@pytest.mark.parametrize("scale, bonus", [(0.1, 10.0), (1.0, 0.0)])
def test_the_walk_to_the_goal_succeeds_and_pays_the_envs_reward_scaled(scale, bonus):
    env = _env("MiniGrid-Empty-5x5-v0", reward_scale=scale, success_reward=bonus)
    env.reset(seed=0)
    first = env_step(env, _answer("forward", "forward", "right"))
    assert (first.reward, first.done, first.info["success"]) == (0.5, False, False)
    last = env_step(env, _answer("forward", "forward"))
    assert last.done and last.info["success"] and last.info["actions"] == ["forward", "forward"]
    # MiniGrid pays 1 - 0.9 x 5 / 100 at the goal, reached on the 5th step; + 0.5 format reward
    assert last.reward == pytest.approx(scale * 0.955 + bonus + 0.5)
    with pytest.raises(RuntimeError, match="ended"):
        env_step(env, _answer("forward"))
    env.close()


@needs_minigrid
def test_a_seed_replays_its_map_and_other_seeds_draw_others():
    env = _env("MiniGrid-DoorKey-5x5-v0")
    first, info = env.reset(seed=4)
    again, again_info = env.reset(seed=4)
    assert np.array_equal(first["images"][0], again["images"][0]) and info["map"] == again_info["map"]
    pictures = {env.reset(seed=s)[0]["images"][0].tobytes() for s in range(8)}
    maps = {env.reset(seed=s)[1]["map"] for s in range(8)}
    assert len(pictures) > 1 and len(maps) > 1
    env.close()


@needs_minigrid
def test_held_out_seeds_play_maps_of_their_split_on_a_varying_env():
    env = _env("MiniGrid-DoorKey-5x5-v0", held_out=True)
    for seed in [*range(6), *splits.seeds_of("validation", 6)]:
        _, info = env.reset(seed=seed)
        assert info["split"] == splits.seed_split(seed) == splits.split_of(info["map"])
    env.close()
    one_map = _env("MiniGrid-Empty-5x5-v0", held_out=True)
    with pytest.raises(RuntimeError, match="env.held_out=false"):
        one_map.reset(seed=splits.seeds_of("validation", 1)[0])
    one_map.close()


@needs_minigrid
def test_babyai_ids_are_found_without_naming_the_package_and_say_their_mission():
    env = _env("BabyAI-GoToRedBall-v0", held_out=True)
    obs = env_reset(env, 3)
    mission = env.game.env.unwrapped.mission
    assert "red ball" in mission and f"Mission: {mission}" in obs.text
    assert env.action_names[:3] == ("left", "right", "forward")
    env.close()
    named = _env("minigrid:MiniGrid-Empty-5x5-v0")  # gymnasium's <package>:<id> works too
    assert MISSION in env_reset(named, 0).text
    named.close()
    with pytest.raises(ValueError, match="env.id=<package>:NoSuch-v0"):
        _env("NoSuch-v0")


@needs_minigrid
@pytest.mark.parametrize("settings, message", [
    ({}, r"renders no text: 'ansi' is not among its render_modes .* env\.render=image"),  # render=text
    ({"render": "both"}, r"env\.render=image \(not both\)"),
    ({"render": "image", "reasoning_reward": {"judge": "rule"}}, "no state_text"),
])
def test_a_setting_a_drawing_env_cannot_take_fails_naming_the_one_to_use(settings, message):
    # as a new user would try it: only the id changed from the YAML's
    config = resolve_config("gym", {"id": "MiniGrid-Empty-5x5-v0", **settings})
    with pytest.raises(ValueError, match=message) as error:
        make("gym", **config)
    assert isinstance(error.value, NoTextError) == ("reasoning_reward" not in settings)


@needs_minigrid
def test_minigrid_has_no_solver_so_no_warm_start():
    config = resolve_config("gym", {"id": "MiniGrid-DoorKey-5x5-v0", **PICTURES})
    assert has_solver(config) is False
    env = make("gym", **config)
    env.reset(seed=0)
    assert not env.has_solver and env.solve() is None and env.state_text() == ""
    env.close()


class Lamp(gym.Env):
    """A lamp drawn 8 pixels high and 16 wide, grey while dark, white once lit: switch it on.
    Its observation is its picture; its metadata names its actions."""

    metadata = {"render_modes": ["rgb_array"], "action_names": ["Off", "On"]}

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.spaces.Box(0, 255, (8, 16, 3), np.uint8)
        self.lit = False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.lit = False
        return self.render(), {}

    def step(self, action):
        self.lit = action == 1
        return self.render(), float(self.lit), self.lit, False, {}

    def render(self):
        return np.full((8, 16, 3), 255 if self.lit else 60, np.uint8)


def test_an_env_of_ones_own_that_draws_plugs_in_with_its_names_and_its_picture_padded_square():
    env = make_env(entry_point=f"{__name__}:Lamp", render="image", image_size=16, format="no_think",
                   max_turns=2, prompt="brief")
    obs = env_reset(env, 0)
    assert env.action_names == ("Off", "On") and "Mission" not in obs.text
    (picture,) = obs.images
    # 8 x 16 padded black above and below to 16 x 16 (the same size: no resampling)
    assert (picture[:4] == 0).all() and (picture[12:] == 0).all() and (picture[4:12] == 60).all()
    lit = env_step(env, _answer("On"))
    assert lit.done and lit.info["success"] and lit.reward == 1.0 + 0.5
    assert (lit.observation.images[0][4:12] == 255).all()
    env.close()
    with pytest.raises(NoTextError, match="env.render=image"):
        make_env(entry_point=f"{__name__}:Lamp")
