"""The learner's models: the critic (a backbone with a scalar value head), loading, and the
per-token log-probs both the trainer and its tests read.

Invariants: token i's log-prob comes from position i - 1's logits divided by the sampling
temperature (0 at position 0); values[:, i] is the value of the prefix before token i.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from learner import losses
from transport.packing import dtype_name


class ValueModel(nn.Module):
    """The critic: a transformer backbone and a scalar linear head (sharded with the root)."""

    def __init__(self, backbone: nn.Module, *, seed: int) -> None:
        super().__init__()
        self.backbone = backbone
        self._no_split_modules = backbone._no_split_modules
        config = backbone.config
        hidden = getattr(config, "text_config", config).hidden_size  # a VLM's: its language model's
        self.head = nn.Linear(hidden, 1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            nn.init.normal_(self.head.weight, std=1.0 / (hidden + 1))
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, **inputs) -> torch.Tensor:
        """Shape: (B, L) -> (B, L) float32; values[:, i] is V(prefix before token i), 0 at i = 0.
        ``inputs``: more of the backbone's (a VLM's image inputs)."""
        hidden = self.backbone(input_ids=input_ids, use_cache=False, **inputs).last_hidden_state
        return F.pad(self.head(hidden).squeeze(-1).float()[:, :-1], (1, 0))


def load_model(auto_cls, path: str) -> nn.Module:
    """A Hugging Face model in float32 (the master weights), dropout off."""
    return auto_cls.from_pretrained(path, dtype=torch.float32).eval()


def token_logprobs(model, ids, temperature, *, entropy=False, entropy_grad=False, inputs=None):
    """(log-prob of each token, entropy of the distribution it was drawn from), each (B, L) with
    0 at position 0: position i - 1's logits / temperature predict token i. ``inputs``: more
    keyword arguments of the model's forward (a VLM's image inputs)."""
    logits = model(input_ids=ids, use_cache=False, **(inputs or {})).logits[:, :-1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = None
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = F.pad(losses.entropy_from_logits(logits), (1, 0))
    return F.pad(logp, (1, 0)), ent


def lazy_full_state(model: nn.Module):
    """``(specs, tensors)``: the model's HF-named state as ``(name, dtype, shape)`` specs, and a
    lazy iterator of ``(name, full tensor)`` in the same order that gathers each tensor from its
    FSDP shards only when it is reached, on the model's device (a GPU learner publishes from GPU
    memory). Collective for a sharded model: every rank reads the iterator to its end."""
    from torch.distributed.tensor import DTensor

    state = model.state_dict()
    specs = [(name, dtype_name(t.dtype, name), tuple(t.shape)) for name, t in state.items()]

    def gather():
        for name, t in state.items():
            yield name, (t.full_tensor() if isinstance(t, DTensor) else t).detach()

    return specs, gather()
