"""envs/gym_game.py: gymnasium envs nobody here wrote, played through VAGEN's layer.

CliffWalking's walk along the cliff is scripted turn by turn (its rewards are -1 a step, -100 and
back to the start off the cliff); FrozenLake's slippery ice checks that a seed replays its
episode; a small env of the test's own comes in by entry point with its action names and state
text."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from envs.formats import format_example
from envs.gym_game import has_solver, make_env
from envs.registry import check_config, make, resolve_config
from tests.envs_api import env_reset, env_step

CLIFF = dict(id="CliffWalking-v1", format="no_think", max_turns=5, max_actions_per_turn=3,
             prompt="brief")


def _answer(*actions: str) -> str:
    return f"<answer>{', '.join(actions)}</answer>"


def test_the_walk_along_the_cliff_succeeds_in_five_turns():
    env = make_env(**CLIFF)
    first = env_reset(env, 0)
    rows = first.text.split("The current state:\n")[1].splitlines()[:4]
    assert rows[3].split() == ["x"] + ["C"] * 10 + ["T"]  # the player at the start
    turns = [("Up", "Right", "Right"), ("Right",) * 3, ("Right",) * 3, ("Right",) * 3, ("Right", "Down")]
    results = [env_step(env, _answer(*t)) for t in turns]
    assert [r.info["actions"] for r in results] == [list(t) for t in turns]
    # -1 per move (the goal's step too) + 0.5 format reward per turn
    assert [r.reward for r in results] == [-2.5, -2.5, -2.5, -2.5, -1.5]
    assert [r.done for r in results] == [False] * 4 + [True]
    assert [r.info["success"] for r in results] == [False] * 4 + [True]
    with pytest.raises(RuntimeError, match="ended"):
        env_step(env, _answer("Up"))


def test_a_step_off_the_cliff_costs_100_and_a_bad_answer_executes_nothing():
    env = make_env(**CLIFF)
    env.reset(seed=0)
    fall = env_step(env, _answer("Right"))  # from the start, right is the cliff
    assert fall.reward == -100 + 0.5 and not fall.done and fall.info["actions"] == ["Right"]
    unknown = env_step(env, _answer("Jump"))
    assert (unknown.reward, unknown.info["actions"], unknown.info["actions_valid"]) == (0.0, [], False)
    garbage = env_step(env, "walk right a bit")
    assert (garbage.reward, garbage.info["actions"], garbage.info["format_correct"]) == (0.0, [], False)
    assert "not in the required format" in garbage.observation.text


def test_a_seed_replays_its_slippery_episode():
    def play(seed: int) -> list[str]:
        env = make_env(id="FrozenLake-v1", kwargs={"is_slippery": True}, success="positive_reward",
                       format="no_think", max_turns=4, max_actions_per_turn=3, prompt="none")
        texts = [env_reset(env, seed).text]
        for _ in range(4):
            result = env_step(env, _answer("Right", "Down", "Right"))
            texts.append(result.observation.text)
            if result.done:
                break
        env.close()
        return texts

    assert play(7) == play(7)
    assert len({tuple(play(s)) for s in range(6)}) > 1  # the slips differ between seeds


class Corridor(gym.Env):
    """A corridor of ``length`` cells: walk to its end. States its position in words."""

    metadata = {"render_modes": ["ansi"], "action_names": ["Back", "Forward"]}

    def __init__(self, length: int = 4, render_mode: str | None = None) -> None:
        self.length, self.render_mode = length, render_mode
        self.action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.spaces.Discrete(length)
        self.position = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = int(self.np_random.integers(0, self.length - 1))
        return self.position, {}

    def step(self, action):
        self.position = min(max(self.position + (1 if action == 1 else -1), 0), self.length - 1)
        done = self.position == self.length - 1
        return self.position, float(done), done, False, {}

    def render(self):
        return "".join("A" if i == self.position else "." for i in range(self.length))

    def state_text(self) -> str:
        return f"the agent is {self.length - 1 - self.position} cells from the end"


def test_an_env_of_ones_own_plugs_in_by_entry_point_with_its_names_and_state():
    env = make_env(entry_point=f"{__name__}:Corridor", kwargs={"length": 5}, format="no_think",
                   max_turns=2, max_actions_per_turn=4, prompt="brief",
                   reasoning_reward={"judge": "rule"})
    env.reset(seed=3)
    start = env.state_text()
    steps = int(start.split()[3])  # "the agent is N cells from the end"
    assert "Actions: Back, Forward." in env.system_prompt()
    result = env_step(env, _answer(*["Forward"] * steps))
    assert result.done and result.info["success"] and env.state_text().startswith("the agent is 0")


@pytest.mark.parametrize("settings, message", [
    ({"id": "CliffWalking-v1", "entry_point": f"{__name__}:Corridor"}, "exactly one of"),
    ({"id": None}, "exactly one of"),
    ({"id": "CliffWalking-v1", "action_names": ["Up", "Down"]}, "4 actions need as many"),
    ({"entry_point": "gymnasium.envs.toy_text.cliffwalking"}, "module:Class"),
    ({"id": "CartPole-v1"}, "render_mode"),  # no ansi rendering
    ({"id": "CliffWalking-v1", "render": "image"}, "observed as text"),
    ({"id": "CliffWalking-v1", "reasoning_reward": {"judge": "rule"}}, "no state_text"),
    ({"id": "CliffWalking-v1", "success": "sometimes"}, "success must be"),
])
def test_a_config_the_layer_cannot_play_fails_naming_why(settings, message):
    with pytest.raises(ValueError, match=message):
        make_env(**settings)


def test_the_registry_builds_it_from_its_yaml_and_checks_overrides():
    env = make("gym", **resolve_config("gym", {"prompt": "none"}))
    obs = env_reset(env, 1)
    assert "T" in obs.text and env.system_prompt() == ""
    env.close()
    check_config("gym", resolve_config("gym", {"id": "Taxi-v4", "success": "terminated"}))
    with pytest.raises(ValueError, match="env 'gym'.*'kwarg'"):
        check_config("gym", resolve_config("gym", {"kwarg": {}}))
    # a value only the env can judge: the keys check passes, building it says what is wrong
    cartpole = resolve_config("gym", {"id": "CartPole-v1"})
    check_config("gym", cartpole)
    with pytest.raises(ValueError, match="CartPole-v1 renders no text"):
        make("gym", **cartpole)


def test_taxi_names_its_six_actions():
    env = make_env(id="Taxi-v4", format="no_think", max_turns=1, prompt="brief")
    env.reset(seed=0)
    assert env.action_names == ("South", "North", "East", "West", "Pickup", "Dropoff")
    result = env_step(env, _answer("Pickup"))  # no passenger here: -10, executed, not the end
    assert result.reward == -10 + 0.5 and result.info["actions"] == ["Pickup"]
    assert np.isfinite(result.reward)


@pytest.mark.parametrize("settings, start_plan", [
    (dict(id="CliffWalking-v1"), ["Up"] + ["Right"] * 11 + ["Down"]),
    # the 4x4 map off the ice: holes end the episode without reward, so the way goes round them
    (dict(id="FrozenLake-v1", kwargs={"is_slippery": False}, success="positive_reward"),
     ["Down", "Down", "Right", "Down", "Right", "Right"]),
])
def test_a_deterministic_table_is_solved_by_search(settings, start_plan):
    env = make_env(**settings, format="no_think", max_turns=20, max_actions_per_turn=3,
                   prompt="none")
    env.reset(seed=0)
    assert env.has_solver and env.solve() == start_plan
    env_step(env, _answer(*start_plan[:2]))
    assert env.solve() == start_plan[2:]  # replanned from where the player stands
    env.close()


def test_taxi_is_solved_by_search_from_every_start():
    env = make_env(id="Taxi-v4", format="no_think", max_turns=1, prompt="none")
    for seed in range(20):
        env.reset(seed=seed)
        plan = env.solve()
        u = env.game.env.unwrapped
        for name in plan:  # the plan played out ends in the drop-off, nothing earlier
            _, reward, terminated, _, _ = u.step(env.action_names.index(name))
        assert terminated and reward == 20 and len(plan) <= 20
    env.close()


class SolvedCorridor(Corridor):
    """A corridor that solves itself."""

    def solve(self) -> list[str]:
        return ["Forward"] * (self.length - 1 - self.position)


@pytest.mark.parametrize("settings", [
    dict(id="CliffWalking-v1"), dict(id="CliffWalkingSlippery-v1"),
    dict(id="Taxi-v4"), dict(id="Taxi-v4", kwargs={"is_rainy": True}),
    dict(id="FrozenLake-v1", success="positive_reward"),  # slippery unless told
    dict(id="FrozenLake-v1", kwargs={"is_slippery": False}, success="positive_reward"),
    dict(id="FrozenLake8x8-v1", kwargs={"is_slippery": False}, success="positive_reward"),
    dict(id=None, entry_point=f"{__name__}:SolvedCorridor"),
    dict(id=None, entry_point=f"{__name__}:Corridor"),
])
def test_has_solver_knows_from_the_config_what_the_built_env_says(settings):
    config = resolve_config("gym", {**settings, "format": "no_think", "prompt": "none",
                                    "reasoning_reward": None})
    env = make("gym", **config)
    env.reset(seed=0)
    assert has_solver(config) is env.has_solver
    env.close()


def test_a_slippery_or_tableless_env_has_no_solver():
    slippery = make_env(id="FrozenLake-v1", kwargs={"is_slippery": True},
                        success="positive_reward", format="no_think", prompt="none")
    corridor = make_env(entry_point=f"{__name__}:Corridor", kwargs={"length": 5},
                        format="no_think", prompt="none")
    for env in (slippery, corridor):
        env.reset(seed=0)
        assert not env.has_solver and env.solve() is None
        env.close()


@pytest.mark.parametrize("scale", [1.0, 0.1])
def test_the_envs_rewards_are_scaled_and_a_success_reward_goes_to_the_step_that_succeeds(scale):
    env = make_env(**CLIFF, success_reward=10, reward_scale=scale)
    env.reset(seed=0)
    plan = env.solve()
    turns = [plan[i:i + 3] for i in range(0, len(plan), 3)]
    rewards = [env_step(env, _answer(*t)).reward for t in turns]
    # 13 moves in turns of 3, 3, 3, 3, 1: -1 x scale a move, +0.5 format a turn, 10 at the goal
    assert rewards == pytest.approx([0.5 - 3 * scale] * 4 + [0.5 - scale + 10])
    env.reset(seed=0)
    assert env_step(env, _answer("Right")).reward == pytest.approx(0.5 - 100 * scale)  # a fall


def _returns(**settings) -> dict[str, float]:
    """The episode return of each way to play CliffWalking through the layer: the walk to the
    goal, never a well-formed answer, and well-formed turns that keep off the cliff (one move a
    turn, or three)."""
    env = make("gym", **resolve_config("gym", settings))
    env.reset(seed=0)
    plan = env.solve()

    def answer(*actions: str) -> str:
        return format_example(env.format, action_example=", ".join(actions))

    answers = {"goal": [answer(*plan[i:i + 3]) for i in range(0, len(plan), 3)],
               "silent": ["no answer"] * 5, "safe, one move a turn": [answer("Up")] * 5,
               "safe, three moves a turn": [answer("Up", "Up", "Up")] * 5}
    out = {}
    for name, turns in answers.items():
        env.reset(seed=0)
        out[name] = sum(env_step(env, a).reward for a in turns)
    env.close()
    return out


def test_under_the_default_rewards_the_goal_is_the_best_return_and_under_the_envs_own_it_is_not():
    """configs/env/gym.yaml puts CliffWalking on VAGEN's grid scale (x 0.1, + 10 at the goal), under
    which walking to the goal is the optimum (10 - 1.3 + 5 x 0.5 = 11.2); on the env's own scale a
    well-formed turn costs more than it earns and not answering (0) beats the walk (-10.5)."""
    default = _returns()
    assert max(default, key=default.get) == "goal" and default["goal"] == pytest.approx(11.2)
    own = _returns(reward_scale=1.0, success_reward=0)
    assert max(own, key=own.get) == "silent" and own["goal"] == pytest.approx(-10.5)
    plus_ten = _returns(reward_scale=1.0, success_reward=10)
    assert max(plus_ten, key=plus_ten.get) == "silent" and plus_ten["goal"] == pytest.approx(-0.5)
