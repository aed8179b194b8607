"""One multi-turn episode, token in and token out: the context, the turn loop, the Trajectory.

Called by the inference actor (actors/actor.py), by evaluation and by the warm start's
demonstrations (actors/demonstrations.py). The model is reached only through a ``Generate``
callable, so this module knows nothing of vLLM; the envs only through an ``EnvClient`` slot.

Invariants:
- Token in, token out: ``ChatContext.token_ids`` is exactly what the model saw and produced. Each
  new observation is rendered by the tokenizer's chat template and *appended*; earlier turns are
  never re-tokenized. The template is applied once per observation to a fixed probe conversation
  to find the text it puts between an assistant's end-of-turn and the next user turn, and that
  glue is tokenized on its own, so any prefix-stable template (ChatML, Llama 3, ...) works.
- The generated tokens (including the end-of-turn token when the model produced it) are the
  policy's: ``loss_mask`` True, their behaviour log-prob and policy version recorded; everything
  else (system prompt, observations, template glue, an end-of-turn token appended after a
  truncated answer) is the environment's: mask False, log-prob 0, version -1.
- ``turn_end`` marks the last generated token of each turn; ``turn_rewards[t]`` is turn t's
  reward from the env. A turn whose answer is empty cannot carry a reward: the episode ends there.
- ``EpisodeResult.metrics`` (also the trajectory's): success, turns, reward and its parts
  (``REWARD_PARTS``), the executed actions counted by name (``action/<name>``), format_correct,
  token counts and times; with a reasoning judge, ``observation_score`` and
  ``prediction_score``, the means over the episode's turns of the judge's scores
  (``reasoning/*_score`` in the env's per-turn metrics; 0 for a turn out of format).
- Images (a VLM, actors/vision.py): each observation's images become the model's pad runs, in
  order, and the trajectory carries them. An answer holding a vision token (the model wrote an
  image placeholder) fails the episode ("vision_token_generated"): it cannot be trained on.
- With a ``record`` list (evaluation's sample episodes, shown by launch/run/pages.py), each
  turn the env answered is appended as plain data (``turn_record``); without one nothing extra is
  built.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from actors.vision import VisionTokens
from envs.protocol import Observation, StepResult, blanked
from envs.service import EnvClient
from envs.wire import EpisodeFailure
from transport.images import encode_image, expand_pads
from transport.receiving import bounded_key
from transport.schema import Trajectory

_PROBE = "\x00probe\x00"


@dataclass
class Generation:
    """One sampled answer: its tokens, their behaviour log-probs and the versions that made them."""

    token_ids: list[int]
    logprobs: list[float]
    """Log-prob of each token under the distribution sampled from (temperature applied)."""
    versions: list[int]
    """The policy version that generated each token."""
    stopped: bool
    """True when the model ended its turn itself (end-of-turn token or stop string)."""

    @classmethod
    def from_vllm(cls, out, version: int, logprobs: bool = True, spans: bool = True) -> "Generation":
        """From a vLLM ``CompletionOutput``: the sampled token's log-prob at each position (0.0
        without ``logprobs``), versions from its ``weight_versions`` spans (``version`` where it
        has none: only an engine that never had a version set reports none; every token's,
        without ``spans``: an answer sampled with one adapter throughout)."""
        ids = list(out.token_ids)
        lps = [out.logprobs[i][t].logprob for i, t in enumerate(ids)] if logprobs else [0.0] * len(ids)
        versions = [version] * len(ids)
        for span in (out.weight_versions or ()) if spans else ():
            versions[span.start:span.end] = [int(span.version)] * (span.end - span.start)
        return cls(ids, lps, versions, stopped=out.finish_reason == "stop")


Generate = Callable[[list[int], list[np.ndarray], int], Awaitable[Generation]]
"""Given the full context's token ids, its images and the most tokens the answer may have (the
context's room, less the end-of-turn an answer cut short is closed with), sample the next answer."""


