"""The Ray controller: place the processes, start them, push weights, evaluate, shut them down.

Called by launch/loop.py (the training loop of a run). Processes, each a Ray actor placed by
launch/placement.py:
- learner ranks (``learner.worker.LearnerWorker``): FSDP2 over gloo/NCCL; rank 0 binds the
  trajectory stream and hosts the weight group;
- inference actors (``actors.actor.InferenceActor``, async Ray actors): a vLLM engine each (one
  worker process, which joins the weight group) and an env pool (or a remote env service).

A weight push calls every actor's ``update_weights`` (pause with requests kept, receive inside the
vLLM worker, reset the prefix cache, resume) together with the learners' ``publish_weights``.

Invariants: ``shutdown`` stops only the Ray actors ``start`` created, and shuts Ray down only if
``init_ray`` started it; the warm start runs in a Ray task whose worker exits after it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch.placement import Node, Roles, place

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Processes:
    learners: list = field(default_factory=list)
    actors: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    """The actors' background ``run`` calls (async mode), by actor index."""
    restarts: list = field(default_factory=list)
    """Times each actor was replaced after a crash."""
    actor_slots: list = field(default_factory=list)
    """Each actor's placement slot (launch/placement.py)."""
    actor_configs: list = field(default_factory=list)
    """Each actor's config (``actor_config``), which a replacement starts from."""
    weight_group: dict = field(default_factory=dict)
    """host, port, world_size, timeout_s of the weight broadcast group (rank 0: the learner)."""


def init_ray(cfg) -> bool:
    """Attach to ``ray.address`` / RAY_ADDRESS, else start a local cluster. True if started here."""
    import ray

    env_vars = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
                "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
                "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false"}
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, runtime_env={"env_vars": env_vars}, log_to_driver=True)
        return False
    needed = _roles(cfg)
    cpus = cfg.ray.num_cpus or max(os.cpu_count() or 1,
                                   needed.learner_ranks * needed.learner_cpus + needed.actors * needed.actor_cpus)
    ray.init(num_cpus=cpus, include_dashboard=False, runtime_env={"env_vars": env_vars},
             _node_ip_address="127.0.0.1", log_to_driver=True)
    return True


def _roles(cfg) -> Roles:
    return Roles(learner_ranks=cfg.learner.ranks, learner_cpus=cfg.learner.cpus,
                 learner_gpus=cfg.learner.gpus, actors=cfg.actors.num,
                 engines_per_actor=cfg.actors.engines_per_actor, actor_cpus=cfg.actors.cpus,
                 engine_gpus=cfg.actors.gpus_per_engine, env_workers=0)


def _nodes() -> list[Node]:
    import ray

    return [Node(n["NodeID"], n["NodeManagerAddress"], n["Resources"].get("CPU", 0.0),
                 int(n["Resources"].get("GPU", 0))) for n in ray.nodes() if n["Alive"]]


def env_config(cfg) -> dict[str, Any]:
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


def trainer_config(cfg, model_path: str) -> dict[str, Any]:
    """learner.trainer.TrainerConfig keys from the model, algorithm and learner groups."""
    lr = cfg.learner
    algo = dataclasses.asdict(cfg.algorithm)
    del algo["reasoning_reward"]  # an env setting (env_config)
    return {
        "model_path": model_path, "critic_path": cfg.model.critic_path,
        "lr": lr.lr, "critic_lr": lr.critic_lr, "grad_clip": lr.grad_clip, "epochs": lr.epochs,
        "num_minibatches": lr.num_minibatches, "micro_batch_size": lr.micro_batch_size,
        "param_dtype": lr.param_dtype, "lr_schedule": lr.lr_schedule,
        "lr_steps": cfg.train.steps, "lr_floor": lr.lr_floor,
        "critic_warmup": lr.critic_warmup, "value_norm": lr.value_norm,
        "temperature": cfg.actors.temperature, "seed": cfg.seed, "vtrace": lr.vtrace, **algo,
    }


