"""Advantage estimators for multi-turn trajectories: masked GAE, bi-level GAE, turn-wise GAE, GRPO.

Called by the learner's train step after values are recomputed; pure functions on torch tensors
(no process groups, no I/O), so they are tested against a naive per-token loop.

Conventions (every function): tensors are Shape (B, L), one row per trajectory.
- ``mask`` (bool) is True on tokens the policy generated (assistant tokens, end-of-turn included).
  Environment tokens (system prompt, observations, padding) are skipped by every recursion, never
  bootstrapped through.
- ``turn_end`` (bool) is True on the last policy token of each turn (a subset of ``mask``). Policy
  tokens after the last ``turn_end`` of a row form one more turn that ends at the last of them.
- ``values[b, i]`` is the critic's value of the prefix before token i.
- Inputs outside ``mask`` are ignored (they may hold anything, NaN included); outputs are 0 there.
- ``log_rho`` = log pi_current - log pi_behaviour per token switches on V-trace style staleness
  correction: rho = min(rho_clip, exp(log_rho)) scales each TD error and c = min(c_clip,
  exp(log_rho)) each recursion step, A_k = rho_k * delta_k + gamma * lam * c_k * A_{k+1}. With
  ``log_rho`` all zero (and clips >= 1) every estimator equals its uncorrected form exactly.
- Advantages are raw; whiten them with :func:`masked_whiten`. ``returns = advantages + values``.

How it is fast: the policy tokens of the batch are gathered once into a flat token list (N,),
in order, so TD errors, turn boundaries and per-turn sums are elementwise or segment ops over
policy tokens only. The backward recursion is a first-order linear scan; it runs on a time-major
(K, B) layout (K = most tokens in a row, so "the next token" is the next row of memory), solved
blockwise: a sequential pass inside blocks of ~sqrt(K) steps over all blocks and trajectories at
once, then a scan over block starts joins them. Python iterates ~2*sqrt(K) times per scan, each
step one vector op over the batch. Arithmetic is float64 internally; outputs take the dtype of
``values``.
"""

from __future__ import annotations

import math

import torch

__all__ = ["masked_gae", "bi_level_gae", "turn_wise_gae", "grpo", "masked_whiten", "masked_mean",
           "turn_ends"]


def masked_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    log_rho: torch.Tensor | None = None,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the policy tokens of each row (VAGEN-Base). Returns (advantages, returns), (B, L).

    Walking backwards over policy positions p_k: delta_k = r[p_k] + gamma * V[p_{k+1}] - V[p_k]
    (V after the last policy token is 0); A[p_k] = rho_k * delta_k + gamma * lam * c_k * A[p_{k+1}].
    """
    tokens = _Tokens(mask)
    r, v = tokens.take(rewards), tokens.take(values)
    rho, c = _traces(tokens.take(log_rho) if log_rho is not None else None, rho_clip, c_clip)
    d = _td_errors(r, v, tokens.is_last, gamma).mul_(rho)
    adv = tokens.scan(d, gamma * lam * c)
    return tokens.put(adv, values.dtype), tokens.put(adv.add_(v), values.dtype)


def bi_level_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    turn_end: torch.Tensor,
    *,
    gamma_token: float,
    gamma_turn: float,
    lam_token: float,
    lam_turn: float,
    log_rho: torch.Tensor | None = None,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GAE over turn ends, then token-level GAE inside each turn (VAGEN-Full).

    Returns (advantages, returns), (B, L). Turn level, backwards over turns with end positions e_t:
    delta_t = r[e_t] + gamma_turn * V[e_{t+1}] - V[e_t] (0 past the last turn);
    A_turn_t = rho_t * delta_t + gamma_turn * lam_turn * c_t * A_turn_{t+1}, where the traces use
    the turn's sequence ratio exp(sum of log_rho over its policy tokens). Token level: A[e_t] =
    A_turn_t; the turn's other tokens walk backwards with gamma_token, lam_token and per-token
    traces, bootstrapping only inside the turn.
    """
    tokens = _Tokens(mask)
    r, v = tokens.take(rewards), tokens.take(values)
    lr = tokens.take(log_rho) if log_rho is not None else None
    turns = _Turns(tokens, turn_end)
    turn_adv = _turn_level(turns, r, v, lr, gamma_turn, lam_turn, rho_clip, c_clip)

    # Token level: the end token takes its turn's advantage and nothing past the turn reaches
    # it. Scan per turn, or per row with the recursion cut at turn ends (w = 0 there),
    # whichever packs tighter (one long turn among many short ones pads the per-turn layout).
    rho, c = _traces(lr, rho_clip, c_clip)
    d = _td_errors(r, v, turns.tokens.is_last, gamma_token).mul_(rho)
    d.index_copy_(0, turns.end_token, turn_adv)
    w = gamma_token * lam_token * c
    if turns.tokens.packed_size <= tokens.packed_size:
        adv = turns.tokens.scan(d, w)
    else:
        w = w if isinstance(w, torch.Tensor) else torch.full_like(d, w)
        adv = tokens.scan(d, w.index_fill_(0, turns.end_token, 0.0))
    return tokens.put(adv, values.dtype), tokens.put(adv.add_(v), values.dtype)


