"""The weight broadcast: learner rank 0 -> every inference worker, in a process group of its own.

``WeightPublisher`` runs on the learner's rank 0; ``WeightSubscriber`` runs inside each inference
worker (the actor's vLLM ``worker_extension_cls`` method receives, then hands the views to
``reload_weights``). Depends on torch only: no Ray, no event loop, no default process group.

Group: the publisher hosts a ``TCPStore`` (port 0 picks a free port, see ``.port``); the group of
rank 0 (publisher, the broadcast source) and ranks 1..world_size-1 (subscribers) rendezvouses
under the store prefix ``weights/{generation}``. Gloo on CPU, NCCL for CUDA tensors. Both ends
form the group lazily, at their first publish / receive of a generation; each side waits at most
``timeout_s`` for the other. After a ``WeightSyncError`` the group is spent: the driver calls
``publisher.reform(world_size)`` (a new generation, also to admit a new or restarted worker) and
every live subscriber ``join(generation)``; the next publish / receive forms the new group.

Wire protocol of one publish, every message a broadcast from rank 0 (as uint8 bytes):
1. header, int64[3]: ``[version, layout digest, layout byte count]``; the count is 0 when this
   group already has the layout (the same layout as the last publish): nothing is resent;
2. only if the count is > 0: the layout as JSON ``[[name, dtype, shape], ...]``, see
   transport/packing.py (which also derives the offsets, identically on both ends);
3. one flat buffer per dtype, in dtype-name order, empty ones skipped.

Invariants: versions strictly increase (the publisher refuses, a subscriber raises otherwise),
except that the first publish of a new generation may repeat the last version (a publish that
failed for some workers, or the current weights for a restarted worker, is re-sent). ``receive`` returns views into buffers reused while the layout stays
the same: they hold the next version's weights after the next ``receive``. Every wait is
bounded by ``timeout_s`` (gloo): a killed peer makes the other side raise within about a second,
a silent one at ``timeout_s`` (gloo's sends wait for the receiver, even for the header). So
publish and receive are called together (the driver triggers both), within ``timeout_s``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Iterable

import torch
import torch.distributed as dist

from transport.packing import Layout

SOURCE = 0  # the publisher's rank: the only broadcast source
_CURRENT = "weights/current"  # store key: "{generation} {world_size}", for subscribers that ask


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


class WeightPublisher(_Member):
    """Learner rank 0: hosts the rendezvous store and broadcasts named tensors from rank 0.

    ``world_size`` counts the publisher: 1 + the number of subscribers. ``backend`` None picks
    NCCL if the first publish has a CUDA tensor, gloo otherwise. With NCCL, every process sets its
    CUDA device (``torch.cuda.set_device``) before its first publish / receive.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, world_size: int = 2, *,
                 backend: str | None = None, timeout_s: float = 60.0):
        store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))
        super().__init__(store, SOURCE, backend, timeout_s)
        self.port: int = store.port
        self.address = f"tcp://{host}:{self.port}"
        """Where subscribers find the store (see transport/channels.py's ``weight_sink``)."""
        self.layouts_sent = 0
        self.last_version: int | None = None
        self._layout: Layout | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        self._layout_in_group = False
        self.reform(world_size)

    def reform(self, world_size: int) -> int:
        """Start the next generation with ``world_size`` ranks and return its number."""
        self._new_generation(self.generation + 1, world_size)
        self._layout_in_group = False
        self._resend_ok = True
        self._store.set(_CURRENT, f"{self.generation} {world_size}")
        return self.generation

    def publish(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Broadcast ``named_tensors`` as ``version``; ``WeightSyncError`` if the group fails.

        The first publish of a generation may repeat the last version (to bring a restarted
        worker up to date); otherwise versions strictly increase.
        """
        named = list(named_tensors)
        last = self.last_version
        if last is not None and (version < last or (version == last and not self._resend_ok)):
            raise ValueError(f"version {version} does not increase on {last}")
        if self.backend is None:
            self.backend = "nccl" if any(t.is_cuda for _, t in named) else "gloo"
        layout = Layout.of(named)
        if layout != self._layout:
            self._layout, self._buffers = layout, layout.allocate(_device(self.backend))
            self._layout_in_group = False
        layout.pack([t for _, t in named], self._buffers)
        payload = b"" if self._layout_in_group else layout.to_bytes()
        header = torch.tensor([version, layout.digest, len(payload)], dtype=torch.int64)
        device = _device(self.backend)
        try:
            group = self._formed_group()
            _broadcast(group, header.to(device))
            if payload:
                raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
                _broadcast(group, raw.to(device))
            for buffer in self._buffers.values():
                _broadcast(group, buffer)
        except RuntimeError as e:  # gloo errors and store timeouts (DistError) are RuntimeErrors
            raise self._fail(f"publish of version {version} failed", e) from e
        self.layouts_sent += bool(payload)
        self._layout_in_group = True
        self.last_version, self._resend_ok = version, False


class WeightSubscriber(_Member):
    """One inference worker's end: joins the publisher's group as ``rank`` (1..world_size-1).

    ``generation`` / ``world_size`` None: the publisher's current ones, read from its store.
    """

    def __init__(self, host: str, port: int, rank: int, world_size: int | None = None, *,
                 generation: int | None = None, backend: str = "gloo", timeout_s: float = 60.0):
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
        super().__init__(store, rank, backend, timeout_s)
        self.layouts_received = 0
        self.last_version: int | None = None
        self._layout: Layout | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        self._views: list[tuple[str, torch.Tensor]] = []
        self._rejoined = True
        self.join(generation, world_size)

    def join(self, generation: int | None = None, world_size: int | None = None) -> int:
        """Leave the current group for ``generation`` (None: the publisher's current one)."""
        if generation is None or world_size is None:
            current, size = map(int, self._store.get(_CURRENT).decode().split())
            generation = current if generation is None else generation
            world_size = size if world_size is None else world_size
        if not 0 < self.rank < world_size:
            raise ValueError(f"rank {self.rank} is no subscriber rank in world size {world_size}")
        self._new_generation(generation, world_size)
        self._rejoined = True
        return generation

    def receive(self) -> tuple[int, list[tuple[str, torch.Tensor]]]:
        """Wait for the next publish: ``(version, [(name, view), ...])``, in publish order."""
        device = _device(self.backend)
        try:
            group = self._formed_group()
            header = torch.empty(3, dtype=torch.int64, device=device)
            _broadcast(group, header)
            version, digest, nbytes = header.tolist()
            if nbytes:
                raw = torch.empty(nbytes, dtype=torch.uint8, device=device)
                _broadcast(group, raw)
                self._adopt(Layout.from_bytes(raw.cpu().numpy().tobytes()), device)
            if self._layout is None or digest != self._layout.digest:
                raise RuntimeError(f"layout digest {digest} does not match the layout held")
            last = self.last_version
            if last is not None and (version < last or (version == last and not self._rejoined)):
                raise RuntimeError(f"version {version} after version {last}")
            for buffer in self._buffers.values():
                _broadcast(group, buffer)
        except (RuntimeError, ValueError) as e:  # ValueError: a layout that does not parse
            raise self._fail("receive failed", e) from e
        self.last_version, self._rejoined = version, False
        return version, self._views

    def _adopt(self, layout: Layout, device: torch.device) -> None:
        self.layouts_received += 1
        if layout != self._layout:
            self._layout, self._buffers = layout, layout.allocate(device)
            self._views = layout.unpack(self._buffers)
