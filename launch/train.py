"""`python -m launch.train`: the Hydra entry point of a training run.

Composes configs/train.yaml with the command line (``env=sokoban actors.num=4``, ``--multirun``
sweeps, ``+experiment=...`` presets), then hands the config and the run directory to the training
loop (launch/loop.py), whose cluster (launch/cluster.py) starts a local Ray cluster or attaches to the one in
``RAY_ADDRESS`` (so ``ray job submit -- python -m launch.train ...`` works unchanged).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from launch.config import RunConfig, to_run_config  # registers the schema with Hydra

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("WANDB_MODE", "offline")


CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def compose(overrides: Sequence[str] = ()) -> RunConfig:
    """configs/train.yaml with ``overrides`` (``["env=sokoban", "train.steps=10"]``) as
    ``python -m launch.train`` composes it, as a ``RunConfig``, for scripts, notebooks,
    benchmarks and tests: hand it and a run directory to ``launch.loop.train``. Sets Hydra's
    global config, through which the ``${hydra:...}`` values (the run name) resolve."""
    from hydra import compose as compose_hydra
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose_hydra("train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return to_run_config(cfg)


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from launch.loop import train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run = to_run_config(cfg)
    # train.resume=<run dir>: the run continues in its own directory, not Hydra's new one
    run_dir = Path(run.train.resume or HydraConfig.get().runtime.output_dir).resolve()
    if not Path(run.storage).is_absolute() and os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"):
        logging.getLogger(__name__).warning(
            "storage=%s is relative, and this is a Ray job: its working directory is Ray's "
            "temporary copy, which Ray deletes after the job; give storage=<absolute path>",
            run.storage)
    print(f"run directory: {run_dir}", flush=True)
    summary = train(run, run_dir)
    print(f"run directory: {run_dir} (summary.json, metrics.jsonl, final-model/)", flush=True)
    return float(summary.get("eval_last3_mean", 0.0))  # the objective a sweeper would maximise


if __name__ == "__main__":
    main()
