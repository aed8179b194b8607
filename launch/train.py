"""`python -m launch.train`: the Hydra entry point of a training run.

Composes configs/train.yaml with the command line (``env=sokoban actors.num=4``, ``--multirun``
sweeps, ``+experiment=...`` presets), then hands the config and the run directory to the training
loop (launch/loop.py), whose Ray controller (launch/controller.py) starts a local Ray cluster or attaches to the one in
``RAY_ADDRESS`` (so ``ray job submit -- python -m launch.train ...`` works unchanged).
"""

from __future__ import annotations

import logging
import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("WANDB_MODE", "offline")


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from launch.loop import train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    summary = train(cfg, HydraConfig.get().runtime.output_dir)
    return float(summary.get("eval_last3_mean", 0.0))  # the objective a sweeper would maximise


if __name__ == "__main__":
    main()
