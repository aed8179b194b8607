"""GridEnv: VAGEN's layer (envs.protocol.Env, a gymnasium env) around one turn-based game.

Built by the games' ``make_env`` (envs.frozenlake, envs.sokoban; envs.gym_game for any gymnasium
env with discrete actions and a text rendering; envs.primitive_skill.game on ManiSkill;
envs.navigation.game on MiniWorld), which envs.registry calls; each is declared with
``takes_layer``, so its signature names GridEnv's settings too and a config's keys can be checked
against it without building an env. The game owns the rules, the map, the solver and the render
data (see ``GridGame``); this class owns what is common to them: the answer format, the rewards
of a turn, the observations and the prompt. A game may also have
``parse_action`` (actions with arguments), ``image`` (a camera instead of the drawn grid),
``instruction`` (the episode's own goal, said in every observation: the system prompt is asked
before the episode is drawn), ``end_reward`` (paid on the episode's last turn), ``judge_score``
(its own rule for the rule judge) and ``state_dict`` (for the structured formats).
Invariants of ``step``:
- An answer in the wrong format executes nothing and earns no format reward.
- Actions are matched to ``action_space`` case-insensitively (or by the game's ``parse_action``)
  and executed in order up to the first invalid one (the valid prefix runs; ``actions_valid`` is
  then False and the format reward 0), and never past the end of the episode.
- Reward = env reward of the executed actions (+ the game's ``end_reward`` on the last turn) +
  format reward + reasoning reward.
- The episode ends on success, on failure (``terminated``), or after ``max_turns`` turns
  (``truncated``); stepping it again raises.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

import gymnasium as gym
import numpy as np

from envs import splits
from envs.formats import ALL_FORMATS, STRUCTURED, Parsed, format_example, format_prompt, format_reward, parse
from envs.grid import Pos, Tile, render_rgb
from envs.judge import make_reasoning_reward
from envs.protocol import IMAGE_PLACEHOLDER, TEXT, Observation, blanked, observation_space
from envs.relations import describe

RENDERS = ("text", "image", "both")
PROMPTS = ("full", "brief", "none")
DEFAULT_REASONING_REWARD: Mapping[str, Any] = MappingProxyType({"judge": "rule"})


class GridGame(Protocol):
    """One grid game's state and rules (envs.frozenlake.FrozenLake, envs.sokoban.Sokoban)."""

    action_space: tuple[str, ...]
    shape: tuple[int, int]
    """(rows, cols) of the grid."""
    task: str
    """The system prompt's first paragraph: the goal and the rules."""
    text_legend: str
    """How to read ``text()``: every symbol and what it means."""
    image_legend: str
    """How to read the RGB render: every colour and shape and what it means."""

    def reset(self, rng: np.random.Generator) -> None:
        """Draw a new episode from ``rng``, which may also drive the episode's later randomness."""
        ...

    def move(self, action: str) -> tuple[float, bool, bool]:
        """Apply one action of ``action_space``; returns (reward, episode over, success)."""
        ...

    def solve(self) -> list[str] | None:
        """A shortest action sequence to success from the current state; None if there is none."""
        ...

    def text(self) -> str:
        """The state as a symbol grid: one character per cell, one line per row."""
        ...

    def layers(self) -> list[tuple[np.ndarray, Tile]]:
        """The RGB render's layers, bottom to top (see envs.grid.render_rgb)."""
        ...

    def objects(self) -> tuple[Pos, list[tuple[str, Pos]]]:
        """The player's position and the (kind, position) of each thing ``state_text`` names."""
        ...