class ChatContext:
    """The growing token sequence of one episode and its per-token records."""

    def __init__(self, tokenizer, system_prompt: str | None, vision: VisionTokens | None = None) -> None:
        self.tokenizer, self.vision = tokenizer, vision
        self.images: list[np.ndarray] = []
        """Every image of the context, in order (RGB uint8): one pad run each in ``token_ids``."""
        self.system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.token_ids: list[int] = []
        self.loss_mask: list[bool] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.turn_end: list[bool] = []
        self.turns = 0
        self._glue, self._eot = _template_glue(tokenizer, self.system)

    def add_observation(self, text: str, images: Sequence[np.ndarray] = ()) -> None:
        """Append the next user turn and the assistant header the model answers after; each
        ``<image>`` of ``text`` becomes the model's pad run for the next of ``images``."""
        if images:
            if self.vision is None:
                raise ValueError("the observation has images but the model has no image processor")
            text = self.vision.render(text, len(images))
        if not self.token_ids:
            rendered = self.tokenizer.apply_chat_template(
                [*self.system, {"role": "user", "content": text}],
                add_generation_prompt=True, tokenize=False)
        else:
            rendered = self._glue + _render_user(self.tokenizer, self.system, text)
        ids = self.tokenizer.encode(rendered, add_special_tokens=False)
        if images:
            ids = expand_pads(ids, self.vision.pad_id, [self.vision.count(im) for im in images])
            self.images += images
        self._extend_env(ids)

    def add_generation(self, gen: Generation) -> None:
        """Append the model's answer as policy tokens; close the turn if the model did not."""
        n = len(gen.token_ids)
        if n == 0 or len(gen.logprobs) != n or len(gen.versions) != n:
            raise ValueError(f"a generation needs >= 1 token and one log-prob and version per token, "
                             f"got {n}, {len(gen.logprobs)}, {len(gen.versions)}")
        self.token_ids += gen.token_ids
        self.loss_mask += [True] * n
        self.logprobs += gen.logprobs
        self.versions += gen.versions
        self.turn_end += [False] * (n - 1) + [True]
        self.turns += 1
        if not gen.stopped:  # truncated: the template's end-of-turn, as environment tokens
            self._extend_env(self._eot)

    @property
    def reserve(self) -> int:
        """Tokens an answer cut short is followed by (its end-of-turn): kept free in the context."""
        return len(self._eot)

    def answer_text(self, gen: Generation) -> str:
        return self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)

    def _extend_env(self, ids: list[int]) -> None:
        n = len(ids)
        self.token_ids += ids
        self.loss_mask += [False] * n
        self.logprobs += [0.0] * n
        self.versions += [-1] * n
        self.turn_end += [False] * n

    def to_trajectory(self, turn_rewards: list[float], **fields) -> Trajectory:
        if len(turn_rewards) != self.turns:
            raise ValueError(f"{self.turns} turns but {len(turn_rewards)} rewards")
        return Trajectory(
            token_ids=np.asarray(self.token_ids, dtype=np.int32),
            loss_mask=np.asarray(self.loss_mask, dtype=bool),
            turn_end=np.asarray(self.turn_end, dtype=bool),
            behaviour_logprobs=np.asarray(self.logprobs, dtype=np.float32),
            policy_version=np.asarray(self.versions, dtype=np.int32),
            turn_rewards=np.asarray(turn_rewards, dtype=np.float32),
            images=[encode_image(im) for im in self.images],
            **fields,
        )


def _render_user(tokenizer, system: list[dict], text: str) -> str:
    """The text a template puts for one more user turn (and the generation prompt) after an
    assistant turn, found by rendering a probe conversation with and without it."""
    probe = [*system, {"role": "user", "content": _PROBE}, {"role": "assistant", "content": _PROBE}]
    before = tokenizer.apply_chat_template(probe, tokenize=False)
    after = tokenizer.apply_chat_template([*probe, {"role": "user", "content": text}],
                                          add_generation_prompt=True, tokenize=False)
    if not after.startswith(before):
        raise ValueError("the chat template is not prefix-stable: a later turn re-renders earlier ones")
    return after[len(before):]


