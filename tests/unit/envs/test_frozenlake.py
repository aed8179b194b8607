"""Tests of envs/frozenlake.py: maps, rules, rewards, slips, renders and the state text."""

from __future__ import annotations

import numpy as np
import pytest

from envs.frozenlake import FrozenLake, make_env
from envs.grid import moved
from tests.envs_api import env_reset, env_step
from tests.unit.envs import grid_helpers
from tests.unit.envs.grid_helpers import answer


def env_at(rows: str, **config):
    return grid_helpers.env_at(make_env, rows, **config)


def play(env, plan: list[str]) -> list:
    """Run ``plan`` through ``step`` in chunks of ``max_actions``; the step results."""
    results = []
    for i in range(0, len(plan), env.max_actions):
        results.append(env_step(env, answer(plan[i : i + env.max_actions])))
    return results


@pytest.mark.parametrize("size, seeds, max_len", [(4, 300, 5), (8, 60, None)])
def test_every_map_is_solvable_and_its_plan_reaches_the_goal(size, seeds, max_len):
    for seed in range(seeds):
        env = make_env(size=size, max_solution_length=max_len, max_turns=20, reasoning_reward=None)
        env_reset(env, seed)
        plan = env.solve()
        assert plan and (max_len is None or len(plan) <= max_len)
        results = play(env, plan)
        assert results[-1].done and results[-1].info["success"]
        assert not any(r.done for r in results[:-1])
        # 10 at the goal, the default step penalty (VAGEN's -0.1) for every executed action
        assert sum(r.info["metrics"]["env_reward"] for r in results) == pytest.approx(10.0 - 0.1 * len(plan))
        assert env.game.text().count("√") == 1


def test_text_render_and_legend_are_exact():
    env = env_at("P_O_\n____\n__OG\nO___")
    assert env.game.text() == "P_O_\n____\n__OG\nO___"
    observation = env_step(env, "not an answer").observation  # executes nothing, shows the state
    assert "\nP_O_\n____\n__OG\nO___\n" in observation.text
    legend = "P: the player\n_: frozen ice (safe)\nO: a hole\nG: the goal\n"
    legend += "X: the player fallen into a hole\n√: the player on the goal"
    assert legend in env.system_prompt()
    assert env.state_text() == (
        "The goal is below and to the right of the player. "
        "The hole is directly to the right of the player. "
        "The hole is below and to the right of the player. "
        "The hole is directly below the player."
    )


def test_falling_into_a_hole_ends_the_episode_and_stops_the_turn():
    env = env_at("P_\nOG")
    result = env_step(env, answer(["Down", "Right", "Up"]))
    assert result.done and not result.info["success"]
    assert result.info["actions"] == ["Down"]
    assert result.info["metrics"]["env_reward"] == pytest.approx(-0.1)  # one action executed
    assert env.game.text() == "__\nXG"


def test_the_border_leaves_the_player_in_place_and_steps_cost_the_penalty():
    env = env_at("P__\n___\n__G", step_penalty=-0.1)
    result = env_step(env, answer(["Up", "Left"]))
    assert not result.done and result.info["actions"] == ["Up", "Left"]
    assert env.game.text() == "P__\n___\n__G"
    assert result.info["metrics"]["env_reward"] == pytest.approx(-0.2)


def test_reaching_the_goal_pays_ten_and_ends_the_turn_there():
    env = env_at("P_G\n___\n___")
    result = env_step(env, answer(["Right", "Right", "Left"]))
    assert result.done and result.info["success"]
    assert result.info["actions"] == ["Right", "Right"]
    assert result.info["metrics"]["env_reward"] == pytest.approx(9.8)  # 10 - 2 actions * 0.1
    assert result.reward == pytest.approx(10.3)  # + 0.5 format
    assert env.game.text() == "__√\n___\n___"


def test_slippery_moves_are_seeded_and_one_third_intended():
    def positions(seed: int) -> list:
        game = FrozenLake(size=8, frozen_prob=1.0, slippery=True, max_solution_length=None)
        game.reset(np.random.default_rng(seed))
        game.goal, out = (-1, -1), []  # no goal: walk forever
        for _ in range(300):
            game.player = (4, 4)
            game.move("Down")
            out.append(game.player)
        return out

    moves = positions(3)
    assert moves == positions(3) and moves != positions(4)
    counts = {pos: moves.count(pos) for pos in set(moves)}
    assert set(counts) == {(5, 4), (4, 3), (4, 5)}  # down, or perpendicular: left, right
    assert all(70 <= n <= 130 for n in counts.values())


