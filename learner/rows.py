"""A learner rank's share of a batch: the ``Rows`` it trains on, how they are taken from the
whole batch (dummy rows included), and how they are cut into mini-batches.

Called by learner/trainer.py. Invariant: a dummy row (index -1) has no policy token, so it adds
nothing to any loss or count, yet runs the same forward/backward passes as a real one.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from learner.batch import Batch


@dataclass
class Rows:
    """This rank's rows with what the learner computed for them. Per-token tensors (m, L)."""

    batch: Batch
    lengths: torch.Tensor
    """(m,): tokens per row, 0 for dummy rows."""
    logp_prox: torch.Tensor | None = None
    values: torch.Tensor | None = None
    logp_ref: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    answer: torch.Tensor | None = None
    """bool: the policy tokens inside ``<answer>...</answer>`` (for metrics), None: not found."""
    vision: list | None = None
    """(m,) entries of learner.vision ``Encoded`` (a VLM's processed images), None: no images."""

    def select(self, rows: slice) -> "Rows":
        """Rows ``rows``, trimmed to the longest of them."""
        length = max(int(self.lengths[rows].max()), 1)

        def cut(x: torch.Tensor | list | None) -> torch.Tensor | list | None:
            if x is None or isinstance(x, list):
                return None if x is None else x[rows]
            return x[rows, :length] if x.dim() == 2 else x[rows]

        batch = Batch(**{f.name: cut(getattr(self.batch, f.name)) for f in fields(Batch)})
        return replace(self, batch=batch, **{f.name: cut(getattr(self, f.name))
                                             for f in fields(self) if f.name != "batch"})


def take_rows(batch: Batch, lengths: torch.Tensor, index: torch.Tensor, pad_id: int, device,
              vision: list | None = None) -> Rows:
    """Rows ``index`` of the batch on ``device``; index -1 gives a dummy row (no policy tokens).
    ``vision``: the whole batch's processed images per row, or None."""
    real, src = index >= 0, index.clamp(min=0)
    fill = {"token_ids": pad_id, "loss_mask": False, "turn_end": False, "behaviour_logprobs": 0.0,
            "policy_version": -1, "token_rewards": 0.0, "scores": 0.0, "group_ids": -1}
    taken = {}
    for name, value in fill.items():
        x = getattr(batch, name)[src].clone()
        x[~real] = value
        taken[name] = x.to(device)
    mine = None if vision is None else [vision[i] if i >= 0 else None for i in index.tolist()]
    rows = Rows(Batch(**taken), torch.where(real, lengths[src], 0), vision=mine)
    return rows.select(slice(None))


def split_rows(count: int, parts: int) -> list[slice]:
    """``parts`` consecutive slices of ``count`` rows, sizes differing by at most one."""
    bounds = [count * j // parts for j in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def longest_first(index: torch.Tensor, lengths: torch.Tensor, minibatches: int) -> torch.Tensor:
    """``index`` (global row indices, -1 for dummy rows) with each mini-batch's rows (the
    ``split_rows`` slices) ordered longest first: micro-batches, each cut to its longest row,
    then compute little padding. Which rows form a mini-batch is unchanged."""
    size = torch.where(index >= 0, lengths[index.clamp(min=0)], 0)
    out = index.clone()
    for mb in split_rows(len(index), minibatches):
        out[mb] = index[mb][torch.argsort(size[mb], descending=True, stable=True)]
    return out


def count_units(mask: torch.Tensor, agg: str) -> int:
    """What a loss with aggregation ``agg`` averages over: tokens, or sequences with tokens."""
    return int(mask.sum()) if agg == "token-mean" else int((mask.sum(-1) > 0).sum())
