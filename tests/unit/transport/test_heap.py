"""transport/heap.py: freed blocks that glibc keeps behind a live one go back to the system."""

from __future__ import annotations

import ctypes

import psutil
import pytest

from transport import heap

BLOCK = 32 << 10  # below glibc's mmap threshold: served from the heap
BLOCKS = 4096  # 128 MiB


@pytest.mark.skipif(heap._libc() is None, reason="needs glibc's malloc_trim")
def test_trim_returns_free_pages_held_behind_a_live_block():
    libc = heap._libc()
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    rss = psutil.Process().memory_info
    heap.trim()
    before = rss().rss
    blocks = [libc.malloc(BLOCK) for _ in range(BLOCKS)]
    guard = libc.malloc(BLOCK)  # keeps the heap's top in use: free() alone cannot shrink it
    try:
        assert all(blocks) and guard
        for b in blocks:
            ctypes.memset(b, 1, BLOCK)  # resident
        filled = rss().rss
        assert filled - before > 0.9 * BLOCK * BLOCKS
        for b in blocks:
            libc.free(b)
        freed = rss().rss
        assert freed - before > 0.9 * BLOCK * BLOCKS, "glibc gave the pages back without a trim"
        assert heap.trim()
        assert freed - rss().rss > 0.9 * BLOCK * BLOCKS
    finally:
        libc.free(guard)
