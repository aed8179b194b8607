"""The env calls of tests that read results as the pool carries them: a gymnasium env's reset and
step (envs/protocol.py) as ``Observation`` / ``StepResult``."""

from envs.protocol import Observation, StepResult, to_observation, to_step_result


def env_reset(env, seed: int) -> Observation:
    """``env.reset(seed=seed)``'s observation."""
    return to_observation(env.reset(seed=seed)[0])


def env_step(env, text: str) -> StepResult:
    """``env.step(text)`` as one StepResult (``done``: terminated or truncated)."""
    return to_step_result(env.step(text))
