"""The policy a run starts from: the given path or the tiny model built for it, checked against
the env (pictures need a vision-language model), then warm-started where the env can make
demonstrations.

Called by the training loop (launch/run/loop.py) before the processes start; the warm start
itself runs where the topology puts it (``Cluster.warm_start``).

Invariant: a model folder in the run directory is complete or absent: each is written into
``<name>.tmp/`` and renamed into place when done, so a run stopped half-way (a stop request
abandons the warm start) never resumes from a partial model.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from envs.registry import has_solver
from launch.config.schema import RunConfig
from launch.model.tiny_model import build_tiny_model


def prepare_model(cfg: RunConfig, run_dir: Path,
                  run_warm_start: Callable[[str, Path], str] | None = None) -> str:
    """The policy's starting point: the given path, or the tiny model built; then warm-started
    by ``run_warm_start(model path, out dir)`` unless disabled or already in <run dir>/warm-start."""
    path = cfg.model.path
    if path is None:
        path = str(_built(run_dir / "tiny-model", lambda out: build_tiny_model(
            out, seed=cfg.model.build_seed, vision=cfg.model.vision)))
    _check_sees_images(cfg, str(path))
    if not cfg.warm_start.enabled:
        return str(path)
    if not has_solver(cfg.env_name, cfg.env):
        print(f"warm start off: the {cfg.env_name} env has no solver to make demonstrations with "
              "(warm_start.enabled=false says so quietly)", flush=True)
        return str(path)
    def sft(out: Path) -> None:
        if run_warm_start is None:
            raise ValueError("warm_start.enabled needs a way to run it (the cluster's warm_start)")
        run_warm_start(str(path), out)

    return str(_built(run_dir / "warm-start", sft))


def _built(final: Path, make: Callable[[Path], object]) -> Path:
    """``final`` if it holds a model, else made by ``make(staging folder)`` and renamed into place."""
    if (final / "config.json").exists():
        return final
    staging = final.with_name(final.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    make(staging)
    shutil.rmtree(final, ignore_errors=True)  # a left-over of an older version, without config.json
    staging.rename(final)
    return final


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
