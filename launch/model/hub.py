"""Access to the Hugging Face hub for a run's models, settled before any process starts.

Called by the training loop (launch/run/loop.py) first thing: the processes it starts inherit
the environment it leaves (``HF_HUB_OFFLINE``). Invariant: a run whose models are local
directories never asks the hub for anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from launch.config.schema import RunConfig


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
        except Exception as e:
            offline = " (HF_HUB_OFFLINE=1 is set)" if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
            raise RuntimeError(
                f"model {repo!r} is not a local directory and could not be fetched from the "
                f"Hugging Face hub{offline}: {type(e).__name__}: {e}. Download it where the "
                f"network allows (huggingface-cli download {repo}) and give its directory, "
                f"or a path on a filesystem every node sees.") from e


_HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.py", "*.tiktoken"]


