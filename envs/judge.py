"""The reasoning reward of VAGEN-Full: judges of state descriptions and the per-turn reward.

Called by the envs: an env holds the ``ReasoningReward`` that ``make_reasoning_reward`` builds from
its config and calls it in ``Env.step`` with the model's <observation> and <prediction> and the true
state text before and after the turn's actions (``Env.state_text()``). Stdlib only. Invariants:
- A judge returns a score in [0, 1], or None when it failed (no reward, counted in metrics); a
  judge never raises for network problems.
- r_reason = w_obs * score(observation, state_before) + w_pred * score(prediction, state_after)
  + repetition penalties; a missing, empty or failed part contributes 0.
"""

from __future__ import annotations

import heapq
import http.client
import json
import re
import urllib.request
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from envs import relations


class Judge(Protocol):
    """Scores a description of a state against the true state text."""

    def score(self, description: str, true_state_text: str) -> float | None:
        """A score in [0, 1], or None when the judge failed."""
        ...


class RuleJudge:
    """The default, offline judge: mean per-kind F1 of the stated relations (envs.relations), or
    the env's own rule (``score``: a game whose state is not relations, e.g. positions in mm)."""

    def __init__(self, kinds: tuple[str, ...] | None = None,
                 score: Callable[[str, str], float] | None = None) -> None:
        self.kinds, self._score = kinds, score

    def score(self, description: str, true_state_text: str) -> float:
        """The rule's score of the description against the truth; never fails."""
        if self._score is not None:
            return self._score(description, true_state_text)
        return relations.score(description, true_state_text, kinds=self.kinds)


_SYSTEM_PROMPT = (
    "You are a strict judge of an agent's description of a grid game state. "
    "Positions are relative to the player. Answer with a single word: YES or NO."
)
_USER_PROMPT = (
    "True state:\n{truth}\n\nAgent's description:\n{description}\n\n"
    "Is the agent's description correct: is every object it mentions where the true state says, "
    "with nothing invented? Answer YES or NO."
)
_VERDICT_RE = re.compile(r"\W*(yes|no)\b", re.IGNORECASE)


class LLMJudge:
    """A binary YES/NO judge behind an OpenAI-compatible chat-completions endpoint (e.g. vLLM).

    YES -> 1.0, NO -> 0.0. Any other answer is asked again, up to ``retries`` more times; a
    timeout, an HTTP or connection error, or malformed JSON fails at once (a dead server must not
    stall the env for retries x timeout). Each failed ``score`` adds one to ``failures``.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout_s: float = 10.0,
        retries: int = 2,
        api_key: str | None = None,
        temperature: float = 0.1,
    ) -> None:
        if timeout_s <= 0 or retries < 0:
            raise ValueError(f"bad timeout_s {timeout_s} or retries {retries}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.timeout_s, self.retries = model, timeout_s, retries
        self.api_key, self.temperature = api_key, temperature
        self.failures = 0

    def score(self, description: str, true_state_text: str) -> float | None:
        """1.0 for YES, 0.0 for NO, None after ``retries`` unclear answers or a transport error."""
        prompt = _USER_PROMPT.format(truth=true_state_text, description=description)
        for _ in range(1 + self.retries):
            content = self._ask(prompt)
            if content is None:
                break
            verdict = _VERDICT_RE.match(content)
            if verdict:
                return 1.0 if verdict.group(1).lower() == "yes" else 0.0
        self.failures += 1
        return None

    def _ask(self, prompt: str) -> str | None:
        """The reply's message content, or None on any transport or decoding problem."""
        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": _SYSTEM_PROMPT},
                {"role": "user", "content": prompt},
            ],
            "temperature": self.temperature,
            "max_tokens": 8,
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, json.dumps(body).encode(), headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                reply = json.loads(response.read())
            content = reply["choices"][0]["message"]["content"]
        except (OSError, http.client.HTTPException, ValueError, LookupError, TypeError):
            return None  # OSError covers timeouts, refused connections and HTTP error statuses
        return content if isinstance(content, str) else None


class RepetitionPenalty:
    """VAGEN's anti-hacking rule: a frequent description that scores low is penalised.

    A description (lowercased, whitespace collapsed) is frequent when, counting it, it occurs at
    least twice among the last ``window`` descriptions and at least as often as the
    ``top_k``-th most frequent one (ties count as frequent). Memory is O(window).
    """

    def __init__(
        self, window: int = 1000, top_k: int = 5, threshold: float = 0.7, penalty: float = -0.1
    ) -> None:
        if window < 1 or top_k < 1:
            raise ValueError(f"bad window {window} or top_k {top_k}")
        self.window, self.top_k, self.threshold, self.penalty = window, top_k, threshold, penalty
        self.recent: deque[str] = deque()
        self.counts: Counter[str] = Counter()

    def __call__(self, description: str, score: float) -> float:
        """Record ``description``; return ``penalty`` if it is frequent and ``score`` < threshold,
        else 0.0."""
        key = " ".join(description.lower().split())
        self.recent.append(key)
        self.counts[key] += 1
        if len(self.recent) > self.window:
            old = self.recent.popleft()
            self.counts[old] -= 1
            if not self.counts[old]:
                del self.counts[old]
        if score >= self.threshold:
            return 0.0
        kth = heapq.nlargest(self.top_k, self.counts.values())[-1]
        count = self.counts[key]
        return self.penalty if count >= 2 and count >= kth else 0.0


