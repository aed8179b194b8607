"""In-process backends of both channels (see transport/channels.py): the loop without sockets.

Made by the factory in transport/channels.py for ``inproc://name`` addresses (or directly, by
tests); used where learner and actors share one process: tests, debugging, the single-process
topology. They keep the contracts of the ZeroMQ stream (transport/stream.py) and the weight
broadcast (transport/weights.py), and are thread-safe: actors send from their threads, the
learner polls and publishes from its own.

``InProcessTrajectoryChannel`` is the learner's end (a ``TrajectorySource``); ``.sink(actor_id)``
makes an actor's end (a ``TrajectorySink``). As over ZeroMQ:
- a trajectory travels as its wire bytes: the sink encodes it (``CodecError`` there), ``poll``
  decodes and validates it (counted in ``rejected`` there, its bytes credited back), so the two
  sides share no object, and ``nbytes`` is the encoded size;
- a send waits while the actor's bytes in flight (sent, neither released nor rejected) are
  ``window_bytes`` or more, so they stay below ``window_bytes`` + one message: one message always
  fits an empty window, whatever its size;
- every trajectory sent is polled or rejected exactly once, each actor's in the order sent.
Unlike ZeroMQ: the window is there at once (no HELLO round trip through ``poll``); a restarted
actor (a new sink, same id) inherits its predecessor's unreleased bytes rather than a fresh
window; sends to a closed channel wait and time out, as they would for a dead learner.

``InProcessWeights`` is the learner's end (a ``WeightSource``); ``.subscriber()`` makes an
inference worker's end (a ``WeightSink``), any number of them. ``publish`` stores clones of the
tensors; ``receive`` waits for a publish newer than the subscriber's last and returns the latest
(so a subscriber that falls behind skips versions; the broadcast has no such case, its publish
waits for every subscriber). Subscribers share the stored tensors: treat them as read-only.
Versions follow the broadcast's rule (strictly increasing, a repeat allowed first after
``reform``); ``reform`` only starts a new generation.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Iterable

import torch

from transport.receiving import Rejected, count_rejected, decode_trajectory
from transport.schema import Trajectory
from transport.weights import WeightSyncError


class InProcessTrajectoryChannel:
    """The learner's end of an in-process trajectory stream, and the maker of the actors' ends."""

    def __init__(self, address: str = "inproc://stream", *, window_bytes: int = 64 << 20,
                 max_message_bytes: int = 256 << 20):
        if window_bytes <= 0:
            raise ValueError(f"window_bytes must be > 0, got {window_bytes}")
        self.address = address
        self.window_bytes = window_bytes
        self.max_message_bytes = max_message_bytes
        self.received: Counter[str] = Counter()
        """Valid trajectories per actor identity (``actor-{id}``, as over ZeroMQ)."""
        self.rejected: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        """Always empty: only this process's code can reach an in-process channel."""
        """Malformed messages per kind (``codec``, ``schema``, ``too_large``) and ``kind/actor``."""
        self.closed = False
        self._changed = threading.Condition()  # a message queued, bytes released, or closed
        self._queue: deque[tuple[str, bytes]] = deque()
        self._in_flight: Counter[str] = Counter()

    def sink(self, actor_id: int) -> InProcessTrajectorySink:
        return InProcessTrajectorySink(self, actor_id)

    def poll(self, timeout_s: float = 0.0, *,
             max_messages: int = 1024) -> list[tuple[str, Trajectory, int]]:
        """What arrived (waiting up to ``timeout_s`` for the first message), as (actor,
        trajectory, nbytes); ``release(actor, nbytes)`` each once done with it."""
        with self._changed:
            if self.closed:
                raise RuntimeError(f"{self.address}: poll after close")
            self._changed.wait_for(lambda: self._queue or self.closed, timeout_s)
            taken = [self._queue.popleft() for _ in range(min(max_messages, len(self._queue)))]
        # Decoding outside the lock: senders keep queueing meanwhile, as into a socket.
        out = [self._accept(actor, payload) for actor, payload in taken]
        return [item for item in out if item is not None]

    def release(self, actor: str, nbytes: int) -> None:
        """Give ``nbytes`` of credit back to ``actor`` (its trajectory left the buffer)."""
        with self._changed:
            self._in_flight[actor] -= nbytes
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self.closed = True
            self._queue.clear()
            self._changed.notify_all()

    def _put(self, actor: str, payload: bytes, timeout_s: float | None) -> None:
        window = self.window_bytes
        with self._changed:
            if not self._changed.wait_for(
                    lambda: not self.closed and self._in_flight[actor] < window, timeout_s):
                raise TimeoutError(f"{actor}: no credit from the learner in time")
            self._queue.append((actor, payload))
            self._in_flight[actor] += len(payload)
            self._changed.notify_all()

    def _accept(self, actor: str, payload: bytes) -> tuple[str, Trajectory, int] | None:
        try:
            trajectory = decode_trajectory(payload, actor, self.max_message_bytes)
        except Rejected as r:
            return self._reject(r.kind, actor, len(payload), r.detail)
        self.received[actor] += 1
        return actor, trajectory, len(payload)

    def _reject(self, kind: str, actor: str, nbytes: int, detail: str) -> None:
        count_rejected(self.rejected, kind, actor, detail)
        self.release(actor, nbytes)  # a malformed message must not starve its sender
        return None


