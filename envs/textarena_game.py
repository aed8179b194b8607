"""TextArena's games (``env=textarena env.id=<game>``) through VAGEN's layer.

A ``TextArenaGame`` is a ``Source`` of envs/text_env.py around ``textarena.make(<id>-raw)`` (the
game without TextArena's own prompt wrappers: the layer writes the prompt). Single-player games
(TextArena's puzzles: TowerOfHanoi, Mastermind, Minesweeper, FifteenPuzzle, Sokoban, FrozenLake,
LightsOut, ...); a game for more players is refused when it starts, naming the setting of its
players; playing against an opponent is not supported yet.

Mapping onto turns:
- The model is shown the game's own messages since its last answer (its rules at the start, its
  board, its descriptions of moves, its complaints about invalid moves), not the echo of its
  answer. The answer (the inner text of <answer>) is the game's action, as the game asks for it
  (``[A C]`` in TowerOfHanoi).
- The game pays at its end (TextArena's rewards arrive with ``close()``): the last turn's env
  reward is ``reward_scale`` times the game's reward, 1 for a win and, for most puzzles, the
  share of the puzzle done otherwise. Success is a game reward of at least ``success_reward``
  (a win). An episode cut by the layer's ``max_turns`` before the game ends pays nothing.
- Invalid moves are the game's to judge: TextArena lets a player correct ``error_allowance``
  invalid moves in a row (one, by default), telling it why, and ends the game on the next. A turn
  whose move the game refused has ``actions_valid`` False and no format reward.
Seeds: TextArena seeds Python's global ``random`` at reset and draws from it as the game goes
(Minesweeper lays its mines at the first move). Each game here keeps its own generator state and
puts it in place only while it runs, so games sharing a worker process do not draw each other's
numbers and the same seed replays the same game. The map of an episode is the game's state at its
start (a secret code, a shuffled board); a game whose start never varies (TowerOfHanoi,
Minesweeper before its first move) has one map, and plays with ``held_out: false``.
No warm start: TextArena ships no solvers or reference moves. No reasoning judge: its games state
their boards in their own drawings, not in words the judge compares with.
Games that fetch data at run time (Wordle and the other word games want NLTK's word lists) fail
to start with a message naming what is missing, as do games that call a hosted model.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from envs.text_env import Outcome, TextEnv, takes_text_layer

_PLAYER_ACTION = "PLAYER_ACTION"
_NLTK_RESOURCE = re.compile(r"Resource\s+\S*?(\w+)\S*\s+not found")


class TextArenaGame:
    """One TextArena game as a ``Source`` (see the module docstring)."""

    has_reference, draws = False, False
    task = ""  # the game's first message states its rules

    def __init__(self, id: str, *, kwargs: Mapping[str, Any] | None, reward_scale: float,
                 success_reward: float, example: str) -> None:
        import textarena
        from textarena.envs.registration import ENV_REGISTRY

        if id not in ENV_REGISTRY:
            single = sorted(i for i in ENV_REGISTRY if not i.endswith(("-raw", "-train")))
            raise ValueError(f"TextArena has no game {id!r}; it has {single}")
        self.name = f"TextArena {id}"
        self.answer_is = "your move, written exactly as the game asks for it"
        self.example = example
        self.reward_scale, self.success_reward = float(reward_scale), float(success_reward)
        raw = f"{id}-raw" if f"{id}-raw" in ENV_REGISTRY else id
        with _missing_data(self.name):
            self.env = textarena.make(raw, **dict(kwargs or {}))
        self._random = random.Random(0).getstate()
        self._start = ""

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        """Python's global generator holds this game's state while the game runs, and the
        caller's again afterwards."""
        outer = random.getstate()
        random.setstate(self._random)
        try:
            yield
        finally:
            self._random = random.getstate()
            random.setstate(outer)

    def start(self, seed: int) -> Outcome:
        import textarena

        refused = f"{self.name} is a game for more players; only single-player games are supported"
        with self._own_random(), _missing_data(self.name):
            try:
                self.env.reset(num_players=1, seed=seed)
            except (AssertionError, ValueError) as e:  # how TextArena's games refuse one player
                if "player" in str(e).lower():
                    raise ValueError(f"{refused} ({e})") from None
                raise
        if not isinstance(self.env.state, textarena.SinglePlayerState):
            raise ValueError(refused)
        self._start = json.dumps(self.env.state.game_state, sort_keys=True, default=str)
        return Outcome(self._messages())

    def layout(self) -> str:
        return self._start

    def act(self, answer: str) -> Outcome:
        state = self.env.state
        with self._own_random():
            done, _ = self.env.step(answer)
        invalid = state.error_count > 0 or state.game_info[0]["invalid_move"]
        text = self._messages()
        if not done:
            return Outcome(text, valid=not invalid)
        rewards, game_info = self.env.close()
        reward = float((rewards or {}).get(0, 0.0))
        reason = game_info[0].get("reason")
        return Outcome("\n".join(line for line in (text, reason) if line),
                       reward=self.reward_scale * reward, done=True,
                       success=reward >= self.success_reward, valid=not invalid,
                       metrics={"game_reward": reward})

    def _messages(self) -> str:
        """The game's messages to the player since the last call, its echo of the answer left out."""
        _, messages = self.env.get_observation()
        return "\n".join(message.strip() for _, message, kind in messages
                         if getattr(kind, "name", "") != _PLAYER_ACTION and message.strip())

    def reference(self, rng: np.random.Generator, noise: float) -> tuple[str, bool]:
        raise ValueError(f"{self.name} has no reference moves")

    def end(self) -> None:
        pass

    def close(self) -> None:
        pass


@contextlib.contextmanager
def _missing_data(name: str) -> Iterator[None]:
    """Turns NLTK's LookupError (data a game would download at run time) into a message that
    names what is missing and how to provide it."""
    try:
        yield
    except LookupError as e:
        found = _NLTK_RESOURCE.search(str(e))
        what = found.group(1) if found else "data"
        raise RuntimeError(
            f"{name} needs NLTK's {what!r} data, which it would download at run time and this "
            f"machine does not have: install it where the env workers run (python -m "
            f"nltk.downloader {what}), or choose a game that needs none (TowerOfHanoi-v0, "
            f"Mastermind-v0, Minesweeper-v0, ...)") from None


@takes_text_layer
def make_env(*, id: str = "TowerOfHanoi-v0", kwargs: Mapping[str, Any] | None = None,
             reward_scale: float = 1.0, success_reward: float = 1.0, example: str = "[move]",
             **layer: Any) -> TextEnv:
    """The TextArena game ``id`` (built with ``kwargs``, the game's own settings) in VAGEN's
    layer; ``layer`` is TextEnv's settings."""
    source = TextArenaGame(id, kwargs=kwargs, reward_scale=reward_scale,
                           success_reward=success_reward, example=example)
    return TextEnv(source, **layer)