def warm_start_config(cfg) -> dict[str, Any]:
    """launch.warm_start.warm_start keyword arguments (all but the model and the output
    directory) from the env and warm_start groups and the seed."""
    ws = cfg.warm_start
    return {
        "env_name": cfg.env_name, "env_config": env_config(cfg),
        "n_seeds": ws.seeds, "seed_offset": 0, "action_noise": ws.action_noise,
        "mistake": ws.mistake, "actions_per_turn": ws.actions_per_turn, "reasoning": ws.reasoning,
        "steps": ws.steps, "batch_size": ws.batch_size, "lr": ws.lr, "schedule": ws.schedule,
        "warmup": ws.warmup, "micro_batch_size": ws.micro_batch_size, "seed": cfg.seed,
    }


def actor_config(cfg, index: int, model_path: str, stream_address: str) -> dict[str, Any]:
    """actors.actor.ActorConfig keys for actor ``index``."""
    ac = cfg.actors
    return {
        "actor_id": index, "run_id": cfg.run_name, "model_path": model_path,
        "env_name": cfg.env_name, "env_config": env_config(cfg),
        "env_workers": ac.env_workers, "envs_per_worker": ac.envs_per_worker,
        "env_address": ac.env_address,
        # actors sharing one env service take disjoint slot ranges of it
        "env_slot_offset": index * ac.env_workers * ac.envs_per_worker if ac.env_address else 0,
        "concurrency": ac.concurrency, "group_size": ac.group_size,
        "whole_groups": cfg.algorithm.estimator == "grpo",  # GRPO batches take whole groups
        "temperature": ac.temperature, "top_p": ac.top_p, "max_tokens": ac.max_tokens,
        "max_turns": cfg.env["max_turns"], "max_context": ac.max_context,
        "kv_cache_bytes": ac.kv_cache_bytes, "seed": cfg.seed * 1000 + index,
        "learner_address": stream_address, "dtype": cfg.model.dtype,
    }


