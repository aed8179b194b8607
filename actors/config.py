"""What an inference actor runs: ``ActorConfig``, built by launch/config/builders.py from the model,
env and actors config groups, and read by actors/actor.py.

Invariant: a config that constructs is usable: unknown keys, empty pools (envs/config.py's
``EnvPoolConfig`` checks its own settings), more episodes in flight than env slots, and sampling
that training cannot learn from raise ValueError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from envs.config import EnvPoolConfig
from transport.security import ClientKeys


@dataclass
class ActorConfig:
    """One inference actor: its engine, its envs, its sampling and where its episodes go."""

    model_path: str
    """Hugging Face model directory the engine starts from (weights and tokenizer)."""
    actor_id: int = 0
    run_id: str = ""
    dtype: str = "float32"
    env_name: str = "frozenlake"
    """A registry name (configs/env/<name>.yaml supplies defaults) or an importable "module:callable"."""
    env_config: dict[str, Any] = field(default_factory=dict)
    """Overrides on the env's YAML defaults (keyword arguments of its make_env)."""
    env_pool: EnvPoolConfig = field(default_factory=EnvPoolConfig)
    """The in-process env worker pool (envs/config.py). Its env slots (env_workers x
    envs_per_worker) are this actor's, also with ``env_address``: the slots it takes on the
    shared env service, whose own pool then runs them; ``env_latency_s`` applies either way."""
    env_address: str | None = None
    """tcp://host:port of an env service (python -m envs.main) instead of an in-process pool."""
    env_slot_offset: int = 0
    """First slot this actor owns on a shared env service (remote envs only)."""
    concurrency: int = 4
    """Training episodes in flight; at most the number of env slots."""
    group_size: int = 1
    """Episodes per seed (a GRPO group)."""
    whole_groups: bool = False
    """Hold each group's trajectories until every member has ended, then send the ones that
    finished together, each stamped with their number (``Trajectory.group_size``): GRPO's
    batches take whole groups. False: each trajectory is sent when its episode ends."""
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 96
    """Tokens per answer (per turn)."""
    max_turns: int = 3
    images_per_turn: int = 1
    """The most images one observation shows (the SVG env's: the target and the last drawing):
    the engine takes max_turns x this many images a prompt."""
    max_context: int = 2048
    """The engine's max_model_len: an episode ends when its context would not fit."""
    engine: str = "async"
    """"async": vLLM's AsyncLLM, its engine core in a child process; "in_process": the engine in
    this process (actors/local_engine.py), for the single-process topology."""
    tensor_parallel: int = 1
    """vLLM's tensor-parallel size: the engine's worker processes (its GPUs; on CPU a core each),
    each a rank of the weight group from the rank the actor is given."""
    kv_cache_bytes: int = 256 << 20
    """Always explicit: on CPU vLLM would otherwise reserve most of the host's memory."""
    seed: int = 0
    """Seeds the engine's sampler and, with actor_id, the stream of episode seeds."""
    train_seeds: tuple[int, int] = (0, 1_000_000)
    """Episode seeds are drawn from [low, high)."""
    learner_address: str | None = None
    """The learner's trajectory stream (transport/stream.py); None: trajectories are not sent."""
    learner_curve: ClientKeys | None = None
    """The stream's CurveZMQ client keys (transport/security.py), as the driver hands them out."""
    env_curve: str | None = None
    """A directory of CurveZMQ certificates (``python -m transport.security DIR``) whose client
    keys open the env service at ``env_address`` (served with ``--curve DIR``)."""
    initial_version: int = 0
    """The weight version of ``model_path``."""
    cores: tuple[int, ...] = ()
    """CPU cores this actor's process, engine and env workers run on (the placement's); () for
    wherever the operating system puts them."""
    log_file: str | None = None
    """This process's output and its vLLM engine's go to this file (appended); None: to the
    console (Ray forwards it to the driver)."""
    incarnation: int = 0
    """Times this actor was restarted: each incarnation plays its own stream of seeds and group
    ids, so a restarted actor repeats no group of the one it replaces."""
    skip_groups: int = 0
    """Groups of this incarnation's stream already played: a resumed run's actor continues the
    stream where the checkpoint left it (its seeds and group ids), repeating none."""

    def __post_init__(self) -> None:
        self.train_seeds = tuple(self.train_seeds)
        self.cores = tuple(self.cores)
        if not self.model_path:
            raise ValueError("model_path is required")
        if min(self.concurrency, self.group_size, self.max_tokens, self.max_turns) < 1:
            raise ValueError("concurrency, group_size, max_tokens and max_turns must be >= 1")
        if self.concurrency > self.num_slots:
            raise ValueError(f"concurrency {self.concurrency} exceeds the {self.num_slots} env slots")
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError("training needs temperature > 0 and top_p in (0, 1]")
        if self.engine not in ("async", "in_process"):
            raise ValueError(f"engine must be 'async' or 'in_process', got {self.engine!r}")
        if self.env_slot_offset and not self.env_address:
            raise ValueError("env_slot_offset is for a shared env service (env_address)")
        if self.incarnation < 0 or self.skip_groups < 0:
            raise ValueError(f"incarnation and skip_groups must be >= 0, got {self.incarnation}, "
                             f"{self.skip_groups}")
        if len(self.train_seeds) != 2 or not 0 <= self.train_seeds[0] < self.train_seeds[1]:
            raise ValueError(f"train_seeds must be [low, high) with 0 <= low < high, got {self.train_seeds}")

    @property
    def num_slots(self) -> int:
        """The env slots this actor's episodes take (the pool's)."""
        return self.env_pool.num_slots

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ActorConfig":
        """The config of keys ``d``; its ``env_pool`` may be a mapping of EnvPoolConfig's keys."""
        _check_keys("actor config", d, cls)
        pool = d.get("env_pool")
        if isinstance(pool, Mapping):
            _check_keys("env_pool", pool, EnvPoolConfig)
            d = {**d, "env_pool": EnvPoolConfig(**pool)}
        return cls(**d)


def _check_keys(what: str, d: Mapping[str, Any], cls: type) -> None:
    unknown = set(d) - {f.name for f in fields(cls)}
    if unknown:
        raise ValueError(f"unknown {what} keys {sorted(unknown)}")
