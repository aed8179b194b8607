"""TextArena's games (``env=textarena env.id=<game>``) through VAGEN's layer.

A ``TextArenaGame`` is a ``Source`` of envs/text_env.py around ``textarena.make(<id>-raw)`` (the
game without TextArena's own prompt wrappers: the layer writes the prompt). Single-player games
(TextArena's puzzles: TowerOfHanoi, Mastermind, Minesweeper, FifteenPuzzle, Sokoban, FrozenLake,
LightsOut, ...), and games for two or more players against a fixed policy (``opponent``): the
model plays seat ``seat``, and every other seat's move is the policy's answer to that seat's own
messages. ``opponent: random_available`` picks uniformly among the moves the game lists
("Available Moves: '[0]', '[4]'", as TicTacToe does); ``module:function`` is a policy of your own,
called as ``function(observation: str, rng: numpy Generator) -> str``. A game for more players
without an opponent is refused when it starts, naming the setting; the model playing itself is
not supported yet.

Mapping onto turns:
- The model is shown the game's own messages since its last answer (its rules at the start, its
  board, its descriptions of moves, its complaints about invalid moves), not the echo of its
  answer. The answer (the inner text of <answer>) is the game's action, as the game asks for it
  (``[A C]`` in TowerOfHanoi).
- The game pays at its end (TextArena's rewards arrive with ``close()``): the last turn's env
  reward is ``reward_scale`` times the game's reward for the model's seat, 1 for a win and, for
  most puzzles, the share of the puzzle done otherwise (-1 a loss, 0 a draw against an
  opponent). Success is a game reward of at least ``success_reward`` (a win). An episode cut
  by the layer's ``max_turns`` before the game ends pays nothing.
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

from envs.registry import load
from envs.text_env import Outcome, TextEnv, takes_text_layer

_PLAYER_ACTION = "PLAYER_ACTION"
_NLTK_RESOURCE = re.compile(r"Resource\s+\S*?(\w+)\S*\s+not found")


class TextArenaGame:
    """One TextArena game as a ``Source`` (see the module docstring)."""

    has_reference, draws = False, False
    task = ""  # the game's first message states its rules

    def __init__(self, id: str, *, kwargs: Mapping[str, Any] | None, reward_scale: float,
                 success_reward: float, example: str, num_players: int, opponent: str | None,
                 seat: int) -> None:
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
        if num_players < 1 or not 0 <= seat < num_players:
            raise ValueError(f"num_players must be >= 1 and seat in [0, num_players), got "
                             f"{num_players} and {seat}")
        if num_players > 1 and opponent is None:
            raise ValueError(f"{self.name} with {num_players} players needs an opponent: "
                             "env.opponent=random_available or module:function")
        self.num_players, self.seat = num_players, seat
        self.opponent = (None if num_players == 1 else random_available if opponent == "random_available"
                         else load(opponent, "opponent"))
        self._random = random.Random(0).getstate()
        self._rng = np.random.default_rng(0)
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

        refused = (f"{self.name} is not a game for {self.num_players} player(s): set "
                   "env.num_players (and env.opponent for more than one)")
        with self._own_random(), _missing_data(self.name):
            try:
                self.env.reset(num_players=self.num_players, seed=seed)
            except (AssertionError, ValueError) as e:  # how TextArena's games refuse a count
                if "player" in str(e).lower():
                    raise ValueError(f"{refused} ({e})") from None
                raise
        if (self.num_players == 1) != isinstance(self.env.state, textarena.SinglePlayerState):
            raise ValueError(refused)
        self._start = json.dumps(self.env.state.game_state, sort_keys=True, default=str)
        self._rng = np.random.default_rng(seed)
        if self._opponents_move():
            raise RuntimeError(f"{self.name} ended before the model's first move (seat {self.seat})")
        return Outcome(self._messages())

    def layout(self) -> str:
        return self._start

    def act(self, answer: str) -> Outcome:
        state = self.env.state
        with self._own_random():
            done, _ = self.env.step(answer)
        # a refused move leaves the seat to move again with the error counted
        invalid = (state.error_count > 0 and state.current_player_id == self.seat
                   or state.game_info[self.seat]["invalid_move"])
        done = done or self._opponents_move()
        text = self._messages()
        return self._end(text, invalid) if done else Outcome(text, valid=not invalid)

    def _end(self, text: str, invalid: bool) -> Outcome:
        """The game is over: its reward for the model's seat, and why it ended."""
        rewards, game_info = self.env.close()
        reward = float((rewards or {}).get(self.seat, 0.0))
        reason = game_info[self.seat].get("reason")
        return Outcome("\n".join(line for line in (text, reason) if line),
                       reward=self.reward_scale * reward, done=True,
                       success=reward >= self.success_reward, valid=not invalid,
                       metrics={"game_reward": reward})

    def _opponents_move(self) -> bool:
        """Every other seat moves (the opponent's answer to its own messages) until the model's
        seat is to move or the game is over; returns whether it is over."""
        state, moves = self.env.state, 0
        while not state.done and state.current_player_id != self.seat:
            seat, messages = self.env.get_observation()
            text = "\n".join(message for _, message, _ in messages)
            with self._own_random():
                self.env.step(self.opponent(text, self._rng))
            moves += 1
            if moves > 1000:
                raise RuntimeError(f"{self.name}: the opponent made 1000 moves without the game "
                                   "coming back to the model's seat")
        return bool(state.done)

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


_AVAILABLE = re.compile(r"Available Moves:\s*(.+)")
_MOVE = re.compile(r"'([^']+)'")


def random_available(observation: str, rng: np.random.Generator) -> str:
    """The ``random_available`` opponent: a move drawn uniformly from the last "Available Moves:
    '[0]', '[4]', ..." list of the observation (TicTacToe's and other board games')."""
    lists = _AVAILABLE.findall(observation)
    moves = _MOVE.findall(lists[-1]) if lists else []
    if not moves:
        raise ValueError("the game lists no available moves for the random_available opponent: "
                         "give a policy of your own (env.opponent=module:function)")
    return moves[int(rng.integers(len(moves)))]


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
             num_players: int = 1, opponent: str | None = None, seat: int = 0,
             **layer: Any) -> TextEnv:
    """The TextArena game ``id`` (built with ``kwargs``, the game's own settings) in VAGEN's
    layer, the model in ``seat`` of ``num_players`` against ``opponent``; ``layer`` is
    TextEnv's settings."""
    source = TextArenaGame(id, kwargs=kwargs, reward_scale=reward_scale, success_reward=success_reward,
                           example=example, num_players=num_players, opponent=opponent, seat=seat)
    return TextEnv(source, **layer)
