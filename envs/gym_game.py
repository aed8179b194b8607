"""Any gymnasium env with discrete actions that renders text or draws, played through VAGEN's layer.

``GymGame`` adapts a ``gymnasium.Env`` (a ``Discrete`` action space; ``render_mode="ansi"`` or
``"rgb_array"``) to the game interface of envs/grid_env.py (``GridGame``), so ``GridEnv`` adds to
it what VAGEN adds to every env: the answer formats and their parser, the format reward, the turn
limit, up to ``max_actions_per_turn`` named actions a turn, and the reasoning judge where the env
can state its state in words. ``make_env`` builds one from a registered gymnasium id
(``env.id=CliffWalking-v1``; ``env.id=<package>:<id>`` imports the package that registers it
first, which ids of ``REGISTERED_BY``, MiniGrid's and BabyAI's, need not say) or an importable class
(``env.entry_point=my_pkg.envs:MyEnv``): ``env=gym`` in a run (configs/env/gym.yaml).

What the env must provide (or the config say):
- discrete actions and their names: ``action_names`` in the config, else the env's
  ``metadata["action_names"]``, else the names of its actions' ``IntEnum`` (``env.unwrapped.actions``,
  as MiniGrid has: left, right, forward, pickup, drop, toggle, done), else the names known here
  for gymnasium's toy-text games (``ACTION_NAMES``). The model answers with the names; each
  executes one ``step``;
- a text rendering or a picture. An env with ``"ansi"`` among its ``render_modes`` is observed as
  text (``env.render=text``): ``render()`` in that mode, colour codes stripped, is the
  observation. An env without it that draws (``"rgb_array"``: MiniGrid, BabyAI) is observed as
  pictures (``env.render=image``, for a vision-language model): ``render()`` in that mode is the
  observation's one picture, padded black to a square and resized to ``image_size`` a side
  (``image``). It has no text, so ``env.render=text`` and ``both`` are refused for it, naming
  ``env.render=image``; its map (``layout``, for held-out seeds: envs/splits.py) is a hash of
  its first picture and its mission;
- optionally a mission: an observation that is a dict with a ``"mission"`` text (MiniGrid's,
  BabyAI's) is said in every observation (``instruction``), as the episode's own goal;
- optionally ``state_text()`` (the true state in words, for the reasoning judge; without it the
  judge cannot score and the config must turn it off) and ``solve()`` (a shortest action-name
  sequence to success, for the warm start's demonstrations). Without ``solve()``, an env whose
  dynamics are a deterministic table, as gymnasium's toy-text games publish them (``P[s][a] =
  [(1.0, next state, reward, terminated)]`` with the state in ``s``: CliffWalking, Taxi,
  FrozenLake off the ice), is solved here by breadth-first search over the table; an env with
  neither (a slippery one, MiniGrid) gets no warm start. The run decides on its warm start before
  it builds an env (``has_solver``), from the class: a table counts there for gymnasium's
  toy-text games (``TABLES``); an env of your own gets a warm start by having ``solve()``.
Success: ``info["success"]`` where the env reports it, else by the config's ``success`` rule:
``terminated`` (reaching a terminal state is success: CliffWalking, Taxi) or ``positive_reward``
(a terminal step with a positive reward: FrozenLake, whose holes also terminate; MiniGrid, which
pays 1 - 0.9 x steps / max_steps at the goal and 0 where lava ends it).
A step's reward is ``reward_scale`` x the env's, plus ``success_reward`` on the step that succeeds
(defaults 1 and 0: the env's own rewards). The layer adds its format reward (0.5 a well-formed
turn) to them, so their scale matters: CliffWalking's -1 a move makes a malformed answer (0, no
move) pay better than a well-formed one, and RL learns to stop moving; 0.1 and 10, VAGEN's grid
games' scale (-0.1 a move, 10 on success), keep moving worth it.
Truncation by the env's own step limit ends the episode without success. Seeds: the episode of
``reset(seed)`` is the gymnasium env's ``reset(seed=...)`` with a seed drawn from it, so the same
seed replays the same episode (the same first picture).
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import inspect
import re
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs.grid_env import GridEnv, takes_layer
from envs.protocol import squared
from envs.registry import load

ACTION_NAMES: dict[str, tuple[str, ...]] = {
    "CliffWalkingEnv": ("Up", "Right", "Down", "Left"),
    "TaxiEnv": ("South", "North", "East", "West", "Pickup", "Dropoff"),
    "FrozenLakeEnv": ("Left", "Down", "Right", "Up"),
}
"""Action names of gymnasium's toy-text games, by the env's class (so every registered variant,
CliffWalkingSlippery-v1 say, has them; their docs' order)."""
TABLES: dict[str, str] = {"CliffWalkingEnv": "is_slippery", "TaxiEnv": "is_rainy",
                          "FrozenLakeEnv": "is_slippery"}
"""gymnasium's toy-text games, whose dynamics are a table (``P``), by the env's class: the keyword
that makes the table random. While it is false the table is deterministic and ``solve`` searches
it, which ``has_solver`` knows from the config without building the env."""
REGISTERED_BY: dict[str, str] = {"MiniGrid-": "minigrid", "BabyAI-": "minigrid"}
"""Packages that register their gymnasium ids when imported, by their ids' prefix: an id of
theirs needs no ``<package>:`` before it."""
SUCCESS_RULES = ("terminated", "positive_reward")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class NoTextError(ValueError):
    """The env draws its state and renders no text: it is observed as pictures (env.render=image)."""


class GymGame:
    """A gymnasium env as a ``GridGame``: observed as its text rendering (``render_mode="ansi"``)
    or as its pictures (``render_mode="rgb_array"``: ``image``); no layers of its own to draw, no
    objects to describe."""

    shape = (1, 1)

    def __init__(self, env, action_names: Sequence[str], *, task: str = "",
                 success: str = "terminated", success_reward: float = 0.0,
                 reward_scale: float = 1.0) -> None:
        import gymnasium as gym

        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise ValueError(f"the env's actions must be Discrete, got {env.action_space}")
        if len(action_names) != env.action_space.n or len(set(action_names)) != len(action_names):
            raise ValueError(f"{env.action_space.n} actions need as many distinct names, "
                             f"got {list(action_names)}")
        if env.render_mode not in ("ansi", "rgb_array"):
            raise ValueError("the env must render text (render_mode='ansi') or draw "
                             f"(render_mode='rgb_array'), got {env.render_mode!r}")
        if success not in SUCCESS_RULES:
            raise ValueError(f"success must be one of {SUCCESS_RULES}, got {success!r}")
        self.env, self.success, self.success_reward = env, success, float(success_reward)
        self.reward_scale = float(reward_scale)
        self.action_space = tuple(action_names)
        self.task = task
        self.draws = env.render_mode == "rgb_array"
        """Observed as the env's pictures (``image``), not its text."""
        self.text_legend = "The state is drawn as the environment renders it."
        self.image_legend = "The picture is the environment's own drawing of the state."
        self._index = {name: i for i, name in enumerate(self.action_space)}
        self._mission = ""

    def reset(self, rng: np.random.Generator) -> None:
        observation, _ = self.env.reset(seed=int(rng.integers(2**31)))
        self._mission = _mission(observation)

    def move(self, action: str) -> tuple[float, bool, bool]:
        observation, reward, terminated, truncated, info = self.env.step(self._index[action])
        self._mission = _mission(observation)
        if "success" in info:
            success = bool(info["success"])
        else:
            success = terminated and (self.success == "terminated" or reward > 0)
        reward = self.reward_scale * float(reward) + self.success_reward * success
        return reward, bool(terminated or truncated), success

    def instruction(self) -> str:
        """The episode's mission where the env's observation carries one, "" where not."""
        return f"Mission: {self._mission}" if self._mission else ""

    @property
    def has_solver(self) -> bool:
        """The env can ``solve()``, or its dynamics are a deterministic table to search (the warm
        start's demonstrations need one of them)."""
        return hasattr(self.env.unwrapped, "solve") or self._table() is not None

    def solve(self) -> list[str] | None:
        """The shortest action names from the current state to success (the env's own solver
        where it has one), or None where success cannot be reached."""
        own = getattr(self.env.unwrapped, "solve", None)
        if own is not None:
            return own()
        table, state = self._table(), getattr(self.env.unwrapped, "s", None)
        return None if table is None or state is None else self._search(table, int(state))

    def _table(self) -> dict | None:
        """The env's transition table ``P`` if it is one this search can use: every state's every
        action has one outcome, with probability 1 (the current state is the env's ``s``)."""
        if not hasattr(self, "_deterministic_table"):
            u = self.env.unwrapped
            table = getattr(u, "P", None)
            usable = isinstance(table, dict) and bool(table) and all(
                len(outcomes) == 1 and outcomes[0][0] == 1.0
                for actions in table.values() for outcomes in actions.values())
            self._deterministic_table = table if usable else None
        return self._deterministic_table

    def _search(self, table: dict, start: int) -> list[str] | None:
        """Breadth-first over ``table`` from ``start`` to a step that counts as success."""
        came_from: dict[int, tuple[int, int] | None] = {start: None}
        queue = deque([start])
        while queue:
            state = queue.popleft()
            for action, ((_, after, reward, terminated),) in table[state].items():
                if terminated and (self.success == "terminated" or reward > 0):
                    path = [action]
                    while came_from[state] is not None:
                        state, previous = came_from[state]
                        path.append(previous)
                    return [self.action_space[a] for a in reversed(path)]
                if not terminated and int(after) not in came_from:
                    came_from[int(after)] = (state, action)
                    queue.append(int(after))
        return None

    def reasoning(self) -> str:
        """A demonstration's reasoning: how long the shortest way is and how it starts."""
        plan = self.solve() or []
        if not plan:
            return "No way to the goal is left, so any move will do."
        moves = f"{len(plan)} move{'s' if len(plan) > 1 else ''}"
        return f"The shortest way to the goal takes {moves} and starts {', '.join(plan[:3])}."

    def text(self) -> str:
        if self.draws:
            raise NotImplementedError("this env draws its state and renders no text (render: image)")
        return _ANSI.sub("", self.env.render()).strip("\n")

    def layout(self) -> str:
        """The map of the episode just drawn, for held-out seeds (envs/splits.py): the text at
        its start, or for an env that draws a hash of its first picture, with its mission."""
        if not self.draws:
            return self.text()
        frame = self._frame()
        digest = hashlib.blake2b(frame.tobytes(), digest_size=16).hexdigest()
        return f"{digest} {frame.shape}\n{self._mission}"

    def image(self, size: int) -> np.ndarray:
        """The env's picture of its state, Shape: (size, size, 3) uint8: its ``rgb_array`` frame
        padded black to a square (centred) and resized."""
        return squared(self._frame(), size, fill=0)

    def _frame(self) -> np.ndarray:
        """The env's ``rgb_array`` render, checked: (H, W, 3) uint8."""
        frame = np.asarray(self.env.render())
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError(f"an rgb_array render must be (H, W, 3) uint8, got {frame.shape} {frame.dtype}")
        return frame

    @property
    def describes(self) -> bool:
        """The env states its state in words (``state_text``): the reasoning judge can score."""
        return hasattr(self.env.unwrapped, "state_text")

    def state_text(self) -> str:
        return self.env.unwrapped.state_text() if self.describes else ""

    def layers(self):
        raise NotImplementedError("a gymnasium env is observed as its own text or pictures")

    def objects(self):
        raise NotImplementedError("a gymnasium env states its state through state_text()")

    def close(self) -> None:
        self.env.close()


@takes_layer
def make_env(*, id: str | None = None, entry_point: str | None = None,
             kwargs: dict[str, Any] | None = None, action_names: Sequence[str] | None = None,
             success: str = "terminated", success_reward: float = 0.0, reward_scale: float = 1.0,
             task: str = "", **layer: Any) -> GridEnv:
    """The gymnasium env ``id`` (``gymnasium.make``) or ``entry_point`` ("module:Class", built
    with ``kwargs``) in VAGEN's layer; ``layer`` is GridEnv's settings (format, max_turns, ...).
    An env that renders text is built in ``"ansi"`` mode and observed as text; one that only
    draws, in ``"rgb_array"`` mode and observed as pictures (``render: image``). Raises
    ``NoTextError`` for ``render: text`` or ``both`` on an env that renders no text, ValueError
    for any other setting the env cannot take."""
    import gymnasium as gym

    _check_one_of(id, entry_point)
    render = layer.get("render", "text")
    kwargs = {"render_mode": "ansi" if render == "text" else "rgb_array", **(kwargs or {})}
    if id is not None:
        env = gym.make(_spec(id), **kwargs)
    else:
        env = load(entry_point, "entry_point")(**kwargs)
    modes = env.metadata.get("render_modes", ())
    problem = None
    if "ansi" in modes and render != "text":
        problem = "is observed as text here (env.render=text)"
    elif "ansi" not in modes and "rgb_array" not in modes:
        problem = f"renders no text ('ansi' is not among its render_modes {modes}) and draws no pictures ('rgb_array')"
    if problem:
        env.close()
        raise ValueError(f"{id or entry_point} {problem}")
    if "ansi" not in modes and render != "image":
        env.close()
        raise NoTextError(
            f"{id or entry_point} renders no text: 'ansi' is not among its render_modes {modes}; it "
            f"draws ('rgb_array'), so observe it as pictures with env.render=image (not {render}), "
            "by a vision-language model (model.vision=true builds a tiny one)")
    names = action_names or env.metadata.get("action_names") or _enum_names(env) or ACTION_NAMES.get(
        type(env.unwrapped).__name__)
    if names is None:
        env.close()
        raise ValueError(f"name the actions of {id or entry_point} (env.action_names=[...]): "
                         "its metadata has no action_names and it has no actions enum")
    game = GymGame(env, names, task=task, success=success, success_reward=success_reward,
                   reward_scale=reward_scale)
    layer.setdefault("reasoning_reward", None)
    if not game.describes and layer["reasoning_reward"] is not None:
        env.close()
        raise ValueError(f"{id or entry_point} has no state_text(): the reasoning judge cannot score "
                         "it (env.reasoning_reward=null)")
    example = tuple(game.action_space[:min(2, len(game.action_space))])
    return GridEnv(game, action_example=example, **layer)


def _mission(observation: Any) -> str:
    """The mission an observation carries (a dict's ``"mission"`` text: MiniGrid's), else ""."""
    mission = observation.get("mission") if isinstance(observation, Mapping) else None
    return mission.strip() if isinstance(mission, str) else ""


def _enum_names(env) -> list[str] | None:
    """The names of the env's actions' ``IntEnum`` (``env.unwrapped.actions``, MiniGrid's), by
    value 0 to n - 1; None where it has none or it does not name them all."""
    actions = getattr(env.unwrapped, "actions", None)
    if not (isinstance(actions, type) and issubclass(actions, enum.IntEnum)):
        return None
    by_value = {int(a): a.name for a in actions}
    n = getattr(env.action_space, "n", 0)
    return [by_value[i] for i in range(n)] if all(i in by_value for i in range(n)) else None


def _spec(id: str):
    """gymnasium's spec of ``id``, the package that registers it imported first: the one it
    names (``<package>:<id>``, as ``gymnasium.make`` reads it), else ``REGISTERED_BY``'s.
    ValueError, saying how to name the package, for an id that is not registered."""
    import gymnasium as gym

    package, _, name = id.rpartition(":")
    package = package or next((p for prefix, p in REGISTERED_BY.items() if name.startswith(prefix)), "")
    if package:
        importlib.import_module(package)
    try:
        return gym.spec(name)
    except gym.error.NameNotFound as e:
        raise ValueError(f"{e} If a package registers it when imported, name the package: "
                         f"env.id=<package>:{name}") from None


def has_solver(config: Mapping[str, Any]) -> bool:
    """Whether ``make_env(**config)`` can solve its episodes, known without building the env
    (the run decides on its warm start with it, launch/model/prepare.py): its class has
    ``solve()``, or it is a toy-text game of ``TABLES`` whose keywords (the registered id's, then
    ``kwargs``) leave its table deterministic. A built env's ``GymGame.has_solver`` also finds a
    deterministic table in an env of another class, which is not known before it is built: such
    an env gets a warm start by defining ``solve()``."""
    id, entry_point = config.get("id"), config.get("entry_point")
    _check_one_of(id, entry_point)
    spec = _spec(id) if id is not None else None
    creator = load(entry_point, "entry_point") if spec is None else spec.entry_point
    cls = load(creator) if isinstance(creator, str) else creator
    if hasattr(cls, "solve"):
        return True
    switch = TABLES.get(getattr(cls, "__name__", ""))
    if switch is None:
        return False
    kwargs = {**(spec.kwargs if spec is not None else {}), **(config.get("kwargs") or {})}
    return not kwargs.get(switch, inspect.signature(cls).parameters[switch].default)


def _check_one_of(id: str | None, entry_point: str | None) -> None:
    if (id is None) == (entry_point is None):
        raise ValueError("give the env as exactly one of id (a gymnasium id) or entry_point "
                         f"(module:Class), got id={id!r}, entry_point={entry_point!r}")
