"""`python -m launch.train`: the Hydra entry point of a training run.

Composes configs/train.yaml with the command line (``env=sokoban actors.num=4``, ``--multirun``
sweeps, ``+experiment=...`` presets), then hands the config and the run directory to the training
loop (launch/run/loop.py), whose Ray topology (launch/topology/ray_cluster.py) starts a local Ray
cluster or attaches to the one in ``RAY_ADDRESS`` (so ``ray job submit -- python -m launch.train
...`` works unchanged). Code that is not a command line composes the same config with
``launch.config.compose.compose``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from launch.config.schema import to_run_config  # registers the schema with Hydra

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("WANDB_MODE", "offline")


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from launch.run.loop import train  # after the config parses: --help stays instant

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
