"""The weight broadcast: learner rank 0 -> every inference worker, in a process group of its own.

``WeightPublisher`` runs on the learner's rank 0; ``WeightSubscriber`` runs inside each inference
worker (the actor's vLLM ``worker_extension_cls`` method receives, and hands the tensors to
``reload_weights`` as they arrive). Depends on torch only: no Ray, no event loop, no default
process group.

Group: the publisher hosts a ``TCPStore`` listening on its ``host`` only (port 0 picks a free port,
see ``.port``; the store has no authentication: whoever reaches that address can read and write
its keys, so on a cluster it belongs on a private network); the group of
rank 0 (publisher, the broadcast source) and ranks 1..world_size-1 (subscribers) rendezvouses
under the store prefix ``weights/{generation}``. The backend follows the publisher's tensors: gloo
for host memory, NCCL for GPU memory (each subscriber then receives into its own GPU's memory);
the publisher records it in its store, where subscribers read it. Both ends form the group
lazily, at their first publish / receive of a generation; each side waits at most ``timeout_s``
for the other. After a ``WeightSyncError`` the group is spent: the driver calls
``publisher.reform(world_size)`` (a new generation, also to admit a new or restarted worker) and
every live subscriber ``join(generation)``; the next publish / receive forms the new group.

Wire protocol of one publish, every message a broadcast from rank 0 (as uint8 bytes):
1. header, int64[3]: ``[version, layout digest, layout byte count]``; the count is 0 when this
   group already has the layout (the same layout as the last publish): nothing is resent;
2. only if the count is > 0: the layout as JSON (names, dtypes, shapes and the bucket size), see
   transport/packing.py, which derives the buckets from it identically on both ends;
3. the buckets, each one flat buffer of at most ``bucket_bytes`` (a single larger tensor alone),
   in the layout's order; buckets of no bytes are skipped.

Memory: the publisher reads its tensors one at a time (a lazy iterator: the learner gathers
each from its FSDP shards when the publish reaches it) and sends each bucket as soon as its last
tensor is packed, reusing its buffers; a subscriber receives each bucket into a buffer no reader
holds any more (its own, reused; a new one while the reader still holds the others: vLLM's
loader keeps a layer's tensors until the layer is complete) and yields its tensors before
receiving the next. So the memory beyond the model is about one bucket per dtype on either side,
plus what the reader holds back.

Invariants: versions strictly increase (the publisher refuses, a subscriber raises otherwise),
except that the first publish of a new generation may repeat the last version (a publish that
failed for some workers, or the current weights for a restarted worker, is re-sent). A publish
is read to its end before the next ``receive`` (a subscriber that stopped half-way is out of
step with the group: its next ``receive`` raises). Every wait is bounded by ``timeout_s`` (gloo):
a killed peer makes the other side raise within about a second, a silent one at ``timeout_s``
(gloo's sends wait for the receiver, even for the header). So publish and receive are called
together (the driver triggers both), within ``timeout_s``.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist

from transport.packing import DTYPES, Bucket, Layout, dtype_name

SOURCE = 0  # the publisher's rank: the only broadcast source
_CURRENT = "weights/current"  # store key: "{generation} {world_size} {backend}", for subscribers
DEFAULT_BUCKET_BYTES = 256 << 20


class WeightSyncError(RuntimeError):
    """The weight group failed (a peer died or went silent, or the protocol broke). Re-form it."""


def _new_group(store: dist.Store, generation: int, rank: int, world_size: int, backend: str,
               timeout: timedelta):
    prefixed = dist.PrefixStore(f"weights/{generation}", store)
    if backend == "gloo":
        return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    if backend == "nccl":
        # Untested here (no GPU); mirrors torch.distributed's own NCCL group construction. NCCL
        # work is asynchronous: a dead or silent peer is caught by NCCL's watchdog at `timeout`,
        # which by default tears the process down rather than raising in publish / receive.
        options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=False)
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")


def _device(backend: str) -> torch.device:
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _broadcast(group, tensor: torch.Tensor) -> None:
    if tensor.numel():
        group.broadcast(tensor.view(torch.uint8), SOURCE).wait()


class _Member:
    """What both ends share: one group per generation, formed lazily, dropped on failure."""

    def __init__(self, store: dist.TCPStore, rank: int, backend: str | None, timeout_s: float):
        self._store, self.rank, self.backend = store, rank, backend
        self._timeout = timedelta(seconds=timeout_s)
        self._group = None
        self._spent = False  # the group of this generation failed: wait for a new generation
        self.generation, self.world_size = -1, 0

    def _new_generation(self, generation: int, world_size: int) -> None:
        self._drop_group()
        self.generation, self.world_size, self._spent = generation, world_size, False

    def _formed_group(self):
        if self._spent:
            raise WeightSyncError(f"generation {self.generation} failed: re-form the group first")
        if self._group is None:
            self._group = _new_group(self._store, self.generation, self.rank, self.world_size,
                                     self.backend, self._timeout)
        return self._group

    def _fail(self, what: str, error: Exception) -> WeightSyncError:
        self._drop_group()
        self._spent = True
        return WeightSyncError(f"rank {self.rank}, generation {self.generation}: {what}: {error}")

    def _drop_group(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.abort()  # closes the connections now, so peers still waiting raise at once

    def close(self) -> None:
        """Leave the group; on the publisher this also stops the store."""
        self._drop_group()
        self._spent = True
        self._store = None


def listening_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """A master ``TCPStore`` that listens on ``host`` only (port 0: a free one), on a socket bound
    there and handed over (the store closes it): given none, TCPStore listens on every interface
    of the node. The weight group's store and the learner ranks' rendezvous both use it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family, backlog=1024)
    port = listener.getsockname()[1]
    return dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s), master_listen_fd=listener.detach())


