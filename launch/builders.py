"""From the run config to each component's arguments, and the model a run starts from.

Called by launch/cluster.py and launch/local.py (the components' configs), launch/loop.py (the
model) and the benchmarks. Pure mapping, no processes: each builder takes the ``RunConfig`` (launch/config.py)
and returns what one component takes (``TrainerConfig`` keys, ``ActorConfig`` keys, the warm
start's arguments, a learner rank's ``WorkerConfig``, the env's keyword arguments).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envs.registry import images_per_observation
from launch.config import RunConfig


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


def trainer_config(cfg: RunConfig, model_path: str) -> dict[str, Any]:
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


def warm_start_config(cfg: RunConfig) -> dict[str, Any]:
    """launch.warm_start.warm_start keyword arguments (all but the model and the output
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


def actor_config(cfg: RunConfig, index: int, model_path: str, stream_address: str) -> dict[str, Any]:
    """actors.actor.ActorConfig keys for actor ``index``."""
    ac = cfg.actors
    return {
        "actor_id": index, "run_id": cfg.run_name, "model_path": model_path,
        "env_name": cfg.env_name, "env_config": env_config(cfg),
        "env_workers": ac.env_workers, "envs_per_worker": ac.envs_per_worker,
        "step_timeout_s": ac.step_timeout_s, "reset_timeout_s": ac.reset_timeout_s,
        "start_timeout_s": ac.start_timeout_s,
        "env_address": ac.env_address, "env_curve": ac.env_curve, "env_latency_s": ac.env_latency_s,
        # actors sharing one env service take disjoint slot ranges of it
        "env_slot_offset": index * ac.env_workers * ac.envs_per_worker if ac.env_address else 0,
        "concurrency": ac.concurrency, "group_size": ac.group_size,
        "whole_groups": cfg.algorithm.estimator == "grpo",  # GRPO batches take whole groups
        "temperature": ac.temperature, "top_p": ac.top_p, "max_tokens": ac.max_tokens,
        "max_turns": cfg.env["max_turns"], "max_context": ac.max_context,
        "images_per_turn": images_per_observation(cfg.env_name),
        "kv_cache_bytes": ac.kv_cache_bytes, "seed": cfg.seed * 1000 + index,
        "learner_address": stream_address, "dtype": cfg.model.dtype,
        "tensor_parallel": ac.tp,
    }


def stream_keys(cfg: RunConfig, networked: bool):
    """The trajectory stream's CurveZMQ keys, (the learner's, the actors'), or None where
    ``transport.curve`` leaves it open (off; auto on loopback: ``networked`` False)."""
    from transport import security

    t = cfg.transport
    if t.curve == "off" or (t.curve == "auto" and not networked):
        return None
    if t.curve_keys:
        return security.read_server(t.curve_keys), security.read_client(t.curve_keys)
    return security.generate()


def worker_config(cfg: RunConfig, model_path: str):
    """A learner rank's ``WorkerConfig`` (the placement adds its cores and log file)."""
    from learner.config import TrainerConfig, WorkerConfig

    return WorkerConfig(
        trainer=TrainerConfig.from_dict(trainer_config(cfg, model_path)),
        threads=cfg.learner.threads, dist_timeout_s=cfg.learner.dist_timeout_s,
        max_staleness=cfg.learner.max_staleness, on_stale=cfg.learner.on_stale,
        group_size=cfg.actors.group_size, partial_groups=cfg.learner.partial_groups,
        window_bytes=cfg.transport.window_bytes, weight_timeout_s=cfg.transport.weight_timeout_s,
        weight_bucket_bytes=int(cfg.transport.weight_bucket_mb * (1 << 20)))


def hub_access(cfg: RunConfig) -> None:
    """Set up this run's access to the Hugging Face hub, before any process starts. A run whose
    models are local directories (the tiny model's included) needs none: ``HF_HUB_OFFLINE=1``
    (unless the environment says otherwise), so no process asks the hub for anything. A hub id
    (``model.path=Qwen/Qwen2.5-VL-3B-Instruct``) is downloaded here, once, into the hub's cache
    (the processes on this node read it there; those on other nodes fetch it themselves), and
    fails with a clear error where it cannot be fetched."""
    ids = [p for p in (cfg.model.path, cfg.model.critic_path) if p and not Path(p).is_dir()]
    if not ids:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        return
    from huggingface_hub import snapshot_download

    for repo in ids:
        try:
            snapshot_download(repo, allow_patterns=_HUB_FILES)
        except Exception as e:  # noqa: BLE001 - offline, no network, no such repo, no access
            offline = " (HF_HUB_OFFLINE=1 is set)" if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
            raise RuntimeError(
                f"model {repo!r} is not a local directory and could not be fetched from the "
                f"Hugging Face hub{offline}: {type(e).__name__}: {e}. Download it where the "
                f"network allows (huggingface-cli download {repo}) and give its directory, "
                f"or a path on a filesystem every node sees.") from e


_HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.py", "*.tiktoken"]


def prepare_model(cfg: RunConfig, run_dir: Path,
                  run_warm_start: Callable[[str, Path], str] | None = None) -> str:
    """The policy's starting point: the given path, or the tiny model built; then warm-started
    by ``run_warm_start(model path, out dir)`` unless disabled or already in <run dir>/warm-start."""
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
    if not _has_solver(cfg):
        print(f"warm start off: the {cfg.env_name} env has no solver to make demonstrations with "
              "(warm_start.enabled=false says so quietly)", flush=True)
        return str(path)
    out = run_dir / "warm-start"
    if (out / "config.json").exists():
        return str(out)
    if run_warm_start is None:
        raise ValueError("warm_start.enabled needs a way to run it (the cluster's warm_start)")
    return run_warm_start(str(path), out)


def _has_solver(cfg: RunConfig) -> bool:
    """Whether the run's env can solve its episodes (``has_solver``, envs/grid_env.py)."""
    from envs.worker import make_env

    env = make_env((cfg.env_name, env_config(cfg)))
    try:
        return bool(getattr(env, "has_solver", False))
    finally:
        env.close()


def _check_sees_images(cfg: RunConfig, path: str) -> None:
    """Before any process starts: an env that renders images needs a vision-language model.
    A path this process cannot read (a hub id on a cluster's nodes) is left to the actors."""
    if cfg.env.get("render", "text") == "text":  # an env's own setting (absent: no images)
        return
    from transformers import AutoConfig

    from learner.vision import is_vision_config

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return
    if not is_vision_config(config):
        raise ValueError(f"env.render={cfg.env.get('render')} needs a vision-language model; "
                         f"{path} is a text model (model.vision=true builds a tiny one)")
