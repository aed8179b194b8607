"""LoRA on the learner's models: PEFT adapters injected before FSDP2 shards a model, its own
weights frozen; and what a weight publish carries when the policy has them.

Called by learner/trainer.py. ``inject`` puts adapters (PEFT's ``LoraLayer``) on the modules
``target_modules`` names, in place, and freezes everything else; the model keeps its class, its
forward and its output layer, so scoring (learner/models.py) and sharding are unchanged.

Invariants:
- only adapter weights require a gradient after ``inject`` (a critic's head, built after, also
  trains); ``adapters_disabled`` gives the base model's outputs exactly: the frozen reference
  policy is the policy with its adapters off, not a second copy of the weights;
- a vision-language model's adapters go on its language model only: a list of module names
  (PEFT matches each as a suffix) never reaches the vision tower; a regular expression that
  matches a vision-tower module raises, since the engine (vLLM) applies adapters to the
  language model;
- the adapter's publish names are PEFT's saved names (``base_model.model.<module>.lora_A.weight``),
  what ``PeftModel.from_pretrained`` and vLLM's adapter loader read; the merged publish names
  are the base model's own, each adapted weight W + (alpha / rank) B A.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields

import torch
from torch import nn

from learner.models import Entry, full, state_entries

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Llama / Qwen decoder layer (attention and MLP)."""
VISION_TOWERS = ("visual", "vision_tower", "vision_model", "vision_encoder")
"""Module names under which a vision-language model in transformers keeps its vision encoder."""
ADAPTER = "default"  # PEFT's adapter name


@dataclass(frozen=True)
class LoraSpec:
    """``learner.lora``: the adapters of the policy (and of the critic's backbone)."""

    rank: int = 8
    alpha: float = 16.0
    """The adapter's output is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input during the policy's and critic's training passes only
    (scoring passes run without it, so the proximal log-probs stay deterministic)."""
    target_modules: tuple[str, ...] | str = DEFAULT_TARGETS
    """Module names (each matched as a suffix of a module's full name), "all-linear", or a
    regular expression matched against full names (PEFT's semantics)."""
    merge: bool = False
    """Publish the base weights with the adapter merged in (a full-weight push) instead of the
    adapter alone: the engine then runs without adapters."""
    save_merged: bool = False
    """The final model also as the base model with the adapter merged in, beside the adapter
    directory (``final-model-merged/``)."""
    init_seed: int | None = None
    """None: PEFT's initialisation (B = 0: the adapted model starts equal to the base). A
    seed: A and B both random (tests use it to start the adapted model away from the base)."""

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha <= 0 or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"learner.lora needs rank >= 1, alpha > 0 and dropout in [0, 1), got "
                             f"rank {self.rank}, alpha {self.alpha}, dropout {self.dropout}")
        if not isinstance(self.target_modules, str):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
            if not self.target_modules:
                raise ValueError("learner.lora.target_modules is empty")

    @classmethod
    def from_dict(cls, d: Mapping) -> "LoraSpec":
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown learner.lora keys: {unknown}")
        return cls(**d)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def inject(model: nn.Module, spec: LoraSpec, *, vision: bool = False) -> nn.Module:
    """``model`` with adapters on ``spec.target_modules`` (in place), everything else frozen.
    ``vision``: a vision-language model (see the module docstring). Raises ValueError if the
    targets match no module, or a vision-tower module."""
    from peft import LoraConfig, inject_adapter_in_model

    targets = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
    exclude = None
    if vision and not isinstance(spec.target_modules, str):
        exclude = rf".*\b({'|'.join(VISION_TOWERS)})\b.*"
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                        target_modules=targets, exclude_modules=exclude,
                        init_lora_weights=spec.init_seed is None)
    with torch.random.fork_rng(devices=[]):
        if spec.init_seed is not None:
            torch.manual_seed(spec.init_seed)
        try:
            inject_adapter_in_model(config, model, adapter_name=ADAPTER)
        except ValueError as e:
            raise ValueError(f"learner.lora.target_modules {spec.target_modules!r}: {e}") from None
    adapted = [name for name, _ in adapted_layers(model)]
    in_tower = [n for n in adapted if any(part in VISION_TOWERS for part in n.split("."))]
    if in_tower:
        raise ValueError(f"learner.lora.target_modules {spec.target_modules!r} match vision-tower "
                         f"modules ({in_tower[0]}, and {len(in_tower) - 1} more): the engine (vLLM) "
                         "applies adapters to the language model only; name its modules instead")
    for name, param in model.named_parameters():  # PEFT marks the adapters trainable, and only them
        param.requires_grad_(".lora_" in name)
    for _, layer in adapted_layers(model):
        layer.lora_dropout.eval()  # built in training mode: off except in training passes
    return model


