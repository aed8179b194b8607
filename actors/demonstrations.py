"""Solver demonstrations for the warm start: whole episodes whose answers a perfect-but-noisy
player wrote, as token-in/token-out Trajectories exactly as the actor would have recorded them.

Called by launch/model/warm_start.py (supervised fine-tuning before RL). Works for the grid envs
(envs.frozenlake, envs.sokoban, envs.gym_game: a ``GridEnv`` with a ``game`` that can ``solve()``), in every
answer format of envs.formats.FORMATS, and for a game that plans its own demonstration turns
(``demonstrate_turn`` and ``reasoning``: envs/primitive_skill/game.py, whose ``"habit"`` puts a
cube back where it was picked and whose other mistakes are missed points), and for an env that
writes its answers itself (``demonstrate``: envs/svg/env.py, the target's own SVG with some
numbers moved).

Invariants:
- Each turn's answer is written from the TRUE state: ``<observation>`` is ``env.state_text()``
  before the turn's actions, ``<prediction>`` the state text after them (computed by playing the
  actions on a copy of the game, which also carries a slippery game's random state, so it is
  exact), ``<reasoning>`` one deterministic sentence naming where the first object (the goal, the
  box) lies: its relation to the player (``reasoning="relation"``, the words of the state text)
  or how many rows and columns away it is (``"offsets"``: "2 rows up and 1 column right", the
  count a plan needs and a relation does not give). ``free_think`` thinks the observation and the
  reasoning; ``no_think`` answers only.
- Actions: ``actions_per_turn`` per turn (default: the env's maximum), each the solver's next
  move replanned from the current state, replaced with probability ``action_noise`` by a
  mistake: a uniformly random action (``mistake="random"``), or a systematic one, which greedy
  decoding does not average out once it is the likelier choice: the solver's move reversed
  (``"reverse"``), the episode's previous action again (``"repeat"``; the first move is the
  solver's), or always the first action of the action space (``"habit"``: FrozenLake's Left,
  Sokoban's Up). Once no solution exists (a box in a corner) every action is random. A turn
  stops early where the episode ends (goal, hole), as the env would stop executing.
- Tokens come from actors.episode.ChatContext as in ``run_episode``: the observation through the
  chat template, the answer as a stopped Generation (``tokenizer.encode(answer)`` + EOS, log-prob
  0, version 0), so ``loss_mask`` is True on exactly the answers and their end-of-turn tokens.
  The env steps on the answer text and its rewards are the turn rewards.
- Images (``render="image"``): pass the model's ``vision`` (actors.vision.VisionTokens), as the
  actor has it; each observation's images then become the model's pad runs in the ids, exactly
  as in the actor's episodes, and the trajectory carries them (PNG). Without ``vision`` an image
  env is refused. The answers are the same text as for a text render: the true state in words.
- Deterministic in (``rng_seed``, seed): each episode has its own generator, so a demonstration
  does not depend on which other seeds were asked for.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from actors.episode import ChatContext, Generation
from actors.vision import VisionTokens
from envs.formats import FORMATS, STRUCTURED, base_format
from envs.protocol import to_observation, to_step_result
from envs.registry import make
from envs.relations import PHRASES, describe, relation
from transport.schema import Trajectory

# What the player does about the first object the state names (envs' ``game.objects()``).
_PLANS = {
    "goal": "so I move toward it and keep off the holes",
    "box": "so I walk behind it and push it onto the target",
}
# The sections inside <think> of the structured formats (envs.formats keeps its table private).
_SECTIONS = {
    "grounding": ("observation", "reasoning"),
    "worldmodeling": ("reasoning", "prediction"),
    "grounding_worldmodeling": ("observation", "reasoning", "prediction"),
}
MISTAKES = ("random", "reverse", "repeat", "habit")
REASONING = ("relation", "offsets")
_REVERSE = {"Left": "Right", "Right": "Left", "Up": "Down", "Down": "Up"}


def make_demonstrations(env_name: str, env_config: Mapping[str, Any], tokenizer,
                        seeds: Iterable[int], *, action_noise: float, rng_seed: int,
                        actions_per_turn: int | None = None, mistake: str = "random",
                        reasoning: str = "relation", vision: VisionTokens | None = None,
                        first_index: int = 0) -> list[Trajectory]:
    """One demonstration episode per seed of ``env_name`` built with ``env_config``; ``vision``:
    the model's image tokens, needed when the env renders images; ``first_index``: the first
    episode's id (a share of a larger set built elsewhere numbers on from its place)."""
    if not 0.0 <= action_noise <= 1.0:
        raise ValueError(f"action_noise must be in [0, 1], got {action_noise}")
    if mistake not in MISTAKES:
        raise ValueError(f"mistake must be one of {MISTAKES}, got {mistake!r}")
    if reasoning not in REASONING:
        raise ValueError(f"reasoning must be one of {REASONING}, got {reasoning!r}")
    env = make(env_name, **env_config)
    if not getattr(env, "has_solver", False):
        env.close()
        raise ValueError(f"the {env_name} env has no solver to demonstrate with: train it without "
                         "a warm start (warm_start.enabled=false)")
    if getattr(env, "observed_as", "text") == "image" and vision is None:
        env.close()
        raise ValueError("the env renders images: demonstrations need the model's vision tokens "
                         "(vision=actors.vision.VisionTokens.from_pretrained(<a VLM>))")
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    if hasattr(env, "demonstrate"):  # an env that writes its own answers (the SVG env)
        if mistake != "random" and action_noise > 0:
            env.close()
            raise ValueError(f"the {env_name} env writes its demonstrations itself, with one kind of "
                             f"mistake (its own): warm_start.mistake={mistake} means nothing there; "
                             "leave it at random")
        try:
            return [_played(env, env_name, tokenizer, vision, eos, int(seed), first_index + i,
                            functools.partial(env.demonstrate, np.random.default_rng([rng_seed, seed]),
                                              action_noise))
                    for i, seed in enumerate(seeds)]
        finally:
            env.close()
    if base_format(env.format) not in (*_SECTIONS, "no_think", "free_think"):
        raise ValueError(f"no demonstrations for format {env.format!r} (of {FORMATS})")
    k = env.max_actions if actions_per_turn is None else actions_per_turn
    if not 1 <= k <= env.max_actions:
        raise ValueError(f"actions_per_turn must be in [1, {env.max_actions}], got {k}")
    out = []
    for i, seed in enumerate(seeds):
        rng = np.random.default_rng([rng_seed, seed])
        out.append(_episode(env, env_name, tokenizer, vision, eos, int(seed), first_index + i, rng,
                            action_noise, mistake, k, reasoning))
    env.close()
    return out


