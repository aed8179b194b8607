"""The two channels as Protocols, and the factory that picks a backend from the address.

Trajectories flow actors -> learner: each actor holds a ``TrajectorySink``, the learner's rank 0
one ``TrajectorySource``. Weights flow learner -> inference workers: the learner's rank 0 holds a
``WeightSource``, each inference worker a ``WeightSink``. Callers need only these four names; the
backends satisfy them structurally (no base classes), checked in tests/unit/transport.

The factory reads the address's scheme; the source binds (or registers) it, sinks connect to
the source's ``address``:

  address           trajectory_source / trajectory_sink      weight_source / weight_sink
  tcp://host:port   stream.TrajectoryReceiver / ...Sender    weights.WeightPublisher / ...Subscriber
  ipc://path        stream.TrajectoryReceiver / ...Sender    -
  inproc://name     inprocess.InProcessTrajectoryChannel     inprocess.InProcessWeights

For weights, tcp://host:port is the publisher's rendezvous store. Port 0 picks a free port: read
the real one from the source's ``address``. ``inproc://`` means this project's in-process backend
(transport/inprocess.py), not ZeroMQ's inproc transport: one process, no sockets, no process
groups. An in-process source registers its name here when made and frees it when closed; a sink
looks the name up, so the source comes first (``ConnectionError`` otherwise).
"""

from __future__ import annotations

import threading
from typing import Iterable, Mapping, Protocol, Sequence, runtime_checkable

import torch

from transport.inprocess import InProcessTrajectoryChannel, InProcessWeights
from transport.schema import Trajectory
from transport.security import ClientKeys, ServerKeys
from transport.stream import TrajectoryReceiver, TrajectorySender
from transport.weights import DEFAULT_BUCKET_BYTES, WeightPublisher, WeightSubscriber

INPROC = "inproc://"


@runtime_checkable
class TrajectorySink(Protocol):
    """One actor's end of the trajectory stream. Called from one thread at a time.

    ``send`` encodes the trajectory (``CodecError`` if it cannot be: nothing is sent) and waits
    while the actor holds no byte credit, i.e. while its bytes in flight (sent, not yet released
    by the learner) have reached the learner's window; one message always fits an empty window.
    After ``timeout_s`` (None: no limit) it raises ``TimeoutError`` and nothing is sent.
    """

    @property
    def sent(self) -> int:
        """Trajectories sent: each is received or rejected once by the source."""
        ...

    def send(self, trajectory: Trajectory, *, timeout_s: float | None = None) -> None: ...

    def close(self, *, flush_s: float = 10.0) -> None:
        """Close; trajectories already sent get up to ``flush_s`` to reach the source."""
        ...


@runtime_checkable
class TrajectorySource(Protocol):
    """The learner's end: every sink's trajectories, validated, bounded in bytes per actor.

    Each actor gets a window of bytes as credit. Every trajectory sent reaches the source exactly
    once: returned by one ``poll`` as ``(actor, trajectory, nbytes)``, ``nbytes`` its encoded
    size, or, if it fails the codec or the schema, counted in ``rejected`` with its bytes
    credited back at once. Each actor's trajectories arrive in the order sent. The caller
    ``release``s each polled entry's bytes once it lets the entry go (trained on or dropped):
    that is the credit that lets its actor send again. ``poll`` and ``release`` are called from
    one thread.
    """

    @property
    def address(self) -> str:
        """Where sinks connect: the bound address (port 0 resolved)."""
        ...

    @property
    def received(self) -> Mapping[str, int]:
        """Valid trajectories per actor (``actor-{id}``)."""
        ...

    @property
    def rejected(self) -> Mapping[str, int]:
        """Malformed messages per kind, and per ``kind/actor``."""
        ...

    @property
    def refused(self) -> Mapping[str, int]:
        """Connections refused by CurveZMQ, per reason (transport/security.py); read it from the
        thread that polls."""
        ...

    def poll(self, timeout_s: float = 0.0) -> list[tuple[str, Trajectory, int]]:
        """What arrived, waiting up to ``timeout_s`` for the first message."""
        ...

    def release(self, actor: str, nbytes: int) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class WeightSource(Protocol):
    """The learner rank 0's end of the weight channel.

    ``publish`` sends ``named_tensors`` as ``version`` to every sink. Versions strictly increase
    (``ValueError`` otherwise), except that the first publish after ``reform`` may repeat the
    last one (to bring a restarted worker up to date). ``WeightSyncError``: the group failed;
    ``reform(world_size)`` starts a new generation (also to admit new or restarted workers) and
    returns its number.
    """

    @property
    def address(self) -> str:
        """Where sinks connect (port 0 resolved)."""
        ...

    def publish(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, *,
                specs: Sequence[tuple[str, str, Sequence[int]]] | None = None) -> None:
        """``specs``: each tensor's ``(name, dtype name, shape)``, in order, when
        ``named_tensors`` is a lazy iterator (read one tensor at a time, never ahead)."""
        ...

    def reform(self, world_size: int) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class WeightSink(Protocol):
    """One inference worker's end of the weight channel.

    ``receive`` waits for the next publish and returns ``(version, tensors)``: ``(name,
    tensor)`` pairs, each once, which may still be arriving while the caller reads them (bucket
    by bucket: read them to the end before the next ``receive``); versions come in order (a
    repeat only after a reform). The tensors are the caller's to read, not to write. A failed
    group or a wait past the backend's timeout raises ``WeightSyncError``, from ``receive`` or
    while the tensors are read.
    """

    def receive(self) -> tuple[int, Iterable[tuple[str, torch.Tensor]]]: ...

    def close(self) -> None: ...


