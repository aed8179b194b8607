"""Policy, value, KL and entropy losses: pure, masked functions of per-token tensors.

Called by the learner's train step once per mini-batch. Every input is Shape (B, L) and ``mask``
(bool) selects the tokens that count (the policy's tokens). Entries outside ``mask`` may hold
anything, inf or NaN included: they are replaced before any arithmetic, so the loss is finite and
the gradient there is exactly zero.

Each loss returns ``(loss, metrics)``: a scalar tensor to minimise and a dict of floats with flat
keys (``clip_frac``, ``approx_kl``, ...) for the learner to prefix and log. Aggregation is a
token mean over the mask by default (``agg="token-mean"``); ``agg="seq-mean"`` averages each
sequence's token mean over the sequences that have tokens.

Log-probabilities: ``logp`` is the current policy (with grad), ``logp_prox`` the proximal policy
recomputed by the learner before the update, ``logp_behav`` the policy that generated the tokens
(recorded by the actor, possibly several versions old).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "aggregate",
    "ppo_policy_loss",
    "decoupled_ppo_loss",
    "tis_policy_loss",
    "value_loss",
    "kl_divergence",
    "kl_loss",
    "entropy_from_logits",
    "entropy_loss",
]

AGGREGATIONS = ("token-mean", "seq-mean")
KL_KINDS = ("k1", "k3", "mse")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean") -> torch.Tensor:
    """Reduce a (B, L) per-token tensor over ``mask`` to a scalar (0 when the mask is empty)."""
    mask = mask.bool()
    x = torch.where(mask, per_token, 0)
    if agg == "token-mean":
        return x.sum() / mask.sum().clamp(min=1)
    if agg == "seq-mean":
        tokens = mask.sum(dim=-1)
        per_seq = x.sum(dim=-1) / tokens.clamp(min=1)
        return per_seq.sum() / (tokens > 0).sum().clamp(min=1)
    raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")


def ppo_policy_loss(
    logp: torch.Tensor,
    logp_prox: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    agg: str = "token-mean",
):
    """Clipped PPO surrogate with ratio pi / pi_prox; ``clip_high`` defaults to ``clip_low``.

    ``dual_clip`` (c > 1) bounds the loss of negative-advantage tokens by -c * A (Ye et al. 2020).
    """
    mask = mask.bool()
    logp, logp_prox, advantages = _clean(mask, logp, logp_prox, advantages)
    per_token, metrics = _clipped_surrogate(
        logp - logp_prox, advantages, mask, clip_low, clip_high, dual_clip
    )
    return aggregate(per_token, mask, agg), metrics


def decoupled_ppo_loss(
    logp: torch.Tensor,
    logp_prox: torch.Tensor,
    logp_behav: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    behav_weight_cap: float | None = 5.0,
    agg: str = "token-mean",
):
    """Decoupled PPO (AReaL): the clipped surrogate against pi_prox, times the detached behaviour
    weight min(pi_prox / pi_behav, cap). Equals :func:`ppo_policy_loss` when behav == prox."""
    mask = mask.bool()
    logp, logp_prox, logp_behav, advantages = _clean(mask, logp, logp_prox, logp_behav, advantages)
    weight = torch.exp((logp_prox - logp_behav).detach())
    if behav_weight_cap is not None:
        weight = weight.clamp(max=behav_weight_cap)
    per_token, metrics = _clipped_surrogate(
        logp - logp_prox, advantages, mask, clip_low, clip_high, dual_clip
    )
    metrics["behav_weight_mean"] = _mean(weight, mask)
    metrics["behav_weight_capped_frac"] = (
        _mean((weight >= behav_weight_cap).float(), mask) if behav_weight_cap is not None else 0.0
    )
    return aggregate(per_token * weight, mask, agg), metrics


def tis_policy_loss(
    logp: torch.Tensor,
    logp_behav: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float = 2.0,
    agg: str = "token-mean",
):
    """Truncated importance sampling: -sg(min(pi / pi_behav, cap)) * A * log pi.

    Its gradient is the off-policy policy gradient with the importance ratio capped; with
    ``cap=inf`` it equals the gradient of plain importance sampling, -(pi / pi_behav) * A.
    """
    mask = mask.bool()
    logp, logp_behav, advantages = _clean(mask, logp, logp_behav, advantages)
    ratio = torch.exp((logp - logp_behav).detach())
    weight = ratio.clamp(max=cap)
    per_token = -weight * advantages * logp
    metrics = {
        "is_ratio_mean": _mean(ratio, mask),
        "is_capped_frac": _mean((ratio > cap).float(), mask),
    }
    return aggregate(per_token, mask, agg), metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = 0.5,
    agg: str = "token-mean",
):
    """0.5 * max((V - R)^2, (V_clipped - R)^2), V_clipped = V_old + clamp(V - V_old, +-clip)."""
    mask = mask.bool()
    values, old_values, returns = _clean(mask, values, old_values, returns)
    unclipped = (values - returns) ** 2
    if clip is None:
        per_token = 0.5 * unclipped
        clip_frac = 0.0
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (clipped_values - returns) ** 2
        per_token = 0.5 * torch.maximum(unclipped, clipped)
        clip_frac = _mean((clipped > unclipped).float(), mask)
    metrics = {
        "clip_frac": clip_frac,
        "explained_var": _explained_variance(values.detach(), returns, mask),
    }
    return aggregate(per_token, mask, agg), metrics


def kl_divergence(logp: torch.Tensor, logp_ref: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled token's log-probs.

    k1: log pi - log pi_ref (unbiased, high variance; the usual in-reward penalty);
    k3: exp(-d) + d - 1 with d = log pi - log pi_ref (unbiased, >= 0, low variance), d clamped to
    +-20 so one wild token cannot overflow; mse: 0.5 * d^2.
    """
    d = logp - logp_ref
    if kind == "k1":
        return d
    if kind == "k3":
        d = d.clamp(-20.0, 20.0)
        return torch.exp(-d) + d - 1.0
    if kind == "mse":
        return 0.5 * d * d
    raise ValueError(f"kind must be one of {KL_KINDS}, got {kind!r}")


