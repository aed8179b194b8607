"""The trajectory stream: many actors -> one learner over ZeroMQ, bounded in bytes, safe on bad input.

Producers: actors (``TrajectorySender``, one per actor). Consumer: the learner
(``TrajectoryReceiver`` feeding a ``TrajectoryBuffer``, see learner/buffer.py).

Why ROUTER/DEALER with credits and not PUSH/PULL: ZeroMQ's high-water marks count messages,
not bytes, and a 16k-token trajectory with images is a thousand times a short one. So the learner
grants each actor a byte window (``CREDIT`` frames) and an actor sends only while it holds credit;
the learner returns an entry's bytes when the buffer lets it go (trained on or dropped). Bytes in
flight per actor stay below ``window_bytes`` + one message, and a slow learner blocks the actors
instead of growing memory anywhere. The ROUTER also tells which actor sent what, for the
sent == received + dropped accounting.

Frames: actor -> learner ``[b"HELLO"]`` (asks for a window; also after a restart) and
``[b"TRAJ", payload]``; learner -> actor ``[b"WINDOW", count]`` (the answer to a HELLO) and
``[b"CREDIT", count]`` (released bytes), counts as 8-byte little-endian integers. Until its window
arrives an actor repeats its HELLO every ``HELLO_INTERVAL_S`` (a HELLO sent before the connection,
or its CURVE handshake, is up is dropped, not queued); it takes the first WINDOW and drops the
answers to its repeats, so repeating never widens the window. No send blocks past its timeout,
even with no learner connected. Payloads are a transport/schema.py Trajectory as typed msgpack
(no pickle: a received message can never execute code), decoded and checked in compiled code
(msgspec). Anything else is counted by kind, logged once per kind, dropped
(transport/receiving.py, as in the in-process channel).
Binds loopback by default; CurveZMQ (transport/security.py: the learner holds the server keys,
each actor the client keys) keeps strangers from connecting or injecting trajectories on a
multi-host network, and ``refused`` counts the handshakes it failed.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import zmq

from transport import wire
from transport.receiving import Rejected, count_rejected, decode_trajectory
from transport.schema import Trajectory
from transport.security import ClientKeys, CurveServer, ServerKeys, curve_client

log = logging.getLogger(__name__)

HELLO, TRAJ, WINDOW, CREDIT = b"HELLO", b"TRAJ", b"WINDOW", b"CREDIT"
HELLO_INTERVAL_S = 1.0
MAX_CREDIT_FRAME_BYTES = 4096
"""An actor takes no larger frame: its frames from the learner are a kind and an 8-byte count,
but ZeroMQ holds its handshake (CurveZMQ's included) to the same limit."""
DEFAULT_ADDRESS = "tcp://127.0.0.1:5557"


class TrajectorySender:
    """One actor's end: ``send`` blocks while the actor has no credit (backpressure)."""

    def __init__(self, address: str, actor_id: int, *, curve: ClientKeys | None = None,
                 context: zmq.Context | None = None):
        self.actor_id = actor_id
        self.sent = 0
        self.sent_bytes = 0
        self._credit = 0
        self._has_window = False
        self._payload = bytearray()
        self._socket = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, f"actor-{actor_id}".encode())
        self._socket.setsockopt(zmq.RCVHWM, 0)  # no credit dropped (TrajectoryReceiver's SNDHWM)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_CREDIT_FRAME_BYTES)  # it takes credit frames only
        if curve is not None:
            curve_client(self._socket, curve)
        self._socket.connect(address)
        self._hello_at = time.monotonic()
        self._say_hello()

    def send(self, trajectory: Trajectory, *, timeout_s: float | None = None) -> None:
        """Send one trajectory; waits for credit (raises TimeoutError after ``timeout_s``)."""
        payload = self._payload  # encoded into one reused buffer; ZeroMQ copies it (below)
        trajectory.encode_into(payload)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._credit <= 0:
            self._take_credit(deadline)
        # Copied into ZeroMQ (a memcpy, cheap beside the encoding): a zero-copy send above
        # zmq.COPY_THRESHOLD lends the payload through pyzmq's garbage-collector thread, whose
        # socket is closed at exit, so a message still held then is released through freed memory.
        sock = self._socket
        try:  # the common case, a free queue, costs no poll
            sock.send(TRAJ, zmq.SNDMORE | zmq.NOBLOCK)
        except zmq.Again:
            if not sock.poll(_wait_ms(deadline), zmq.POLLOUT):
                raise TimeoutError(
                    f"actor {self.actor_id}: the connection to the learner is gone") from None
            sock.send(TRAJ, zmq.SNDMORE | zmq.NOBLOCK)
        sock.send(payload, zmq.NOBLOCK)  # a message's later parts always follow its first
        self._credit -= len(payload)
        self.sent += 1
        self.sent_bytes += len(payload)

    def _say_hello(self) -> None:
        try:
            self._socket.send_multipart([HELLO], flags=zmq.NOBLOCK)
        except zmq.Again:  # no connection up yet: the next HELLO goes after HELLO_INTERVAL_S
            pass

    def _take_credit(self, deadline: float | None) -> None:
        wait_ms = _wait_ms(deadline)
        if not self._has_window:  # wake up in time to repeat the HELLO
            next_hello_ms = max(0, int((self._hello_at + HELLO_INTERVAL_S - time.monotonic()) * 1000))
            wait_ms = next_hello_ms if wait_ms < 0 else min(wait_ms, next_hello_ms)
        if not self._socket.poll(wait_ms, zmq.POLLIN):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"actor {self.actor_id}: no credit from the learner in time")
            if not self._has_window and time.monotonic() >= self._hello_at + HELLO_INTERVAL_S:
                self._hello_at = time.monotonic()
                self._say_hello()
            return
        while self._socket.poll(0, zmq.POLLIN):
            frames = self._socket.recv_multipart()
            if len(frames) != 2 or len(frames[1]) != 8 or frames[0] not in (WINDOW, CREDIT):
                continue
            if frames[0] == WINDOW:
                if self._has_window:
                    continue  # the answer to a repeated HELLO
                self._has_window = True
            self._credit += int.from_bytes(frames[1], "little", signed=True)

    def close(self, *, flush_s: float = 10.0) -> None:
        """Close, giving queued trajectories up to ``flush_s`` to reach the learner."""
        self._socket.close(linger=int(flush_s * 1000))


