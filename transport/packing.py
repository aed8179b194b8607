"""Packing named tensors into flat buckets of bounded size, and the layout that undoes it.

Called by transport/weights.py on both ends of the weight broadcast: the learner's rank 0 packs
tensors into buckets and broadcasts each bucket as soon as it is full; each inference worker
receives a bucket into a buffer of its own and hands out views of it, so neither end ever holds
more than about one bucket per dtype beyond the model.

Invariants:
- A layout is the publisher's list of ``(name, dtype, shape)`` in publish order plus the bucket
  size in bytes (0: unbounded, one bucket per dtype); nothing else travels. Both ends derive the
  buckets from it with the same code: walking the tensors in order, each goes into the open
  bucket of its dtype, which is closed first if the tensor would take it past the bucket size
  (a tensor larger than the bucket size gets a bucket of its own). Buckets travel in the order
  they close; the ones still open at the end close in dtype-name order. So a bucket's tensors
  all come before the tensor that closed it: a publisher reading tensors one at a time can send
  each bucket once its last tensor is packed, and never needs to read ahead.
- Inside a bucket each tensor starts where the previous one ended (counted in elements), so
  every view is aligned for its dtype. A bucket of empty tensors only has no bytes to send.
- Only the dtypes in ``DTYPES`` are accepted (``from_bytes`` rejects others: the JSON never names
  an arbitrary attribute of torch).
- ``digest`` is a 63-bit hash of the canonical JSON, so it fits an int64 header slot.
- ``Bucket.unpack`` returns views into the bucket's buffer: no copy.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Sequence

import torch

DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8",
                 "uint8", "bool", "float8_e4m3fn", "float8_e5m2")
    if hasattr(torch, name)
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def dtype_name(dtype: torch.dtype, what: str = "tensor") -> str:
    """The layout's name of ``dtype``; ``ValueError`` for a dtype the layout does not carry."""
    if dtype not in _NAMES:
        raise ValueError(f"{what}: dtype {dtype} is not one of {sorted(DTYPES)}")
    return _NAMES[dtype]


@dataclass(frozen=True)
class Entry:
    """One tensor: its bucket and where it lives there (``offset``, ``numel`` in elements)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Bucket:
    """One flat buffer's worth of tensors of one dtype: the unit that travels."""

    index: int
    dtype: str
    numel: int
    entries: tuple[Entry, ...]
    last: int
    """The position of its last tensor in the layout: once that is packed, it is complete."""

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype].itemsize

    def allocate(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.empty(self.numel, dtype=DTYPES[self.dtype], device=device)

    def view(self, entry: Entry, buffer: torch.Tensor) -> torch.Tensor:
        return buffer.narrow(0, entry.offset, entry.numel).view(entry.shape)

    def unpack(self, buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """``(name, view)`` for every tensor of the bucket: views into ``buffer``, no copy."""
        return [(e.name, self.view(e, buffer)) for e in self.entries]


@dataclass(frozen=True)
class Layout:
    """Names, dtypes and shapes of a list of tensors, and the buckets they travel in."""

    entries: tuple[Entry, ...]
    buckets: tuple[Bucket, ...]
    bucket_bytes: int = 0

    @classmethod
    def build(cls, specs: Iterable[tuple[str, str, Sequence[int]]], bucket_bytes: int = 0) -> Layout:
        """Layout of ``(name, dtype name, shape)`` triples, in order, in buckets of at most
        ``bucket_bytes`` (0: one bucket per dtype); see the module docstring."""
        bucket_bytes = int(bucket_bytes)
        if bucket_bytes < 0:
            raise ValueError(f"bucket_bytes must be >= 0, got {bucket_bytes}")
        specs = list(specs)
        open_: dict[str, list[int]] = {}  # dtype -> indices of the open bucket's tensors
        used: dict[str, int] = {}  # dtype -> elements in its open bucket
        closed: list[tuple[str, list[int]]] = []
        shapes, seen = [], set()
        for i, (name, dtype, shape) in enumerate(specs):
            if dtype not in DTYPES:
                raise ValueError(f"tensor {name!r}: dtype {dtype!r} is not one of {sorted(DTYPES)}")
            if name in seen:
                raise ValueError(f"tensor {name!r} appears twice")
            seen.add(name)
            shape = tuple(int(d) for d in shape)
            if any(d < 0 for d in shape):
                raise ValueError(f"tensor {name!r}: negative dimension in {shape}")
            shapes.append(shape)
            numel, size = math.prod(shape), DTYPES[dtype].itemsize
            if (bucket_bytes and open_.get(dtype)
                    and (used[dtype] + numel) * size > bucket_bytes):
                closed.append((dtype, open_.pop(dtype)))
                used[dtype] = 0
            open_.setdefault(dtype, []).append(i)
            used[dtype] = used.get(dtype, 0) + numel
        closed += sorted(open_.items())
        entries: list[Entry | None] = [None] * len(specs)
        buckets = []
        for b, (dtype, members) in enumerate(closed):
            offset, mine = 0, []
            for i in members:
                entry = Entry(str(specs[i][0]), dtype, shapes[i], b, offset)
                offset += entry.numel
                entries[i] = entry
                mine.append(entry)
            buckets.append(Bucket(b, dtype, offset, tuple(mine), members[-1]))
        return cls(tuple(entries), tuple(buckets), bucket_bytes)

    @classmethod
    def of(cls, named_tensors: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int = 0) -> Layout:
        return cls.build(((name, dtype_name(t.dtype, f"tensor {name!r}"), t.shape)
                          for name, t in named_tensors), bucket_bytes)

    @classmethod
    def from_bytes(cls, data: bytes) -> Layout:
        raw = json.loads(data.decode("utf-8"))
        if not isinstance(raw, dict) or set(raw) != {"bucket_bytes", "tensors"}:
            raise ValueError("a layout is {\"bucket_bytes\": n, \"tensors\": [...]}")
        return cls.build(raw["tensors"], raw["bucket_bytes"])

    def to_bytes(self) -> bytes:
        return self._json

    @cached_property
    def _json(self) -> bytes:
        specs = [[e.name, e.dtype, list(e.shape)] for e in self.entries]
        raw = {"bucket_bytes": self.bucket_bytes, "tensors": specs}
        return json.dumps(raw, separators=(",", ":")).encode("utf-8")

    @cached_property
    def digest(self) -> int:
        raw = hashlib.blake2b(self._json, digest_size=8).digest()
        return int.from_bytes(raw, "little") & (2**63 - 1)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    @cached_property
    def largest_bucket_bytes(self) -> int:
        return max((b.nbytes for b in self.buckets), default=0)

    def pack_all(self, tensors: Sequence[torch.Tensor], device: torch.device | str = "cpu"
                 ) -> list[torch.Tensor]:
        """Every bucket's buffer, filled from ``tensors`` (in layout order): for tests and tools."""
        buffers = [b.allocate(device) for b in self.buckets]
        for entry, t in zip(self.entries, tensors, strict=True):
            self.buckets[entry.bucket].view(entry, buffers[entry.bucket]).copy_(t)
        return buffers
