"""Sokoban: push every box onto a target.

``Sokoban`` is the game (rules, solver, render data; rooms come from envs.sokoban_gen);
``make_env`` wraps it in envs.grid_env.GridEnv, the text protocol (envs.protocol.Env). Called
through envs.registry. Invariants (VAGEN's settings are the defaults):
- Classic push rules: moving into a box pushes it when the cell beyond is floor or target without
  a box; otherwise, as into a wall, the move is blocked and the player stays. No pulling.
- Every executed action costs ``step_penalty`` (-0.1), blocked or not; a push onto a target gives
  +1, off a target -1; all boxes on targets gives +10 and ends the episode with success.
- Generated rooms are not already solved and are solvable in at most ``max_solution_length`` moves
  (5, as VAGEN filters its seeds; None: any length), see envs.sokoban_gen.
"""

from __future__ import annotations

import numpy as np

from envs.grid import Pos, Tile, cells_of, from_text, to_text
from envs.grid_env import GridEnv, check_int, takes_layer
from envs.sokoban_gen import generate, push, solve

_SYMBOLS = "#_OX√PS"
_TILES = {
    "floor": Tile("tile", (215, 205, 185)),
    "wall": Tile("tile", (90, 60, 50)),
    "target": Tile("ring", (220, 40, 40)),
    "box": Tile("square", (230, 160, 40)),
    "box_on_target": Tile("square", (60, 170, 70)),
    "player": Tile("circle", (40, 90, 220)),
}


class Sokoban:
    """The game state and rules. ``reset`` draws a room; ``move`` applies one action."""

    action_space: tuple[str, ...] = ("Up", "Down", "Left", "Right")
    task = (
        "You are a Sokoban player. Push every box onto a target. You push a box by moving into "
        "it, if the cell behind it is free; you cannot pull boxes or push two at once, and you "
        "cannot walk through walls."
    )
    text_legend = (
        "The room is a grid of symbols, one per cell, with row 0 at the top:\n"
        "#: wall\n_: floor\nO: target\nX: box\n√: box on a target\nP: the player\n"
        "S: the player on a target"
    )
    image_legend = (
        "The room is shown from above as a grid of cells: brown cells are walls, beige cells are "
        "floor, red rings are targets, orange squares are boxes, green squares are boxes on "
        "targets and the blue circle is you."
    )

    def __init__(
        self,
        *,
        size: int = 6,
        num_boxes: int = 1,
        max_solution_length: int | None = 5,
        step_penalty: float = -0.1,
        box_reward: float = 1.0,
        solved_reward: float = 10.0,
    ) -> None:
        check_int("size", size, 5)
        check_int("num_boxes", num_boxes, 1)
        if num_boxes > (size - 2) ** 2 // 4:
            raise ValueError(f"num_boxes {num_boxes} is too many for a {size}x{size} room")
        if max_solution_length is not None:
            check_int("max_solution_length", max_solution_length, 1)
        self.size, self.num_boxes, self.max_solution_length = size, num_boxes, max_solution_length
        self.step_penalty, self.box_reward = float(step_penalty), float(box_reward)
        self.solved_reward = float(solved_reward)
        self.shape = (size, size)
        self.walls = np.ones(self.shape, dtype=bool)
        self.targets: frozenset[Pos] = frozenset()
        self.boxes: frozenset[Pos] = frozenset()
        self.player: Pos = (0, 0)

    def reset(self, rng: np.random.Generator) -> None:
        """Draw a solvable, unsolved room from ``rng``."""
        room = generate(rng, self.size, self.num_boxes, self.max_solution_length)
        self.walls, self.targets, self.boxes, self.player = room

    def move(self, action: str) -> tuple[float, bool, bool]:
        """Apply one action of ``action_space``; returns (reward, episode over, success)."""
        reward = self.step_penalty
        result = push(self.walls, self.boxes, self.player, action)
        if result is not None:
            on_before = len(self.boxes & self.targets)
            self.player, self.boxes = result
            reward += self.box_reward * (len(self.boxes & self.targets) - on_before)
        if self.boxes == self.targets:
            return reward + self.solved_reward, True, True
        return reward, False, False

    def solve(self) -> list[str] | None:
        """A shortest action sequence solving the room; None when it cannot be solved."""
        return solve(self.walls, self.targets, self.boxes, self.player)

    def chars(self) -> np.ndarray:
        """The symbol grid as a 2-D character array (see ``text_legend``)."""
        chars = np.where(self.walls, "#", "_")
        for pos in self.targets:
            chars[pos] = "O"
        for pos in self.boxes:
            chars[pos] = "√" if pos in self.targets else "X"
        chars[self.player] = "S" if self.player in self.targets else "P"
        return chars

    def text(self) -> str:
        return to_text(self.chars())

    def load(self, text: str) -> None:
        """Set the state from a symbol grid (the inverse of ``text``); for tests and demos."""
        chars = from_text(text, _SYMBOLS)
        players = cells_of(chars, "PS")
        boxes, targets = cells_of(chars, "X√"), cells_of(chars, "O√S")
        counts_ok = len(players) == 1 and len(boxes) == len(targets) > 0
        if chars.shape != self.shape or not counts_ok:
            raise ValueError(
                f"need a {self.shape} room with one player and as many boxes as targets: {text!r}"
            )
        self.walls = chars == "#"
        self.player, self.boxes, self.targets = players[0], frozenset(boxes), frozenset(targets)

    def layers(self) -> list[tuple[np.ndarray, Tile]]:
        """The RGB render's layers, bottom to top (see envs.grid.render_rgb)."""
        targets, boxes, player = (np.zeros(self.shape, bool) for _ in range(3))
        for pos in self.targets:
            targets[pos] = True
        for pos in self.boxes:
            boxes[pos] = True
        player[self.player] = True
        return [
            (~self.walls, _TILES["floor"]),
            (self.walls, _TILES["wall"]),
            (targets & ~boxes, _TILES["target"]),
            (boxes & ~targets, _TILES["box"]),
            (boxes & targets, _TILES["box_on_target"]),
            (player, _TILES["player"]),
        ]

    def objects(self) -> tuple[Pos, list[tuple[str, Pos]]]:
        """The player and the things to describe relative to it: boxes, then targets."""
        boxes = [("box", pos) for pos in sorted(self.boxes)]
        return self.player, boxes + [("target", pos) for pos in sorted(self.targets)]


@takes_layer
def make_env(
    *,
    size: int = 6,
    num_boxes: int = 1,
    max_solution_length: int | None = 5,
    step_penalty: float = -0.1,
    **config,
) -> GridEnv:
    """Sokoban as an Env; ``config`` holds GridEnv's settings (format, render, ...)."""
    game = Sokoban(
        size=size,
        num_boxes=num_boxes,
        max_solution_length=max_solution_length,
        step_penalty=step_penalty,
    )
    return GridEnv(game, action_example=("Up", "Left"), **config)