@dataclass
class ReasoningReward:
    """The per-turn reasoning reward an env holds and calls in ``step``."""

    judge: Judge
    observation_weight: float = 0.5
    """Weight of score(<observation> vs the true state before the turn's actions)."""
    prediction_weight: float = 0.5
    """Weight of score(<prediction> vs the true state after the turn's actions)."""
    repetition: RepetitionPenalty | None = None
    """Anti-hacking penalty applied to each judged description; None: off."""

    def __call__(
        self,
        *,
        observation: str | None,
        prediction: str | None,
        state_before: str,
        state_after: str,
    ) -> tuple[float, dict[str, float]]:
        """(reward, metrics). A None part (no such section in the format) is skipped and has no
        score metric; an empty one scores 0; a judge failure contributes 0 and is counted."""
        reward, failures, penalty = 0.0, 0, 0.0
        metrics: dict[str, float] = {}
        parts = (
            ("observation", observation, state_before, self.observation_weight),
            ("prediction", prediction, state_after, self.prediction_weight),
        )
        for name, text, truth, weight in parts:
            if text is None:
                continue
            score = self.judge.score(text, truth) if text.strip() else 0.0
            if score is None:
                failures += 1
                score = 0.0
            elif self.repetition is not None and text.strip():
                penalty += self.repetition(text, score)
            metrics[f"reasoning/{name}_score"] = score
            reward += weight * score
        metrics["reasoning/judge_failures"] = float(failures)
        metrics["reasoning/repetition_penalty"] = penalty
        return reward + penalty, metrics


_COMMON_KEYS = {"enabled", "judge", "observation_weight", "prediction_weight", "repetition_penalty"}
_JUDGE_KEYS = {
    "rule": {"kinds"},
    "llm": {"base_url", "model", "timeout_s", "retries", "api_key", "temperature"},
}


def make_reasoning_reward(config: dict | None,
                          rule_score: Callable[[str, str], float] | None = None
                          ) -> ReasoningReward | None:
    """Build the reasoning reward from a plain dict; None when ``config`` is None or disabled.

    Keys: ``enabled`` (default True), ``judge`` ("rule", the default, with optional ``kinds``;
    or "llm" with ``base_url``, ``model`` and optional ``timeout_s``, ``retries``, ``api_key``,
    ``temperature``), ``observation_weight`` and ``prediction_weight`` (default 0.5 each, >= 0),
    ``repetition_penalty`` (False, True, or a dict of ``RepetitionPenalty`` arguments).
    ``rule_score``: the env's own rule for the rule judge (default: relations' F1).
    Raises ValueError naming an unknown key or a key of the other judge.
    """
    if config is None or not config.get("enabled", True):
        return None
    kind = config.get("judge", "rule")
    if kind not in _JUDGE_KEYS:
        raise ValueError(f"unknown judge {kind!r}; expected one of {sorted(_JUDGE_KEYS)}")
    for key in config:
        if key not in _COMMON_KEYS | _JUDGE_KEYS[kind]:
            raise ValueError(f"unknown key {key!r} in reasoning reward config (judge={kind!r})")
    judge_args = {k: config[k] for k in _JUDGE_KEYS[kind] if k in config}
    if kind == "rule":
        kinds = judge_args.get("kinds")
        judge: Judge = RuleJudge(tuple(kinds) if kinds is not None else None, rule_score)
    else:
        for key in ("base_url", "model"):
            if key not in judge_args:
                raise ValueError(f"judge='llm' needs {key!r}")
        judge = LLMJudge(**judge_args)
    weights = {k: float(config.get(k, 0.5)) for k in ("observation_weight", "prediction_weight")}
    if min(weights.values()) < 0:
        raise ValueError(f"reasoning reward weights must be >= 0, got {weights}")
    repetition = config.get("repetition_penalty", False)
    if isinstance(repetition, dict):
        for key in repetition:
            if key not in ("window", "top_k", "threshold", "penalty"):
                raise ValueError(f"unknown key {key!r} in repetition_penalty")
        repetition = RepetitionPenalty(**repetition)
    else:
        repetition = RepetitionPenalty() if repetition else None
    return ReasoningReward(judge, repetition=repetition, **weights)
