"""The Ray controller: place the processes, start them, drive the loop, shut everything down.

Called by ``python -m launch.train`` (the Hydra entry) with the composed config and the run
directory. Processes, each a Ray actor placed by launch/placement.py:
- learner ranks (``learner.worker.LearnerWorker``): FSDP2 over gloo/NCCL; rank 0 binds the
  trajectory stream and hosts the weight group;
- inference actors (``actors.actor.InferenceActor``, async Ray actors): a vLLM engine each (one
  worker process, which joins the weight group) and an env pool (or a remote env service).

The loop. ``async``: actors play episodes without pause; each learner step takes the next batch
within the staleness bound, and every ``publish_every`` steps the controller calls every actor's
``update_weights`` (pause with requests kept, receive inside the vLLM worker, reset the prefix
cache, resume) together with the learners' ``publish_weights``. ``sync``: the same components
with no overlap: generate a batch, train, push, repeat (the baseline the async mode is measured
against). Greedy evaluation on held-out seeds runs before RL, every ``eval_every`` steps and at
the end.

Invariants: everything started here is stopped here, on success, on error and on SIGTERM (which
checkpoints first); the controller stops only the Ray actors it created, and shuts Ray down only
if it started it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch.metrics import RunLogger
from launch.placement import Node, Roles, place

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Processes:
    learners: list = field(default_factory=list)
    actors: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    """The actors' background ``run`` calls (async mode)."""


class Stop:
    """Set by SIGTERM/SIGINT: the loop checkpoints and leaves at the next step boundary."""

    def __init__(self) -> None:
        self.requested = False
        self._old = {}

    def __enter__(self) -> "Stop":
        for sig in (signal.SIGTERM,):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        log.warning("signal %s: checkpointing and stopping after this step", signum)
        self.requested = True

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


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


def trainer_config(cfg, model_path: str) -> dict[str, Any]:
    """learner.trainer.TrainerConfig keys from the model, algorithm and learner groups."""
    a, lr = cfg.algorithm, cfg.learner
    from omegaconf import OmegaConf

    algo = OmegaConf.to_container(a, resolve=True)
    return {
        "model_path": model_path, "critic_path": cfg.model.critic_path,
        "lr": lr.lr, "critic_lr": lr.critic_lr, "grad_clip": lr.grad_clip, "epochs": lr.epochs,
        "num_minibatches": lr.num_minibatches, "param_dtype": lr.param_dtype,
        "critic_warmup": lr.critic_warmup,
        "temperature": cfg.actors.temperature, "seed": cfg.seed, "vtrace": lr.vtrace, **algo,
    }