def prepare_model(cfg, run_dir: Path) -> str:
    """The policy's starting point: the given path, or the tiny model built (and warm-started)."""
    path = cfg.model.path
    if path is None:
        from launch.tiny_model import build_tiny_model

        base = run_dir / "tiny-model"
        if not (base / "config.json").exists():
            build_tiny_model(base, seed=cfg.model.build_seed, vision=cfg.model.vision)
        path = str(base)
    _check_sees_images(cfg, str(path))
    if not cfg.warm_start.enabled:
        return str(path)
    out = run_dir / "warm-start"
    if (out / "config.json").exists():
        return str(out)
    import ray

    # Nothing else runs yet: on CPU the task takes a whole node. max_calls=1: the worker process
    # exits after the task and gives its memory back.
    cpus = cfg.learner.cpus if cfg.learner.gpus else max(
        n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"])
    task = ray.remote(num_cpus=cpus, num_gpus=cfg.learner.gpus, max_calls=1)(_warm_start_task)
    return str(ray.get(task.remote(max(1, int(cpus)), str(path), str(out),
                                   **warm_start_config(cfg))))


def _check_sees_images(cfg, path: str) -> None:
    """Before any process starts: an env that renders images needs a vision-language model.
    A path this process cannot read (a hub id on a cluster's nodes) is left to the actors."""
    if cfg.env.get("render") != "image":  # an env's own setting: envs without images have none
        return
    from transformers import AutoConfig

    from learner.vision import is_vision_config

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return
    if not is_vision_config(config):
        raise ValueError(f"env.render=image needs a vision-language model; {path} is a text model "
                         "(model.vision=true builds a tiny one)")


def _warm_start_task(threads: int, *args, **kwargs) -> Path:
    import torch

    from launch.warm_start import warm_start

    torch.set_num_threads(threads)
    return warm_start(*args, **kwargs)


def start(cfg, model_path: str, procs: Processes, log_dir: Path | None = None,
          streams: list[dict[str, int]] | None = None) -> dict[str, Any]:
    """Place and start the learner ranks and the actors into ``procs`` (filled as they are
    created, so ``shutdown(procs)`` stops them also when starting fails half-way); the actors
    join the weight group. With ``log_dir`` each process's output (an actor's vLLM engine
    included) goes to ``log_dir/learner-<rank>.log`` / ``actor-<index>.log``, not the console.
    ``streams`` (a resumed run's, from its checkpoint: ``incarnation`` and ``groups_drawn`` per
    actor) continue each actor's seed stream where it was."""
    import ray

    from learner.config import TrainerConfig, WorkerConfig
    from learner.worker import LearnerWorker

    placement = place(_nodes(), _roles(cfg), bind_cores=cfg.ray.bind_cores)
    wcfg = WorkerConfig(
        trainer=TrainerConfig.from_dict(trainer_config(cfg, model_path)),
        threads=cfg.learner.threads, dist_timeout_s=cfg.learner.dist_timeout_s,
        max_staleness=cfg.learner.max_staleness, on_stale=cfg.learner.on_stale,
        group_size=cfg.actors.group_size, partial_groups=cfg.learner.partial_groups,
        window_bytes=cfg.transport.window_bytes, weight_timeout_s=cfg.transport.weight_timeout_s)
    learner_cls = ray.remote(LearnerWorker)
    for slot in placement.of("learner"):
        procs.learners.append(learner_cls.options(
            num_cpus=slot.cpus, num_gpus=slot.gpus, scheduling_strategy=_on(slot.node),
        ).remote(slot.index, cfg.learner.ranks, dataclasses.replace(
            wcfg, cores=slot.cores, log_file=_log_file(log_dir, f"learner-{slot.index}"))))
    host = placement.learner_address if cfg.ray.address or os.environ.get("RAY_ADDRESS") else "127.0.0.1"
    port = _free_port()
    infos = ray.get([w.setup.remote(
        host, port, stream_address=f"tcp://{'*' if host != '127.0.0.1' else host}:{cfg.transport.stream_port or 0}",
        weight_host=host, weight_port=cfg.transport.weight_port,
        weight_world_size=placement.weight_world_size, device=cfg.learner.device,
    ) for w in procs.learners])
    stream = infos[0]["stream_address"].replace("0.0.0.0", host)
    procs.weight_group = {"host": host, "port": infos[0]["weight_port"],
                          "world_size": placement.weight_world_size,
                          "timeout_s": cfg.transport.weight_timeout_s}
    procs.actor_slots = placement.of("actor")
    procs.actor_configs = [{**actor_config(cfg, slot.index, model_path, stream), "cores": slot.cores,
                            "log_file": _log_file(log_dir, f"actor-{slot.index}")}
                           for slot in procs.actor_slots]
    procs.restarts = [0] * len(procs.actor_slots)
    for i, stream in enumerate((streams or [])[:len(procs.actor_slots)]):
        procs.restarts[i] = stream["incarnation"]
        procs.actor_configs[i]["skip_groups"] = stream["groups_drawn"]
    for i in range(len(procs.actor_slots)):
        procs.actors.append(_new_actor(procs, i, procs.restarts[i]))
    ray.get([a.start.remote() for a in procs.actors])
    _join_weight_group(procs)
    return {"placement": placement, "stream": stream, "weight_port": infos[0]["weight_port"]}


def _new_actor(procs: Processes, index: int, incarnation: int = 0):
    """A Ray actor for actor ``index`` on its placement slot (not started)."""
    import ray

    from actors.actor import InferenceActor

    slot, slots = procs.actor_slots[index], procs.actor_slots
    env_vars = {}
    # Two CPU engines on one node: one core each. An actor that holds cores of its own
    # (slot.cores) puts its engine on those instead (actors/actor.py).
    if len(slots) > 1 and not slot.gpus:
        env_vars["VLLM_CPU_OMP_THREADS_BIND"] = str(slot.index % max(1, os.cpu_count() or 1))
    return ray.remote(InferenceActor).options(
        num_cpus=slot.cpus, num_gpus=slot.gpus, scheduling_strategy=_on(slot.node),
        runtime_env={"env_vars": env_vars} if env_vars else None,
    ).remote({**procs.actor_configs[index], "incarnation": incarnation})


def _join_weight_group(procs: Processes) -> None:
    """Every actor's engine joins the weight group's current generation."""
    import ray

    g = procs.weight_group
    ray.get([a.join_weight_group.remote(g["host"], g["port"], slot.weight_ranks[0], g["world_size"],
                                        g["timeout_s"])
             for a, slot in zip(procs.actors, procs.actor_slots)])


def restart_actor(procs: Processes, index: int, max_restarts: int, error: BaseException) -> None:
    """Replace actor ``index`` (dead, or its run failed) with a started one of the next
    incarnation; its episodes in flight are lost. Re-raises ``error`` past ``max_restarts``.
    The new engine holds the model path's weights: call ``reform_weights`` next."""
    import ray

    if procs.restarts[index] >= max_restarts:
        raise RuntimeError(f"actor {index} failed after {max_restarts} restarts") from error
    log.warning("actor %d failed (%s: %s): restarting it", index, type(error).__name__, error)
    ray.kill(procs.actors[index], no_restart=True)
    procs.restarts[index] += 1
    procs.actor_configs[index]["skip_groups"] = 0  # a new incarnation's stream starts afresh
    procs.actors[index] = _new_actor(procs, index, procs.restarts[index])
    ray.get(procs.actors[index].start.remote())


def reform_weights(procs: Processes, version: int) -> dict[str, float]:
    """A new generation of the weight group, every actor in it, and ``version`` pushed to all
    (the same version again is allowed: a restarted actor needs the current weights)."""
    import ray

    world = procs.weight_group["world_size"]
    ray.get([w.reform_weight_group.remote(world) for w in procs.learners])
    _join_weight_group(procs)
    return push_weights(procs, version)


def push_weights(procs: Processes, version: int) -> dict[str, float]:
    """Every actor receives (in flight) the learner's weights of ``version``; returns timings.

    Raises ``PushError`` (after every call returned) if the learner or any actor failed.
    """
    import ray

    t0 = time.perf_counter()
    learner_refs = [w.publish_weights.remote() for w in procs.learners]
    actor_refs = [a.update_weights.remote(version) for a in procs.actors]
    results = []
    for ref in learner_refs + actor_refs:  # wait for all: none is left receiving alone
        try:
            results.append(ray.get(ref))
        except Exception as e:  # noqa: BLE001 - sorted out by the caller from PushError.errors
            results.append(e)
    errors = {i: r for i, r in enumerate(results[len(learner_refs):]) if isinstance(r, Exception)}
    learner_errors = [r for r in results[:len(learner_refs)] if isinstance(r, Exception)]
    if errors or learner_errors:
        raise PushError(version, errors, learner_errors)
    published, updates = results[0], results[len(learner_refs):]
    out = {**published, "weights/push_s": time.perf_counter() - t0}
    for key in ("pause_s", "receive_s", "total_s"):
        vals = [u.get(key, 0.0) for u in updates]
        if vals:
            out[f"weights/actor_{key}"] = max(vals)
    return out


class PushError(RuntimeError):
    """A weight push failed: ``errors`` by actor index, and the learners' errors."""

    def __init__(self, version: int, errors: dict[int, Exception], learner_errors: list[Exception]):
        super().__init__(f"push of version {version} failed: actors {sorted(errors)}, "
                         f"learner {[str(e) for e in learner_errors]}")
        self.errors, self.learner_errors = errors, learner_errors


def evaluate(procs: Processes, seeds: list[int]) -> dict[str, float]:
    """Greedy episodes on ``seeds``, split across the actors; means weighted by episodes."""
    import ray

    n = len(procs.actors)
    parts = ray.get([a.evaluate.remote(seeds[i::n]) for i, a in enumerate(procs.actors)])
    total = sum(p["n"] for p in parts)
    counted = [p for p in parts if p["n"]] or parts  # an actor with no episode has no scores
    keys = sorted({k for p in counted for k, v in p.items() if k != "n" and isinstance(v, (int, float))})
    out = {k: sum(p.get(k, 0.0) * p["n"] for p in parts) / max(total, 1) for k in keys}
    out["n"] = float(total)
    return out


def shutdown(procs: Processes, started_ray: bool) -> None:
    """Stop what we started, in order: actors (engines, env pools, senders), then learners."""
    import ray

    for a in procs.actors:
        try:
            ray.get(a.close.remote(), timeout=60)
        except Exception as e:  # noqa: BLE001 - a dead actor is being cleaned up anyway
            log.warning("actor close failed: %s", e)
    for w in procs.learners:
        try:
            ray.get(w.close.remote(), timeout=60)
        except Exception as e:  # noqa: BLE001
            log.warning("learner close failed: %s", e)
    for h in procs.actors + procs.learners:
        ray.kill(h)
    if started_ray:
        ray.shutdown()


def _log_file(log_dir: Path | None, name: str) -> str | None:
    return None if log_dir is None else str(Path(log_dir).resolve() / f"{name}.log")


def _on(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
