"""Learning-rate schedules, shared by the warm start's SFT (learner/sft.py) and RL
(learner/trainer.py). Pure: a step number in, a learning rate out.

``lr_at(s, ...)`` for step s (1-based) of ``steps``: ``lr`` throughout (``constant``), or a
linear warm-up over ``warmup`` steps, then a cosine from ``lr`` down to ``floor * lr`` at the
last step and after it (``cosine``).
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine")


def lr_at(step: int, *, lr: float, steps: int, schedule: str = "constant", warmup: int = 0,
          floor: float = 0.0) -> float:
    """The learning rate of ``step``; see the module docstring."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"floor must be in [0, 1], got {floor}")
    if schedule == "constant":
        return lr
    if warmup and step <= warmup:
        return lr * step / warmup
    progress = min(1.0, (step - warmup) / max(steps - warmup, 1))
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))
