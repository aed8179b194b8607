"""A Trajectory's wire form in compiled code (transport/_wire.c, built by the install), for
transport/schema.py: the sender's encoding and the receiver's checks and arrays, one pass each.

- The per-token flags byte (``pack``): a flag is loss_mask + turn_end: 0 an environment token,
  1 a policy token, 2 the policy token that ends a turn.
- ``encode_into``: the whole message, byte for byte what msgspec writes (schema.py falls back
  to msgspec for anything off the common path).
- ``columns``: a received message's six per-token arrays, made in one pass that also checks
  the flags, and that the log-probs and the turn rewards are finite (a receiver reads each byte
  of a message once); ``trajectory``: the whole Trajectory around them.

Where the module is not built, numpy and msgspec do the same: the results are equal
(tests/unit/transport/test_wire.py) and the fallbacks cost a few µs more a message; ``COMPILED``
says which one runs.
"""

from __future__ import annotations

import numpy as np

try:
    from transport import _wire
except ImportError:  # not built (a checkout without the install step): numpy does the same
    _wire = None

COMPILED = _wire is not None
BAD_FLAG, NON_FINITE, TOO_LONG, BAD_LENGTHS = -1, -2, -3, -4
"""Why a message is invalid, as ``columns`` and ``trajectory`` say it: a flag above
2, a log-prob or reward that is not finite, more tokens than the limit, per-token fields whose
lengths disagree with the flags (or rewards that are not float32s)."""


def pack(loss_mask: np.ndarray, turn_end: np.ndarray) -> bytes | None:
    """loss_mask + turn_end as one byte a token; None when a turn end lies outside loss_mask or
    the lengths differ. Both are bool arrays."""
    if _wire is not None:
        try:
            return _wire.pack(loss_mask, turn_end)
        except (TypeError, ValueError, BufferError):  # not contiguous: numpy takes any layout
            pass
    return pack_numpy(loss_mask, turn_end)


def pack_numpy(loss_mask: np.ndarray, turn_end: np.ndarray) -> bytes | None:
    """``pack`` in numpy (the reference the compiled one must equal)."""
    loss, turn = np.asarray(loss_mask, bool), np.asarray(turn_end, bool)
    if loss.shape != turn.shape or np.any(turn & ~loss):
        return None
    return np.add(loss, turn, dtype=np.uint8).tobytes()


def encode_into(trajectory, buffer: bytearray) -> bool:
    """Write the trajectory's msgpack over ``buffer`` in compiled code; False where that is not
    built or the trajectory is off its common path (schema.py then encodes through msgspec)."""
    return _wire is not None and _wire.encode_into(trajectory, buffer)


def trajectory(cls, image_cls, msg, max_tokens: int):
    """The Trajectory ``cls`` of a decoded message (transport/schema.py's ``_WireTrajectory``),
    its images made with ``image_cls``, or an int saying why it is invalid (the constants above,
    or the number of turn ends that the rewards do not match); None where transport/_wire.c
    is not built (schema.py then builds it in Python). The schema version is checked first."""
    return None if _wire is None else _wire.trajectory(cls, image_cls, msg, max_tokens)


def columns(flags, token_ids, logprobs, versions, rewards) -> tuple[np.ndarray, ...] | int:
    """A received message's six per-token arrays (token_ids, loss_mask, turn_end, logprobs,
    versions, rewards), or an int when they are invalid: ``BAD_FLAG``, ``NON_FINITE``, or the
    number of turn ends when the rewards do not match it. The arrays are read-only views of the
    wire fields, the masks excepted. The caller has checked that ``token_ids``, ``logprobs``
    and ``versions`` hold 4 bytes a flag and ``rewards`` a multiple of 4."""
    if _wire is None:
        return columns_numpy(flags, token_ids, logprobs, versions, rewards)
    return _wire.columns(flags, token_ids, logprobs, versions, rewards)


def columns_numpy(flags, token_ids, logprobs, versions, rewards) -> tuple[np.ndarray, ...] | int:
    """``columns`` in numpy (the reference the compiled one must equal)."""
    bits = np.frombuffer(flags, np.uint8)
    if bits.size and bits.max() > 2:
        return BAD_FLAG
    if not (np.isfinite(np.frombuffer(logprobs, "<f4")).all()
            and np.isfinite(np.frombuffer(rewards, "<f4")).all()):
        return NON_FINITE
    loss_mask, turn_end = bits != 0, bits == 2
    turns = int(np.count_nonzero(turn_end))
    if len(rewards) != 4 * turns:
        return turns
    return (np.frombuffer(token_ids, "<i4"), loss_mask, turn_end, np.frombuffer(logprobs, "<f4"),
            np.frombuffer(versions, "<i4"), np.frombuffer(rewards, "<f4"))
