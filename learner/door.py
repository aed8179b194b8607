"""What a trajectory must mean before the learner takes it: the checks at the learner's door.

A trajectory that passed the wire's checks (transport/schema.py: types, one length for every
per-token array, masks that nest, finite numbers) can still mean nothing to this learner: a
token id outside its vocabulary (the embedding lookup would fail mid-step), a first token marked
as the policy's (there is no logit to score it), a policy version ahead of the learner's (no
such weights were ever published), more tokens than the learner takes, an image that does not
decode. Any of these would end the learner's step, and the run with it; at the door each is
refused with its reason instead, counted, and its sender's credit returned.

Called by rank 0's receiving thread (learner/worker.py's ``Inbox``) for every trajectory before
it enters the buffer. Pure: no process group, no socket; images are only opened, not decoded
into arrays (their header and checksums are read).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from transport.schema import Trajectory

REASONS = ("first_token_policy", "token_out_of_vocab", "future_version", "too_long", "image")
"""Every reason ``Door.refusal`` gives, in the order it checks them."""


@dataclass(frozen=True)
class Door:
    """The learner's limits: ``vocab_size`` (the policy's embedding rows: ids must be below
    it) and ``max_tokens`` (the most tokens a trajectory may hold)."""

    vocab_size: int
    max_tokens: int

    def __post_init__(self) -> None:
        if self.vocab_size < 1 or self.max_tokens < 1:
            raise ValueError(f"vocab_size and max_tokens must be >= 1, got {self.vocab_size}, "
                             f"{self.max_tokens}")

    def refusal(self, t: Trajectory, version: int) -> str | None:
        """Why ``t`` cannot be trained on by a learner at policy ``version`` (one of
        ``REASONS``), or None if it can."""
        n = len(t.token_ids)
        if n and t.loss_mask[0]:
            return "first_token_policy"
        if n and (int(t.token_ids.min()) < 0 or int(t.token_ids.max()) >= self.vocab_size):
            return "token_out_of_vocab"
        versions = t.policy_version[t.loss_mask]
        if versions.size and int(versions.max()) > version:
            return "future_version"
        if n > self.max_tokens:
            return "too_long"
        if t.images and not all(_decodes(image.png, image.width, image.height) for image in t.images):
            return "image"
        return None


def _decodes(png: bytes, width: int, height: int) -> bool:
    """The PNG opens, its checksums hold (``verify``) and it is ``width`` x ``height``."""
    try:
        with Image.open(io.BytesIO(png)) as image:
            size = image.size
            image.verify()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return False  # PIL raises SyntaxError for some broken chunks
    return size == (width, height)