def _template_glue(tokenizer, system: list[dict]) -> tuple[str, list[int]]:
    """(text after the end-of-turn token up to the next turn, the end-of-turn token ids).

    With ChatML an assistant turn renders as ``...answer<|im_end|>\\n``: the model generates up
    to ``<|im_end|>`` (its EOS), and ``\\n`` is glue the environment adds before the next turn.
    """
    probe = [*system, {"role": "user", "content": _PROBE}, {"role": "assistant", "content": _PROBE}]
    rendered = tokenizer.apply_chat_template(probe, tokenize=False)
    tail = rendered[rendered.rindex(_PROBE) + len(_PROBE):]
    eos = tokenizer.eos_token or ""
    if eos and tail.startswith(eos):
        return tail[len(eos):], tokenizer.encode(eos, add_special_tokens=False)
    return tail, []


REWARD_PARTS = {"reward_env": "env_reward", "reward_format": "format_reward",
                "reward_reasoning": "reasoning_reward"}
"""The reward's parts in an episode's metrics (sums over its turns), from each turn's
``info["metrics"]`` key: the env's own, the format reward, the reasoning judge's. An env that
reports none of them has them 0 (the episode's ``reward`` is then the env's alone)."""


MAX_ACTION_NAMES = 16
"""The most action names an episode's metrics count apart; later names count as ``other``."""


def action_name(action: Any, seen: Mapping[str, float]) -> str:
    """An executed action's name for the action histogram (``action/<name>`` in the episode's
    metrics: how many times it was executed): its leading word (``pick(10, 20)`` -> ``pick``),
    ``other`` for one without or past ``MAX_ACTION_NAMES`` names."""
    match = re.match(r"[A-Za-z_]\w*", str(action))
    name = match.group(0).lower() if match else "other"
    return bounded_key(seen, name, "other", MAX_ACTION_NAMES)


def judge_scores(turn_metrics: dict[str, float]) -> dict[str, float]:
    """The reasoning judge's scores among an env turn's ``info["metrics"]``, named without the
    ``reasoning/`` prefix: ``{"observation_score": ..., "prediction_score": ...}`` ({} without a judge)."""
    return {k.removeprefix("reasoning/"): float(v) for k, v in turn_metrics.items()
            if k.startswith("reasoning/") and k.endswith("_score")}


def turn_record(obs: Observation, answer: str, result: StepResult) -> dict[str, Any]:
    """One played turn as plain data (str, float, bool, lists and dicts of them): what the model
    was shown (``observation`` text, ``images`` as base64 PNG), its ``answer`` text, the turn's
    ``reward`` and its terms (``metrics``: the env's ``info["metrics"]``), the judge's ``scores``
    (``judge_scores``), ``format_correct``, ``actions_valid``, the executed ``actions``,
    ``success`` and ``done``."""
    info = result.info
    metrics = {k: float(v) for k, v in info.get("metrics", {}).items()}
    return {
        "observation": obs.text,
        "images": [base64.b64encode(encode_image(im).png).decode("ascii") for im in obs.images],
        "answer": answer, "reward": float(result.reward), "metrics": metrics,
        "scores": judge_scores(metrics), "format_correct": bool(info.get("format_correct", False)),
        "actions_valid": bool(info.get("actions_valid", False)),
        "actions": [str(a) for a in info.get("actions", [])],
        "success": bool(info.get("success", False)), "done": bool(result.done),
    }


@dataclass
class EpisodeResult:
    trajectory: Trajectory | None
    """None when the episode failed (env crash, timeout) and nothing can be trained on."""
    failure: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)


