"""TextEnv: VAGEN's layer around an environment of another ecosystem, one that speaks text.

Built by the sources' ``make_env`` (envs/textarena_game.py: TextArena's games;
envs/reasoning_task.py: reasoning-gym's tasks; envs/openenv_env.py: OpenEnv environments and
servers), which envs/registry.py calls; each is declared with ``takes_text_layer``, so its
signature names this class's settings too and a config's keys are checked without building an
env. The source owns the episode (``Source``): its start, what the model is told, what an answer
does, the rewards and the end. This class owns what every env here has: the answer format and
its reward, the turn limit, held-out seeds, the observation of a turn, the system prompt, and
the warm start's answers where the source has reference answers.

A turn:
- The reply is parsed strictly in ``format`` (envs/formats.py); the answer is the inner text of
  <answer>, whole (one answer a turn, not a list of actions).
- A malformed reply is refused without calling the source: no env reward, no format reward,
  the turn counts, and the next observation says why (info ``format_correct`` False).
- A well-formed answer goes to the source's ``act``. One the source refuses before its env sees
  it (an OpenEnv action that does not validate), or that its env calls an invalid move (a
  TextArena game), has ``actions_valid`` False and earns no format reward, as an invalid action
  of the grid games; ``metrics["invalid"]`` counts it.
- Reward = the source's reward of the turn + the format reward (+ the reasoning reward, only for
  a source that states its state in words: ``state_text``; none of today's three can, so the
  judge is refused for them with a message saying so).
- The episode ends when the source says so (``terminated``; success is the source's word) or
  after ``max_turns`` turns (``truncated``); stepping it again raises.
Seeds: ``reset(seed)`` starts the source's episode of a seed drawn from ``seed``'s generator,
drawing again until the episode's map (the source's ``layout``) is of the seed's split where
``held_out`` (envs/splits.py). So the same seed, the same episode, wherever the source's own
randomness follows its seed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from envs import splits
from envs.formats import FORMATS, answer_prompt, format_example, parse
from envs.grid_env import PROMPTS, check_int, takes_settings_of
from envs.judge import make_reasoning_reward
from envs.protocol import IMAGE_PLACEHOLDER, TEXT, Observation, blanked, observation_space, squared

_ONE_ANSWER = "\x00"
"""The parser's action separator: a character no answer holds, so the answer stays whole."""


@dataclass
class Outcome:
    """What one answer did in the source."""

    text: str
    """What the model is told next: the environment's own words (its board, its feedback)."""
    reward: float = 0.0
    """The environment's reward of this turn (a game that pays at its end pays on the last)."""
    done: bool = False
    """The environment ended the episode (won, lost, or its own limit)."""
    success: bool = False
    valid: bool = True
    """False: the answer was refused (by the source before its env saw it, or by the env as an
    invalid move); no format reward then."""
    images: Sequence[np.ndarray] = ()
    """RGB uint8 pictures the environment returned, shown after the text."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The source's own per-turn numbers, added to the turn's metrics."""


class Source(Protocol):
    """An environment of another ecosystem, as TextEnv plays it (see the module docstring)."""

    name: str
    """How messages name it: "TextArena TowerOfHanoi-v0"."""
    task: str
    """The system prompt's first paragraph ("": the first observation says everything)."""
    answer_is: str
    """What goes inside <answer>, for the system prompt: "your move, written as the game asks"."""
    example: str
    """An answer's text for the system prompt's example reply."""
    has_reference: bool
    """The source knows a right answer to its turns (``reference``): demonstrations need one."""
    draws: bool
    """Its observations carry pictures (``Outcome.images``)."""

    def start(self, seed: int) -> Outcome:
        """Start the episode of ``seed``; its first observation (``done`` False)."""
        ...

    def layout(self) -> str:
        """The episode's map: text that determines its start (a question, a secret code, a
        board), hashed into its split; the same text for two seeds is one map."""
        ...

    def act(self, answer: str) -> Outcome:
        """Play one well-formed answer (the inner text of <answer>)."""
        ...

    def end(self) -> None:
        """The episode ended: release what only it needed (a server's session)."""
        ...

    def reference(self, rng: np.random.Generator, noise: float) -> tuple[str, bool]:
        """A demonstration's answer to the current turn and whether it is a mistake (with
        probability ``noise``); only where ``has_reference``."""
        ...

    def close(self) -> None:
        ...


