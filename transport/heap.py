"""Give freed heap memory back to the operating system (glibc's ``malloc_trim``).

A long run allocates and frees blocks of every size each step: batches of variable length and
the gathered state dict of every publish in the learner, the temporaries of every weight reload
in the vLLM worker (a weight broadcast's bucket buffers are kept and reused). glibc keeps freed blocks
inside its arenas, and when live blocks sit between them it cannot shrink the heap, so resident
memory creeps up over hours although nothing leaks. ``malloc_trim(0)`` hands every free page in
every arena back (it also releases pages in the middle of a heap), which bounds that creep; it
takes milliseconds, so the learner calls it once per step and the actor's vLLM worker once per
weight update.

A no-op where the C library is not glibc (macOS, musl).
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
