"""What an inference actor runs: ``ActorConfig``, built by launch/config/builders.py from the model,
env and actors config groups, and read by actors/actor.py.

Invariants:
- A config that constructs is usable: unknown keys, empty pools (envs/config.py's
  ``EnvPoolConfig`` checks its own settings), more episodes in flight than env slots, sampling
  that training cannot learn from, and env service addresses that are not distinct strings raise
  ValueError.
- ``env_address`` is a list once constructed (``env_addresses``, the one place that reads one
  address or several): [] for the in-process pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from envs import splits
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
    env_address: str | list[str] | None = None
    """tcp://host:port of an env service (python -m envs.main) instead of an in-process pool, or
    a list of them: every one sized for all actors, an episode goes to any live one
    (envs/failover.py). Normalised to a list (``env_addresses``); [] is the in-process pool."""
    env_slot_offset: int = 0
    """First slot this actor owns on a shared env service, the same on each (remote envs only)."""
    env_timeout_s: float = 30.0
    """A call to an env service without a reply in this time marks the service down."""
    env_heartbeat_s: float = 2.0
    """Each env service is pinged this often; one silent for 3 pings is marked down."""
    env_grace_s: float = 120.0
    """With no env service live this long, the actor fails (naming every address)."""
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
    """Episode seeds are drawn from [low, high): training seeds, clear of the held-out splits'
    (envs/splits.py's ``SEEDS``)."""
    learner_address: str | None = None
    """The learner's trajectory stream (transport/stream.py); None: trajectories are not sent."""
    learner_curve: ClientKeys | None = None
    """The stream's CurveZMQ client keys (transport/security.py), as the driver hands them out."""
    env_curve: str | None = None
    """A directory of CurveZMQ certificates (``python -m transport.security DIR``) whose client
    keys open the env service at ``env_address`` (served with ``--curve DIR``)."""
    initial_version: int = 0
    """The weight version of ``model_path``."""
    lora_rank: int = 0
    """> 0: the learner trains LoRA adapters of this rank and publishes each version as an
    adapter, which the engine (built with LoRA) serves beside the base weights
    (actors/weight_updates.py); 0: full-weight updates."""
    lora_keep: int = 2
    """Adapters kept registered: the learner's staleness bound + 1, so an answer started under
    a version finishes under it."""
    lora_probe_tolerance: float = 1e-3
    """After every adapter update, the engine's log-probs of the learner's probe must equal the
    learner's within this (nats, per token); a larger difference fails the update."""
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
        self.env_address = env_addresses(self.env_address)
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
        if min(self.env_timeout_s, self.env_heartbeat_s, self.env_grace_s) <= 0:
            raise ValueError(f"env_timeout_s, env_heartbeat_s and env_grace_s must be > 0, got "
                             f"{self.env_timeout_s}, {self.env_heartbeat_s}, {self.env_grace_s}")
        if self.incarnation < 0 or self.skip_groups < 0:
            raise ValueError(f"incarnation and skip_groups must be >= 0, got {self.incarnation}, "
                             f"{self.skip_groups}")
        if len(self.train_seeds) != 2 or not 0 <= self.train_seeds[0] < self.train_seeds[1]:
            raise ValueError(f"train_seeds must be [low, high) with 0 <= low < high, got {self.train_seeds}")
        if self.lora_rank < 0 or self.lora_keep < 1 or not self.lora_probe_tolerance > 0:
            raise ValueError(f"lora_rank must be >= 0, lora_keep >= 1, lora_probe_tolerance > 0; got "
                             f"{self.lora_rank}, {self.lora_keep}, {self.lora_probe_tolerance}")
        if splits.meets_held_out(*self.train_seeds):
            raise ValueError(f"train_seeds {self.train_seeds} reach the held-out seeds {dict(splits.SEEDS)}")

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


def env_addresses(value: str | Sequence[str] | None) -> list[str]:
    """``env_address`` as a list: one address, several (distinct), or none ([]: in-process)."""
    if value is None:
        return []
    wrong = ValueError(f"env_address must be an address or a list of distinct addresses, got {value!r}")
    if not isinstance(value, (str, Sequence)):
        raise wrong
    addresses = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(a, str) and a for a in addresses) or len(set(addresses)) != len(addresses):
        raise wrong
    return addresses


def _check_keys(what: str, d: Mapping[str, Any], cls: type) -> None:
    unknown = set(d) - {f.name for f in fields(cls)}
    if unknown:
        raise ValueError(f"unknown {what} keys {sorted(unknown)}")
