"""Tests of envs/grid.py (text, RGB, BFS helpers) and envs/grid_env.py (the turn protocol),
run against both grid games."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from envs.grid import Tile, bfs, from_text, render_rgb, to_text
from envs.protocol import IMAGE_PLACEHOLDER, Env
from envs.registry import make
from tests.envs_api import env_reset, env_step

ENVS = ("frozenlake", "sokoban")


def answer(actions: list[str], observation: str = "I see.", prediction: str = "It moves.") -> str:
    """A correct grounding_worldmodeling answer."""
    return (
        f"<think><observation>{observation}</observation><reasoning>Go.</reasoning>"
        f"<prediction>{prediction}</prediction></think><answer>{','.join(actions)}</answer>"
    )


# ---------------------------------------------------------------- grid helpers


def test_text_round_trip_and_errors():
    chars = from_text("#_O\nXP√\n", "#_OXP√")
    assert chars.shape == (2, 3) and to_text(chars) == "#_O\nXP√"
    with pytest.raises(ValueError, match="rectangular"):
        from_text("##\n#", "#")
    with pytest.raises(ValueError, match="unknown symbols"):
        from_text("#?", "#")


@pytest.mark.parametrize("shape", [(4, 4), (6, 6), (5, 7), (8, 8)])
@pytest.mark.parametrize("image_size", [50, 96])
def test_render_rgb_has_the_exact_size_and_paints_layers_in_order(shape, image_size):
    everywhere, corner = np.ones(shape, bool), np.zeros(shape, bool)
    corner[0, 0] = True
    red, blue = Tile("tile", (255, 0, 0)), Tile("circle", (0, 0, 255))
    image = render_rgb(shape, [(everywhere, red), (corner, blue)], image_size)
    assert image.shape == (image_size, image_size, 3) and image.dtype == np.uint8
    cell_h, cell_w = image_size // shape[0], image_size // shape[1]
    assert tuple(image[cell_h // 2, cell_w // 2]) == (0, 0, 255)  # the circle on top
    assert tuple(image[image_size - cell_h // 2, image_size - cell_w // 2]) == (255, 0, 0)
    assert tuple(image[0, 0]) != (255, 0, 0)  # a grid line, not the tile


def test_bfs_finds_a_shortest_plan_or_none():
    moves = lambda n: [("+1", n + 1), ("*2", n * 2)] if n < 100 else []  # noqa: E731
    assert bfs(1, moves, lambda n: n == 10) == ["+1", "*2", "+1", "*2"]
    assert bfs(1, moves, lambda n: n == 1) == []
    assert bfs(1, lambda n: [], lambda n: n == 2) is None


# ---------------------------------------------------------------- the turn protocol


@pytest.mark.parametrize("name", ENVS)
def test_env_satisfies_the_protocol(name):
    env = make(name)
    assert isinstance(env, Env)
    assert set(env.action_names) == {"Up", "Down", "Left", "Right"}


@pytest.mark.parametrize("name", ENVS)
def test_wrong_format_executes_nothing_and_earns_nothing(name):
    env = make(name, reasoning_reward=None)
    env_reset(env, 5)
    grid = env.game.text()
    result = env_step(env, f"<answer>{env.solve()[0]}</answer>")  # no <think>: wrong format
    assert env.game.text() == grid
    assert result.reward == 0.0 and not result.done
    assert result.info["format_correct"] is False and result.info["actions_valid"] is False
    assert result.info["actions"] == []
    assert result.info["metrics"]["format_reward"] == 0.0
    assert "not in the required format" in result.observation.text


@pytest.mark.parametrize("name", ENVS)
def test_invalid_action_runs_the_valid_prefix_without_format_reward(name):
    env, twin = make(name, reasoning_reward=None), make(name, reasoning_reward=None)
    env_reset(env, 7), env_reset(twin, 7)
    first = env.solve()[0]
    expected = env_step(twin, answer([first])).info["metrics"]["env_reward"]
    result = env_step(env, answer([first.lower(), "Jump", first]))
    assert result.info["actions"] == [first]  # matched case-insensitively, stopped at "Jump"
    assert result.info["actions_valid"] is False and result.info["format_correct"] is True
    assert result.info["metrics"]["format_reward"] == 0.0
    assert result.reward == pytest.approx(expected)
    assert env.game.text() == twin.game.text()
    assert "'Jump' is not a valid action" in result.observation.text


@pytest.mark.parametrize("name", ENVS)
def test_turn_limit_and_stepping_after_the_end(name):
    env = make(name, max_turns=2)
    with pytest.raises(RuntimeError, match="before reset"):
        env_step(env, answer(["Up"]))
    env_reset(env, 0)
    assert not env_step(env, "nonsense").done
    last = env_step(env, "nonsense")
    assert last.done and not last.info["success"]
    assert last.info["metrics"]["turn"] == 2.0
    with pytest.raises(RuntimeError, match="ended"):
        env_step(env, answer(["Up"]))


@pytest.mark.parametrize("name", ENVS)
def test_perfect_descriptions_earn_the_full_reasoning_reward(name):
    env, twin = make(name), make(name, reasoning_reward=None)
    env_reset(env, 11), env_reset(twin, 11)
    actions = env.solve()[:2]
    env_step(twin, answer(actions))
    result = env_step(env, answer(actions, env.state_text(), twin.state_text()))
    metrics = result.info["metrics"]
    assert metrics["reasoning_reward"] == pytest.approx(1.0)
    assert metrics["reasoning/observation_score"] == 1.0
    assert metrics["reasoning/prediction_score"] == 1.0
    assert result.reward == pytest.approx(metrics["env_reward"] + 0.5 + 1.0)


@pytest.mark.parametrize("name", ENVS)
def test_reasoning_reward_follows_the_format_and_can_be_disabled(name):
    env = make(name, format="worldmodeling")
    env_reset(env, 3)
    text = f"<think><reasoning>Go.</reasoning><prediction>{env.state_text()}</prediction></think>"
    metrics = env_step(env, text + f"<answer>{env.solve()[0]}</answer>").info["metrics"]
    assert "reasoning/prediction_score" in metrics
    assert "reasoning/observation_score" not in metrics  # no <observation> in this format

    env = make(name, reasoning_reward=None)
    env_reset(env, 3)
    metrics = env_step(env, answer([env.solve()[0]], env.state_text())).info["metrics"]
    assert metrics["reasoning_reward"] == 0.0
    assert not any(key.startswith("reasoning/") for key in metrics)


@pytest.mark.parametrize("name", ENVS)
def test_same_seed_same_episode_and_different_seeds_differ(name):
    def play(seed: int) -> list:
        env = make(name, render="image", max_turns=5)
        obs = env_reset(env, seed)
        trace = [obs.text, obs.images[0].tobytes(), env.game.text(), env.state_text()]
        for actions in (["Up", "Left"], ["Down", "Right", "Down"], ["Left"]):
            result = env_step(env, answer(actions))
            trace += [result.observation.images[0].tobytes(), env.game.text(), result.reward]
            if result.done:
                break
        return trace

    assert play(4) == play(4)
    firsts = set()
    for seed in range(20):
        env = make(name)
        env_reset(env, seed)
        firsts.add(env.game.text())
    assert len(firsts) > 10


def is_plain(value) -> bool:
    """Plain data the wire carries without pickle: no numpy scalars, no tuples."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(is_plain(v) for v in value)
    return type(value) in (str, float, bool, int)


