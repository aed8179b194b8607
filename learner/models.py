"""The learner's models: the critic (a backbone with a scalar value head), loading, and the
per-token log-probs both the trainer and its tests read.

Invariants: token i's log-prob comes from position i - 1's logits divided by the sampling
temperature (0 at position 0); values[:, i] is the value of the prefix before token i.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

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


LOGIT_CHUNK_MIB = 256.0
"""The most float32 logits held at once when tokens are scored (MiB): a batch whose logits take
more is scored in chunks of positions that take this much (``chunk_positions``)."""


def chunk_positions(vocab_size: int, mib: float = LOGIT_CHUNK_MIB) -> int:
    """Positions whose float32 logits over ``vocab_size`` take ``mib`` MiB (at least 1); 0 for
    ``mib`` 0: never chunked. 256 MiB is 1365 positions of a 49,152-token vocabulary."""
    return 0 if mib <= 0 else max(1, int(mib * 2**20) // (4 * vocab_size))


def token_logprobs(model, ids, temperature, *, entropy=False, entropy_grad=False, inputs=None,
                   chunk=None):
    """(log-prob of each token, entropy of the distribution it was drawn from), each (B, L) with
    0 at position 0: position i - 1's logits / temperature predict token i. ``inputs``: more
    keyword arguments of the model's forward (a VLM's image inputs). ``chunk``: the most
    positions whose logits exist at once (``scored_head``; None: ``chunk_positions`` of the
    model's vocabulary; 0: the whole batch's at once)."""
    scores = token_scores(model, ids, temperature, entropy=entropy, entropy_grad=entropy_grad,
                          inputs=inputs, chunk=chunk)
    return scores.logp, scores.entropy


class TokenScores(NamedTuple):
    """Per-token scores, each (B, L) with 0 at position 0 (None where not asked for): the token's
    log-prob, the entropy of the distribution it was drawn from, whether it was that distribution's
    most likely token."""

    logp: torch.Tensor
    entropy: torch.Tensor | None = None
    top: torch.Tensor | None = None


def token_scores(model, ids, temperature, *, entropy=False, entropy_grad=False, top=False,
                 inputs=None, chunk=None) -> TokenScores:
    """``token_logprobs``' scores, and with ``top`` whether each token was the argmax. A batch of
    at most ``chunk`` positions is scored whole, from its logits."""
    inputs = inputs or {}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if chunk is None:
        chunk = chunk_positions(head.out_features) if isinstance(head, nn.Linear) else 0
    if chunk and ids.shape[0] * (ids.shape[1] - 1) > chunk and _chunkable(model, head):
        with scored_head(model, ids[:, 1:], temperature, chunk=chunk, entropy=entropy,
                         entropy_grad=entropy_grad, top=top):
            out = model(input_ids=ids, use_cache=False, **inputs).logits  # (B, L - 1, columns)
        columns = iter(out.unbind(-1))
        logp = next(columns)
        ent = next(columns) if entropy else None
        if ent is not None and not (entropy_grad and torch.is_grad_enabled()):
            ent = ent.detach()  # computed without a graph: a column of the scores' stack
        hit = next(columns) > 0.5 if top else None
    else:
        logits = model(input_ids=ids, use_cache=False, **inputs).logits[:, :-1].float() / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        ent = hit = None
        if entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = losses.entropy_from_logits(logits)
        if top:
            hit = logits.detach().argmax(-1) == ids[:, 1:]
    pad = functools.partial(F.pad, pad=(1, 0))
    return TokenScores(pad(logp), None if ent is None else pad(ent),
                       None if hit is None else pad(hit.to(torch.uint8)).bool())


@contextlib.contextmanager
def scored_head(model, targets, temperature, *, chunk, entropy=False, entropy_grad=False, top=False):
    """Within it, ``model``'s output layer returns, in place of logits, each position's scores of
    ``targets`` (B, L - 1): (B, L - 1, k) float columns log-prob, then entropy and top where asked.
    The scores are computed ``chunk`` positions at a time, each chunk's logits recomputed in the
    backward (activation checkpointing), so at most ``chunk`` x V logits exist at once, forward or
    backward. The layer runs inside the model's own forward, where a sharded (FSDP) model's
    output weights are gathered, and is restored on exit."""
    head = model.get_output_embeddings()

    def score(hidden: torch.Tensor) -> torch.Tensor:
        batch, length = targets.shape
        h = hidden[:, :length].reshape(batch * length, -1)
        t = targets.reshape(-1)
        grad = torch.is_grad_enabled()
        parts = []
        for start in range(0, len(t), chunk):
            args = (h[start:start + chunk], t[start:start + chunk])
            if grad:
                parts.append(checkpoint(_chunk_scores, head, *args, temperature, entropy,
                                        entropy_grad, top, use_reentrant=False))
            else:
                parts.append(_chunk_scores(head, *args, temperature, entropy, False, top))
        # a fresh tensor, not a view: FSDP hooks a sharded model's outputs for its backward
        return torch.cat(parts).view(batch, length, -1).clone()

    head.forward = score
    try:
        yield
    finally:
        del head.forward  # the class's own again


def _chunk_scores(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                  entropy: bool, entropy_grad: bool, top: bool) -> torch.Tensor:
    """(n, k) columns for n positions: log-prob of the target, then entropy and argmax == target
    (as 0/1) where asked. The logits are computed as the plain layer would (its dtype, then
    float32), so the scores equal the unchunked ones."""
    logits = F.linear(hidden, head.weight, head.bias).float() / temperature
    lse = torch.logsumexp(logits, dim=-1)
    columns = [logits.gather(-1, targets[:, None]).squeeze(-1) - lse]
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            columns.append(lse - (torch.softmax(logits, dim=-1) * logits).sum(-1))
    if top:
        columns.append((logits.detach().argmax(-1) == targets).float())
    return torch.stack(columns, dim=-1)


def _chunkable(model, head: nn.Module | None) -> bool:
    """Whether the model's logits are its output layer's (``head``'s) outputs, untouched: no final
    soft-capping or scaling after the layer (Gemma 2's, Cohere's), which a scored head would bypass."""
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    return (isinstance(head, nn.Linear)
            and getattr(text, "final_logit_softcapping", None) is None
            and getattr(text, "logit_scale", None) in (None, 1, 1.0))


@dataclass
class Entry:
    """One tensor of a weight publish: its name, dtype and shape, and how to read it in full."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    read: Callable[[], torch.Tensor] = field(repr=False)


def full(t: torch.Tensor) -> torch.Tensor:
    """``t`` whole, detached: gathered from its FSDP shards (a collective) where it is sharded."""
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach()


def state_entries(model: nn.Module) -> list[Entry]:
    """The model's HF-named state as publish entries, in order. A tensor the state names twice
    (tied input and output embeddings: SmolLM2's 113 MB table under ``model.embed_tokens.weight``
    and ``lm_head.weight``) comes once, under its first name; an engine built from the same
    config ties the other to it (vLLM skips a tied ``lm_head`` when loading anyway)."""
    entries, seen = [], set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            entries.append(Entry(name, t.dtype, tuple(t.shape), lambda t=t: full(t)))
    return entries


def lazy_publish(entries: list[Entry]):
    """``(specs, tensors)``: the entries as ``(name, dtype, shape)`` specs, and a lazy iterator
    of ``(name, full tensor)`` in the same order that reads each tensor only when it is reached
    (a sharded one gathered then, on the model's device: a GPU learner publishes from GPU
    memory). Collective for a sharded model: every rank reads the iterator to its end."""
    specs = [(e.name, dtype_name(e.dtype, e.name), e.shape) for e in entries]

    @torch.no_grad()
    def read():
        for e in entries:
            yield e.name, e.read()

    return specs, read()


def lazy_full_state(model: nn.Module):
    """``lazy_publish`` of the model's whole state (``state_entries``)."""
    return lazy_publish(state_entries(model))
