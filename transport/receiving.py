"""What every trajectory receiver does with a payload: decode and validate it as a Trajectory,
or reject it and count the rejection.

Called by both backends of the learner's end of the trajectory stream: the ZeroMQ receiver
(transport/stream.py) and the in-process channel (transport/inprocess.py), so both decode,
validate and count in one way. Imports no socket library: the in-process backend stays free of
ZeroMQ.
Invariants:
- ``decode_trajectory`` returns a Trajectory checked by transport/schema.py, or raises
  ``Rejected`` with its kind: ``too_large`` (over the receiver's ``max_bytes``, not decoded),
  ``codec`` or ``schema``.
- ``count_rejected`` counts a rejection under its kind and under ``kind/actor``, and logs only
  the first of each kind; past ``MAX_SENDER_KEYS`` keys a new sender's rejections are counted
  under ``kind/others``, so senders that make up identities cannot grow the counter without
  bound.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from transport.codec import CodecError
from transport.schema import SchemaError, Trajectory

log = logging.getLogger(__name__)

MAX_SENDER_KEYS = 4096
"""The most ``kind/actor`` keys ``count_rejected`` keeps; later senders share ``kind/others``."""


class Rejected(Exception):
    """A payload that is not a valid trajectory: ``kind`` (too_large | codec | schema) counts it."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind, self.detail = kind, detail


def decode_trajectory(payload: bytes | memoryview, actor: str, max_bytes: int) -> Trajectory:
    """A received payload as a validated Trajectory (every receiver's one path), or ``Rejected``.
    ``payload`` is any buffer with a length: bytes, or a ZeroMQ frame received zero-copy."""
    if len(payload) > max_bytes:
        raise Rejected("too_large", f"{len(payload)} bytes from {actor!r}")
    try:
        return Trajectory.from_bytes(payload)
    except CodecError as e:
        raise Rejected("codec", str(e)) from None
    except SchemaError as e:
        raise Rejected("schema", str(e)) from None


def bounded_key(counter: Mapping[str, Any], key: str, overflow: str, limit: int = MAX_SENDER_KEYS) -> str:
    """``key``, or ``overflow`` once ``counter`` holds ``limit`` keys and not ``key``: names a
    sender makes up cannot grow a counter without bound."""
    return key if key in counter or len(counter) < limit else overflow


def count_rejected(rejected: Counter, kind: str, actor: str, detail: str) -> None:
    """Count a dropped message by kind and by ``kind/actor``; log the first of each kind."""
    if not rejected[kind]:
        log.warning("dropping malformed %s message (logged once per kind): %s", kind, detail)
    rejected[kind] += 1
    rejected[bounded_key(rejected, f"{kind}/{actor}", f"{kind}/others")] += 1