def _episode(env, env_name: str, tokenizer, vision: VisionTokens | None, eos: int, seed: int,
             index: int, rng: np.random.Generator, noise: float, mistake: str, k: int,
             reasoning: str) -> Trajectory:
    """A grid game's episode: each turn's actions from ``_choose``, written in the env's format."""
    structured = env.format in STRUCTURED  # the state as a dict: a game that can write it
    previous = None

    def turn() -> tuple[str, int, int]:
        nonlocal previous
        actions, after, n_random = _choose(env.game, rng, noise, mistake, k, previous, structured)
        previous = actions[-1]
        state = env.game.describe_state(True) if structured else env.state_text()
        answer = _answer(base_format(env.format), env.action_sep, state=state,
                         reasoning=_reasoning(env.game, reasoning), prediction=after,
                         actions=actions)
        return answer, n_random, len(actions)

    return _played(env, env_name, tokenizer, vision, eos, seed, index, turn)


def _played(env, env_name: str, tokenizer, vision: VisionTokens | None, eos: int, seed: int,
            index: int, turn: Callable[[], tuple[str, int, int]]) -> Trajectory:
    """The episode of ``seed`` played with the answers ``turn()`` writes from the env's current
    state (each with how many of its parts were mistakes, of how many), recorded as the actor
    records: ``random_action_share`` is the mistakes' share of all the parts."""
    ctx = ChatContext(tokenizer, env.system_prompt(), vision)
    obs = to_observation(env.reset(seed=seed)[0])
    rewards, success, mistakes, parts = [], False, 0, 0
    while True:
        answer, missed, of = turn()
        ids = tokenizer.encode(answer, add_special_tokens=False) + [eos]
        ctx.add_observation(obs.text, obs.images)
        ctx.add_generation(Generation(ids, [0.0] * len(ids), [0] * len(ids), stopped=True))
        result = to_step_result(env.step(answer))
        rewards.append(float(result.reward))
        success, mistakes, parts = bool(result.info["success"]), mistakes + missed, parts + of
        obs = result.observation
        if result.done:
            break
    metrics = {"success": float(success), "turns": float(len(rewards)),
               "reward": float(sum(rewards)), "random_action_share": mistakes / max(parts, 1)}
    return ctx.to_trajectory(rewards, run_id="demonstrations", actor_id=0, episode_id=index,
                             env_name=env_name, seed=seed, group_id=index, metrics=metrics)


