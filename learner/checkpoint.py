"""What a learner checkpoint carries: the sharded models and optimizers, the process's RNG
states, and a fingerprint of the optimizers, so a resumed run can check they came back as saved.

Called by learner/trainer.py's ``save_checkpoint`` / ``load_checkpoint``. The models and
optimizers (torch.distributed.checkpoint) and ``optimizer_fingerprint`` are collective over the
default process group (every rank calls them); the RNG states are per process.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor


def save_trainables(trainables: list, path, *, frozen: bool = True) -> None:
    """``(name, model, optimizer)`` triples, sharded under ``path``; ``frozen`` False leaves out
    the weights that do not train (with LoRA: everything but the adapters and the critic's
    head, which the model path holds). Collective."""
    dcp.save(_trainables_state(trainables, frozen), checkpoint_id=str(path))


def load_trainables(trainables: list, path, *, frozen: bool = True) -> None:
    """Restore what ``save_trainables`` wrote into the same triples. Collective."""
    state = _trainables_state(trainables, frozen)
    dcp.load(state, checkpoint_id=str(path))
    options = _options(frozen)
    for name, model, optim in trainables:
        set_state_dict(model, optim, model_state_dict=state[name], optim_state_dict=state[f"{name}_optim"],
                       options=options)


def _options(frozen: bool) -> StateDictOptions:
    return StateDictOptions(ignore_frozen_params=not frozen, strict=frozen)


def _trainables_state(trainables: list, frozen: bool) -> dict:
    state = {}
    for name, model, optim in trainables:
        weights, state[f"{name}_optim"] = get_state_dict(model, optim, options=_options(frozen))
        if not frozen:  # a tied weight's second name (lm_head) escapes torch's filter: not a parameter name
            trained = {n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
            weights = {k: v for k, v in weights.items() if k in trained}
        state[name] = weights
    return state


def rng_states() -> dict:
    """This process's torch, numpy and python RNG states, as tensors, numbers and strings only:
    ``torch.load(weights_only=True)`` reads them back, so loading executes no pickle."""
    numpy_state = np.random.get_state(legacy=False)
    version, internal, gauss = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"bit_generator": numpy_state["bit_generator"],
                      "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                      "pos": int(numpy_state["state"]["pos"]),
                      "has_gauss": int(numpy_state["has_gauss"]), "gauss": float(numpy_state["gauss"])},
            "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64),
                       "gauss": gauss}}


def set_rng_states(states: dict) -> None:
    """Restore what ``rng_states`` returned."""
    torch.set_rng_state(states["torch"])
    n = states["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    p = states["python"]
    random.setstate((p["version"], tuple(int(x) for x in p["internal"].tolist()), p["gauss"]))


def optimizer_fingerprint(optimizers: Iterable[torch.optim.Optimizer], device) -> list[float]:
    """Per optimizer: its step count and the sums of its moment estimates over all ranks'
    shards (float64): what a restored optimizer must reproduce. Collective."""
    out = []
    for optim in optimizers:
        sums = torch.zeros(3, dtype=torch.float64, device=device)
        for state in optim.state.values():
            for i, key in enumerate(("step", "exp_avg", "exp_avg_sq")):
                value = state.get(key)
                if isinstance(value, DTensor):
                    value = value.to_local()
                if value is not None:
                    sums[i] += value.double().sum()
        dist.all_reduce(sums)
        out += sums.tolist()
    return out


_WEIGHT_FILES = (".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json", ".pt")


def save_hf(state: dict[str, torch.Tensor], rank: int, policy_class, hf_config, model_path: str,
            path: str | Path) -> None:
    """Rank 0 writes ``state`` (a full state dict, as ``Trainer.state_dict_for_publish`` gives
    it) as a Hugging Face directory at ``path``: weights, config, and the tokenizer and other
    non-weight files of ``model_path``. Collective (a barrier: the directory exists on return)."""
    if rank == 0:
        out = Path(path)
        with torch.device("meta"):
            model = policy_class.from_config(hf_config, dtype=torch.float32)
        model.load_state_dict(state, assign=True)
        model.save_pretrained(out)
        copy_model_files(model_path, out)
    dist.barrier()


def copy_model_files(model_path: str | Path, out: str | Path) -> None:
    """The tokenizer and the other files of ``model_path`` that are neither weights nor its
    config, copied into ``out``."""
    for f in Path(model_path).iterdir():
        if f.is_file() and f.name != "config.json" and not f.name.endswith(_WEIGHT_FILES):
            shutil.copy2(f, Path(out) / f.name)
