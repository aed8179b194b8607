"""The agent-environment protocol: what an env is, what it returns, what crosses a process boundary.

An env is a gymnasium env (``Env``), made with ``gymnasium.make`` under a ``vagen/...`` id
(envs/registry.py). Called by the env worker (envs/worker.py), which turns its gymnasium results
into the ``Observation`` / ``StepResult`` that the result codec (envs/wire.py), the pool
(envs/pool.py), the env service and, through them, the actors carry.
Invariants:
- An env speaks text: ``reset(seed=...)`` gives the first observation, ``step(llm_text)`` takes
  the model's raw answer, parses it itself (envs/formats.py), executes only the valid actions of
  a correctly formatted answer, and returns this turn's total reward.
- Same seed, same episode: ``reset(seed=...)`` fully determines the episode.
- ``Observation.text`` holds one ``IMAGE_PLACEHOLDER`` per entry of ``Observation.images``, in order.
- Everything here is plain data (str, float, bool, int, lists, dicts and uint8 numpy arrays), so
  it encodes with msgpack without pickle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
from gymnasium.spaces import Box, Dict, Sequence, Text

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


class AnyText(Text):
    """Text of any characters (gymnasium's ``Text`` holds a fixed character set): the model
    answers with whatever its tokenizer can write. ``sample`` draws letters and digits."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"


TEXT = AnyText(max_length=1 << 16, min_length=0)
"""The space of the model's answers and of observation texts, up to 64 Ki characters."""


def observation_space(image_size: int | None = None) -> Dict:
    """``{"text": str, "images": (RGB uint8 arrays of image_size x image_size, ...)}``. Without an
    ``image_size`` (a text env) the images are always the empty tuple; the element shape is then
    only a placeholder."""
    shape = (image_size, image_size, 3) if image_size else (1, 1, 3)
    return Dict({"text": TEXT, "images": Sequence(Box(0, 255, shape, np.uint8))})


def squared(image: np.ndarray, size: int, fill: int) -> np.ndarray:
    """An RGB picture of any shape as the model is shown it, Shape: (size, size, 3) uint8: padded
    to a square with ``fill`` (0 black, 255 white), centred, then resized (bilinear). ValueError
    for an array that is not (H, W, 3)."""
    from PIL import Image

    image = np.asarray(image, dtype=np.uint8)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"a picture must be (H, W, 3) RGB, got shape {image.shape}")
    h, w, _ = image.shape
    side = max(h, w)
    canvas = np.full((side, side, 3), fill, np.uint8)
    canvas[(side - h) // 2:(side - h) // 2 + h, (side - w) // 2:(side - w) // 2 + w] = image
    return np.asarray(Image.fromarray(canvas).resize((size, size), Image.BILINEAR))


def blanked(images) -> list[np.ndarray]:
    """Every picture white, each its own size: the ablation (an env's ``blank_images``) that tells
    whether a model reads its pictures."""
    return [np.full_like(image, 255) for image in images]


def to_observation(obs: Mapping[str, Any]) -> Observation:
    """A gymnasium observation (``{"text", "images"}``) as the pool's ``Observation``."""
    return Observation(obs["text"], list(obs.get("images", ())))


def to_step_result(step: tuple) -> StepResult:
    """A gymnasium step's ``(obs, reward, terminated, truncated, info)`` as the pool's StepResult."""
    obs, reward, terminated, truncated, info = step
    return StepResult(to_observation(obs), float(reward), bool(terminated or truncated), info)


@runtime_checkable
class Env(Protocol):
    """A multi-turn text (and image) environment: a ``gymnasium.Env`` whose action is the model's
    answer (``TEXT``) and whose observation is ``{"text", "images"}`` (``observation_space``),
    with two methods of its own. Implementations: envs.grid_env.GridEnv (FrozenLake, Sokoban, any
    gymnasium game through envs.gym_game), envs.text_env.TextEnv (TextArena, reasoning-gym and
    OpenEnv through their sources), envs.action_words."""

    def system_prompt(self) -> str:
        """The system message: the task, the symbols, the actions and the answer format ("": the
        chat has no system message)."""
        ...

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Start the episode that ``seed`` determines; returns the first observation and info."""
        ...

    def step(self, action: str) -> tuple[dict, float, bool, bool, dict]:
        """Parse the model's raw answer, execute its valid actions; returns the observation, this
        turn's reward, terminated (the task ended: success or failure), truncated (the turn limit)
        and the info of ``StepResult.info``."""
        ...

    def state_text(self) -> str:
        """The true current state in words (relative positions), for the reasoning judge."""
        ...

    def close(self) -> None:
        """Release resources (renderers, simulators)."""
        ...
