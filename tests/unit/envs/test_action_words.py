"""envs/action_words.py: the reward is the share of non-space characters spelling action words."""

import pytest

from envs.registry import make, resolve_config


def test_reward_counts_the_characters_of_action_words():
    env = make("action_words", **resolve_config("action_words", {}))
    assert env.system_prompt() == "" and "Which way" in env.reset(0).text
    result = env.step("Up Downward xx")  # "Up" + "Down" = 6 of 12 characters
    assert result.done and result.reward == pytest.approx(6 / 12)
    assert result.info["actions"] == ["Up", "Down"] and result.info["success"]
    env.reset(1)
    assert env.step("Left,Right").reward == pytest.approx(9 / 10)
    env.reset(2)
    assert env.step("   ").reward == 0.0 and not env.step("nothing").info["success"]


def test_one_turn_only():
    with pytest.raises(ValueError, match="one turn"):
        make("action_words", max_turns=3)