def check_int(name: str, value: Any, low: int) -> int:
    """``value`` if it is an int (not a bool) >= ``low``, else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


class GridEnv(gym.Env):
    """A multi-turn text (or image) gymnasium env playing ``game``; see the module docstring.

    The action is the model's answer (any text); the observation is ``{"text", "images"}``;
    ``render()`` is the game's symbol grid. ``action_names`` are the game's actions.

    Settings: ``format`` (one of envs.formats.FORMATS, or a STRUCTURED one for a game with a
    ``state_dict()``, whose keys the system prompt then lists), ``render`` ("text": the symbol grid;
    "image": one RGB picture of ``image_size`` pixels a side; "both": the picture, then the text,
    as VAGEN shows PrimitiveSkill), ``max_turns``,
    ``max_actions_per_turn`` (more are dropped by the parser), ``action_sep``, ``format_reward``
    (per correct turn), ``reasoning_reward`` (envs.judge.make_reasoning_reward's config; None
    disables it), ``prompt`` ("full": the format's whole instructions and an example answer in the
    system prompt, the answer template again every turn; "brief": the rules, the legend, the
    actions and the answer template once, for small models trained on demonstrations, whose
    sequences it makes about half as long; "none": no system prompt and no reminder, only the
    turn and the state, for models that learn everything from demonstrations, whose sequences
    it makes shorter again), ``held_out`` (each seed plays a map of its split only, so no
    evaluation map is ever a training map: envs/splits.py; off for games whose maps barely
    vary). ``action_example`` is the actions of the system prompt's example answer.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        game: GridGame,
        *,
        action_example: tuple[str, ...],
        format: str = "grounding_worldmodeling",
        render: str = "text",
        image_size: int = 96,
        max_turns: int = 3,
        max_actions_per_turn: int = 3,
        action_sep: str = ",",
        format_reward: float = 0.5,
        reasoning_reward: Mapping[str, Any] | None = DEFAULT_REASONING_REWARD,
        prompt: str = "full",
        render_mode: str | None = None,
        blank_images: bool = False,
        held_out: bool = True,
    ) -> None:
        if format not in ALL_FORMATS:
            raise ValueError(f"unknown format {format!r}; expected one of {ALL_FORMATS}")
        if format in STRUCTURED and not hasattr(game, "state_dict"):
            raise ValueError(f"format {format!r} states the state as a dict, which this game "
                             "cannot (it has no state_dict()): use a format of the five")
        if render not in RENDERS:
            raise ValueError(f"unknown render {render!r}; expected one of {RENDERS}")
        if prompt not in PROMPTS:
            raise ValueError(f"unknown prompt {prompt!r}; expected one of {PROMPTS}")
        if not isinstance(action_sep, str) or not action_sep.strip():
            raise ValueError(f"action_sep must be a non-blank string, got {action_sep!r}")
        self.game = game
        self.format, self.action_sep, self.prompt = format, action_sep, prompt
        self.render_setting = render
        self.observed_as = "text" if render == "text" else "image"
        """"text" (the symbol grid only) or "image" (a picture in every observation)."""
        self.image_size = check_int("image_size", image_size, 4 * max(game.shape))
        if blank_images and render == "text":
            raise ValueError("blank_images blanks image observations: it needs render=image or both")
        self.blank_images = bool(blank_images)
        """Every picture white, the same size: the ablation that tells whether a model reads them."""
        self.held_out = bool(held_out)
        """Each seed plays a map of its split only (envs/splits.py)."""
        self.max_turns = check_int("max_turns", max_turns, 1)
        self.max_actions = check_int("max_actions_per_turn", max_actions_per_turn, 1)
        self.format_reward = float(format_reward)
        self.judge = make_reasoning_reward(
            None if reasoning_reward is None else dict(reasoning_reward),
            rule_score=getattr(game, "judge_score", None),
        )
        self.action_names: tuple[str, ...] = tuple(game.action_space)
        self._actions = {a.lower(): a for a in self.action_names}
        self.action_space = TEXT
        self.observation_space = observation_space(None if render == "text" else self.image_size)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self._example = action_sep.join(action_example)
        # The per-turn reminder: the example answer with every section's text elided.
        self._template = re.sub(r">[^<]+<", ">...<", format_example(format, action_example="..."))
        self._turn, self._done, self._started = 0, False, False

    def system_prompt(self) -> str:
        if self.prompt == "none":
            return ""
        legend = {"text": self.game.text_legend, "image": self.game.image_legend,
                  "both": f"{self.game.image_legend} {self.game.text_legend}"}[self.render_setting]
        answer = (f"Answer as {self._template}" if self.prompt == "brief" else
                  format_prompt(self.format, action_example=self._example,
                                action_sep=self.action_sep, max_actions=self.max_actions))
        return "\n\n".join(part for part in [
            self.game.task,
            legend,
            f"Actions: {', '.join(self.action_names)}. You have {self.max_turns} turns; in each "
            f"turn give 1 to {self.max_actions} actions, executed in order.",
            answer,
            self._structure(),
        ] if part)  # fmt: skip

    def _structure(self) -> str:
        """A structured format's rule for <observation> and <prediction> ("" for the others)."""
        if self.format not in STRUCTURED:
            return ""
        keys = ", ".join(f"'{key}': (x, y, z)" for key in self.game.state_dict())
        return f"Write <observation> and <prediction> as a dict: {{{keys}}}."

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """The episode of ``seed`` (None: one drawn from the env's generator), on a map of the
        seed's split (envs/splits.py); info: ``map`` (the map's key) and ``split`` (None with ``held_out`` off)."""
        super().reset(seed=seed)
        split = splits.wanted(seed, self.held_out)
        rng = np.random.default_rng(int(self.np_random.integers(2**31)) if seed is None else seed)
        key = splits.draw(functools.partial(self._next_map, rng), split, f"{type(self.game).__name__}, seed {seed}")
        self._turn, self._done, self._started = 0, False, True
        return self._observe(""), {"map": key, "split": split}

    def _next_map(self, rng: np.random.Generator) -> str:
        """Draw the next episode from ``rng``; returns its map's layout text: the game's
        ``layout()`` where it has one, else its symbol grid at the start."""
        self.game.reset(rng)
        own = getattr(self.game, "layout", None)
        return own() if own is not None else self.game.text()

    def render(self) -> str:
        return self.game.text()

    def step(self, llm_text: str) -> tuple[dict, float, bool, bool, dict]:
        if not self._started:
            raise RuntimeError("step() before reset()")
        if self._done:
            raise RuntimeError("step() after the episode ended; call reset()")
        parsed = parse(
            llm_text, self.format, action_sep=self.action_sep, max_actions=self.max_actions
        )
        checked = [self._match(a) for a in parsed.actions]
        matched = [action for action, _ in checked]
        actions_valid = parsed.format_correct and None not in matched
        state_before = self.state_text()
        env_reward, executed, ended, success = 0.0, [], False, False
        for action in matched:
            if action is None or ended:
                break
            reward, ended, success = self.game.move(action)
            env_reward += reward
            executed.append(action)
        fmt_reward = format_reward(parsed, actions_valid, reward=self.format_reward)
        reason_reward, reason_metrics = 0.0, {}
        if self.judge is not None:
            reason_reward, reason_metrics = self.judge(
                observation=parsed.observation if "grounding" in self.format else None,
                prediction=parsed.prediction if "worldmodeling" in self.format else None,
                state_before=state_before,
                state_after=self.state_text(),
            )
        self._turn += 1
        self._done = ended or self._turn >= self.max_turns
        end_reward = getattr(self.game, "end_reward", None)
        if self._done and end_reward is not None:
            env_reward += end_reward()
        metrics = {
            "env_reward": env_reward,
            "format_reward": fmt_reward,
            "reasoning_reward": float(reason_reward),
            "n_actions": float(len(executed)),
            "turn": float(self._turn),
            "actions_truncated": float(parsed.truncated),
            **reason_metrics,
        }
        info = {
            "success": success,
            "format_correct": parsed.format_correct,
            "actions_valid": actions_valid,
            "actions": executed,
            "metrics": metrics,
        }
        reward = env_reward + fmt_reward + float(reason_reward)
        observation = self._observe(_feedback(parsed, checked, executed))
        return observation, reward, ended, self._done and not ended, info

    def _match(self, text: str) -> tuple[str | None, str]:
        """(the action ``text`` names, "") or (None, why not): the game's own ``parse_action``
        where it has one (actions with arguments), else a case-insensitive name match."""
        own = getattr(self.game, "parse_action", None)
        if own is not None:
            return own(text)
        action = self._actions.get(text.lower())
        return action, "" if action else f"not one of {', '.join(self.action_names)}"

    def state_text(self) -> str:
        """The true state in words for the reasoning judge: the game's own ``state_text`` where it
        has one (envs/gym_game.py), else the relations of its objects (envs/relations.py)."""
        own = getattr(self.game, "state_text", None)
        if own is not None:
            return own()
        player, objects = self.game.objects()
        return describe(player, objects)

    def solve(self) -> list[str] | None:
        """An optimal action sequence from the current state (BFS); None when there is none."""
        return self.game.solve()

    @property
    def has_solver(self) -> bool:
        """``solve`` can answer (the warm start's demonstrations need it): a game says otherwise."""
        return getattr(self.game, "has_solver", True)

    def close(self) -> None:
        close = getattr(self.game, "close", None)  # a game holding a simulator or a gymnasium env
        if close is not None:
            close()

    def _observe(self, feedback: str) -> dict:
        turn = f"Turn {self._turn + 1} of {self.max_turns}."
        header = "The episode is over." if self._done else turn
        if self.observed_as == "text":
            state, images = self.game.text(), []
        else:
            state = IMAGE_PLACEHOLDER
            own = getattr(self.game, "image", None)  # a simulator's camera, else the grid drawn
            images = [own(self.image_size) if own is not None else
                      render_rgb(self.game.shape, self.game.layers(), self.image_size)]
            if self.blank_images:
                images = blanked(images)
            if self.render_setting == "both":
                state = f"{state}\n{self.game.text()}"
        reminder = "" if self.prompt != "full" else (
            f"Reply exactly as {self._template} with 1 to {self.max_actions} actions from "
            f"{', '.join(self.action_names)}, separated by {self.action_sep!r}."
        )
        own_goal = getattr(self.game, "instruction", None)
        goal = own_goal() if own_goal else ""
        lines = [feedback, header, goal, "The current state:", state, reminder]
        checked = Observation("\n".join(line for line in lines if line), images)  # one image a placeholder
        return {"text": checked.text, "images": tuple(checked.images)}