def _choose(game, rng: np.random.Generator, noise: float, mistake: str, k: int,
            previous: str | None, structured: bool = False) -> tuple[list[str], str, int]:
    """(the turn's actions, the state text after them, how many were mistakes), on a game copy;
    ``previous``: the episode's last action before this turn (None at its start)."""
    own = getattr(game, "demonstrate_turn", None)  # a simulator cannot be copied: it plans
    if own is not None:
        return own(rng, noise, k, structured, mistake)
    sim = copy.deepcopy(game)
    actions, n_random = [], 0
    for _ in range(k):
        plan = sim.solve()
        if plan and rng.random() >= noise:
            action = plan[0]
        elif plan and mistake == "reverse":
            action = _REVERSE[plan[0]]
            n_random += 1
        elif plan and mistake == "repeat":
            action = previous or plan[0]
            n_random += previous is not None
        elif plan and mistake == "habit":
            action = sim.action_space[0]
            n_random += 1
        else:
            action = sim.action_space[int(rng.integers(len(sim.action_space)))]
            n_random += 1
        actions.append(action)
        previous = action
        if sim.move(action)[1]:  # the episode ends here: the env executes nothing after it
            break
    own_text = getattr(sim, "state_text", None)  # as GridEnv.state_text: the game's own words
    return actions, own_text() if own_text else describe(*sim.objects()), n_random


def _reasoning(game, how: str) -> str:
    own = getattr(game, "reasoning", None)  # a game that is not a grid says it itself
    if own is not None:
        return own()
    player, objects = game.objects()
    kind, pos = objects[0]
    plan = _PLANS.get(kind, "so I move toward it")
    if how == "offsets":
        return f"The {kind} is {offsets(player, pos)}, {plan}."
    rel = relation(player, pos, kind)
    return f"The {kind} is {PHRASES[rel.vertical, rel.horizontal]} the player, {plan}."


def offsets(player: tuple[int, int], pos: tuple[int, int]) -> str:
    """Where ``pos`` lies from ``player`` (both (row, col)) in rows and columns, e.g. "2 rows up
    and 1 column right", "1 row down", "at the player"."""
    (pr, pc), (r, c) = player, pos
    parts = [f"{abs(n)} {unit}{'s' if abs(n) > 1 else ''} {sign}"
             for n, unit, sign in ((r - pr, "row", "up" if r < pr else "down"),
                                   (c - pc, "column", "left" if c < pc else "right")) if n]
    return " and ".join(parts) or "at the player"


def _answer(format: str, action_sep: str, *, state: str, reasoning: str, prediction: str,
            actions: list[str]) -> str:
    """The answer in ``format`` (the tag sequences of envs.formats)."""
    answer = f"<answer>{action_sep.join(actions)}</answer>"
    if format == "no_think":
        return answer
    if format == "free_think":
        return f"<think>{state} {reasoning}</think>{answer}"
    text = {"observation": state, "reasoning": reasoning, "prediction": prediction}
    inner = "".join(f"<{name}>{text[name]}</{name}>" for name in _SECTIONS[format])
    return f"<think>{inner}</think>{answer}"
