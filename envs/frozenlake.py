"""FrozenLake: walk from the start to the goal over frozen cells without falling into a hole.

``FrozenLake`` is the game (map generation, solver, render data); its moves are gymnasium's
``FrozenLakeEnv`` on the drawn map (the same dynamics: the border holds the player, a hole or the
goal ends the episode, a slippery move goes the intended way or either perpendicular way with 1/3
each, drawn from the lake's generator, seeded by the episode's). The maps are drawn here, not by
gymnasium's ``generate_random_map``, which always starts top-left with the goal bottom-right:
VAGEN draws both anywhere, and so does the default job as measured (the same maps and moves as
before the lake was gymnasium's). Building the lake's transition table at each reset costs
little beside an episode's generation.
``make_env`` wraps the game
in envs.grid_env.GridEnv, VAGEN's layer (a gymnasium env). Called through envs.registry.
Invariants (VAGEN's settings are the defaults):
- Every generated map has a path from the start to the goal over frozen cells (checked by BFS),
  of at most ``max_solution_length`` moves (5, as VAGEN filters its seeds; None: any length).
- Reaching the goal gives ``goal_reward`` (10: VAGEN's 1 + 9 bonus) and ends the episode with
  success; entering a hole ends it without; moving into the border leaves the player in place.
  Every executed action also costs ``step_penalty`` (added, so a penalty is negative).
- Slippery: the intended move happens with probability 1/3, each perpendicular move with 1/3,
  drawn from the lake's generator (seeded from the episode's), so the same seed replays the same
  slips.
"""

from __future__ import annotations

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

from envs.grid import Pos, Tile, bfs, cells_of, from_text, moved, to_text
from envs.grid_env import GridEnv, check_int, takes_layer

_SYMBOLS = "P_OGX√"
_TILES = {
    "frozen": Tile("tile", (190, 225, 245)),
    "hole": Tile("tile", (20, 40, 90)),
    "goal": Tile("diamond", (240, 190, 30)),
    "player": Tile("circle", (220, 60, 60)),
}