async def run_episode(generate: Generate, env: EnvClient, slot: int, seed: int, tokenizer, *,
                      max_turns: int, max_context: int, run_id: str = "", actor_id: int = 0,
                      episode_id: int = 0, group_id: int = 0, env_name: str = "",
                      vision: VisionTokens | None = None,
                      record: list[dict[str, Any]] | None = None, blind: bool = False) -> EpisodeResult:
    """Play one episode on ``slot`` from ``seed``; see the module docstring for what is recorded.

    The episode ends when the env says done, after ``max_turns`` answers, or when the context
    would no longer fit ``max_context`` tokens (the trajectory keeps the turns played). Given
    ``record``, each turn the env answered is appended to it (``turn_record``), also when the
    episode fails later. ``blind``: the model sees every picture white (the env scores the
    real ones): the floor of launch/run/baselines.py that tells whether it reads them.
    """
    t0 = time.perf_counter()
    system = await env.system_prompt(slot)
    obs = (await env.reset([slot], [seed]))[0]
    if isinstance(system, EpisodeFailure) or isinstance(obs, EpisodeFailure):
        reason = system.reason if isinstance(system, EpisodeFailure) else obs.reason
        return EpisodeResult(None, failure=reason)
    ctx = ChatContext(tokenizer, system, vision)
    rewards: list[float] = []
    scores: dict[str, float] = {}  # the reasoning judge's scores, summed over turns
    parts = dict.fromkeys(REWARD_PARTS, 0.0)  # the reward's parts, summed over turns
    actions: dict[str, float] = {}  # executed actions by name, counted over turns
    success = format_ok = 0.0
    gen_s = env_s = 0.0
    generated = 0
    for _ in range(max_turns):
        ctx.add_observation(obs.text, blanked(obs.images) if blind else obs.images)
        room = max_context - len(ctx.token_ids) - ctx.reserve
        if room < 1:
            break
        t = time.perf_counter()
        gen = await generate(ctx.token_ids, ctx.images, room)
        if len(gen.token_ids) > room:
            raise ValueError(f"an answer of {len(gen.token_ids)} tokens where {room} fit the context")
        gen_s += time.perf_counter() - t
        if vision is not None and vision.special_ids.intersection(gen.token_ids):
            # An image placeholder the model wrote would be read as an image: not trainable.
            return EpisodeResult(None, failure="vision_token_generated")
        text = ctx.answer_text(gen)
        ctx.add_generation(gen)
        generated += len(gen.token_ids)
        t = time.perf_counter()
        result = (await env.step([slot], [text]))[0]
        env_s += time.perf_counter() - t
        if isinstance(result, EpisodeFailure):
            return EpisodeResult(None, failure=result.reason)
        if record is not None:
            record.append(turn_record(obs, text, result))
        rewards.append(float(result.reward))
        success = float(result.info.get("success", False))
        format_ok += float(result.info.get("format_correct", False))
        turn_metrics = result.info.get("metrics", {})
        for name, value in judge_scores(turn_metrics).items():
            scores[name] = scores.get(name, 0.0) + value
        for name, key in REWARD_PARTS.items():
            parts[name] += float(turn_metrics.get(key, 0.0))
        for action in result.info.get("actions", ()):
            name = action_name(action, actions)
            actions[name] = actions.get(name, 0.0) + 1
        obs = result.observation
        if result.done:
            break
    if not rewards:  # the first observation alone fills the context
        return EpisodeResult(None, failure="context_overflow")
    metrics = {
        "success": success, "turns": float(len(rewards)), "reward": float(sum(rewards)),
        "format_correct": format_ok / len(rewards), "generated_tokens": float(generated),
        "context_tokens": float(len(ctx.token_ids)), "generate_s": gen_s, "env_s": env_s,
        "episode_s": time.perf_counter() - t0,
    } | parts | {f"action/{name}": n for name, n in actions.items()} | {
        name: total / len(rewards) for name, total in scores.items()}
    traj = ctx.to_trajectory(rewards, run_id=run_id, actor_id=actor_id, episode_id=episode_id,
                             env_name=env_name, seed=seed, group_id=group_id, metrics=metrics,
                             created_at=time.time())
    return EpisodeResult(traj, metrics=metrics)
