"""The env worker pool's settings: one dataclass for the run's ``actors`` group (launch/config/schema.py's
``ActorsConfig`` extends it), an inference actor's pool (actors/config.py's ``ActorConfig`` holds
one) and ``python -m envs.main``'s command line, with the same names.

Called by envs/main.py and, through the run config, by the actors (envs/pool.py takes these).
No ``from __future__ import annotations``: Hydra reads these annotations as types.
"""

from dataclasses import dataclass


@dataclass
class EnvPoolConfig:
    """An env worker pool: its processes, the envs in each, and how long a call may take."""

    env_workers: int = 1
    """Env worker processes."""
    envs_per_worker: int = 16
    """Envs in each worker (env slots = env_workers * envs_per_worker)."""
    step_timeout_s: float = 30.0
    """A batch of env steps taking longer ends those episodes (the worker is replaced)."""
    reset_timeout_s: float = 30.0
    """The same for a batch of resets."""
    start_timeout_s: float = 120.0
    """A worker process that has not built its envs by then failed to start (simulators on a
    busy host take long: docs/environments.md has what ManiSkill's scenes took)."""
    env_latency_s: float = 0.0
    """Every env reset and step answers this much later, as a remote simulator's would (the wait
    holds no env worker: envs/service.py's LatencyEnvClient); for benchmarks of latency hiding."""

    def __post_init__(self) -> None:
        if min(self.env_workers, self.envs_per_worker) < 1:
            raise ValueError("env_workers and envs_per_worker must be >= 1")
        if min(self.step_timeout_s, self.reset_timeout_s, self.start_timeout_s) <= 0:
            raise ValueError("step_timeout_s, reset_timeout_s and start_timeout_s must be > 0")
        if self.env_latency_s < 0:
            raise ValueError(f"env_latency_s must be >= 0, got {self.env_latency_s}")

    @property
    def num_slots(self) -> int:
        """Env slots: the most episodes the pool plays at once."""
        return self.env_workers * self.envs_per_worker
