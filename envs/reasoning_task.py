"""reasoning-gym's procedural tasks (``env=reasoning_gym env.task=<name>``) through VAGEN's layer.

A ``ReasoningTask`` is a ``Source`` of envs/text_env.py: the episode is one item of
``reasoning_gym.create_dataset(task, seed=dataset_seed, size=size, **settings)`` (``settings``:
the generator's own, e.g. ``{min_terms: 2, max_terms: 4}`` for basic_arithmetic), the item the
episode's seed picks; the model is shown its question. A turn's answer is scored by the task's
own ``score_answer`` (1.0 right, partial credit where the task gives it); the turn's env reward is
``score_reward`` times the score, success is a score of at least ``success_score``, and success
ends the episode. With ``max_turns`` > 1 a turn that falls short is answered with
``retry_feedback`` (its ``{score}`` filled in) and the model tries again, until success or the
turn limit. A scorer that raises on an answer scores it 0 and counts it (``scorer_error``).

The map of an episode is its question: held-out seeds play questions no training seed plays.
The items' answers are the warm start's demonstrations (a mistake is another item's answer),
where the task gives answers that score (``has_solver``); some give none (propositional_logic's
many right answers), and a warm start is then refused before anything is built.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np

from envs.text_env import Outcome, TextEnv, takes_text_layer

TASK = ("Solve the task you are given. Think it through if you like, then give the final "
        "answer alone, exactly as the task asks for it.")


class ReasoningTask:
    """One reasoning-gym task as a ``Source`` (see the module docstring)."""

    draws = False

    def __init__(self, task: str, *, settings: Mapping[str, Any] | None, dataset_seed: int,
                 size: int, score_reward: float, success_score: float, retry_feedback: str) -> None:
        self.dataset = dataset(task, settings, dataset_seed, size)
        self.name = f"reasoning-gym {task}"
        self.task, self.answer_is = TASK, "the final answer"
        self.score_reward, self.success_score = float(score_reward), float(success_score)
        if not 0 < self.success_score <= 1:
            raise ValueError(f"success_score must be in (0, 1], got {success_score}")
        self.retry_feedback = retry_feedback
        retry_feedback.format(score=0.0)  # a template that does not fill fails here, not mid-run
        example = self.dataset[len(self.dataset) - 1]["answer"]
        self.example = str(example) if example is not None else "42"
        self.has_reference = has_reference(self.dataset, self.success_score)
        self._entry: dict[str, Any] = {}

    def start(self, seed: int) -> Outcome:
        self._entry = self.dataset[seed % len(self.dataset)]
        return Outcome(self._entry["question"])

    def layout(self) -> str:
        return self._entry["question"]

    def act(self, answer: str) -> Outcome:
        try:
            score, failed = float(self.dataset.score_answer(answer, self._entry)), 0.0
        except Exception:  # noqa: BLE001 - the task's scorer failing on a model's text scores 0
            score, failed = 0.0, 1.0
        success = score >= self.success_score
        text = "" if success else self.retry_feedback.format(score=score)
        return Outcome(text, reward=self.score_reward * score, done=success, success=success,
                       metrics={"score": score, "scorer_error": failed})

    def reference(self, rng: np.random.Generator, noise: float) -> tuple[str, bool]:
        if rng.random() < noise:  # another item's answer: right in shape, wrong here
            other = self.dataset[int(rng.integers(len(self.dataset)))]
            if other["answer"] is not None and other["answer"] != self._entry["answer"]:
                return str(other["answer"]), True
        if self._entry.get("answer") is None:
            raise ValueError(f"{self.name} gave no reference answer to this question")
        return str(self._entry["answer"]), False

    def end(self) -> None:
        pass

    def close(self) -> None:
        pass


def dataset(task: str, settings: Mapping[str, Any] | None, seed: int, size: int):
    """The task's generator: ``reasoning_gym.create_dataset``, with a message naming the tasks
    for an unknown one."""
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        raise ValueError(f"reasoning-gym has no task {task!r}; it has {sorted(DATASETS)}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return reasoning_gym.create_dataset(task, seed=seed, size=size, **dict(settings or {}))


def has_reference(data, success_score: float = 1.0) -> bool:
    """Whether the task's items carry answers its scorer accepts (tried on its first items)."""
    entries = [data[i] for i in range(min(4, len(data)))]
    return all(e.get("answer") is not None
               and data.score_answer(str(e["answer"]), e) >= success_score for e in entries)


@takes_text_layer
def make_env(*, task: str = "basic_arithmetic", settings: Mapping[str, Any] | None = None,
             dataset_seed: int = 0, size: int = 100_000, score_reward: float = 1.0,
             success_score: float = 1.0,
             retry_feedback: str = "Your answer scored {score:.2f} of 1. Try again.",
             **layer: Any) -> TextEnv:
    """The reasoning-gym task ``task`` in VAGEN's layer; ``layer`` is TextEnv's settings."""
    source = ReasoningTask(task, settings=settings, dataset_seed=dataset_seed, size=size,
                           score_reward=score_reward, success_score=success_score,
                           retry_feedback=retry_feedback)
    return TextEnv(source, **layer)


def has_solver(config: Mapping[str, Any]) -> bool:
    """Whether ``make_env(**config)`` can demonstrate (the warm start): its task's items carry
    answers its scorer accepts. Builds the generator, not the env."""
    bound = inspect.signature(make_env).bind(**config)  # make_env's defaults for what config omits
    bound.apply_defaults()
    c = bound.arguments
    return has_reference(dataset(c["task"], c["settings"], int(c["dataset_seed"]), int(c["size"])),
                         float(c["success_score"]))
