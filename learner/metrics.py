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

from learner.advantages import masked_mean
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


def add_masked_mean(metrics: StepMetrics, key: str, x: torch.Tensor, mask: torch.Tensor) -> None:
    """``masked_mean`` of ``x`` over ``mask``, weighted by its tokens across ranks (a rank with
    none adds the key with weight 0, as every rank must add the same keys)."""
    metrics.add(key, float(masked_mean(x, mask)), float(mask.sum()))


def turn_starts(mask: torch.Tensor) -> torch.Tensor:
    """The first policy token of each turn (a maximal run of ``mask`` in a row). (B, L) bool."""
    before = torch.zeros_like(mask)
    before[:, 1:] = mask[:, :-1]
    return mask & ~before


def turn_sums(x: torch.Tensor, mask: torch.Tensor, turn_end: torch.Tensor) -> torch.Tensor:
    """Per turn (the policy tokens up to and including each ``turn_end``, row by row), the sum
    of ``x`` over its tokens: a 1-D tensor, one entry per turn with a policy token."""
    turn = torch.cumsum(turn_end.long(), dim=1) - turn_end.long()  # turn ends strictly before
    rows = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(mask)
    keys = (rows * (mask.shape[1] + 1) + turn)[mask]
    if not keys.numel():
        return x.new_zeros(0)
    _, inverse = torch.unique(keys, return_inverse=True)
    out = x.new_zeros(int(inverse.max()) + 1)
    return out.index_add_(0, inverse, x[mask])


def fresh_gap(metrics: StepMetrics, log_ratio: torch.Tensor, fresh: torch.Tensor) -> None:
    """The engine's and the learner's log-probs of the same tokens where they differ by numerics
    alone: |behaviour - proximal| over every rank's ``fresh`` policy tokens (sampled by the
    version the learner holds: staleness 0), its mean and max (``policy/fresh_gap_mean``,
    ``policy/fresh_gap_max``); absent when no token is fresh. A max far above the numerics' (below
    1e-4 for SmolLM2-135M in float32 on CPU) says the engine samples from other weights than
    the learner trains: a weight push that did not arrive, or did not reach a tied layer."""
    gap = torch.where(fresh, log_ratio.abs(), 0.0).double()
    sums = torch.stack([fresh.sum().double(), gap.sum()])
    top = gap.max() if gap.numel() else gap.new_zeros(())
    dist.all_reduce(sums)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    n, total = sums.tolist()
    if n:
        metrics.exact["policy/fresh_gap_mean"] = total / n
        metrics.exact["policy/fresh_gap_max"] = float(top)


def vtrace_metrics(metrics: StepMetrics, log_rho: torch.Tensor, mask: torch.Tensor,
                   turn_end: torch.Tensor, rho_clip: float) -> None:
    """How much V-trace truncates this step: per policy token, the mean clipped ratio
    min(rho_clip, pi/mu) (``vtrace/rho_mean``) and the share clipped (``vtrace/clipped``); per
    turn, the same of the turn's ratio, the product of its tokens' (``vtrace/turn_rho_mean``,
    ``vtrace/turn_clipped``), which turn-level estimators use."""
    ratio = torch.exp(log_rho)
    add_masked_mean(metrics, "vtrace/rho_mean", ratio.clamp(max=rho_clip), mask)
    add_masked_mean(metrics, "vtrace/clipped", (ratio > rho_clip).float(), mask)
    turn_ratio = torch.exp(turn_sums(torch.where(mask, log_rho, 0.0), mask, turn_end))
    n = float(turn_ratio.numel())
    metrics.add("vtrace/turn_rho_mean", float(turn_ratio.clamp(max=rho_clip).mean()) if n else 0.0, n)
    metrics.add("vtrace/turn_clipped", float((turn_ratio > rho_clip).float().mean()) if n else 0.0, n)