def test_image_render_colours_each_kind():
    env = env_at("P_\nOG", render="image", image_size=64)
    image = env_step(env, "not an answer").observation.images[0]
    centre = {pos: tuple(image[16 + 32 * pos[0], 16 + 32 * pos[1]]) for pos in np.ndindex(2, 2)}
    corner = {pos: tuple(image[4 + 32 * pos[0], 4 + 32 * pos[1]]) for pos in np.ndindex(2, 2)}
    assert centre[0, 0] == (220, 60, 60)  # the player's circle
    assert corner[0, 0] == corner[0, 1] == (190, 225, 245)  # frozen ice
    assert centre[1, 0] == (20, 40, 90)  # a hole
    assert centre[1, 1] == (240, 190, 30)  # the goal's diamond
    assert len({centre[0, 0], centre[1, 0], centre[1, 1], corner[0, 1]}) == 4


def test_load_rejects_a_grid_without_one_player_and_one_goal():
    game = FrozenLake(size=2)
    with pytest.raises(ValueError):
        game.load("__\n_G")
    with pytest.raises(ValueError):
        game.load("P_\nGG")


@pytest.mark.parametrize("config", [{"size": 1}, {"frozen_prob": 0.0}, {"max_solution_length": 0}])
def test_bad_game_settings_are_rejected(config):
    with pytest.raises(ValueError):
        FrozenLake(**config)


def test_moves_are_gymnasiums_frozen_lake_as_a_naive_walk_predicts():
    """Not slippery, on 200 drawn maps: every move of random walks equals a walk by hand (the
    border holds the player, a hole ends it, the goal ends it with success and pays ten)."""
    rng = np.random.default_rng(0)
    for seed in range(200):
        game = FrozenLake(step_penalty=-0.1)
        game.reset(np.random.default_rng(seed))
        player, holes, goal = game.player, game.holes.copy(), game.goal
        for _ in range(8):
            action = game.action_space[int(rng.integers(4))]
            r, c = moved(player, action)
            player = (r, c) if 0 <= r < 4 and 0 <= c < 4 else player
            success = player == goal
            expected = (-0.1 + 10.0 * success, success or bool(holes[player]), success)
            assert game.move(action) == pytest.approx(expected) and game.player == player
            if expected[1]:
                break


def test_blank_images_keep_the_size_and_the_episode_and_lose_only_the_picture():
    from envs.registry import make as make_env_by_name
    from envs.registry import resolve_config

    seen, blank = (make_env_by_name("frozenlake", **resolve_config(
        "frozenlake", {"render": "image", "image_size": 48, "blank_images": b})) for b in (False, True))
    a, b = seen.reset(seed=9)[0], blank.reset(seed=9)[0]
    assert a["text"] == b["text"] and b["images"][0].shape == a["images"][0].shape == (48, 48, 3)
    assert (b["images"][0] == 255).all() and not (a["images"][0] == 255).all()
    assert seen.state_text() == blank.state_text()  # the same map underneath
    with pytest.raises(ValueError, match="needs render=image or both"):
        make_env_by_name("frozenlake", **resolve_config("frozenlake", {"blank_images": True}))


def test_render_both_is_the_picture_then_the_text_observation():
    """render=both: the image render's picture and the text render's state, in that order, and
    the system prompt explains both; the episode is the same whichever is shown."""
    from envs.registry import make as make_env_by_name
    from envs.registry import resolve_config

    envs = {render: make_env_by_name("frozenlake", **resolve_config(
        "frozenlake", {"render": render, "image_size": 48})) for render in ("text", "image", "both")}
    obs = {render: env.reset(seed=4)[0] for render, env in envs.items()}
    grid = envs["text"].render()
    assert grid in obs["text"]["text"] and grid in obs["both"]["text"]
    assert grid not in obs["image"]["text"]
    assert obs["both"]["text"].index("<image>") < obs["both"]["text"].index(grid)
    assert obs["both"]["text"].replace(f"<image>\n{grid}", "<image>") == obs["image"]["text"]
    assert (obs["both"]["images"][0] == obs["image"]["images"][0]).all()
    prompt = envs["both"].system_prompt()
    game = envs["both"].game
    assert game.image_legend in prompt and game.text_legend in prompt
    assert game.text_legend not in envs["image"].system_prompt()
    assert envs["both"].observed_as == "image" and envs["text"].observed_as == "text"