def actor_config(cfg, index: int, model_path: str, stream_address: str) -> dict[str, Any]:
    """actors.actor.ActorConfig keys for actor ``index``."""
    from omegaconf import OmegaConf

    ac = cfg.actors
    return {
        "actor_id": index, "run_id": cfg.run_name, "model_path": model_path,
        "env_name": cfg.env_name, "env_config": OmegaConf.to_container(cfg.env, resolve=True),
        "env_workers": ac.env_workers, "envs_per_worker": ac.envs_per_worker,
        "env_address": ac.env_address,
        # actors sharing one env service take disjoint slot ranges of it
        "env_slot_offset": index * ac.env_workers * ac.envs_per_worker if ac.env_address else 0,
        "concurrency": ac.concurrency, "group_size": ac.group_size,
        "temperature": ac.temperature, "top_p": ac.top_p, "max_tokens": ac.max_tokens,
        "max_turns": cfg.env.max_turns, "max_context": ac.max_context,
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
            build_tiny_model(base, seed=cfg.model.build_seed)
        path = str(base)
    if not cfg.warm_start.enabled:
        return str(path)
    out = run_dir / "warm-start"
    if (out / "config.json").exists():
        return str(out)
    import ray
    from omegaconf import OmegaConf

    ws = cfg.warm_start
    # Nothing else runs yet: on CPU the task takes a whole node. max_calls=1: the worker process
    # exits after the task and gives its memory back.
    cpus = cfg.learner.cpus if cfg.learner.gpus else max(
        n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"])
    task = ray.remote(num_cpus=cpus, num_gpus=cfg.learner.gpus, max_calls=1)(_warm_start_task)
    return str(ray.get(task.remote(
        max(1, int(cpus)), str(path), str(out), env_name=cfg.env_name,
        env_config=OmegaConf.to_container(cfg.env, resolve=True), n_seeds=ws.seeds, seed_offset=0,
        action_noise=ws.action_noise, steps=ws.steps, batch_size=ws.batch_size, lr=ws.lr,
        seed=cfg.seed)))


def _warm_start_task(threads: int, *args, **kwargs) -> Path:
    import torch

    from launch.warm_start import warm_start

    torch.set_num_threads(threads)
    return warm_start(*args, **kwargs)


def start(cfg, model_path: str) -> tuple[Processes, dict[str, Any]]:
    """Place and start the learner ranks and the actors; the actors join the weight group."""
    import ray

    from actors.actor import InferenceActor
    from learner.worker import LearnerWorker

    placement = place(_nodes(), _roles(cfg))
    procs = Processes()
    wcfg = {"trainer": trainer_config(cfg, model_path), "max_staleness": cfg.learner.max_staleness,
            "on_stale": cfg.learner.on_stale, "window_bytes": cfg.transport.window_bytes,
            "weight_timeout_s": cfg.transport.weight_timeout_s, "threads": cfg.learner.get("threads")}
    learner_cls = ray.remote(LearnerWorker)
    for slot in placement.of("learner"):
        procs.learners.append(learner_cls.options(
            num_cpus=slot.cpus, num_gpus=slot.gpus, scheduling_strategy=_on(slot.node),
        ).remote(slot.index, cfg.learner.ranks, wcfg))
    host = placement.learner_address if cfg.ray.address or os.environ.get("RAY_ADDRESS") else "127.0.0.1"
    port = _free_port()
    infos = ray.get([w.setup.remote(
        host, port, stream_address=f"tcp://{'*' if host != '127.0.0.1' else host}:{cfg.transport.stream_port or 0}",
        weight_host=host, weight_port=cfg.transport.weight_port,
        weight_world_size=placement.weight_world_size, device=cfg.learner.device,
    ) for w in procs.learners])
    stream = infos[0]["stream_address"].replace("0.0.0.0", host)
    actor_cls = ray.remote(InferenceActor)
    slots = placement.of("actor")
    for slot in slots:
        env_vars = {}
        if len(slots) > 1 and not slot.gpus:  # two CPU engines on one node: one core each
            env_vars["VLLM_CPU_OMP_THREADS_BIND"] = str(slot.index % max(1, os.cpu_count() or 1))
        procs.actors.append(actor_cls.options(
            num_cpus=slot.cpus, num_gpus=slot.gpus, scheduling_strategy=_on(slot.node),
            runtime_env={"env_vars": env_vars} if env_vars else None,
        ).remote(actor_config(cfg, slot.index, model_path, stream)))
    ray.get([a.start.remote() for a in procs.actors])
    ray.get([a.join_weight_group.remote(host, infos[0]["weight_port"], slot.weight_ranks[0],
                                        placement.weight_world_size, cfg.transport.weight_timeout_s)
             for a, slot in zip(procs.actors, slots)])
    return procs, {"placement": placement, "stream": stream, "weight_port": infos[0]["weight_port"]}


def push_weights(procs: Processes, version: int) -> dict[str, float]:
    """Every actor receives (in flight) the learner's weights of ``version``; returns timings."""
    import ray

    t0 = time.perf_counter()
    learner_refs = [w.publish_weights.remote() for w in procs.learners]
    actor_refs = [a.update_weights.remote(version) for a in procs.actors]
    published = ray.get(learner_refs)[0]
    updates = ray.get(actor_refs)
    out = {**published, "weights/push_s": time.perf_counter() - t0}
    for key in ("pause_s", "receive_s", "total_s"):
        vals = [u.get(key, 0.0) for u in updates]
        if vals:
            out[f"weights/actor_{key}"] = max(vals)
    return out


def evaluate(procs: Processes, seeds: list[int]) -> dict[str, float]:
    """Greedy episodes on ``seeds``, split across the actors; means weighted by episodes."""
    import ray

    n = len(procs.actors)
    parts = ray.get([a.evaluate.remote(seeds[i::n]) for i, a in enumerate(procs.actors)])
    total = sum(p["n"] for p in parts)
    keys = [k for k in parts[0] if k != "n" and isinstance(parts[0][k], (int, float))]
    out = {k: sum(p[k] * p["n"] for p in parts) / max(total, 1) for k in keys}
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


def _on(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def train(cfg, run_dir: Path) -> dict[str, Any]:
    """One whole run; returns the summary (also written to ``<run dir>/summary.json``)."""
    import json

    import ray
    from omegaconf import OmegaConf

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    logger = RunLogger(run_dir, OmegaConf.to_container(cfg, resolve=True), wandb_mode=cfg.logger.mode,
                       use_wandb=cfg.logger.wandb, project=cfg.logger.project, name=cfg.run_name)
    started = init_ray(cfg)
    monitor = None
    if started:  # a local cluster: every process of the run is a descendant of this one
        from launch.memory import MemoryMonitor

        monitor = MemoryMonitor(os.getpid())
    procs = Processes()
    summary: dict[str, Any] = {"run_dir": str(run_dir), "mode": cfg.train.mode}
    t = cfg.train
    try:
        with Stop() as stop:
            t0 = time.perf_counter()
            model_path = prepare_model(cfg, run_dir)
            summary["warm_start_s"] = round(time.perf_counter() - t0, 1)
            procs, info = start(cfg, model_path)
            step = 0
            checkpoint = run_dir / "checkpoint"
            if t.resume and (checkpoint / "extra.pt").exists():
                extra = ray.get([w.load_checkpoint.remote(str(checkpoint)) for w in procs.learners])[0]
                step = int(extra["step"])
                push_weights(procs, step)  # the actors' engines start from the model path, not the checkpoint
            seeds = list(range(t.eval_seed_offset, t.eval_seed_offset + t.eval_seeds))
            evals = [logger.log("eval", step, evaluate(procs, seeds))]
            print(f"eval before RL: success {evals[-1]['success']:.3f} on {len(seeds)} seeds", flush=True)
            if t.mode == "async":
                _set_budgets(cfg, procs, step, dropped=0)
                procs.runs = [a.run.remote() for a in procs.actors]
            per_actor = _episodes_per_actor(cfg)
            empty = 0
            while step < t.steps and not stop.requested:
                t_step = time.perf_counter()
                if t.mode == "sync":
                    ray.get([a.run.remote(num_episodes=n) for a, n in zip(procs.actors, per_actor)])
                metrics = ray.get([w.train_step.remote(t.batch_size) for w in procs.learners])[0]
                if not metrics:
                    empty += 1
                    _check_actors(procs)
                    if empty >= 3:
                        raise RuntimeError("no full batch arrived in 3 waits: are the actors producing?")
                    continue
                step += 1
                if step % t.publish_every == 0:
                    metrics.update(push_weights(procs, step))
                if procs.runs:
                    _set_budgets(cfg, procs, step, dropped=int(metrics.get("buffer/dropped_stale", 0)))
                wall = time.perf_counter() - t_step
                metrics["timing/step_wall_s"] = wall
                metrics["throughput/trajectories_per_s"] = t.batch_size / wall
                metrics["throughput/tokens_per_s"] = metrics.get("rollout/tokens", 0.0) / wall
                if monitor is not None:
                    metrics["memory/total_gib"] = monitor.sample() / 2**30
                    metrics.update({f"memory/{k}_gib": v / 2**30 for k, v in monitor.current.items()})
                record = logger.log("train", step, metrics)
                if step % cfg.logger.print_every == 0:
                    logger.progress(record)
                if t.eval_every and step % t.eval_every == 0 and step < t.steps:
                    evals.append(logger.log("eval", step, evaluate(procs, seeds)))
                    print(f"eval at step {step}: success {evals[-1]['success']:.3f}", flush=True)
                if t.checkpoint_every and step % t.checkpoint_every == 0:
                    _checkpoint(procs, checkpoint, step)
            if procs.runs:
                ray.get([a.stop.remote() for a in procs.actors])
                ray.get(procs.runs)
            if evals[-1]["step"] != step and not stop.requested:  # a stop request leaves quickly
                evals.append(logger.log("eval", step, evaluate(procs, seeds)))
            print(f"eval after RL: success {evals[-1]['success']:.3f}", flush=True)
            _checkpoint(procs, checkpoint, step)
            ray.get([w.save_hf.remote(str(run_dir / "final-model")) for w in procs.learners])
            (run_dir / "samples.txt").write_text(ray.get(procs.learners[0].samples_text.remote(t.save_samples)))
            last = [e["success"] for e in evals[-3:]]
            summary.update(
                steps=step, eval_before=evals[0]["success"], eval_after=evals[-1]["success"],
                eval_last3_mean=sum(last) / len(last), interrupted=stop.requested,
                actors=ray.get([a.stats.remote() for a in procs.actors]),
                accounting=ray.get(procs.learners[0].accounting.remote()),
            )
    finally:
        if monitor is not None:
            summary["memory"] = monitor.report()
            monitor.close()
        shutdown(procs, started)
        logger.plot()
        logger.close()
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def episode_budget(step: int, *, batch_size: int, run_ahead: int, max_staleness: int,
                   dropped: int, actors: int, group_size: int) -> int:
    """Per actor: the most training episodes it may have started (and not failed) once the
    learner has taken ``step`` batches: ``1 + run_ahead`` batches beyond them (run_ahead capped
    at max_staleness), plus what the buffer dropped (so the learner never starves), split over
    the actors in whole GRPO groups. run_ahead 1: the actors fill the next batch while the
    learner trains on this one, so trajectories are about one version stale."""
    total = (step + 1 + min(run_ahead, max_staleness)) * batch_size + dropped
    return -(-total // (actors * group_size)) * group_size


def _set_budgets(cfg, procs: Processes, step: int, *, dropped: int) -> None:
    import ray

    budget = episode_budget(step, batch_size=cfg.train.batch_size, run_ahead=cfg.actors.run_ahead,
                            max_staleness=cfg.learner.max_staleness, dropped=dropped,
                            actors=len(procs.actors), group_size=cfg.actors.group_size)
    ray.get([a.set_episode_budget.remote(budget) for a in procs.actors])


def _episodes_per_actor(cfg) -> list[int]:
    """Sync mode: whole GRPO groups per actor adding up to at least the batch size."""
    groups = -(-cfg.train.batch_size // cfg.actors.group_size)
    n = cfg.actors.num
    return [(groups // n + (i < groups % n)) * cfg.actors.group_size for i in range(n)]


def _checkpoint(procs: Processes, path: Path, step: int) -> None:
    import ray

    ray.get([w.save_checkpoint.remote(str(path), {"step": step}) for w in procs.learners])


def _check_actors(procs: Processes) -> None:
    """Raise the error of an actor whose background run ended (a crash, not a stop)."""
    import ray

    done, _ = ray.wait(procs.runs, num_returns=len(procs.runs), timeout=0)
    for ref in done:
        ray.get(ref)  # re-raises the actor's failure
