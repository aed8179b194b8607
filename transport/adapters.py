"""An adapter publish: what the weight broadcast carries when the policy trains LoRA adapters,
and the directory an engine loads an adapter from.

The learner (learner/trainer.py) publishes, over the same channel as full weights
(transport/weights.py or transport/inprocess.py), the adapter's tensors under PEFT's saved names
and three more tensors: the adapter's ``adapter_config.json`` (its bytes), and a probe: fixed
token ids and the learner's log-probs of them under the policy it publishes (temperature 1). So
a publish is self-describing: the receiving worker (actors/vllm_extension.py) needs nothing
else to write the adapter and to check, once its engine serves it, that the engine's log-probs
of the probe are the learner's (actors/weight_updates.py).

Invariants: ``split`` refuses a publish that lacks the config or the probe, or carries no
adapter tensor; ``write_adapter`` makes the directory appear whole or not at all (written
beside, then renamed): a reader never sees half an adapter.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

CONFIG = "__adapter__.config"
PROBE_IDS = "__adapter__.probe_ids"
PROBE_LOGPROBS = "__adapter__.probe_logprobs"
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"


def extras(config: dict, probe_ids: torch.Tensor, probe_logprobs: torch.Tensor
           ) -> list[tuple[str, torch.Tensor]]:
    """The tensors a publish carries beside the adapter's: its config and the probe."""
    raw = json.dumps(config, sort_keys=True).encode()
    return [(CONFIG, torch.frombuffer(bytearray(raw), dtype=torch.uint8)),
            (PROBE_IDS, probe_ids.to(torch.int64).flatten()),
            (PROBE_LOGPROBS, probe_logprobs.to(torch.float32).flatten())]


@dataclass
class AdapterPublish:
    """One received adapter publish, its tensors copied out of the receive buffers."""

    config: dict
    tensors: dict[str, torch.Tensor]
    probe_ids: list[int]
    probe_logprobs: list[float]


def split(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> AdapterPublish:
    """A publish's tensors -> its parts; ValueError if one is missing."""
    tensors: dict[str, torch.Tensor] = {}
    special: dict[str, torch.Tensor] = {}
    for name, t in named_tensors:
        (special if name in (CONFIG, PROBE_IDS, PROBE_LOGPROBS) else tensors)[name] = t.to("cpu", copy=True)
    missing = sorted({CONFIG, PROBE_IDS, PROBE_LOGPROBS} - set(special)) + ([] if tensors else ["an adapter tensor"])
    if missing:
        raise ValueError(f"not an adapter publish: it lacks {', '.join(missing)}")
    config = json.loads(bytes(special[CONFIG].numpy()).decode())
    return AdapterPublish(config, tensors, special[PROBE_IDS].tolist(), special[PROBE_LOGPROBS].tolist())


def write_adapter(path: str | Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """A PEFT adapter directory at ``path`` (``adapter_config.json``, ``adapter_model.safetensors``),
    what ``PeftModel.from_pretrained`` and vLLM's ``LoRARequest`` load. Written beside and renamed
    into place; if ``path`` already exists (another writer of the same adapter won), it is kept."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(staging / WEIGHTS_FILE))
        try:
            os.rename(staging, path)
        except OSError:
            if not (path / WEIGHTS_FILE).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path