class InProcessTrajectorySink:
    """One actor's end: ``send`` waits while the actor's window is full (backpressure)."""

    def __init__(self, channel: InProcessTrajectoryChannel, actor_id: int):
        self.actor_id = actor_id
        self.sent = 0
        self.sent_bytes = 0
        self._channel = channel
        self._identity = f"actor-{actor_id}"
        self._closed = False

    def send(self, trajectory: Trajectory, *, timeout_s: float | None = None) -> None:
        """Send one trajectory; waits for credit (raises TimeoutError after ``timeout_s``)."""
        if self._closed:
            raise RuntimeError(f"actor {self.actor_id}: send after close")
        payload = trajectory.to_bytes()
        self._channel._put(self._identity, payload, timeout_s)
        self.sent += 1
        self.sent_bytes += len(payload)

    def close(self, *, flush_s: float = 10.0) -> None:
        """Close. Nothing to flush: a trajectory is in the channel once ``send`` returns."""
        self._closed = True


class InProcessWeights:
    """The learner's end of an in-process weight channel, and the maker of the workers' ends."""

    def __init__(self, address: str = "inproc://weights") -> None:
        self.address = address
        self.generation = 0
        self.last_version: int | None = None
        self.closed = False
        self._changed = threading.Condition()  # a publish, or closed
        self._publishes = 0  # subscribers wait for this count to pass the one they last saw
        self._named: list[tuple[str, torch.Tensor]] = []
        self._resend_ok = True

    def subscriber(self, *, timeout_s: float = 60.0) -> InProcessWeightSubscriber:
        return InProcessWeightSubscriber(self, timeout_s)

    def publish(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, *,
                specs=None) -> None:
        """Store clones of ``named_tensors`` as ``version`` and wake the subscribers (one
        process: the whole state is kept, ``specs`` is not needed)."""
        last = self.last_version
        if last is not None and (version < last or (version == last and not self._resend_ok)):
            raise ValueError(f"version {version} does not increase on {last}")
        named = [(name, tensor.detach().clone()) for name, tensor in named_tensors]
        with self._changed:
            if self.closed:
                raise WeightSyncError("publish after close")
            self._named, self.last_version, self._resend_ok = named, version, False
            self._publishes += 1
            self._changed.notify_all()

    def reform(self, world_size: int) -> int:
        """Start the next generation (nothing to re-form in one process) and return its number."""
        with self._changed:
            self.generation += 1
            self._resend_ok = True
            return self.generation

    def close(self) -> None:
        """Close; subscribers waiting in ``receive`` raise ``WeightSyncError`` at once."""
        with self._changed:
            self.closed = True
            self._named = []
            self._changed.notify_all()


class InProcessWeightSubscriber:
    """One inference worker's end: ``receive`` waits up to ``timeout_s`` for a newer publish."""

    def __init__(self, weights: InProcessWeights, timeout_s: float):
        self.timeout_s = timeout_s
        self.last_version: int | None = None
        self._weights = weights
        self._seen = 0
        self._closed = False

    def receive(self) -> tuple[int, list[tuple[str, torch.Tensor]]]:
        """The next publish: ``(version, [(name, tensor), ...])`` in publish order."""
        weights = self._weights
        with weights._changed:
            if not weights._changed.wait_for(
                    lambda: weights._publishes > self._seen or weights.closed or self._closed,
                    self.timeout_s):
                raise WeightSyncError(f"no publish within {self.timeout_s} s")
            if weights.closed or self._closed:
                raise WeightSyncError("the weight channel is closed")
            self._seen = weights._publishes
            version, named = weights.last_version, list(weights._named)
        self.last_version = version
        return version, named

    def close(self) -> None:
        with self._weights._changed:
            self._closed = True
            self._weights._changed.notify_all()