def kl_loss(
    logp: torch.Tensor,
    logp_ref: torch.Tensor,
    mask: torch.Tensor,
    *,
    kind: str = "k3",
    agg: str = "token-mean",
    only: torch.Tensor | None = None,
):
    """KL to the reference policy as a loss term (the caller scales it by its coefficient).

    ``only`` (a subset of ``mask``): the tokens whose KL counts; the others of ``mask`` count as
    0 but still in the denominator, so the term aggregates like every other over ``mask``."""
    mask = mask.bool()
    where = mask if only is None else mask & only.bool()
    logp, logp_ref = _clean(where, logp, logp_ref)
    per_token = kl_divergence(logp, logp_ref, kind)
    loss = aggregate(per_token, mask, agg)
    return loss, {"kl": float(loss.detach())}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim. Shape: (..., V) -> (...)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def entropy_loss(entropy: torch.Tensor, mask: torch.Tensor, *, agg: str = "token-mean"):
    """Minus the mean entropy: minimising it (times a coefficient) raises entropy."""
    mask = mask.bool()
    (entropy,) = _clean(mask, entropy)
    mean = aggregate(entropy, mask, agg)
    return -mean, {"entropy": float(mean.detach())}


# --- helpers ----------------------------------------------------------------------------------


def _clean(mask: torch.Tensor, *tensors: torch.Tensor):
    """Zero every entry outside ``mask`` (a where, so no gradient reaches those entries)."""
    for t in tensors:
        if t.shape != mask.shape:
            raise ValueError(f"shape {tuple(t.shape)} does not match mask {tuple(mask.shape)}")
    return tuple(torch.where(mask, t, torch.zeros((), dtype=t.dtype, device=t.device)) for t in tensors)


def _clipped_surrogate(log_ratio, advantages, mask, clip_low, clip_high, dual_clip):
    clip_high = clip_low if clip_high is None else clip_high
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    metrics = {
        "clip_frac": _mean((clipped > unclipped).float(), mask),
        # KL(pi_prox || pi) from tokens sampled (about) from pi_prox.
        "approx_kl": _mean(kl_divergence(-log_ratio.detach(), torch.zeros_like(log_ratio), "k3"), mask),
        "ratio_mean": _mean(ratio.detach(), mask),
    }
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (per_token > bound)
        per_token = torch.where(dual, bound, per_token)
        metrics["dual_clip_frac"] = _mean(dual.float(), mask)
    return per_token, metrics


def _mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float(aggregate(x.detach(), mask))


def _explained_variance(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    var_target = _variance(target, mask)
    if var_target == 0.0:
        return math.nan
    return 1.0 - _variance(target - pred, mask) / var_target


def _variance(x: torch.Tensor, mask: torch.Tensor) -> float:
    mean = aggregate(x, mask)
    return float(aggregate((x - mean) ** 2, mask))