class WeightPublisher(_Member):
    """Learner rank 0: hosts the rendezvous store and broadcasts named tensors from rank 0.

    ``world_size`` counts the publisher: 1 + the number of subscribers. ``backend`` None picks
    NCCL if the first tensor of the first publish is on a GPU, gloo otherwise; subscribers learn
    it from the store when they form a group. With NCCL, every process sets its CUDA device
    (``torch.cuda.set_device``) before its first publish / receive. ``bucket_bytes``: the most
    bytes one bucket holds (0: one bucket per dtype, the whole model at once).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, world_size: int = 2, *,
                 backend: str | None = None, timeout_s: float = 60.0,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        store = listening_store(host, port, timeout_s)
        super().__init__(store, SOURCE, backend, timeout_s)
        self.port: int = store.port
        self.address = f"tcp://{host}:{self.port}"
        """Where subscribers find the store (see transport/channels.py's ``weight_sink``)."""
        self.bucket_bytes = int(bucket_bytes)
        self.layouts_sent = 0
        self.buckets_sent = 0
        self.peak_buffer_bytes = 0
        """The most bytes of bucket buffers the publisher has held at once."""
        self.last_version: int | None = None
        self._layout: Layout | None = None
        self._free: dict[str, list[torch.Tensor]] = {}  # dtype -> buffers to reuse
        self._held = 0
        self._layout_in_group = False
        self.reform(world_size)

    def reform(self, world_size: int) -> int:
        """Start the next generation with ``world_size`` ranks and return its number."""
        self._new_generation(self.generation + 1, world_size)
        self._layout_in_group = False
        self._resend_ok = True
        self._record()
        return self.generation

    def _record(self) -> None:
        self._store.set(_CURRENT, f"{self.generation} {self.world_size} {self.backend or '-'}")

    def publish(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, *,
                specs: Sequence[tuple[str, str, Sequence[int]]] | None = None) -> None:
        """Broadcast ``named_tensors`` as ``version``; ``WeightSyncError`` if the group fails.

        ``specs``: every tensor's ``(name, dtype name, shape)`` in order, when ``named_tensors``
        is a lazy iterator (each tensor read only when the publish reaches it; nothing is read
        ahead); without ``specs`` the tensors are listed first. A tensor that does not match its
        spec raises ``ValueError`` (the group is then spent: re-form it). The first publish of
        a generation may repeat the last version (to bring a restarted worker up to date);
        otherwise versions strictly increase.
        """
        last = self.last_version
        if last is not None and (version < last or (version == last and not self._resend_ok)):
            raise ValueError(f"version {version} does not increase on {last}")
        tensors = iter(named_tensors)
        if specs is None:
            listed = list(tensors)
            specs = [(n, dtype_name(t.dtype, f"tensor {n!r}"), t.shape) for n, t in listed]
            tensors = iter(listed)
        first = next(tensors, None)
        if self.backend is None:
            self.backend = "nccl" if first is not None and first[1].is_cuda else "gloo"
            self._record()
        layout = Layout.build(specs, self.bucket_bytes)
        if layout != self._layout:
            self._layout, self._free = layout, {}
            self._layout_in_group = False
        payload = b"" if self._layout_in_group else layout.to_bytes()
        device = _device(self.backend)
        header = torch.tensor([version, layout.digest, len(payload)], dtype=torch.int64)
        try:
            group = self._formed_group()
            _broadcast(group, header.to(device))
            if payload:
                raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
                _broadcast(group, raw.to(device))
            self._layout_in_group = True  # sent: a failure below spends the group anyway
            self._send_buckets(group, layout, [first] if first else [], tensors, device)
        except (RuntimeError, ValueError) as e:  # gloo/NCCL errors, store timeouts, a bad tensor
            self._free, self._held = {}, 0  # the buffers being filled are dropped with the group
            raise self._fail(f"publish of version {version} failed", e) from e
        self.layouts_sent += bool(payload)
        self.last_version, self._resend_ok = version, False

    def _send_buckets(self, group, layout: Layout, first: list, tensors: Iterator,
                      device: torch.device) -> None:
        buckets, filling = layout.buckets, {}  # bucket index -> its buffer, while being filled
        sent = 0
        for position, (name, tensor) in enumerate(_chain(first, tensors)):
            if position >= len(layout.entries):
                raise ValueError(f"more tensors than the {len(layout.entries)} of the specs")
            entry = layout.entries[position]
            if (name, dtype_name(tensor.dtype, name), tuple(tensor.shape)) != (
                    entry.name, entry.dtype, entry.shape):
                raise ValueError(f"tensor {position} is {name!r} {tensor.dtype} "
                                 f"{tuple(tensor.shape)}; the specs say {entry.name!r} "
                                 f"{entry.dtype} {entry.shape}")
            bucket = buckets[entry.bucket]
            if entry.bucket not in filling:
                filling[entry.bucket] = self._take(bucket.dtype, device)
            bucket.view(entry, filling[entry.bucket]).copy_(tensor)
            while sent < len(buckets) and buckets[sent].last <= position:
                self._send(group, buckets[sent], filling.pop(buckets[sent].index, None))
                sent += 1
        while sent < len(buckets):  # only buckets of empty tensors are left
            if buckets[sent].numel:
                raise ValueError(f"{len(layout.entries)} tensors in the specs, fewer were given")
            sent += 1

    def _take(self, dtype: str, device: torch.device) -> torch.Tensor:
        """A buffer for a bucket of ``dtype``: big enough for any bucket of the dtype, so every
        buffer fits every bucket; reused once sent."""
        free = self._free.setdefault(dtype, [])
        if free:
            buffer = free.pop()
        else:
            numel = max(b.numel for b in self._layout.buckets if b.dtype == dtype)
            buffer = torch.empty(numel, dtype=DTYPES[dtype], device=device)
        self._held += buffer.numel() * buffer.element_size()
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self._held)
        return buffer

    def _send(self, group, bucket: Bucket, buffer: torch.Tensor | None) -> None:
        if buffer is None:  # a bucket of empty tensors: nothing travels
            return
        _broadcast(group, buffer[:bucket.numel])
        self.buckets_sent += 1
        self._held -= buffer.numel() * buffer.element_size()
        self._free[bucket.dtype].append(buffer)


