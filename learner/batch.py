"""From received trajectories to the learner's padded tensors, with rewards placed on tokens.

Called by the learner's train step on each batch the trajectory buffer hands out. Pure: torch and
numpy only, no process groups. Invariants:
- rows are right-padded to the longest trajectory; padding has loss_mask False, turn_end False,
  token id ``pad_id``, policy_version -1;
- reward placement follows VAGEN. Multi-turn reward on: turn t's reward sits on turn t's last
  token and the final reward is added on the episode's last policy token (the last turn's end).
  Off: one scalar, the sum of all turn rewards plus the final reward, on the last policy token of the episode;
- an optional per-token KL penalty, -kl_coef * (log pi_behaviour - log pi_ref), is added on every
  policy token (VAGEN's KL in the reward, k1 estimator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from transport.schema import Trajectory


@dataclass
class Batch:
    """Tensors of one training batch. Every per-token tensor is Shape (B, L)."""

    token_ids: torch.Tensor
    """int64."""
    loss_mask: torch.Tensor
    """bool: the policy's tokens."""
    turn_end: torch.Tensor
    """bool: the last policy token of each turn."""
    behaviour_logprobs: torch.Tensor
    """float32, 0 off the mask."""
    policy_version: torch.Tensor
    """int64, -1 off the mask."""
    token_rewards: torch.Tensor
    """float32: rewards placed on tokens (see the module docstring), 0 elsewhere."""
    scores: torch.Tensor
    """float32, Shape: (B,): each episode's total reward (for GRPO and logging)."""
    group_ids: torch.Tensor
    """int64, Shape: (B,)."""


def collate(trajectories: Sequence[Trajectory], *, multi_turn_reward: bool = True,
            pad_id: int = 0) -> Batch:
    """Pad and stack ``trajectories`` into a Batch, placing their rewards on tokens."""
    if not trajectories:
        raise ValueError("cannot collate an empty batch")
    length = max(len(t.token_ids) for t in trajectories)
    rows = len(trajectories)
    token_ids = np.full((rows, length), pad_id, dtype=np.int64)
    loss_mask = np.zeros((rows, length), dtype=bool)
    turn_end = np.zeros((rows, length), dtype=bool)
    behaviour = np.zeros((rows, length), dtype=np.float32)
    version = np.full((rows, length), -1, dtype=np.int64)
    rewards = np.zeros((rows, length), dtype=np.float32)
    scores = np.zeros(rows, dtype=np.float32)
    for b, t in enumerate(trajectories):
        n = len(t.token_ids)
        token_ids[b, :n] = t.token_ids
        loss_mask[b, :n] = t.loss_mask
        turn_end[b, :n] = t.turn_end
        behaviour[b, :n] = np.where(t.loss_mask, t.behaviour_logprobs, 0.0)
        version[b, :n] = np.where(t.loss_mask, t.policy_version, -1)
        rewards[b, :n] = place_rewards(t, multi_turn_reward=multi_turn_reward)
        scores[b] = float(t.turn_rewards.sum()) + t.final_reward
    return Batch(
        token_ids=torch.from_numpy(token_ids),
        loss_mask=torch.from_numpy(loss_mask),
        turn_end=torch.from_numpy(turn_end),
        behaviour_logprobs=torch.from_numpy(behaviour),
        policy_version=torch.from_numpy(version),
        token_rewards=torch.from_numpy(rewards),
        scores=torch.from_numpy(scores),
        group_ids=torch.tensor([t.group_id for t in trajectories], dtype=torch.int64),
    )


def place_rewards(t: Trajectory, *, multi_turn_reward: bool = True) -> np.ndarray:
    """One trajectory's rewards on its tokens. Shape: (L,) float32."""
    out = np.zeros(len(t.token_ids), dtype=np.float32)
    policy = np.flatnonzero(t.loss_mask)
    if policy.size == 0:
        return out
    # The episode's last policy token ends its last turn (an unclosed trailing turn included).
    if multi_turn_reward:
        out[np.flatnonzero(t.turn_end)] = t.turn_rewards
        out[policy[-1]] += t.final_reward
    else:
        out[policy[-1]] = float(t.turn_rewards.sum()) + t.final_reward
    return out


def kl_penalty(batch: Batch, ref_logprobs: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """``batch.token_rewards`` minus kl_coef * (log pi_behaviour - log pi_ref) on policy tokens."""
    kl = torch.where(batch.loss_mask, batch.behaviour_logprobs - ref_logprobs, 0.0)
    return batch.token_rewards - kl_coef * kl
