"""When freed heap memory goes back to the operating system: at once (glibc's defaults), when a
step ends (``trim``), or when much of it is free (``keep_freed``).

A long run allocates and frees blocks of every size each step: batches of variable length and
the gathered state dict of every publish in the learner, the temporaries of every weight reload
in the vLLM worker (a weight broadcast's bucket buffers are kept and reused). glibc keeps freed blocks
inside its arenas, and when live blocks sit between them it cannot shrink the heap, so resident
memory creeps up over hours although nothing leaks. ``malloc_trim(0)`` hands every free page in
every arena back (it also releases pages in the middle of a heap), which bounds that creep; it
takes milliseconds, so the learner calls it once per step and the actor's vLLM worker once per
weight update.

The trajectory stream wants the opposite between steps: ``keep_freed`` keeps the blocks of
received and sent messages mapped, for the next messages to reuse. A no-op where the C library
is not glibc (macOS, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    lib = ctypes.CDLL(name) if name else None
    return lib if lib is not None and hasattr(lib, "malloc_trim") else None


def trim() -> bool:
    """Release the free pages of every malloc arena; True if any memory went back."""
    lib = _libc()
    return bool(lib.malloc_trim(ctypes.c_size_t(0))) if lib is not None else False


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD_MAX = 32 << 20  # the largest glibc accepts on 64-bit hosts


def keep_freed(trim_threshold: int = 64 << 20) -> bool:
    """Serve blocks up to ``MMAP_THRESHOLD_MAX`` from the heap, and shrink the heap only when more
    than ``trim_threshold`` bytes are free at its top (or at ``trim()``). True where set.

    For the trajectory stream's two ends. ZeroMQ allocates each message (hundreds of KiB at 16k
    tokens) on one thread and frees it on another, and the receiver frees them several at a
    time. glibc's defaults give such memory back to the system at once (a block above its
    adaptive mmap threshold is unmapped when freed; a free that leaves twice that threshold at
    a heap's top shrinks the heap), and the next messages fault the same pages back in, zeroed:
    measured on a 2-core x86 machine, the stream ran at 0.73 of raw ZeroMQ's messages/s at 2k
    tokens with the defaults, 0.84-0.90 with this (docs/benchmarks.md). Free memory at a heap's
    top stays below ``trim_threshold``; free blocks inside a heap stay mapped until a ``trim()``
    (the learner's, every step). In an hour of the default job this held about 0.1 GiB more in
    the learner, none in the actor (docs/benchmarks.md, "Memory over an hour").
    """
    lib = _libc()
    if lib is None or not hasattr(lib, "mallopt"):
        return False
    return bool(lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
                and lib.mallopt(M_TRIM_THRESHOLD, min(trim_threshold, (1 << 31) - 1)))