def _use_count(buffer: torch.Tensor) -> int | None:
    """References to ``buffer``'s storage (every view holds one); None where torch has no way
    to tell."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return None if count is None else int(count(buffer.untyped_storage()._cdata))


def _chain(first: list, rest: Iterator) -> Iterator:
    yield from first
    yield from rest


class WeightSubscriber(_Member):
    """One inference worker's end: joins the publisher's group as ``rank`` (1..world_size-1).

    ``generation`` / ``world_size`` None: the publisher's current ones, read from its store;
    ``backend`` None: the publisher's (read from its store when the group forms).
    """

    def __init__(self, host: str, port: int, rank: int, world_size: int | None = None, *,
                 generation: int | None = None, backend: str | None = None,
                 timeout_s: float = 60.0):
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
        super().__init__(store, rank, backend, timeout_s)
        self._backend_given = backend
        self.layouts_received = 0
        self.last_version: int | None = None
        self._layout: Layout | None = None
        self._reading = False  # a publish is being read
        self._rejoined = True
        self._pool: list[tuple[torch.Tensor, int]] = []  # (bucket buffer, its use count alone)
        self._pool_layout: Layout | None = None
        self.join(generation, world_size)

    def join(self, generation: int | None = None, world_size: int | None = None) -> int:
        """Leave the current group for ``generation`` (None: the publisher's current one)."""
        if generation is None or world_size is None:
            current, size, _ = self._current()
            generation = current if generation is None else generation
            world_size = size if world_size is None else world_size
        if not 0 < self.rank < world_size:
            raise ValueError(f"rank {self.rank} is no subscriber rank in world size {world_size}")
        self._new_generation(generation, world_size)
        self._rejoined, self._reading = True, False
        return generation

    def _free_buffer(self, layout: Layout, bucket: Bucket, device: torch.device) -> torch.Tensor:
        """A buffer for ``bucket``: one of this subscriber's that no reader holds a view of any
        more (reused: no fresh pages to fault in for every bucket of every publish), else a new
        one, big enough for any bucket of its dtype. Where torch cannot say whether a buffer is
        still held, always a new one (freed when the reader drops it)."""
        for buffer, alone in self._pool:
            if buffer.dtype == DTYPES[bucket.dtype] and _use_count(buffer) == alone:
                return buffer
        numel = max(b.numel for b in layout.buckets if b.dtype == bucket.dtype)
        buffer = torch.empty(numel, dtype=DTYPES[bucket.dtype], device=device)
        alone = _use_count(buffer)
        if alone is not None:
            self._pool.append((buffer, alone))
        return buffer

    def _current(self) -> tuple[int, int, str | None]:
        generation, size, backend = self._store.get(_CURRENT).decode().split()
        return int(generation), int(size), None if backend == "-" else backend

    def receive(self) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
        """Wait for the next publish: ``(version, tensors)``; ``tensors`` yields ``(name,
        tensor)`` bucket by bucket, receiving each bucket when the reader reaches it. Read it
        to its end before the next ``receive``. Each tensor is a view into a buffer that is
        not reused while the reader holds any view of it, so it stays valid as long as kept."""
        if self._reading:
            raise self._fail("receive", RuntimeError("the previous publish was not read to its end"))
        try:
            if self.backend is None and self._group is None:
                self.backend = self._backend_given or self._current()[2] or "gloo"
            device = _device(self.backend)
            group = self._formed_group()
            header = torch.empty(3, dtype=torch.int64, device=device)
            _broadcast(group, header)
            version, digest, nbytes = header.tolist()
            if nbytes:
                raw = torch.empty(nbytes, dtype=torch.uint8, device=device)
                _broadcast(group, raw)
                self.layouts_received += 1
                self._layout = Layout.from_bytes(raw.cpu().numpy().tobytes())
            if self._layout is None or digest != self._layout.digest:
                raise RuntimeError(f"layout digest {digest} does not match the layout held")
            last = self.last_version
            if last is not None and (version < last or (version == last and not self._rejoined)):
                raise RuntimeError(f"version {version} after version {last}")
        except (RuntimeError, ValueError) as e:  # ValueError: a layout that does not parse
            raise self._fail("receive failed", e) from e
        self._reading = True
        return version, self._tensors(group, self._layout, version, device)

    def _tensors(self, group, layout: Layout, version: int, device: torch.device
                 ) -> Iterator[tuple[str, torch.Tensor]]:
        if layout is not self._pool_layout:
            self._pool, self._pool_layout = [], layout
        for bucket in layout.buckets:
            buffer = self._free_buffer(layout, bucket, device)[:bucket.numel]
            try:
                _broadcast(group, buffer)
            except RuntimeError as e:
                self._reading = False
                raise self._fail(f"receive of version {version}, bucket {bucket.index}", e) from e
            yield from bucket.unpack(buffer)
            del buffer
        self._reading = False
        self.last_version, self._rejoined = version, False
