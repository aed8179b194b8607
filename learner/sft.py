"""Supervised fine-tuning on demonstration trajectories: the warm start's loss and its loop.

Called by launch/model/warm_start.py before RL, in one process (no process group: the models it is for
train in seconds to minutes). Pure torch; the trajectories come from actors/demonstrations.py
through the wire schema, collated by learner.batch like RL batches. A vision-language model's
trajectories carry images: ``train_sft`` gets the model's ``learner.vision.ImageInputs`` and
feeds every forward the pixel values, patch grids and modality ids (M-RoPE) of its batch, as
learner/trainer.py does.

Invariants:
- the loss is the token mean, over the whole batch, of the cross-entropy of the policy's tokens
  (``loss_mask``, the demonstrated answers and their end-of-turn tokens); token i is predicted by
  the logits at position i - 1, so the first token of a row is never a target;
- rows are right-padded and attention is causal, so padding never reaches a real position and
  no attention mask is needed; tokens off the mask have no influence on the loss except as
  context for later tokens;
- ``train_sft`` is deterministic in ``seed`` (batch order); each step draws ``batch_size``
  trajectories from a fresh shuffle of the data once the previous one is used up;
- the learning rate of step s (1-based) is ``learner.schedule.lr_at(s, ...)``: ``lr`` throughout
  (``constant``) or a linear warm-up over ``warmup`` steps, then a cosine from ``lr`` down to 0
  at the last step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from learner.batch import Batch, collate
from learner.models import token_scores
from learner.schedule import lr_at
from learner.vision import ImageInputs
from transport.schema import Trajectory


def sft_loss(model, batch: Batch, inputs: dict | None = None, *,
             total_tokens: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean cross-entropy on ``batch.loss_mask`` and its metrics.

    ``model(input_ids, **inputs).logits`` has Shape (B, L, V) (``learner.models.token_scores``
    scores it in chunks of positions); token_ids and loss_mask Shape
    (B, L); ``inputs``: more keyword arguments of the forward (a VLM's image inputs,
    ``image_inputs``). ``total_tokens``: the batch is a micro-batch of a larger one with that
    many target tokens; the loss is then this part's sum divided by it, so the parts' losses
    (and gradients) add up to the whole batch's mean. Metrics: ``sft/loss``,
    ``sft/token_accuracy`` (greedy next-token prediction right), ``sft/tokens`` (the number of
    target tokens), of this batch.
    """
    device = next(model.parameters()).device
    ids = batch.token_ids.to(device)
    targets, mask = ids[:, 1:], batch.loss_mask[:, 1:].to(device)
    inputs = {k: v.to(device) for k, v in (inputs or {}).items()}
    tokens = targets[mask]
    if tokens.numel() == 0:
        raise ValueError("the batch has no policy tokens to learn")
    # scored in chunks of positions (learner/models.py): no (B, L, V) logits are held
    scores = token_scores(model, ids, 1.0, top=True, inputs=inputs)
    loss = -scores.logp[:, 1:][mask].mean()
    with torch.no_grad():
        accuracy = scores.top[:, 1:][mask].float().mean()
    metrics = {"sft/loss": float(loss.detach()), "sft/token_accuracy": float(accuracy),
               "sft/tokens": float(tokens.numel())}
    if total_tokens is not None:
        loss = loss * (tokens.numel() / total_tokens)
    return loss, metrics


def image_inputs(images: ImageInputs | None, trajectories: Sequence[Trajectory],
                 batch: Batch) -> dict:
    """The forward's image inputs for ``batch``, collated from ``trajectories`` in order ({} when
    none has images)."""
    if not any(t.images for t in trajectories):
        return {}
    if images is None:
        raise ValueError("trajectories with images: give train_sft the model's image inputs "
                         "(images=learner.vision.ImageInputs(<a VLM>))")
    return images.model_inputs(images.encode(trajectories), batch.token_ids)


def train_sft(model, trajectories: Sequence[Trajectory], *, steps: int, batch_size: int,
              lr: float, seed: int, pad_id: int = 0, weight_decay: float = 0.0,
              grad_clip: float = 1.0, schedule: str = "constant", warmup: int = 0,
              log_every: int = 10, images: ImageInputs | None = None, micro_batch_size: int = 0,
              on_log: Callable[[dict[str, float]], None] | None = None) -> list[dict[str, float]]:
    """``steps`` AdamW steps on mini-batches of ``trajectories``; returns every step's metrics.

    ``on_log`` gets the metrics of every ``log_every``-th step and of the last one. ``images``:
    a vision-language model's image processor, needed when the trajectories carry images.
    ``micro_batch_size``: each batch is run as forwards of that many rows, longest first, each
    padded only to its own longest row, with gradients accumulated to the whole batch's token
    mean: the same update with less padding (0: one forward of the whole batch).
    """
    if steps < 0 or batch_size < 1 or not trajectories:
        raise ValueError(f"need steps >= 0, batch_size >= 1 and trajectories, got {steps}, "
                         f"{batch_size}, {len(trajectories)}")
    lr_at(1, lr=lr, steps=steps, schedule=schedule, warmup=warmup)  # a bad schedule fails here
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()
    order: list[int] = []
    history = []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        while len(order) < batch_size:
            order += rng.permutation(len(trajectories)).tolist()
        rows, order = order[:batch_size], order[batch_size:]
        chosen = [trajectories[i] for i in rows]
        step_lr = lr_at(step, lr=lr, steps=steps, schedule=schedule, warmup=warmup)
        for group in optimizer.param_groups:
            group["lr"] = step_lr
        optimizer.zero_grad(set_to_none=True)
        metrics = _accumulate(model, chosen, pad_id, images, micro_batch_size)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or float("inf"))
        optimizer.step()
        metrics.update({"step": float(step), "optim/grad_norm": float(norm), "optim/lr": step_lr,
                        "time/step_s": time.perf_counter() - t0})
        history.append(metrics)
        if on_log is not None and (step % log_every == 0 or step == steps):
            on_log(metrics)
    model.eval()
    return history


def _accumulate(model, chosen: Sequence[Trajectory], pad_id: int, images: ImageInputs | None,
                micro_batch_size: int) -> dict[str, float]:
    """Backward the batch's token-mean loss, in micro-batches of ``micro_batch_size`` rows
    (longest first; 0: the whole batch in its order, one forward); returns the whole batch's
    metrics."""
    rows = sorted(chosen, key=lambda t: len(t.token_ids), reverse=True) if micro_batch_size else chosen
    size = micro_batch_size or len(rows)
    total = sum(int(t.loss_mask[1:].sum()) for t in rows)
    if total == 0:
        raise ValueError("the batch has no policy tokens to learn")
    loss_sum = right = 0.0
    for i in range(0, len(rows), size):
        part = rows[i:i + size]
        if not any(t.loss_mask[1:].any() for t in part):
            continue  # nothing to learn here, and nothing it could add to the batch's mean
        batch = collate(part, pad_id=pad_id)
        loss, metrics = sft_loss(model, batch, image_inputs(images, part, batch), total_tokens=total)
        loss.backward()
        loss_sum += metrics["sft/loss"] * metrics["sft/tokens"]
        right += metrics["sft/token_accuracy"] * metrics["sft/tokens"]
    return {"sft/loss": loss_sum / total, "sft/token_accuracy": right / total, "sft/tokens": float(total)}
