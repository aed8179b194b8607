"""Straightforward per-token loops for the estimators in learner/advantages.py.

The reference the vectorised code is tested against and the baseline its benchmark is measured
against. Written to read like the estimators' definitions, one Python float at a time.
"""

from __future__ import annotations

import math

import torch


def _rows(*tensors):
    return [t.tolist() if t is not None else None for t in tensors]


def _trace(log_rho, clip):
    return 1.0 if log_rho is None else min(clip, math.exp(log_rho))


def _turns(positions, turn_end):
    """Split a row's policy positions into turns (runs closed by a turn_end)."""
    turns, current = [], []
    for p in positions:
        current.append(p)
        if turn_end[p]:
            turns.append(current)
            current = []
    if current:
        turns.append(current)
    return turns


def masked_gae(rewards, values, mask, *, gamma, lam, log_rho=None, rho_clip=1.0, c_clip=1.0):
    R, V, M, LR = _rows(rewards, values, mask.bool(), log_rho)
    adv = [[0.0] * len(row) for row in R]
    ret = [[0.0] * len(row) for row in R]
    for b in range(len(R)):
        pos = [i for i, m in enumerate(M[b]) if m]
        a_next = 0.0
        for k in range(len(pos) - 1, -1, -1):
            p = pos[k]
            v_next = V[b][pos[k + 1]] if k + 1 < len(pos) else 0.0
            delta = R[b][p] + gamma * v_next - V[b][p]
            lr = LR[b][p] if LR is not None else None
            a = _trace(lr, rho_clip) * delta + gamma * lam * _trace(lr, c_clip) * a_next
            adv[b][p], ret[b][p] = a, a + V[b][p]
            a_next = a
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def turn_advantages(R, V, LR, turns, *, gamma_turn, lam_turn, rho_clip, c_clip):
    """A_turn for each turn of one row."""
    out = [0.0] * len(turns)
    a_next = 0.0
    for t in range(len(turns) - 1, -1, -1):
        e = turns[t][-1]
        v_next = V[turns[t + 1][-1]] if t + 1 < len(turns) else 0.0
        delta = R[e] + gamma_turn * v_next - V[e]
        lr = sum(LR[p] for p in turns[t]) if LR is not None else None
        a = _trace(lr, rho_clip) * delta + gamma_turn * lam_turn * _trace(lr, c_clip) * a_next
        out[t] = a_next = a
    return out


def bi_level_gae(rewards, values, mask, turn_end, *, gamma_token, gamma_turn, lam_token, lam_turn,
                 log_rho=None, rho_clip=1.0, c_clip=1.0):
    R, V, M, E, LR = _rows(rewards, values, mask.bool(), turn_end.bool(), log_rho)
    adv = [[0.0] * len(row) for row in R]
    ret = [[0.0] * len(row) for row in R]
    for b in range(len(R)):
        turns = _turns([i for i, m in enumerate(M[b]) if m], E[b])
        lrow = LR[b] if LR is not None else None
        a_turn = turn_advantages(R[b], V[b], lrow, turns, gamma_turn=gamma_turn,
                                 lam_turn=lam_turn, rho_clip=rho_clip, c_clip=c_clip)
        for t, turn in enumerate(turns):
            a_next = a_turn[t]
            e = turn[-1]
            adv[b][e] = a_next
            for k in range(len(turn) - 2, -1, -1):
                p, nxt = turn[k], turn[k + 1]
                delta = R[b][p] + gamma_token * V[b][nxt] - V[b][p]
                lr = lrow[p] if lrow is not None else None
                a = _trace(lr, rho_clip) * delta + gamma_token * lam_token * _trace(lr, c_clip) * a_next
                adv[b][p] = a_next = a
            for p in turn:
                ret[b][p] = adv[b][p] + V[b][p]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def turn_wise_gae(rewards, values, mask, turn_end, *, gamma_turn, lam_turn, log_rho=None,
                  rho_clip=1.0, c_clip=1.0):
    R, V, M, E, LR = _rows(rewards, values, mask.bool(), turn_end.bool(), log_rho)
    adv = [[0.0] * len(row) for row in R]
    ret = [[0.0] * len(row) for row in R]
    for b in range(len(R)):
        turns = _turns([i for i, m in enumerate(M[b]) if m], E[b])
        a_turn = turn_advantages(R[b], V[b], LR[b] if LR is not None else None, turns,
                                 gamma_turn=gamma_turn, lam_turn=lam_turn, rho_clip=rho_clip,
                                 c_clip=c_clip)
        for t, turn in enumerate(turns):
            for p in turn:
                adv[b][p], ret[b][p] = a_turn[t], a_turn[t] + V[b][p]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def grpo(scores, group_ids, *, eps=1e-6, scale=True):
    s, g = scores.tolist(), group_ids.tolist()
    out = []
    for i, x in enumerate(s):
        members = [s[j] for j in range(len(s)) if g[j] == g[i]]
        if len(members) < 2:
            out.append(0.0)
            continue
        mean = sum(members) / len(members)
        std = math.sqrt(sum((m - mean) ** 2 for m in members) / (len(members) - 1))
        out.append((x - mean) / (std + eps) if scale else x - mean)
    return torch.tensor(out, dtype=torch.float64)


def random_episode_batch(batch: int, length: int, *, generator: torch.Generator,
                         max_turns: int = 6, dtype=torch.float32):
    """Multi-turn rows: a prompt, then alternating assistant turns and observations, then padding.

    Returns rewards, values, mask, turn_end, log_rho; each (B, L). Rewards sit on turn ends plus a
    small per-token term (a KL penalty, say); off-mask entries hold garbage (NaN) to prove they
    are ignored.
    """
    g = generator
    mask = torch.zeros(batch, length, dtype=torch.bool)
    turn_end = torch.zeros_like(mask)
    for b in range(batch):
        i = int(torch.randint(0, max(1, length // 8), (1,), generator=g))
        turns = int(torch.randint(1, max_turns + 1, (1,), generator=g))
        for t in range(turns):
            n = int(torch.randint(1, max(2, length // (2 * turns)), (1,), generator=g))
            if i + n > length:
                break
            mask[b, i:i + n] = True
            last_turn_open = t == turns - 1 and bool(torch.rand((), generator=g) < 0.3)
            if not last_turn_open:
                turn_end[b, i + n - 1] = True
            i += n + int(torch.randint(0, max(1, length // (3 * turns)), (1,), generator=g))
    rewards = 0.01 * torch.randn(batch, length, generator=g, dtype=dtype)
    rewards = rewards + turn_end * torch.randn(batch, length, generator=g, dtype=dtype)
    values = torch.randn(batch, length, generator=g, dtype=dtype)
    log_rho = 0.3 * torch.randn(batch, length, generator=g, dtype=dtype)
    nan = torch.tensor(float("nan"), dtype=dtype)
    rewards, values, log_rho = (torch.where(mask, x, nan) for x in (rewards, values, log_rho))
    return rewards, values, mask, turn_end, log_rho