class TrajectoryReceiver:
    """The learner's end: decodes and validates, counts per actor, returns credit on release."""

    def __init__(self, address: str = DEFAULT_ADDRESS, *, window_bytes: int = 64 << 20,
                 max_message_bytes: int = 256 << 20, curve: ServerKeys | None = None,
                 context: zmq.Context | None = None):
        self.window_bytes = window_bytes
        self.max_message_bytes = max_message_bytes
        self.received: Counter[str] = Counter()
        """Valid trajectories per actor identity."""
        self.rejected: Counter[str] = Counter()
        """Malformed messages per kind (``codec``, ``schema``, ``frame``, ``too_large``)."""
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        # A restarted actor reconnects under its old identity, maybe before the dead connection
        # is noticed: it takes the identity over (by default ZeroMQ would refuse it).
        self._socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        # Credit must never be dropped, or an actor's window shrinks for good; ZeroMQ drops what
        # a ROUTER sends past its high-water mark. So none on the way out (WINDOW and CREDIT
        # frames only). An actor reads its credit only once it has used its window up, so the
        # frames that wait for it are bounded by the trajectories it sent in one window.
        self._socket.setsockopt(zmq.SNDHWM, 0)
        # A frame over the limit is refused by ZeroMQ from its header, before it is read: the
        # peer is disconnected (an actor's sender reconnects), nothing of it is allocated here.
        self._socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self._curve = None if curve is None else CurveServer(self._socket, curve)
        self._pending: dict[str, int] = {}
        """Released bytes not yet granted back, by actor (see ``release``)."""
        self._timeout_ms = -1  # the socket's RCVTIMEO (ZeroMQ's default: none)
        self._socket.bind(address)
        self.address = self._socket.getsockopt(zmq.LAST_ENDPOINT).decode()
        if not wire.COMPILED:
            log.warning("transport/_wire.c is not built (the install builds it): trajectories "
                        "are checked through msgspec and numpy, several µs slower a message")

    def poll(self, timeout_s: float = 0.0, *, max_messages: int = 64) -> list[tuple[str, Trajectory, int]]:
        """Receive what arrived (waiting up to ``timeout_s`` for the first message).

        Returns (actor, trajectory, nbytes) for each valid trajectory; the caller must
        ``release(actor, nbytes)`` once it is done with each (that returns the actor's credit).
        At most ``max_messages`` a call: a caller that is done with a batch before the next
        call keeps the messages it holds few, and their memory warm for ZeroMQ to reuse
        (measured on a 2-core x86 machine at 16k tokens, 1024 a call ran at 0.79 of raw ZeroMQ
        against 0.86-1.03; docs/benchmarks.md).
        """
        out: list[tuple[str, Trajectory, int]] = []
        sock, waited = self._socket, timeout_s <= 0
        while len(out) < max_messages:
            try:  # what is queued is read at once
                frame = sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self._flush_credit()  # all read: the actors may be waiting for this credit
                if out or waited:
                    break
                waited = True  # nothing yet: wait once, for the first message, in the receive
                try:  # itself (pyzmq's Socket.poll builds a Poller each call, a few us)
                    frame = self._recv_within(int(timeout_s * 1000))
                except zmq.Again:
                    break
            actor = frame.bytes.decode("utf-8", "replace")
            frames = []  # the rest of the message, in place (a frame knows whether more follow)
            while frame.more:
                frame = sock.recv(copy=False)
                frames.append(frame)
            item = self._handle(actor, frames)
            if item is not None:
                out.append(item)
        return out

    def _recv_within(self, timeout_ms: int) -> zmq.Frame:
        """The next frame, waiting up to ``timeout_ms`` (-1: for good); zmq.Again after that."""
        if timeout_ms != self._timeout_ms:
            self._socket.setsockopt(zmq.RCVTIMEO, timeout_ms)
            self._timeout_ms = timeout_ms
        return self._socket.recv(copy=False)

    def release(self, actor: str, nbytes: int) -> None:
        """Give ``nbytes`` of credit back to ``actor`` (its trajectory left the buffer).

        Credit is sent once a ``poll`` has read every queued message, one frame an actor for
        all its releases since (while messages keep coming, their senders hold credit enough),
        or at once when an actor's pending credit reaches an eighth of the window."""
        pending = self._pending.get(actor, 0) + nbytes
        if pending >= self.window_bytes // 8:
            self._pending.pop(actor, None)
            self._grant(actor, pending)
        else:
            self._pending[actor] = pending

    def _flush_credit(self) -> None:
        pending, self._pending = self._pending, {}
        for actor, nbytes in pending.items():
            self._grant(actor, nbytes)

    @property
    def refused(self) -> Counter[str]:
        """Failed CurveZMQ handshakes by reason (transport/security.py); empty without CURVE."""
        return Counter() if self._curve is None else Counter(self._curve.drain())

    def close(self) -> None:
        if self._curve is not None:
            self._curve.close()
        self._socket.close()

    def _handle(self, actor: str, frames: list[zmq.Frame]) -> tuple[str, Trajectory, int] | None:
        kind = frames[0].bytes if frames else b""
        if kind == HELLO and len(frames) == 1:
            self._grant(actor, self.window_bytes, WINDOW)
            return None
        if kind != TRAJ or len(frames) != 2:
            return self._reject("frame", actor, 0, f"unexpected frames from {actor!r}")
        payload = frames[1]  # zero-copy (a Frame is a buffer): the arrays are views of it
        try:
            trajectory = decode_trajectory(payload, actor, self.max_message_bytes)
        except Rejected as r:
            return self._reject(r.kind, actor, len(payload), r.detail)
        self.received[actor] += 1
        return actor, trajectory, len(payload)

    def _reject(self, kind: str, actor: str, nbytes: int, detail: str) -> None:
        count_rejected(self.rejected, kind, actor, detail)
        if nbytes:
            self.release(actor, nbytes)  # a malformed message must not starve its sender
        return None

    def _grant(self, actor: str, nbytes: int, kind: bytes = CREDIT) -> None:
        try:
            self._socket.send_multipart([actor.encode(), kind, nbytes.to_bytes(8, "little", signed=True)],
                                        flags=zmq.NOBLOCK)
        except zmq.ZMQError as e:  # the actor is gone; it asks again with HELLO when it is back
            log.debug("credit to %s not delivered: %s", actor, e)


def _wait_ms(deadline: float | None) -> int:
    """Milliseconds until ``deadline`` for ``zmq.Socket.poll`` (-1: no deadline, wait for good)."""
    return -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
