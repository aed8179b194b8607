"""envs/action_words.py: the reward is the share of non-space characters spelling action words."""

import pytest

from envs.registry import make, resolve_config
from tests.envs_api import env_reset, env_step


def test_reward_counts_the_characters_of_action_words():
    env = make("action_words", **resolve_config("action_words", {}))
    assert env.system_prompt() == "" and "Which way" in env_reset(env, 0).text
    result = env_step(env, "Up Downward xx")  # "Up" + "Down" = 6 of 12 characters
    assert result.done and result.reward == pytest.approx(6 / 12)
    assert result.info["actions"] == ["Up", "Down"] and result.info["success"]
    env_reset(env, 1)
    assert env_step(env, "Left,Right").reward == pytest.approx(9 / 10)
    env_reset(env, 2)
    assert env_step(env, "   ").reward == 0.0 and not env_step(env, "nothing").info["success"]


def test_one_turn_only():
    with pytest.raises(ValueError, match="one turn"):
        make("action_words", max_turns=3)