def _feedback(parsed: Parsed, checked: list[tuple[str | None, str]], executed: list[str]) -> str:
    """The observation's first line: what happened to the answer."""
    if not parsed.format_correct:
        return f"Your answer was not in the required format ({parsed.error}); nothing was executed."
    bad = [(text, why) for text, (action, why) in zip(parsed.actions, checked) if action is None]
    if bad:
        text, why = bad[0]
        return (f"{text!r} is not a valid action ({why}). "
                f"Executed: {', '.join(executed) or 'nothing'}.")
    return f"Executed: {', '.join(executed)}."


_Factory = TypeVar("_Factory", bound=Callable[..., Any])


def takes_settings_of(layer: type, *, given: tuple[str, ...] = ()) -> Callable[[_Factory], _Factory]:
    """The decorator that declares a ``make_env(*, <its own keywords>, **settings)`` building
    ``layer(<what it made>, **settings)``: the factory's signature (``inspect.signature``, which
    envs/registry.py's ``check_config`` binds a config to) becomes its own keywords followed by
    ``layer``'s keyword-only settings, less those it gives itself (``given``), so a key that
    neither takes fails before any env is built. The call itself is unchanged."""

    def declare(factory: _Factory) -> _Factory:
        own = inspect.signature(factory)
        params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
        taken = {p.name for p in params} | set(given)
        settings = [p for p in inspect.signature(layer).parameters.values()
                    if p.kind is p.KEYWORD_ONLY and p.name not in taken]
        factory.__signature__ = own.replace(parameters=params + settings)  # type: ignore[attr-defined]
        return factory

    return declare


takes_layer = takes_settings_of(GridEnv, given=("action_example",))
"""Declares a game's ``make_env(*, <the game's keywords>, **layer)`` that builds
``GridEnv(game, action_example=..., **layer)`` (``takes_settings_of``)."""
