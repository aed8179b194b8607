"""Small deterministic envs for the pool and service tests (factories "tests.unit.envs.fake_envs:X").

CounterEnv counts steps from its seed; the others misbehave on purpose: RaisingEnv raises,
HangingEnv sleeps past any test timeout, CrashingEnv kills its own process. Each misbehaves only
when the model's text asks for it (``"raise"``, ``"hang"``, ``"crash"``), so a test chooses which
slot fails and when. ``assert_same`` compares results that crossed a process boundary.
"""

from __future__ import annotations

import os
import time

import numpy as np

from envs.protocol import IMAGE_PLACEHOLDER, StepResult


class CounterEnv:
    """Counts: reset(seed=s) starts at s; each step adds len(text); done after ``max_steps``.
    The gymnasium signatures of envs/protocol.py's Env, without subclassing gymnasium.Env."""

    built = 0
    """Envs of this class built in this process (a check that must build none counts them)."""

    def __init__(self, max_steps: int = 3, image: bool = False) -> None:
        CounterEnv.built += 1
        self.max_steps = max_steps
        self.image = image
        self.value = 0
        self.steps = 0

    def system_prompt(self) -> str:
        return f"count to {self.max_steps}"

    def _obs(self) -> dict:
        if not self.image:
            return {"text": f"value={self.value}", "images": ()}
        img = np.full((2, 3, 3), self.value % 256, dtype=np.uint8)
        return {"text": f"value={self.value} {IMAGE_PLACEHOLDER}", "images": (img,)}

    def reset(self, *, seed: int, options=None) -> tuple[dict, dict]:
        self.value, self.steps = seed, 0
        return self._obs(), {}

    def step(self, llm_text: str) -> tuple[dict, float, bool, bool, dict]:
        self._misbehave(llm_text)
        self.value += len(llm_text)
        self.steps += 1
        info = {"success": False, "format_correct": True, "actions_valid": True,
                "actions": [llm_text], "metrics": {"n_actions": 1.0}}
        return self._obs(), float(len(llm_text)), self.steps >= self.max_steps, False, info

    def _misbehave(self, llm_text: str) -> None:
        pass

    def state_text(self) -> str:
        return f"the counter is at {self.value}"

    def close(self) -> None:
        pass


class RaisingEnv(CounterEnv):
    """Raises RuntimeError on a step whose text is "raise" (and on reset with seed -1); answers
    "unencodable" with an info the wire cannot carry."""

    def reset(self, *, seed: int, options=None) -> tuple[dict, dict]:
        if seed == -1:
            raise RuntimeError("bad seed")
        return super().reset(seed=seed)

    def step(self, llm_text: str) -> tuple[dict, float, bool, bool, dict]:
        result = super().step(llm_text)
        if llm_text == "unencodable":
            result[-1]["oops"] = object()
        return result

    def _misbehave(self, llm_text: str) -> None:
        if llm_text == "raise":
            raise RuntimeError("boom")


class HangingEnv(CounterEnv):
    """Sleeps ``hang_s`` (a minute by default) on a step whose text is "hang"."""

    def __init__(self, hang_s: float = 60.0, **config) -> None:
        super().__init__(**config)
        self.hang_s = hang_s

    def _misbehave(self, llm_text: str) -> None:
        if llm_text == "hang":
            time.sleep(self.hang_s)


class CrashingEnv(CounterEnv):
    """Ends its whole process (no cleanup, like a segfault) on a step whose text is "crash"."""

    def _misbehave(self, llm_text: str) -> None:
        if llm_text == "crash":
            os._exit(3)


def assert_same(a, b) -> None:
    """Pool result == in-process result, arrays compared by value."""
    assert type(a) is type(b)
    obs_a, obs_b = (a.observation, b.observation) if isinstance(a, StepResult) else (a, b)
    if isinstance(a, StepResult):
        assert (a.reward, a.done, a.info) == (b.reward, b.done, b.info)
    assert obs_a.text == obs_b.text and len(obs_a.images) == len(obs_b.images)
    assert all(np.array_equal(x, y) and x.dtype == y.dtype for x, y in zip(obs_a.images, obs_b.images))


def flaky_factory(block: str, start_s: float = 0.0, **config) -> CounterEnv:
    """A CounterEnv after ``start_s`` seconds, or then a start-up error while the file ``block``
    exists (a slow simulator that cannot start for a while)."""
    time.sleep(start_s)
    if os.path.exists(block):
        raise RuntimeError("the simulator cannot start")
    return CounterEnv(**config)


def failing_factory(**config) -> CounterEnv:
    """An env factory that cannot build its env (a config error)."""
    raise ValueError("no such env")
