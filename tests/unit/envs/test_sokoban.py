"""Tests of envs/sokoban.py and envs/sokoban_gen.py: rooms, push rules, rewards, renders."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from envs.grid import MOVES, moved
from envs.sokoban import Sokoban, make_env
from tests.envs_api import env_reset, env_step
from tests.unit.envs import grid_helpers
from tests.unit.envs.grid_helpers import answer


def env_at(rows: str, **config):
    return grid_helpers.env_at(make_env, rows, **config)


def step(env, actions: list[str]):
    """(env reward, done, success, executed actions) of one turn."""
    result = env_step(env, answer(actions))
    info = result.info
    return info["metrics"]["env_reward"], result.done, info["success"], info["actions"]


def connected(floor: set) -> bool:
    start = next(iter(floor))
    seen, queue = {start}, deque([start])
    while queue:
        pos = queue.popleft()
        for action in MOVES:
            nxt = moved(pos, action)
            if nxt in floor and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen == floor


@pytest.mark.parametrize(
    "size, num_boxes, seeds, max_len", [(6, 1, 200, 5), (7, 2, 40, 5), (7, 2, 10, None)]
)
def test_every_room_is_solvable_and_its_plan_solves_it(size, num_boxes, seeds, max_len):
    for seed in range(seeds):
        env = make_env(
            size=size,
            num_boxes=num_boxes,
            max_solution_length=max_len,
            max_turns=30,
            reasoning_reward=None,
        )
        env_reset(env, seed)
        game = env.game
        assert game.walls[[0, -1]].all() and game.walls[:, [0, -1]].all()
        assert connected({(int(r), int(c)) for r, c in np.argwhere(~game.walls)})
        assert len(game.boxes) == len(game.targets) == num_boxes and game.boxes != game.targets
        assert game.player not in game.boxes and not game.walls[game.player]
        plan = env.solve()
        assert plan and (max_len is None or len(plan) <= max_len)
        on_target = len(game.boxes & game.targets)
        total = 0.0
        for i in range(0, len(plan), env.max_actions):
            reward, done, success, _ = step(env, plan[i : i + env.max_actions])
            total += reward
            assert done == success == (i + env.max_actions >= len(plan))
        assert total == pytest.approx(-0.1 * len(plan) + (num_boxes - on_target) + 10.0)


def test_walking_onto_a_target_costs_one_step():
    env = env_at("######\n#PO__#\n#____#\n#__X_#\n#____#\n######")
    assert step(env, ["Right"]) == (pytest.approx(-0.1), False, False, ["Right"])
    assert env.game.text() == "######\n#_S__#\n#____#\n#__X_#\n#____#\n######"


def test_a_box_against_a_wall_blocks_the_move():
    env = env_at("######\n#XP__#\n#____#\n#__O_#\n#____#\n######")
    assert step(env, ["Left", "Up"]) == (pytest.approx(-0.2), False, False, ["Left", "Up"])
    assert env.game.text() == "######\n#XP__#\n#____#\n#__O_#\n#____#\n######"


def test_a_box_against_a_box_blocks_the_move():
    env = env_at("######\n#_XXP#\n#O_O_#\n#____#\n#____#\n######")
    assert step(env, ["Left"]) == (pytest.approx(-0.1), False, False, ["Left"])
    assert env.game.text() == "######\n#_XXP#\n#O_O_#\n#____#\n#____#\n######"


def test_pushing_onto_targets_pays_one_each_and_ten_when_all_are_on():
    env = env_at("######\n#_OXP#\n#__X_#\n#__O_#\n#____#\n######")
    assert step(env, ["Left"]) == (pytest.approx(0.9), False, False, ["Left"])
    assert env.game.text() == "######\n#_√P_#\n#__X_#\n#__O_#\n#____#\n######"
    assert step(env, ["Down", "Down"]) == (pytest.approx(10.9), True, True, ["Down"])
    assert env.game.text() == "######\n#_√__#\n#__P_#\n#__√_#\n#____#\n######"


def test_pushing_off_a_target_costs_one():
    env = env_at("######\n#__√P#\n#__X_#\n#____#\n#O___#\n######")
    assert step(env, ["Left"]) == (pytest.approx(-1.1), False, False, ["Left"])
    assert env.game.text() == "######\n#_XS_#\n#__X_#\n#____#\n#O___#\n######"


def test_walking_away_from_a_box_does_not_pull_it():
    env = env_at("######\n#_XP_#\n#____#\n#__O_#\n#____#\n######")
    step(env, ["Right", "Down"])
    assert env.game.text() == "######\n#_X__#\n#___P#\n#__O_#\n#____#\n######"


def test_solve_is_optimal_and_none_for_a_cornered_box():
    env = env_at("######\n#X___#\n#__P_#\n#__O_#\n#____#\n######")
    assert env.solve() is None
    env = env_at("######\n#____#\n#_XP_#\n#__O_#\n#____#\n######")
    plan = env.solve()
    assert plan == ["Up", "Left", "Down", "Left", "Down", "Right"]  # push down, then right
    assert [env.game.move(action)[2] for action in plan] == [False] * 5 + [True]


def test_text_legend_and_state_text_are_exact():
    env = env_at("######\n#_OXP#\n#__X_#\n#__O_#\n#____#\n######")
    legend = "#: wall\n_: floor\nO: target\nX: box\n√: box on a target\nP: the player\n"
    legend += "S: the player on a target"
    assert legend in env.system_prompt()
    observation = env_step(env, "not an answer").observation  # executes nothing, shows the state
    assert "\n######\n#_OXP#\n#__X_#\n#__O_#\n#____#\n######\n" in observation.text
    assert env.state_text() == (
        "The box is directly to the left of the player. "
        "The box is below and to the left of the player. "
        "The target is directly to the left of the player. "
        "The target is below and to the left of the player."
    )


def test_image_render_colours_player_box_target_distinctly():
    env = env_at("######\n#PXO_#\n#√___#\n#____#\n#____#\n######", render="image", image_size=96)
    image = env_step(env, "not an answer").observation.images[0]
    centre = lambda r, c: tuple(image[16 * r + 8, 16 * c + 8])  # noqa: E731
    ring = lambda r, c: tuple(image[16 * r + 8, 16 * c + 2])  # noqa: E731 (inside the ring band)
    player, box, box_on_target = centre(1, 1), centre(1, 2), centre(2, 1)
    target, floor, wall = ring(1, 3), centre(1, 3), centre(0, 0)
    assert player == (40, 90, 220) and box == (230, 160, 40) and target == (220, 40, 40)
    assert len({player, box, box_on_target, target, floor, wall}) == 6


def test_load_and_settings_are_checked():
    game = Sokoban(size=5)
    with pytest.raises(ValueError):
        game.load("#####\n#PX_#\n#___#\n#___#\n#####")  # a box but no target
    with pytest.raises(ValueError):
        Sokoban(size=6, num_boxes=5)
    with pytest.raises(ValueError):
        Sokoban(size=4)