class TextEnv(gym.Env):
    """A multi-turn text (and image) gymnasium env playing ``source``; see the module docstring.

    Settings: ``format`` (one of envs.formats.FORMATS), ``prompt`` ("full": the format's whole
    instructions and an example, and a reminder of the reply's shape every turn; "brief": the
    template once; "none": no system prompt), ``max_turns``, ``format_reward`` (a well-formed,
    valid turn's), ``reasoning_reward`` (envs.judge's config, only for a source with
    ``state_text``), ``held_out`` (seeds play maps of their split only), ``render`` ("image" for
    a source that returns pictures, which its observations then show at ``image_size`` pixels a
    side: a vision-language model's env; "text" for every other), ``blank_images`` (every
    picture white: the ablation).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, source: Source, *, format: str = "free_think", prompt: str = "brief",
                 max_turns: int = 1, format_reward: float = 0.5,
                 reasoning_reward: Mapping[str, Any] | None = None, held_out: bool = True,
                 render: str = "text", image_size: int = 224, blank_images: bool = False) -> None:
        draws = bool(source.draws)
        problem = None
        if render not in ("text", "image"):
            problem = f"render must be text or image, got {render!r}"
        elif (render == "image") != draws:
            problem = (f"{source.name} returns pictures: env.render=image (a vision-language model)"
                       if draws else f"{source.name} returns no pictures: env.render=text")
        elif format not in FORMATS:
            problem = f"format must be one of {FORMATS} (the answer is free text), got {format!r}"
        elif prompt not in PROMPTS:
            problem = f"unknown prompt {prompt!r}; expected one of {PROMPTS}"
        elif reasoning_reward is not None and not hasattr(source, "state_text"):
            problem = (f"{source.name} states no state in words for the reasoning judge to "
                       "compare with: env.reasoning_reward=null")
        elif blank_images and not draws:
            problem = "blank_images blanks pictures: it needs render=image"
        try:
            if problem:
                raise ValueError(problem)
            self.max_turns = check_int("max_turns", max_turns, 1)
            self.image_size = check_int("image_size", image_size, 8)
        except ValueError:
            source.close()  # a source may hold a simulator or a server's session
            raise
        self.source = source
        self.format, self.prompt = format, prompt
        self.format_reward = float(format_reward)
        self.held_out = bool(held_out)
        """Each seed plays a map of its split only (envs/splits.py)."""
        self.blank_images = bool(blank_images)
        self.observed_as = "image" if draws else "text"
        """As GridEnv's: "image" where the source returns pictures (a vision-language model's env)."""
        self.judge = make_reasoning_reward(None if reasoning_reward is None else dict(reasoning_reward))
        self.action_space = TEXT
        self.observation_space = observation_space(self.image_size if draws else None)
        self._template = re.sub(r">[^<]+<", ">...<", format_example(format, action_example="..."))
        self._turn, self._done, self._started = 0, False, False

    def system_prompt(self) -> str:
        if self.prompt == "none":
            return ""
        answer = (f"Reply as {self._template}; <answer> holds {self.source.answer_is}."
                  if self.prompt == "brief" else
                  answer_prompt(self.format, answer_is=self.source.answer_is, example=self.source.example))
        turns = f"You have {self.max_turns} turn{'s' if self.max_turns > 1 else ''}; one answer a turn."
        return "\n\n".join(part for part in (self.source.task, turns, answer) if part)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """The episode of ``seed`` (None: one drawn from the env's generator) on a map of the seed's
        split; info: ``map`` (its key) and ``split`` (None with ``held_out`` off)."""
        super().reset(seed=seed)
        split = splits.wanted(seed, self.held_out)
        rng = np.random.default_rng(int(self.np_random.integers(2**31)) if seed is None else seed)
        first: list[Outcome] = []

        def next_map() -> str:
            first[:] = [self.source.start(int(rng.integers(2**31)))]
            return self.source.layout()

        key = splits.draw(next_map, split, f"{self.source.name}, seed {seed}")
        self._turn, self._done, self._started = 0, False, True
        return self._observe("", first[0]), {"map": key, "split": split}

    def step(self, llm_text: str) -> tuple[dict, float, bool, bool, dict]:
        if not self._started:
            raise RuntimeError("step() before reset()")
        if self._done:
            raise RuntimeError("step() after the episode ended; call reset()")
        parsed = parse(llm_text, self.format, action_sep=_ONE_ANSWER, max_actions=1)
        state_before = self.state_text()
        if parsed.format_correct:
            outcome = self.source.act(parsed.answer)
            feedback = ""
        else:
            outcome = Outcome("", valid=False)
            feedback = (f"Your reply was not in the required format ({parsed.error}); "
                        "nothing was played.")
        fmt_reward = self.format_reward if parsed.format_correct and outcome.valid else 0.0
        reason_reward, reason_metrics = 0.0, {}
        if self.judge is not None and parsed.format_correct:
            reason_reward, reason_metrics = self.judge(
                observation=parsed.observation if "grounding" in self.format else None,
                prediction=parsed.prediction if "worldmodeling" in self.format else None,
                state_before=state_before, state_after=self.state_text())
        self._turn += 1
        ended = outcome.done
        self._done = ended or self._turn >= self.max_turns
        if self._done:
            self.source.end()
        metrics = {"env_reward": float(outcome.reward), "format_reward": fmt_reward,
                   "reasoning_reward": float(reason_reward), "turn": float(self._turn),
                   "invalid": float(parsed.format_correct and not outcome.valid),
                   **outcome.metrics, **reason_metrics}
        info = {"success": bool(outcome.success), "format_correct": parsed.format_correct,
                "actions_valid": parsed.format_correct and outcome.valid,
                "actions": [parsed.answer] if parsed.format_correct else [], "metrics": metrics}
        reward = float(outcome.reward) + fmt_reward + float(reason_reward)
        return self._observe(feedback, outcome), reward, ended, self._done and not ended, info

    def state_text(self) -> str:
        """The source's state in words where it has one (the reasoning judge's), else ""."""
        own = getattr(self.source, "state_text", None)
        return own() if own is not None else ""

    @property
    def has_solver(self) -> bool:
        """The source has reference answers: the warm start can demonstrate (``demonstrate``)."""
        return bool(self.source.has_reference)

    def demonstrate(self, rng: np.random.Generator, noise: float) -> tuple[str, int, int]:
        """A demonstration turn (actors/demonstrations.py): (the reply, 1 if it is a mistake else
        0, 1): the source's reference answer, or with probability ``noise`` a wrong one, in the
        format; its thinking says only that it answers (the source has no worked reasoning)."""
        if self.format not in ("no_think", "free_think"):
            raise ValueError(f"{self.source.name} demonstrates in no_think or free_think only: its "
                             f"answers come without the observation or prediction {self.format} asks for")
        answer, wrong = self.source.reference(rng, noise)
        reply = f"<answer>{answer}</answer>"
        if self.format == "free_think":
            reply = f"<think>I work it out and give my answer.</think>{reply}"
        return reply, int(wrong), 1

    def close(self) -> None:
        self.source.close()

    def _observe(self, feedback: str, outcome: Outcome) -> dict:
        header = ("The episode is over." if self._done else
                  f"Turn {self._turn + 1} of {self.max_turns}." if self.max_turns > 1 else "")
        images = [squared(image, self.image_size, fill=255) for image in outcome.images]
        if self.blank_images:
            images = blanked(images)
        pictures = "\n".join(IMAGE_PLACEHOLDER for _ in images)
        reminder = f"Reply as {self._template}." if self.prompt == "full" and not self._done else ""
        lines = [feedback, header, outcome.text.strip(), pictures, reminder]
        checked = Observation("\n".join(line for line in lines if line), images)
        return {"text": checked.text, "images": tuple(checked.images)}


takes_text_layer = takes_settings_of(TextEnv)
"""Declares a source's ``make_env(*, <the source's keywords>, **layer)`` that builds
``TextEnv(source, **layer)``: see envs/grid_env.py's ``takes_settings_of``."""