class FrozenLake:
    """The game state and rules. ``reset`` draws a map; ``move`` applies one action."""

    action_space: tuple[str, ...] = ("Left", "Down", "Right", "Up")
    task = (
        "You are walking on a frozen lake. Reach the goal without falling into a hole. "
        "Moving into the edge of the lake leaves you where you are."
    )
    text_legend = (
        "The lake is a grid of symbols, one per cell, with row 0 at the top:\n"
        "P: the player\n_: frozen ice (safe)\nO: a hole\nG: the goal\n"
        "X: the player fallen into a hole\n√: the player on the goal"
    )
    image_legend = (
        "The lake is shown from above as a grid of cells: light blue cells are frozen ice (safe), "
        "dark blue cells are holes, the yellow diamond is the goal and the red circle is you."
    )

    def __init__(
        self,
        *,
        size: int = 4,
        frozen_prob: float = 0.8,
        slippery: bool = False,
        max_solution_length: int | None = 5,
        step_penalty: float = 0.0,
        goal_reward: float = 10.0,
    ) -> None:
        check_int("size", size, 2)
        if max_solution_length is not None:
            check_int("max_solution_length", max_solution_length, 1)
        if not 0.0 < frozen_prob <= 1.0:
            raise ValueError(f"frozen_prob must be in (0, 1], got {frozen_prob!r}")
        self.size, self.frozen_prob, self.slippery = size, float(frozen_prob), bool(slippery)
        self.max_solution_length = max_solution_length
        self.step_penalty, self.goal_reward = float(step_penalty), float(goal_reward)
        self.shape = (size, size)
        self.holes = np.zeros(self.shape, dtype=bool)
        self.goal: Pos = (0, 0)
        self._lake: FrozenLakeEnv | None = None
        self._player: Pos = (0, 0)

    @property
    def player(self) -> Pos:
        return self._player

    @player.setter
    def player(self, pos: Pos) -> None:  # the lake's state follows (tests set it)
        self._player = pos
        if self._lake is not None:
            self._lake.s = pos[0] * self.size + pos[1]

    def reset(self, rng: np.random.Generator) -> None:
        """Draw a map with a path from start to goal; ``rng`` then seeds the lake's slips."""
        while True:
            self.holes = rng.random(self.shape) >= self.frozen_prob
            start, goal = rng.choice(self.size * self.size, size=2, replace=False)
            self._lake = None
            self.player, self.goal = divmod(int(start), self.size), divmod(int(goal), self.size)
            self.holes[self.player] = self.holes[self.goal] = False
            plan, limit = self.solve(), self.max_solution_length
            if plan is not None and (limit is None or len(plan) <= limit):
                self._new_lake(int(rng.integers(2**31)))
                return

    def _new_lake(self, seed: int) -> None:
        """gymnasium's FrozenLakeEnv on this map, its state on the player."""
        desc = np.where(self.holes, "H", "F")
        desc[self.goal] = "G"
        desc[self.player] = "S"
        self._lake = FrozenLakeEnv(desc=["".join(row) for row in desc], is_slippery=self.slippery)
        self._lake.reset(seed=seed)

    def move(self, action: str) -> tuple[float, bool, bool]:
        """Apply one action of ``action_space``; returns (reward, episode over, success)."""
        state, _, terminated, _, _ = self._lake.step(self.action_space.index(action))
        self._player = divmod(int(state), self.size)
        if self.player == self.goal:
            return self.step_penalty + self.goal_reward, True, True
        return self.step_penalty, bool(terminated), False

    def solve(self) -> list[str] | None:
        """A shortest path to the goal as if not slippery; None from a hole."""

        def moves(pos: Pos):
            for action in self.action_space:
                r, c = moved(pos, action)
                if 0 <= r < self.size and 0 <= c < self.size and not self.holes[r, c]:
                    yield action, (r, c)

        if self.holes[self.player]:
            return None
        return bfs(self.player, moves, lambda pos: pos == self.goal)

    def chars(self) -> np.ndarray:
        """The symbol grid as a 2-D character array (see ``text_legend``)."""
        chars = np.where(self.holes, "O", "_")
        chars[self.goal] = "G"
        on = chars[self.player]
        chars[self.player] = {"O": "X", "G": "√"}.get(on, "P")
        return chars

    def text(self) -> str:
        return to_text(self.chars())

    def load(self, text: str) -> None:
        """Set the state from a symbol grid (the inverse of ``text``); for tests and demos."""
        chars = from_text(text, _SYMBOLS)
        players, goals = cells_of(chars, "PX√"), cells_of(chars, "G√")
        if chars.shape != self.shape or len(players) != 1 or len(goals) != 1:
            raise ValueError(f"need a {self.shape} grid with one player and one goal: {text!r}")
        self.holes = np.isin(chars, ["O", "X"])
        self._lake = None
        self.player, self.goal = players[0], goals[0]
        self._new_lake(0)

    def layers(self) -> list[tuple[np.ndarray, Tile]]:
        """The RGB render's layers, bottom to top (see envs.grid.render_rgb)."""
        goal, player = np.zeros(self.shape, bool), np.zeros(self.shape, bool)
        goal[self.goal] = player[self.player] = True
        return [(~self.holes, _TILES["frozen"]), (self.holes, _TILES["hole"]),
                (goal, _TILES["goal"]), (player, _TILES["player"])]  # fmt: skip

    def objects(self) -> tuple[Pos, list[tuple[str, Pos]]]:
        """The player and the things to describe relative to it: the goal, then the holes."""
        holes = [("hole", pos) for pos in cells_of(self.chars(), "OX")]
        return self.player, [("goal", self.goal), *holes]


@takes_layer
def make_env(
    *,
    size: int = 4,
    frozen_prob: float = 0.8,
    slippery: bool = False,
    max_solution_length: int | None = 5,
    step_penalty: float = -0.1,
    **config,
) -> GridEnv:
    """FrozenLake as an Env; ``config`` holds GridEnv's settings (format, render, ...)."""
    game = FrozenLake(
        size=size,
        frozen_prob=frozen_prob,
        slippery=slippery,
        max_solution_length=max_solution_length,
        step_penalty=step_penalty,
    )
    return GridEnv(game, action_example=("Left", "Down"), **config)
