"""From the run config to each component's arguments: pure mapping, no processes, no files, no
environment variables.

Called by the topologies (launch/topology/: each component's config and the warm start's
arguments), by launch/model/prepare.py (the env's keyword arguments) and by the benchmarks.
Each builder takes the ``RunConfig`` (launch/config/schema.py) and returns what one component
takes: the env's keyword arguments, the trainer's, a learner rank's, an actor's and its env
pool's config dataclasses, the warm start's keyword arguments (``warm_start`` is a function). A
key of a few choices (a str Enum of the schema) reaches a component as its plain word: the
components know no schema types."""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

from actors.config import ActorConfig
from envs.config import EnvPoolConfig
from envs.registry import images_per_observation
from launch.config.schema import RunConfig

if TYPE_CHECKING:  # learner/config.py imports torch: imported where a builder needs it
    from learner.config import TrainerConfig, WorkerConfig


def env_config(cfg: RunConfig) -> dict[str, Any]:
    """The env's keyword arguments: the env group, its reasoning reward as the algorithm preset
    says (``algorithm.reasoning_reward``, on for VAGEN-Full only). Off, the judge still scores
    the answers' <observation> and <prediction> (``*_score`` metrics, for comparing methods) but
    adds nothing to the reward: its weights are 0 and its repetition penalty is off."""
    env = copy.deepcopy(cfg.env)
    judge = env.get("reasoning_reward")
    if judge is not None and not cfg.algorithm.reasoning_reward:
        env["reasoning_reward"] = {**judge, "observation_weight": 0.0, "prediction_weight": 0.0,
                                   "repetition_penalty": False}
    return env


def trainer_config(cfg: RunConfig, model_path: str) -> TrainerConfig:
    """The trainer's config: every key of the algorithm group but ``reasoning_reward`` (an env
    setting: ``env_config``), the learner group's keys that TrainerConfig has, under the same
    names (the others place and pace the ranks: ``worker_config``, the placement), and the
    model's paths, the train steps the lr schedule spans, the sampling temperature and the seed.

    TrainerConfig declares its fields itself rather than taking these groups' dataclasses: it is
    the learner's own config, usable without a run (learner/config.py imports torch, which
    composing a run does not), its defaults are the library's (vtrace off; a run turns it on),
    and its ``dict | None`` fields are types an OmegaConf schema cannot hold."""
    from learner.config import TrainerConfig

    takes = {f.name for f in dataclasses.fields(TrainerConfig)} - {"lora"}
    learner = {k: v for k, v in dataclasses.asdict(cfg.learner).items() if k in takes}
    algo = dataclasses.asdict(cfg.algorithm)
    del algo["reasoning_reward"]  # an env setting (env_config)
    return TrainerConfig(**learner, **algo, model_path=model_path, critic_path=cfg.model.critic_path,
                         lr_steps=cfg.train.steps, temperature=cfg.actors.temperature, seed=cfg.seed,
                         lora=lora_spec(cfg))


def lora_spec(cfg: RunConfig) -> dict[str, Any] | None:
    """learner/lora.py's ``LoraSpec`` keys of ``learner.lora``; None when it is off."""
    lo = cfg.learner.lora
    if not lo.enabled:
        return None
    targets = lo.target_modules if isinstance(lo.target_modules, str) else list(lo.target_modules)
    return {"rank": lo.rank, "alpha": lo.alpha, "dropout": lo.dropout, "target_modules": targets,
            "merge": lo.merge, "save_merged": lo.save_merged}


def warm_start_config(cfg: RunConfig) -> dict[str, Any]:
    """launch.model.warm_start.warm_start keyword arguments (all but the model and the output
    directory) from the env and warm_start groups and the seed."""
    ws = cfg.warm_start
    return {
        "env_name": cfg.env_name, "env_config": env_config(cfg),
        "n_seeds": ws.seeds, "seed_offset": 0, "action_noise": ws.action_noise,
        "mistake": ws.mistake, "actions_per_turn": ws.actions_per_turn, "reasoning": ws.reasoning,
        "steps": ws.steps, "batch_size": ws.batch_size, "lr": ws.lr, "schedule": ws.schedule,
        "warmup": ws.warmup, "micro_batch_size": ws.micro_batch_size, "seed": cfg.seed,
        "workers": ws.workers,
    }


def actor_config(cfg: RunConfig, index: int, model_path: str, stream_address: str) -> ActorConfig:
    """Actor ``index``'s config; the topology adds what its placement and the run's history say
    (``dataclasses.replace``: cores, log file, stream keys, incarnation, groups played)."""
    ac, lo = cfg.actors, cfg.learner.lora
    return ActorConfig(
        actor_id=index, run_id=cfg.run_name, model_path=model_path,
        env_name=cfg.env_name, env_config=env_config(cfg), env_pool=env_pool_config(cfg),
        env_address=ac.env_address, env_curve=ac.env_curve, env_timeout_s=ac.env_timeout_s,
        env_heartbeat_s=ac.env_heartbeat_s, env_grace_s=ac.env_grace_s,
        # actors sharing env services take disjoint slot ranges, the same on each service
        env_slot_offset=index * ac.num_slots if ac.env_address else 0,
        concurrency=ac.concurrency, group_size=ac.group_size,
        whole_groups=cfg.algorithm.estimator == "grpo",  # GRPO batches take whole groups
        temperature=ac.temperature, top_p=ac.top_p, max_tokens=ac.max_tokens,
        max_turns=cfg.env["max_turns"], max_context=ac.max_context,
        images_per_turn=images_per_observation(cfg.env_name),
        kv_cache_bytes=ac.kv_cache_bytes, seed=cfg.seed * 1000 + index,
        learner_address=stream_address, dtype=str(cfg.model.dtype), tensor_parallel=ac.tp,
        # adapter pushes (not merged ones): the engine serves the last max_staleness + 1 adapters
        lora_rank=lo.rank if lo.enabled and not lo.merge else 0, lora_keep=cfg.learner.max_staleness + 1,
        lora_probe_tolerance=lo.probe_tolerance)


def env_pool_config(cfg: RunConfig) -> EnvPoolConfig:
    """Each actor's env worker pool: the actors group's pool keys (the group extends
    ``EnvPoolConfig``)."""
    return EnvPoolConfig(**{f.name: getattr(cfg.actors, f.name)
                            for f in dataclasses.fields(EnvPoolConfig)})


def worker_config(cfg: RunConfig, model_path: str) -> WorkerConfig:
    """A learner rank's ``WorkerConfig`` (the placement adds its cores and log file)."""
    from learner.config import WorkerConfig

    return WorkerConfig(
        trainer=trainer_config(cfg, model_path),
        threads=cfg.learner.threads, dist_timeout_s=cfg.learner.dist_timeout_s,
        max_staleness=cfg.learner.max_staleness, on_stale=str(cfg.learner.on_stale),
        group_size=cfg.actors.group_size, partial_groups=str(cfg.learner.partial_groups),
        window_bytes=cfg.transport.window_bytes, weight_timeout_s=cfg.transport.weight_timeout_s,
        weight_bucket_bytes=int(cfg.transport.weight_bucket_mb * (1 << 20)))