@pytest.mark.parametrize("name", ENVS)
def test_step_results_are_plain_data(name):
    env = make(name, max_turns=4)
    env_reset(env, 2)
    for text in ("junk", answer(["Up", "Jump"]), answer(env.solve()[:3]), answer(["Left"])):
        result = env_step(env, text)
        assert type(result.reward) is float and type(result.done) is bool
        assert is_plain(result.info)
        assert all(type(v) is float for v in result.info["metrics"].values())
        if result.done:
            break


def test_episodes_do_not_depend_on_the_process_hash_seed():
    script = (
        "from envs.registry import make\n"
        "for name in ('frozenlake', 'sokoban'):\n"
        "    for seed in range(20):\n"
        "        env = make(name, num_boxes=2, size=7) if name == 'sokoban' else make(name)\n"
        "        env.reset(seed=seed)\n"
        "        print(env.game.text(), env.state_text(), env.solve())\n"
    )
    root = Path(__file__).resolve().parents[3]
    outputs = [
        subprocess.run(
            [sys.executable, "-c", script],
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for hash_seed in (1, 2)
    ]
    assert outputs[0] == outputs[1] and outputs[0].count("\n") > 40


@pytest.mark.parametrize("name", ENVS)
def test_observations_render_the_state_and_remind_the_format(name):
    env = make(name)
    obs = env_reset(env, 1)
    assert env.game.text() in obs.text and obs.images == []
    assert "<think><observation>...</observation>" in obs.text and "Turn 1 of 3" in obs.text
    assert env.game.text_legend in env.system_prompt()
    assert "Answer format:" in env.system_prompt()

    env = make(name, render="image", image_size=64)
    obs = env_reset(env, 1)
    assert obs.text.count(IMAGE_PLACEHOLDER) == 1 and len(obs.images) == 1
    assert obs.images[0].shape == (64, 64, 3) and obs.images[0].dtype == np.uint8
    assert env.game.image_legend in env.system_prompt()
    result = env_step(env, answer([env.solve()[0]]))
    assert len(result.observation.images) == 1


@pytest.mark.parametrize("name", ENVS)
def test_brief_prompt_keeps_rules_legend_and_template_once_and_plays_the_same(name):
    full, brief = make(name), make(name, prompt="brief")
    template = "<think><observation>...</observation><reasoning>...</reasoning>" \
               "<prediction>...</prediction></think><answer>...</answer>"
    assert brief.system_prompt().endswith(f"Answer as {template}")
    for part in (brief.game.task, brief.game.text_legend, "Actions: "):
        assert part in brief.system_prompt() and part in full.system_prompt()
    assert len(brief.system_prompt()) < len(full.system_prompt()) / 2
    obs_full, obs_brief = env_reset(full, 3), env_reset(brief, 3)
    assert template in obs_full.text and "Reply" not in obs_brief.text
    assert obs_full.text.startswith(obs_brief.text)
    text = answer(full.solve())
    a, b = env_step(full, text), env_step(brief, text)
    assert (a.reward, a.done, a.info["success"]) == (b.reward, b.done, b.info["success"])


@pytest.mark.parametrize("name", ENVS)
def test_no_prompt_gives_the_turn_and_state_only_and_plays_the_same(name):
    brief, bare = make(name, prompt="brief"), make(name, prompt="none")
    assert bare.system_prompt() == ""
    first_brief, first_bare = env_reset(brief, 5), env_reset(bare, 5)
    assert first_bare.text == first_brief.text
    assert first_bare.text.splitlines()[:2] == ["Turn 1 of 3.", "The current state:"]
    text = answer(brief.solve()[:1])
    a, b = env_step(brief, text), env_step(bare, text)
    assert (a.reward, a.done, a.info["success"], a.observation.text) == \
        (b.reward, b.done, b.info["success"], b.observation.text)


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize(
    "config, error",
    [
        ({"format": "xml"}, ValueError),
        ({"render": "video"}, ValueError),
        ({"prompt": "short"}, ValueError),
        ({"image_size": 8}, ValueError),
        ({"max_turns": 0}, ValueError),
        ({"max_actions_per_turn": True}, ValueError),
        ({"action_sep": " "}, ValueError),
        ({"reasoning_reward": {"judge": "oracle"}}, ValueError),
        ({"size": 1}, ValueError),
        ({"max_solution_length": 0}, ValueError),
        ({"colour": "red"}, TypeError),
    ],
)
def test_bad_config_is_rejected(name, config, error):
    with pytest.raises(error):
        make(name, **config)


def test_a_structured_format_needs_a_game_that_states_a_dict():
    from envs.registry import make, resolve_config

    with pytest.raises(ValueError, match="has no state_dict"):
        make("frozenlake", **resolve_config("frozenlake", {"format": "grounding_structured"}))
