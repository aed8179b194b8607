"""The agent-environment protocol: what an env is, what it returns, what crosses a process boundary.

Called by the env worker pool (envs/pool.py), the env worker (envs/worker.py), the result codec
(envs/wire.py), the env service (envs/main.py) and, through the pool client, by the actors.
Invariants:
- An env speaks text: ``reset(seed)`` gives the first observation, ``step(llm_text)`` takes the
  model's raw answer, parses it itself (envs/formats.py), executes only the valid actions of a
  correctly formatted answer, and returns this turn's total reward.
- Same seed, same episode: ``reset(seed)`` fully determines the episode.
- ``Observation.text`` holds one ``IMAGE_PLACEHOLDER`` per entry of ``Observation.images``, in order.
- Everything here is plain data (str, float, bool, int, lists, dicts and uint8 numpy arrays), so
  it encodes with msgpack without pickle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

IMAGE_PLACEHOLDER = "<image>"


@dataclass
class Observation:
    """What the agent sees at the start of a turn."""

    text: str
    """The user message: the rendered state (a symbol grid, or ``<image>`` placeholders) and
    the instruction for this turn."""
    images: list[np.ndarray] = field(default_factory=list)
    """RGB uint8 arrays, Shape: (H, W, 3), one per ``<image>`` placeholder in ``text``."""

    def __post_init__(self) -> None:
        n = self.text.count(IMAGE_PLACEHOLDER)
        if n != len(self.images):
            raise ValueError(f"{n} {IMAGE_PLACEHOLDER} placeholders but {len(self.images)} images")


@dataclass
class StepResult:
    """The outcome of one turn (one model answer, up to ``max_actions_per_turn`` actions)."""

    observation: Observation
    reward: float
    """This turn's total: env reward + format reward + reasoning reward (+ step penalties)."""
    done: bool
    """The episode ended: success, failure, or the turn limit."""
    info: dict[str, Any]
    """At least: ``success`` (bool), ``format_correct`` (bool), ``actions_valid`` (bool: every
    parsed action was valid), ``actions`` (list[str]: the executed actions), and ``metrics``
    (dict[str, float]: per-turn numbers, e.g. ``env_reward``, ``format_reward``,
    ``reasoning_reward``, ``n_actions``)."""


@runtime_checkable
class Env(Protocol):
    """A multi-turn text (and image) environment. Implementations: envs.frozenlake, envs.sokoban."""

    def system_prompt(self) -> str:
        """The system message: the task, the symbols, the actions and the answer format ("": the
        chat has no system message)."""
        ...

    def reset(self, seed: int) -> Observation:
        """Start the episode that ``seed`` determines; returns the first observation."""
        ...

    def step(self, llm_text: str) -> StepResult:
        """Parse the model's raw answer, execute its valid actions, return the turn's result."""
        ...

    def state_text(self) -> str:
        """The true current state in words (relative positions), for the reasoning judge."""
        ...

    def close(self) -> None:
        """Release resources (renderers, simulators)."""
        ...