_registry_lock = threading.Lock()
_inproc_trajectories: dict[str, InProcessTrajectoryChannel] = {}
_inproc_weights: dict[str, InProcessWeights] = {}


def trajectory_source(address: str, *, window_bytes: int = 64 << 20,
                      max_message_bytes: int = 256 << 20,
                      curve: ServerKeys | None = None) -> TrajectorySource:
    """The learner's end, bound at ``address``; ``curve`` applies to ZeroMQ only."""
    if not address.startswith(INPROC):
        return TrajectoryReceiver(address, window_bytes=window_bytes,
                                  max_message_bytes=max_message_bytes, curve=curve)
    _no_curve(address, curve)
    channel = InProcessTrajectoryChannel(address, window_bytes=window_bytes,
                                         max_message_bytes=max_message_bytes)
    return _register(_inproc_trajectories, channel)


def trajectory_sink(address: str, actor_id: int, *,
                    curve: ClientKeys | None = None) -> TrajectorySink:
    """Actor ``actor_id``'s end, connected to the source at ``address``."""
    if not address.startswith(INPROC):
        return TrajectorySender(address, actor_id, curve=curve)
    _no_curve(address, curve)
    return _lookup(_inproc_trajectories, address).sink(actor_id)


def weight_source(address: str, *, world_size: int, backend: str | None = None,
                  timeout_s: float = 60.0, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> WeightSource:
    """The publisher, for ``world_size`` ranks (itself included); in-process ignores the rest."""
    if not address.startswith(INPROC):
        host, port = _host_port(address)
        return WeightPublisher(host, port, world_size, backend=backend, timeout_s=timeout_s,
                               bucket_bytes=bucket_bytes)
    return _register(_inproc_weights, InProcessWeights(address))


def weight_sink(address: str, *, rank: int, world_size: int | None = None,
                backend: str | None = None, timeout_s: float = 60.0) -> WeightSink:
    """Subscriber ``rank`` (1..world_size-1; None: the publisher's current world size);
    ``backend`` None: the publisher's.

    In-process uses ``timeout_s`` only: subscribers need no ranks there.
    """
    if not address.startswith(INPROC):
        host, port = _host_port(address)
        return WeightSubscriber(host, port, rank, world_size, backend=backend, timeout_s=timeout_s)
    return _lookup(_inproc_weights, address).subscriber(timeout_s=timeout_s)


def _register(registry, channel):
    if channel.address == INPROC:
        raise ValueError(f"an in-process address needs a name: {INPROC}<name>")
    with _registry_lock:
        held = registry.get(channel.address)
        if held is not None and not held.closed:
            raise ValueError(f"{channel.address} is in use (close its source first)")
        registry[channel.address] = channel
    return channel


def _lookup(registry, address: str):
    with _registry_lock:
        channel = registry.get(address)
    if channel is None or channel.closed:
        raise ConnectionError(f"no open source at {address}: make the source before its sinks")
    return channel


def _no_curve(address: str, curve: ServerKeys | ClientKeys | None) -> None:
    if curve is not None:
        raise ValueError(f"{address}: CurveZMQ keys apply to ZeroMQ addresses only")


def _host_port(address: str) -> tuple[str, int]:
    scheme, _, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme != "tcp" or not host or not port.isdigit():
        raise ValueError(f"a weight channel address is tcp://host:port or {INPROC}name, "
                         f"got {address!r}")
    return host.strip("[]"), int(port)