def adapted_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(full name, layer)`` of every module that carries an adapter."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """Within it, ``model`` computes as its base model (every adapter skipped), without touching
    ``requires_grad`` (PEFT's own switch does, which a sharded model must not see mid-step)."""
    layers = [layer for _, layer in adapted_layers(model)]
    for layer in layers:
        layer._disable_adapters = True  # what PEFT's forward reads (BaseTunerLayer.disable_adapters)
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


@contextlib.contextmanager
def adapter_dropout(model: nn.Module, active: bool):
    """Within it, the adapters' dropout is on if ``active`` (the models stay in eval mode
    otherwise: nothing else of theirs has dropout on)."""
    drops = [d for _, layer in adapted_layers(model) for d in layer.lora_dropout.values()
             if isinstance(d, nn.Dropout)]
    if not active or not drops:
        yield
        return
    for d in drops:
        d.train()
    try:
        yield
    finally:
        for d in drops:
            d.eval()


def peft_config(spec: LoraSpec, model: nn.Module, base_model: str) -> dict:
    """The adapter's ``adapter_config.json`` as PEFT writes it, with the modules actually
    adapted as its targets (suffixes), so every reader sees what the tensors hold."""
    from peft import LoraConfig

    suffixes = sorted({name.rsplit(".", 1)[-1] for name, _ in adapted_layers(model)})
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                        target_modules=suffixes, base_model_name_or_path=base_model,
                        task_type="CAUSAL_LM")
    return json.loads(json.dumps(config.to_dict(), default=_jsonable))


def _jsonable(value):
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON data")


def saved_name(name: str) -> str:
    """A parameter's name in the adapted model -> its name in a saved adapter (PEFT's):
    ``model.layers.0.self_attn.q_proj.lora_A.default.weight`` ->
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``."""
    return "base_model.model." + name.replace(f".{ADAPTER}.", ".")


# --- what a publish reads (learner/models.py's ``lazy_publish`` reads it lazily) ----------------

def adapter_entries(model: nn.Module) -> list[Entry]:
    """The adapter's tensors, by their saved names (``saved_name``), in the model's order."""
    return [Entry(saved_name(name), p.dtype, tuple(p.shape), lambda p=p: full(p))
            for name, p in model.named_parameters() if ".lora_" in name]


def merged_entries(model: nn.Module, spec: LoraSpec) -> list[Entry]:
    """learner/models.py's ``state_entries`` (a tied tensor once) under the base model's own
    names: no adapter tensor, each adapted layer's weight read as W + scale B A, its bias as
    it is."""
    layers = dict(adapted_layers(model))
    entries = []
    for e in state_entries(model):
        owner, _, leaf = e.name.rpartition(".base_layer.")
        if ".lora_" in e.name:
            continue
        if not owner:
            entries.append(e)
            continue
        read = e.read
        if leaf == "weight" and owner in layers:
            a, b = layers[owner].lora_A[ADAPTER].weight, layers[owner].lora_B[ADAPTER].weight

            def read(w=e.read, a=a, b=b):
                base = w()
                return (base.float() + spec.scale * (full(b).float() @ full(a).float())).to(base.dtype)

        entries.append(Entry(f"{owner}.{leaf}", e.dtype, e.shape, read))
    return entries


PROBE_TEXT = ("The learner publishes a new adapter; the engine must answer with the same "
              "probabilities: 0 1 2 3 4 5 6 7 8 9, north south east west, <answer>Left</answer>.")
"""The probe's text: after every adapter publish the engine's log-probs of its tokens must
equal the learner's (transport/adapters.py)."""
PROBE_TOKENS = 48


def probe_ids(tokenizer) -> torch.Tensor:
    """The probe's token ids (at most ``PROBE_TOKENS``), shape (1, L)."""
    ids = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"][:PROBE_TOKENS]
    return torch.tensor([ids], dtype=torch.int64)
