"""The per-token flags byte of a Trajectory on the wire: packed by the sender, unpacked and checked
by the receiver (transport/schema.py), once a message each.

A flag is loss_mask + turn_end: 0 an environment token, 1 a policy token, 2 the policy token that
ends a turn. ``unpack`` also checks that the log-probs and the turn rewards are finite, so that
a receiver reads each byte of a message once. Both run in compiled code (transport/_flags.c,
built by the install) when it is built and in numpy otherwise; the two give the same results
(tests/unit/transport/test_flags.py). The numpy path costs a few µs more a message: ``COMPILED``
says which one runs.
"""

from __future__ import annotations

import numpy as np

try:
    from transport import _flags
except ImportError:  # not built (a checkout without the install step): numpy does the same
    _flags = None

COMPILED = _flags is not None
BAD_FLAG, NON_FINITE = -1, -2
"""What ``unpack`` returns for a flag above 2, and for a log-prob or reward that is not finite."""


def pack(loss_mask: np.ndarray, turn_end: np.ndarray) -> bytes | None:
    """loss_mask + turn_end as one byte a token; None when a turn end lies outside loss_mask or
    the lengths differ. Both are bool arrays."""
    if _flags is not None:
        try:
            return _flags.pack(loss_mask, turn_end)
        except (TypeError, ValueError, BufferError):  # not contiguous: numpy takes any layout
            pass
    return pack_numpy(loss_mask, turn_end)


def unpack(flags, logprobs, rewards) -> tuple[np.ndarray, np.ndarray, int]:
    """(loss_mask, turn_end, turns) from a message's flags, checking the flags and that the
    float32 ``logprobs`` (4 bytes a flag) and ``rewards`` are finite; ``turns`` is the number of
    turn ends, or ``BAD_FLAG`` / ``NON_FINITE`` (the masks are then meaningless). ``flags``,
    ``logprobs`` and ``rewards`` are bytes-like."""
    if _flags is None:
        return unpack_numpy(flags, logprobs, rewards)
    n = len(flags)
    masks = np.empty(2 * n, np.bool_)
    turns = _flags.unpack(flags, logprobs, rewards, masks)
    return masks[:n], masks[n:], turns


def pack_numpy(loss_mask: np.ndarray, turn_end: np.ndarray) -> bytes | None:
    """``pack`` in numpy (the reference the compiled one must equal)."""
    loss, turn = np.asarray(loss_mask, bool), np.asarray(turn_end, bool)
    if loss.shape != turn.shape or np.any(turn & ~loss):
        return None
    return np.add(loss, turn, dtype=np.uint8).tobytes()


def unpack_numpy(flags, logprobs, rewards) -> tuple[np.ndarray, np.ndarray, int]:
    """``unpack`` in numpy (the reference the compiled one must equal)."""
    bits = np.frombuffer(flags, np.uint8)
    loss_mask, turn_end = bits != 0, bits == 2
    if bits.size and bits.max() > 2:
        return loss_mask, turn_end, BAD_FLAG
    finite = (np.isfinite(np.frombuffer(logprobs, "<f4")).all()
              and np.isfinite(np.frombuffer(rewards, "<f4")).all())
    return loss_mask, turn_end, int(np.count_nonzero(turn_end)) if finite else NON_FINITE
