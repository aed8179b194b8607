"""Value normalisation for the critic (``TrainerConfig.value_norm``): running statistics of the
returns, and the PopArt rescaling of the value head that keeps its predictions when they move.

Called by learner/trainer.py. Invariants: statistics are over all ranks' policy tokens
(learner.metrics.global_moments, so every rank holds the same); the first batch sets
them outright (a fresh head, whose output is about 0, then predicts the mean return); afterwards
they follow an exponential moving average with weight ``DECAY`` on the past, and ``update``
rescales the head in place so that ``std * head + mean`` is unchanged by the move.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from learner.metrics import global_moments

DECAY = 0.9
"""Weight of the running statistics against each new batch's."""
MIN_VAR = 1e-4


class ValueNorm:
    def __init__(self) -> None:
        self.stats: tuple[float, float, float] | None = None
        """(mean, second moment, std) of the returns; None before the first batch."""

    def denormalize(self, raw: torch.Tensor) -> torch.Tensor:
        """The head's output (B, L) in return units; position 0 (no prefix) stays 0."""
        if self.stats is None:
            return raw
        mean, _, std = self.stats
        return torch.cat([raw[:, :1], raw[:, 1:] * std + mean], dim=1)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        mean, _, std = self.stats
        return (x - mean) / std

    @property
    def std(self) -> float:
        return self.stats[2]

    @torch.no_grad()
    def update(self, returns: torch.Tensor, mask: torch.Tensor, head: nn.Linear) -> None:
        """Move the statistics toward this batch's and rescale ``head`` to keep its predictions."""
        n, ((batch_mean, batch_sq),) = global_moments(mask, returns)
        if n == 0:
            return
        if self.stats is None:
            mean, sq = batch_mean, batch_sq
        else:
            old_mean, old_sq, old_std = self.stats
            mean = DECAY * old_mean + (1 - DECAY) * batch_mean
            sq = DECAY * old_sq + (1 - DECAY) * batch_sq
        std = math.sqrt(max(sq - mean * mean, MIN_VAR))
        if self.stats is not None:
            head.weight.mul_(old_std / std)
            head.bias.mul_(old_std / std).add_((old_mean - mean) / std)
        self.stats = (mean, sq, std)
