"""transport/heap.py: freed blocks go back to the system at a trim; with keep_freed, not before."""

from __future__ import annotations

import ctypes
import subprocess
import sys

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


_FREE_AND_MEASURE = """
import ctypes, sys
import psutil
from transport import heap
if sys.argv[1] == "keep":
    assert heap.keep_freed()
libc = heap._libc()
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
rss = lambda: psutil.Process().memory_info().rss
size, count = 256 << 10, 128  # 32 MiB of message-sized blocks, above glibc's first mmap threshold
heap.trim()
before = rss()
blocks = [libc.malloc(size) for _ in range(count)]
for b in blocks:
    ctypes.memset(b, 1, size)
filled = rss()
for b in reversed(blocks):  # the heap's top first: plain glibc would shrink the heap as it goes
    libc.free(b)
freed = rss()
trimmed = heap.trim()
print((filled - before) >> 20, (freed - before) >> 20, (rss() - before) >> 20, trimmed)
"""


@pytest.mark.skipif(heap._libc() is None, reason="needs glibc's mallopt")
@pytest.mark.parametrize("mode", ["keep", "defaults"])
def test_keep_freed_keeps_freed_message_blocks_mapped_until_a_trim(mode):
    out = subprocess.run([sys.executable, "-c", _FREE_AND_MEASURE, mode], check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()
    filled, freed, trimmed, gave_back = int(out[0]), int(out[1]), int(out[2]), out[3] == "True"
    assert filled >= 30
    if mode == "keep":  # still resident after the frees, for the next messages to reuse
        assert freed >= 30 and gave_back and trimmed <= 2
    else:  # glibc's defaults: returned at once, page by page faulted in again next time
        assert freed <= 2
