"""The run config as ``python -m launch.train`` composes it, for code that is not the Hydra entry.

Called by scripts, notebooks, benchmarks and tests, and by the secondary command lines (``python
-m launch.model.warm_start`` takes its defaults from it). ``compose`` gives the same ``RunConfig``
as the command line with the same overrides would.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from launch.config.schema import RunConfig, to_run_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
"""configs/: train.yaml and its groups."""


def compose(overrides: Sequence[str] = ()) -> RunConfig:
    """configs/train.yaml with ``overrides`` (``["env=sokoban", "train.steps=10"]``) as
    ``python -m launch.train`` composes it, as a ``RunConfig``: hand it and a run directory to
    ``launch.run.loop.train``. Sets Hydra's global config, through which the ``${hydra:...}``
    values (the run name) resolve."""
    from hydra import compose as compose_hydra
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose_hydra("train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return to_run_config(cfg)