def turn_wise_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    turn_end: torch.Tensor,
    *,
    gamma_turn: float,
    lam_turn: float,
    log_rho: torch.Tensor | None = None,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The turn level of :func:`bi_level_gae`: every policy token of turn t gets A_turn_t.

    Returns (advantages, returns), (B, L); returns = advantages + values, so at each turn end
    they are A_turn_t + V[e_t], the target this estimator's critic is fit to.
    """
    tokens = _Tokens(mask)
    r, v = tokens.take(rewards), tokens.take(values)
    lr = tokens.take(log_rho) if log_rho is not None else None
    turns = _Turns(tokens, turn_end)
    turn_adv = _turn_level(turns, r, v, lr, gamma_turn, lam_turn, rho_clip, c_clip)
    adv = turn_adv.index_select(0, turns.tokens.row)
    return tokens.put(adv, values.dtype), tokens.put(adv.add_(v), values.dtype)


def grpo(scores: torch.Tensor, group_ids: torch.Tensor, *, eps: float = 1e-6,
         scale: bool = True) -> torch.Tensor:
    """Group-normalised scores. Shape: scores (N,), group_ids (N,) ints -> advantages (N,).

    (s - mean of its group) / (unbiased std of its group + eps); a group of one gets 0.
    ``scale=False`` keeps the mean-centred score (Dr. GRPO): a group whose scores differ only by
    small rewards (format, step penalties: every rollout failed) then moves the policy in
    proportion to those rewards instead of as much as a group where some rollouts succeeded.
    """
    if scores.shape != group_ids.shape or scores.dim() != 1:
        raise ValueError(f"scores {tuple(scores.shape)} and group_ids {tuple(group_ids.shape)} must be (N,)")
    s = scores.to(torch.float64)
    _, group = torch.unique(group_ids, return_inverse=True)
    n_groups = int(group.max()) + 1 if group.numel() else 0
    count = torch.zeros(n_groups, dtype=torch.float64, device=s.device).index_add_(
        0, group, torch.ones_like(s))
    mean = torch.zeros_like(count).index_add_(0, group, s) / count
    dev = s - mean[group]
    sq = torch.zeros_like(count).index_add_(0, group, dev * dev)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    scaled = dev / (std[group] + eps) if scale else dev
    adv = torch.where(count[group] > 1, scaled, torch.zeros_like(dev))
    return adv.to(scores.dtype if scores.is_floating_point() else torch.float32)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``mask`` (0 when the mask is empty). Shape: any, same for both."""
    mask = mask.bool()
    return torch.where(mask, x, 0).sum() / mask.sum().clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, *, over: torch.Tensor | None = None,
                  eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) on ``mask``, 0 off it; mean and unbiased variance over
    ``over`` (default: ``mask``). turn_wise_gae's advantages are whitened ``over`` the turn ends
    (:func:`turn_ends`), one entry per turn as VAGEN does, so long turns weigh no more."""
    mask = mask.bool()
    over = mask if over is None else over.bool()
    n = over.sum()
    mean = masked_mean(x, over)
    var = (torch.where(over, x - mean, 0) ** 2).sum() / (n - 1).clamp(min=1)
    return torch.where(mask, x - mean, 0) * torch.rsqrt(var + eps)


def turn_ends(mask: torch.Tensor, turn_end: torch.Tensor) -> torch.Tensor:
    """The last policy token of every turn: ``turn_end`` on the mask, plus each row's last policy
    token (which closes an unclosed trailing turn). Shape: (B, L) bool."""
    tokens = _Tokens(mask)
    if tuple(turn_end.shape) != tokens.shape:
        raise ValueError(f"turn_end {tuple(turn_end.shape)} must match mask {tokens.shape}")
    last = torch.zeros(math.prod(tokens.shape), dtype=torch.bool, device=mask.device)
    last.index_fill_(0, tokens.src[tokens.is_last], True)
    return (turn_end.bool() & mask.bool()) | last.view(tokens.shape)


# --- token lists and the packed layout the scan runs on ---------------------------------------


class _Segments:
    """N items in order, grouped into B consecutive runs (rows); item i is the rank[i]-th of
    row[i]. Moves per-item values (N,) to the time-major packed layout (K, B) and back."""

    def __init__(self, counts: torch.Tensor):
        batch, n = counts.numel(), int(counts.sum())
        self.counts = counts
        self.row = torch.repeat_interleave(torch.arange(batch, device=counts.device), counts, output_size=n)
        starts = counts.cumsum(0) - counts
        self.rank = torch.arange(n, device=counts.device) - starts.index_select(0, self.row)
        self.is_last = self.rank == (counts - 1).index_select(0, self.row)
        self.width = _scan_rows(max(int(counts.max()) if batch else 0, 1))
        self.slot = self.rank * batch + self.row
        self.packed_size = self.width * batch

    def scan(self, d: torch.Tensor, w: torch.Tensor | float) -> torch.Tensor:
        """Per item: A[i] = d[i] + w[i] * A[next item of the row] (0 past the row's end)."""
        packed_w = self._to_packed(w) if isinstance(w, torch.Tensor) else w
        return _reverse_scan(self._to_packed(d), packed_w).view(-1).index_select(0, self.slot)

    def _to_packed(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(self.width * self.counts.numel(), dtype=x.dtype, device=x.device)
        return out.index_copy_(0, self.slot, x).view(self.width, -1)


class _Tokens(_Segments):
    """The policy tokens of a (B, L) mask as a flat list, row by row, in order."""

    def __init__(self, mask: torch.Tensor):
        if mask.dim() != 2:
            raise ValueError(f"mask must be (B, L), got {tuple(mask.shape)}")
        mask = mask.bool()
        self.shape = tuple(mask.shape)
        self.src = mask.reshape(-1).nonzero().squeeze(1)
        super().__init__(mask.sum(dim=1, dtype=torch.int32).long())

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L) -> (N,) float64: the policy tokens' entries."""
        if tuple(x.shape) != self.shape:
            raise ValueError(f"expected shape {self.shape}, got {tuple(x.shape)}")
        return x.reshape(-1).index_select(0, self.src).to(torch.float64)

    def put(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(N,) -> (B, L) of ``dtype``, zero off the mask."""
        out = torch.zeros(math.prod(self.shape), dtype=dtype, device=x.device)
        return out.index_copy_(0, self.src, x.to(dtype)).view(self.shape)


class _Turns(_Segments):
    """The turns of a token list: closed by turn_end, or by the row's last policy token."""

    def __init__(self, tokens: _Tokens, turn_end: torch.Tensor):
        if tuple(turn_end.shape) != tokens.shape:
            raise ValueError(f"turn_end {tuple(turn_end.shape)} must match mask {tokens.shape}")
        ends = turn_end.bool().reshape(-1).index_select(0, tokens.src) | tokens.is_last
        self.end_token = ends.nonzero().squeeze(1)
        row = tokens.row.index_select(0, self.end_token)
        super().__init__(torch.bincount(row, minlength=tokens.counts.numel()))
        # A turn's tokens are consecutive in the list and never cross rows (each row's last
        # token ends one), so the turns also segment the token list: `tokens.row` is each
        # token's turn and `tokens.is_last` marks turn ends.
        first = torch.full((1,), -1, dtype=self.end_token.dtype, device=self.end_token.device)
        self.tokens = _Segments(torch.diff(self.end_token, prepend=first))

    def sum(self, per_token: torch.Tensor) -> torch.Tensor:
        """(N,) -> (T,): sum over each turn's tokens."""
        out = torch.zeros(self.end_token.numel(), dtype=per_token.dtype, device=per_token.device)
        return out.index_add_(0, self.tokens.row, per_token)


def _turn_level(turns: _Turns, r, v, log_rho, gamma_turn, lam_turn, rho_clip, c_clip):
    """A_turn of every turn. Shape: per-token (N,) inputs -> (T,)."""
    r_end, v_end = r.index_select(0, turns.end_token), v.index_select(0, turns.end_token)
    rho, c = _traces(turns.sum(log_rho) if log_rho is not None else None, rho_clip, c_clip)
    d = _td_errors(r_end, v_end, turns.is_last, gamma_turn).mul_(rho)
    return turns.scan(d, gamma_turn * lam_turn * c)


# --- small pieces -----------------------------------------------------------------------------


def _td_errors(r: torch.Tensor, v: torch.Tensor, is_last: torch.Tensor, gamma: float) -> torch.Tensor:
    """r + gamma * V[next item] - V, with V past a row's last item = 0. Shape: (N,), new tensor."""
    v_next = torch.zeros_like(v)
    v_next[:-1] = v[1:]
    v_next.masked_fill_(is_last, 0.0)
    return v_next.mul_(gamma).add_(r).sub_(v)


def _traces(log_rho: torch.Tensor | None, rho_clip: float, c_clip: float):
    """Clipped importance ratios (rho, c); (1, 1) without correction."""
    if log_rho is None:
        return 1.0, 1.0
    ratio = torch.exp(log_rho)
    return ratio.clamp(max=rho_clip), ratio.clamp_(max=c_clip)


_SEQUENTIAL_STEPS = 16


def _scan_block(k: int) -> int:
    return math.isqrt(k - 1) + 1


def _scan_rows(k: int) -> int:
    """Rows to allocate for a scan over k steps, so that blocks tile them without a copy."""
    if k <= _SEQUENTIAL_STEPS:
        return k
    block = _scan_block(k)
    return -(-k // block) * block


def _reverse_scan(d: torch.Tensor, w: torch.Tensor | float) -> torch.Tensor:
    """Solve A[k] = d[k] + w[k] * A[k+1], A[K] = 0, along dim 0. Shape: (K, N) -> (K, N).

    ``w`` is a tensor like ``d`` or a float. Rows of padding must have d = 0 (then A = 0 there
    whatever w is). May reuse ``d``'s memory.
    """
    k, n = d.shape
    scalar = not isinstance(w, torch.Tensor)
    if k <= _SEQUENTIAL_STEPS:
        out = torch.empty_like(d)
        acc = torch.zeros_like(d[0])
        for j in range(k - 1, -1, -1):
            if scalar:
                acc = torch.add(d[j], acc, alpha=w, out=out[j])
            else:
                acc = torch.addcmul(d[j], w[j], acc, out=out[j])
        return out

    block = _scan_block(k)
    n_blocks = -(-k // block)
    if n_blocks * block != k:  # pad with zero steps (a copy; packed inputs are rarely ragged)
        d = torch.cat([d, d.new_zeros(n_blocks * block - k, n)])
        if not scalar:
            w = torch.cat([w, w.new_zeros(n_blocks * block - k, n)])
    d3 = d.view(n_blocks, block, n)
    # Inside each block with a zero boundary: local[j] = d[j] + w[j] * local[j+1], and
    # gain[j] = product of w from j to the block's end: how much of the next block's A reaches j.
    local = torch.empty_like(d3)
    acc = torch.zeros_like(d3[:, 0])
    if scalar:
        for j in range(block - 1, -1, -1):
            acc = torch.add(d3[:, j], acc, alpha=w, out=local[:, j])
        powers = torch.arange(block, 0, -1, dtype=d.dtype, device=d.device)
        gain = torch.pow(w, powers)[None, :, None]
        start_w = float(gain[0, 0, 0])
    else:
        w3 = w.view(n_blocks, block, n)
        gain = torch.empty_like(d3)
        prod = torch.ones_like(acc)
        for j in range(block - 1, -1, -1):
            acc = torch.addcmul(d3[:, j], w3[:, j], acc, out=local[:, j])
            prod = torch.mul(w3[:, j], prod, out=gain[:, j])
        start_w = gain[:, 0]
    starts = _reverse_scan(local[:, 0].clone(), start_w)
    next_start = torch.zeros_like(starts)
    next_start[:-1] = starts[1:]
    local.addcmul_(gain, next_start[:, None, :])
    return local.view(n_blocks * block, n)[:k]
