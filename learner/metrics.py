"""What a learner step reports, over all ranks: weighted means of per-micro-batch metrics, the
batch's own figures, and statistics of per-token tensors on the policy tokens of every rank.

Called by learner/trainer.py and learner/value_norm.py. Every function that all-reduces is
collective over the default process group; every rank gets the same result.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.distributed as dist

from learner.batch import Batch


def global_moments(mask: torch.Tensor, *xs: torch.Tensor) -> tuple[float, list[tuple[float, float]]]:
    """(number of masked tokens, [(mean, mean of squares) of each x]) over all ranks' masked
    tokens, in float64; means are 0 when no rank has a token."""
    parts = [mask.sum().double()]
    for x in xs:
        x = torch.where(mask, x, 0.0).double()
        parts += [x.sum(), (x * x).sum()]
    sums = torch.stack(parts)
    dist.all_reduce(sums)
    n, *rest = sums.tolist()
    scale = 1.0 / n if n else 0.0
    return n, [(rest[i] * scale, rest[i + 1] * scale) for i in range(0, len(rest), 2)]


def explained_variance(values, returns, mask) -> float:
    """1 - Var(returns - values) / Var(returns) over all ranks' policy tokens, before the update."""
    _, ((my, myy), (mr, mrr)) = global_moments(mask, returns, returns - values)
    var_y, var_r = myy - my * my, mrr - mr * mr
    return 1.0 - var_r / var_y if var_y > 0 else math.nan


def batch_metrics(batch: Batch, lengths: torch.Tensor, version: int) -> dict[str, float]:
    """Metrics of the whole batch (every rank has it)."""
    staleness = (version - batch.policy_version[batch.loss_mask]).float()
    return {
        "policy/staleness_mean": float(staleness.mean()) if staleness.numel() else 0.0,
        "policy/staleness_max": float(staleness.max()) if staleness.numel() else 0.0,
        "rollout/score_mean": float(batch.scores.mean()),
        "rollout/tokens": float(lengths.sum()),
        "rollout/policy_tokens": float(batch.loss_mask.sum()),
    }


class StepMetrics:
    """Weighted means, summed over micro-batches and all-reduced over ranks. Every rank adds
    the same keys; a non-finite value counts with weight 0 (NaN when nothing finite was added).
    ``exact`` holds values that are already global (the same on every rank)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)
        self.exact: dict[str, float] = {}

    def add(self, key: str, value: float, weight: float = 1.0) -> None:
        ok = math.isfinite(value)
        self.sums[key] += value * weight if ok else 0.0
        self.weights[key] += weight if ok else 0.0

    def reduce(self, device) -> dict[str, float]:
        keys = sorted(self.sums)
        t = torch.tensor([self.sums[k] for k in keys] + [self.weights[k] for k in keys],
                         dtype=torch.float64, device=device)
        dist.all_reduce(t)
        s, w = t.tolist()[:len(keys)], t.tolist()[len(keys):]
        return {k: s[i] / w[i] if w[i] > 0 else math.nan for i, k in enumerate(keys)} | self.exact
