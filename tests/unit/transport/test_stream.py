"""transport/stream.py over real ZeroMQ sockets on loopback: delivery, byte-bounded backpressure,
malformed input, per-actor accounting, CurveZMQ."""

import random
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from tests.unit.transport.trajectories import make_trajectory
from transport import security
from transport.codec import encode
from transport.stream import TrajectoryReceiver, TrajectorySender


@pytest.fixture
def receiver():
    rx = TrajectoryReceiver("tcp://127.0.0.1:0", window_bytes=1 << 20)
    yield rx
    rx.close()


def _settle(rx, seconds=0.5):
    """Let the receiver answer the senders' HELLOs (single-threaded tests poll by hand)."""
    got, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        got += rx.poll(0.02)
    return got


def _drain(rx, want, timeout_s=5.0):
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += rx.poll(0.05)
    return got


def test_many_actors_deliver_and_accounting_balances(receiver):
    senders = [TrajectorySender(receiver.address, actor_id=a) for a in range(3)]
    _settle(receiver)
    try:
        sent = {}
        for a, s in enumerate(senders):
            for e in range(5):
                t = make_trajectory(a, e, length=128, seed=10 * a + e)
                s.send(t, timeout_s=5)
                sent[(a, e)] = t
        got = _drain(receiver, 15)
        assert len(got) == 15
        for actor, t, nbytes in got:
            ref = sent[(t.actor_id, t.episode_id)]
            assert actor == f"actor-{t.actor_id}" and nbytes > 0
            assert np.array_equal(t.token_ids, ref.token_ids)
            assert np.array_equal(t.behaviour_logprobs, ref.behaviour_logprobs)
            receiver.release(actor, nbytes)
        for a, s in enumerate(senders):
            assert s.sent == receiver.received[f"actor-{a}"] + receiver.rejected[f"codec/actor-{a}"]
    finally:
        for s in senders:
            s.close()


def test_a_restarted_actor_takes_over_its_identity(receiver):
    old = TrajectorySender(receiver.address, actor_id=7)
    _settle(receiver)
    old.send(make_trajectory(7, 0, length=16, seed=0), timeout_s=5)
    assert [t.episode_id for _, t, _ in _drain(receiver, 1)] == [0]
    new = TrajectorySender(receiver.address, actor_id=7)  # the old connection is still open
    try:
        _settle(receiver)
        new.send(make_trajectory(7, 1, length=16, seed=1), timeout_s=5)
        assert [t.episode_id for _, t, _ in _drain(receiver, 1)] == [1]
        assert receiver.received["actor-7"] == 2
    finally:
        old.close()
        new.close()


def test_sender_blocks_when_the_learner_does_not_release():
    one = len(make_trajectory(length=256).to_bytes())
    rx = TrajectoryReceiver("tcp://127.0.0.1:0", window_bytes=3 * one)
    tx = TrajectorySender(rx.address, actor_id=0)
    _settle(rx)
    try:
        for e in range(3):
            tx.send(make_trajectory(episode_id=e, length=256), timeout_s=5)
            rx.poll(0.05)
        # The window is used up and nothing was released: the next send cannot go.
        with pytest.raises(TimeoutError):
            tx.send(make_trajectory(episode_id=3, length=256), timeout_s=0.5)
        assert tx.sent == 3
        # Released bytes come back as credit, and the actor continues.
        rx.release("actor-0", one)
        tx.send(make_trajectory(episode_id=4, length=256), timeout_s=5)
        assert tx.sent == 4 and len(_drain(rx, 1)) == 1
    finally:
        tx.close()
        rx.close()


def test_a_sender_started_before_the_learner_gets_one_window_once_it_is_up():
    one = len(make_trajectory(length=256).to_bytes())
    probe = TrajectoryReceiver("tcp://127.0.0.1:0")
    address = probe.address  # a free port, nobody listening once the probe is closed
    probe.close()
    tx = TrajectorySender(address, actor_id=0)
    sent = threading.Thread(target=lambda: [
        tx.send(make_trajectory(episode_id=e, length=256), timeout_s=30) for e in range(4)],
        daemon=True)
    sent.start()
    time.sleep(2.5)  # the sender repeats its HELLO meanwhile: each queued, each answered later
    rx = TrajectoryReceiver(address, window_bytes=3 * one)
    try:
        held = _drain(rx, 3, timeout_s=30)
        held += _settle(rx, 1.5)
        # Three HELLOs or more reached the learner, but only the first window counts: the
        # fourth trajectory waits for released bytes.
        assert [t.episode_id for _, t, _ in held] == [0, 1, 2] and tx.sent == 3
        rx.release("actor-0", one)
        assert [t.episode_id for _, t, _ in _drain(rx, 1, timeout_s=30)] == [3]
    finally:
        sent.join(5)
        tx.close(flush_s=0)
        rx.close()


def test_bytes_in_flight_stay_within_the_window_under_a_slow_learner():
    window = 200_000
    rx = TrajectoryReceiver("tcp://127.0.0.1:0", window_bytes=window)
    tx = TrajectorySender(rx.address, actor_id=0)
    held, peak, done = [], [0], threading.Event()

    def produce():
        for e in range(60):
            tx.send(make_trajectory(episode_id=e, length=2048, seed=e), timeout_s=10)
        done.set()

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        released = 0
        deadline = time.monotonic() + 30
        while not (done.is_set() and released == tx.sent_bytes) and time.monotonic() < deadline:
            held += rx.poll(0.01)
            peak[0] = max(peak[0], tx.sent_bytes - released)
            if len(held) >= 3 or done.is_set():  # a slow learner: frees three at a time
                for actor, _, nbytes in held:
                    rx.release(actor, nbytes)
                    released += nbytes
                held = []
        thread.join(10)
        assert tx.sent == 60
        message = len(make_trajectory(length=2048).to_bytes())
        assert window // 2 < peak[0] <= window + message  # the window was used, never exceeded
    finally:
        thread.join(1)
        tx.close()
        rx.close()


def test_malformed_messages_are_counted_and_the_receiver_keeps_going(receiver):
    ctx = zmq.Context.instance()
    rogue = ctx.socket(zmq.DEALER)
    rogue.setsockopt(zmq.IDENTITY, b"actor-9")
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(receiver.address)
    good = make_trajectory(9, 0).to_wire()
    rng = random.Random(0)
    payload = encode(good)
    bad = [
        [b"TRAJ", b""],
        [b"TRAJ", rng.randbytes(300)],
        [b"TRAJ", payload[: len(payload) // 2]],                       # truncated
        [b"TRAJ", encode(dict(good, schema_version=99))],               # wrong schema version
        [b"TRAJ", encode(dict(good, flags=good["flags"][:5]))],         # mismatched lengths
        [b"TRAJ", encode(dict(good, token_ids=np.zeros(64, np.float64)))],  # an array, not bytes
        [b"TRAJ", msgpack.packb({"x": [1, 2, 3]})],
        [b"NOPE", b"x"],
        [b"TRAJ", b"a", b"b"],
    ] + [[b"TRAJ", rng.randbytes(rng.randrange(1, 2000))] for _ in range(200)]
    try:
        for frames in bad:
            rogue.send_multipart(frames)
        rogue.send_multipart([b"TRAJ", payload])
        got = _drain(receiver, 1)
        assert [t.episode_id for _, t, _ in got] == [0]
        rejected = sum(v for k, v in receiver.rejected.items() if "/" not in k)
        assert rejected == len(bad)
        assert receiver.rejected["schema"] >= 3 and receiver.rejected["frame"] == 2
    finally:
        rogue.close()


def test_curve_keeps_strangers_out_and_counts_them():
    server_keys, actor_keys = security.generate()
    stranger = security.generate()[1]
    rx = TrajectoryReceiver("tcp://127.0.0.1:0", curve=server_keys)
    ok = TrajectorySender(rx.address, 0, curve=actor_keys)
    # a key pair the server never allowed, and an actor with no keys at all
    bad = TrajectorySender(rx.address, 1, curve=security.ClientKeys(
        stranger.public, stranger.secret, actor_keys.server_public))
    plain = TrajectorySender(rx.address, 2)
    # The receiver answers in a thread of its own, so the CURVE handshakes may take as long as a
    # loaded machine needs: no fixed settling window.
    got, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            got.extend(rx.poll(0.02))

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        ok.send(make_trajectory(0, 0), timeout_s=60)
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [t.actor_id for _, t, _ in got] == [0]
        for sender, actor in ((bad, 1), (plain, 2)):
            with pytest.raises(TimeoutError):  # never gets a window: the handshake is refused
                sender.send(make_trajectory(actor, 0), timeout_s=2.0)
        deadline = time.monotonic() + 30
        while (rx.refused["unknown_key"] < 1 or rx.refused["no_curve"] < 1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rx.refused["unknown_key"] >= 1 and rx.refused["no_curve"] >= 1
        assert rx.received["actor-1"] == rx.received["actor-2"] == 0 and len(got) == 1
    finally:
        stop.set()
        server.join(timeout=5)
        for sender in (ok, bad, plain):
            sender.close(flush_s=0)
        rx.close()


def test_released_credit_goes_back_in_one_frame_per_actor_once_a_poll_has_read_all():
    """Small releases are summed and sent once a poll finds nothing more queued; an eighth of the
    window goes at once."""
    window = 8000
    rx = TrajectoryReceiver("tcp://127.0.0.1:0", window_bytes=window)
    actor = zmq.Context.instance().socket(zmq.DEALER)
    actor.setsockopt(zmq.IDENTITY, b"actor-5")
    actor.setsockopt(zmq.LINGER, 0)
    actor.connect(rx.address)

    def frames_within(seconds):
        got = []
        while actor.poll(int(seconds * 1000)):
            got.append(actor.recv_multipart())
            seconds = 0.05
        return got

    try:
        actor.send_multipart([b"HELLO"])
        _settle(rx, 0.3)
        assert frames_within(2.0) == [[b"WINDOW", window.to_bytes(8, "little")]]
        for n in (100, 200, 300):
            rx.release("actor-5", n)
        assert frames_within(0.2) == []  # held back until the receiver polls
        rx.poll(0)
        assert frames_within(2.0) == [[b"CREDIT", (600).to_bytes(8, "little")]]
        rx.release("actor-5", window // 8)  # with nothing pending: sent at once
        assert frames_within(2.0) == [[b"CREDIT", (window // 8).to_bytes(8, "little")]]
        rx.poll(0)
        assert frames_within(0.2) == []  # nothing was left to flush
        payload = make_trajectory(5, 0, length=16).to_bytes()
        for _ in range(3):
            actor.send_multipart([b"TRAJ", payload])
        time.sleep(0.5)  # all three queued at the receiver
        rx.release("actor-5", 100)
        assert len(rx.poll(0, max_messages=2)) == 2
        assert frames_within(0.2) == []  # more is queued: the sender is not waiting for this
        assert len(rx.poll(0)) == 1
        assert frames_within(2.0) == [[b"CREDIT", (100).to_bytes(8, "little")]]  # all read
    finally:
        actor.close()
        rx.close()


def test_a_large_payload_is_copied_into_zeromq_not_lent_through_pyzmqs_garbage_collector():
    """Above zmq.COPY_THRESHOLD a zero-copy send leaves the payload's release to pyzmq's
    garbage-collector thread, whose socket is closed at exit: a trajectory still held then is
    released through a freed socket during interpreter shutdown (valgrind shows the invalid reads;
    it fits the one time the test suite's process died at exit). The sender copies, so nothing
    is lent."""
    from zmq.utils.garbage import gc

    rx = TrajectoryReceiver("inproc://stream-copies-its-payload", window_bytes=1 << 24)
    tx = TrajectorySender(rx.address, actor_id=0)
    try:
        _settle(rx, 0.2)
        sent = make_trajectory(length=16384, seed=1)
        assert len(sent.to_bytes()) > zmq.COPY_THRESHOLD
        lent_before = len(gc.refs)
        tx.send(sent, timeout_s=5)
        got = _drain(rx, 1)
        assert len(got) == 1 and np.array_equal(got[0][1].token_ids, sent.token_ids)
        assert len(gc.refs) == lent_before  # the receiver holds the message: a loan would show
    finally:
        tx.close(flush_s=0)
        rx.close()


def test_poll_waits_for_the_first_message_and_no_longer(receiver):
    tx = TrajectorySender(receiver.address, actor_id=4)
    try:
        _settle(receiver, 0.3)
        t0 = time.monotonic()
        assert receiver.poll(0.3) == []  # nothing comes: the whole timeout is waited
        assert time.monotonic() - t0 >= 0.29
        late = threading.Timer(0.2, tx.send, (make_trajectory(4, 1, length=32),), {"timeout_s": 5})
        late.start()
        t0 = time.monotonic()
        got = receiver.poll(5.0)  # returns with the first message, not at the timeout
        late.join()
        assert [t.episode_id for _, t, _ in got] == [1] and 0.15 <= time.monotonic() - t0 < 2.0
        assert receiver.poll(0) == []
    finally:
        tx.close(flush_s=0)


def test_no_credit_is_lost_while_the_sender_has_not_read_it():
    """A poll that empties the queue returns its credit in a frame of its own, and the sender
    reads its frames only once its credit runs out: thousands can queue up meanwhile (here over
    ZeroMQ's inproc transport, whose queues end at the high-water marks, with no kernel buffer
    behind them). Dropping any would shrink the window for good: once everything is released,
    the sender must hold the whole window again."""
    trajectory = make_trajectory(length=16)
    one = len(trajectory.to_bytes())
    window, total = 5000 * one, 4000
    rx = TrajectoryReceiver("inproc://credit-frames", window_bytes=window)
    tx = TrajectorySender("inproc://credit-frames", actor_id=0)
    errors = []

    def send_all():  # one at a time, so that most polls find one message and empty the queue
        try:
            for _ in range(total):
                tx.send(trajectory, timeout_s=10)
                time.sleep(0.0002)
        except TimeoutError as e:
            errors.append(e)

    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    received, deadline = 0, time.monotonic() + 60
    try:
        while received < total and not errors and time.monotonic() < deadline:
            for actor, _, nbytes in rx.poll(0.01):
                rx.release(actor, nbytes)
                received += 1
        sender.join(15)
        assert not errors and received == total == tx.sent
        rx.poll(0)  # the last releases' credit
        tx._take_credit(time.monotonic() + 2)  # what a send would do with its credit used up
        assert tx._credit == window
    finally:
        tx.close(flush_s=0)
        rx.close()


def test_a_frame_over_the_limit_is_refused_by_zeromq_before_it_is_read():
    """ZMQ_MAXMSGSIZE: the oversize frame never reaches the receiver's code (no decode, no
    ``too_large`` count: nothing of it was allocated), its sender is disconnected, and an
    honest actor's trajectories go on arriving."""
    rx = TrajectoryReceiver("tcp://127.0.0.1:0", window_bytes=1 << 20, max_message_bytes=1 << 20)
    ctx = zmq.Context.instance()
    rogue = ctx.socket(zmq.DEALER)
    rogue.setsockopt(zmq.IDENTITY, b"actor-6")
    rogue.setsockopt(zmq.LINGER, 0)
    events = rogue.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    rogue.connect(rx.address)
    sender = TrajectorySender(rx.address, actor_id=5)
    try:
        rogue.send_multipart([b"TRAJ", bytes(2 << 20)])
        _settle(rx, 0.5)
        assert events.poll(5000), "the oversize sender was not disconnected"
        sender.send(make_trajectory(5, 1), timeout_s=10)
        got = _drain(rx, 1)
        assert [t.episode_id for _, t, _ in got] == [1]
        assert not rx.rejected  # refused below the receiver's code: never decoded or counted
    finally:
        rogue.disable_monitor()
        events.close()
        rogue.close()
        sender.close(flush_s=0)
        rx.close()


def test_ten_thousand_fuzzed_messages_crash_nothing_and_each_is_counted_once():
    """Random frames, wrong frame shapes, schema-breaking fields and bit-flipped or cut valid
    payloads from one rogue socket: the receiver keeps going, every message is either a valid
    trajectory or one rejection of one kind, and an honest sender is served afterwards."""
    rx = TrajectoryReceiver("tcp://127.0.0.1:0", window_bytes=1 << 20)
    ctx = zmq.Context.instance()
    rogue = ctx.socket(zmq.DEALER)
    rogue.setsockopt(zmq.IDENTITY, b"actor-8")
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.setsockopt(zmq.SNDHWM, 0)
    rogue.connect(rx.address)
    rng = random.Random(1234)
    good = make_trajectory(8, 0).to_wire()
    payload = encode(good)
    broken_fields = [dict(good, schema_version=7), dict(good, flags=good["flags"][:3]),
                     dict(good, token_ids=b"\x00" * 5), dict(good, turn_rewards=b"\x00" * 3),
                     dict(good, run_id=17), {k: v for k, v in good.items() if k != "token_ids"}]
    sent = {"frame": 0, "schema": 0, "other": 0}

    def fuzz() -> list[bytes]:
        kind = rng.randrange(5)
        if kind == 0:  # a frame shape the protocol does not have
            sent["frame"] += 1
            return rng.choice([[rng.randbytes(rng.randrange(0, 9)) + b"?", payload], [b"TRAJ"],
                               [b"TRAJ", payload, b"x"], [b"HELLO", b"x"], [b""]])
        if kind == 1:  # well-formed msgpack that breaks the schema
            sent["schema"] += 1
            return [b"TRAJ", encode(rng.choice(broken_fields))]
        sent["other"] += 1
        if kind == 2:  # noise
            return [b"TRAJ", rng.randbytes(rng.randrange(0, 3000))]
        data = bytearray(payload)
        if kind == 3:  # a valid payload cut short
            return [b"TRAJ", bytes(data[:rng.randrange(0, len(data))])]
        for _ in range(rng.randrange(1, 8)):  # a valid payload with a few bits flipped
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return [b"TRAJ", bytes(data)]

    total = 10_000
    try:
        got = []
        for n in range(total):
            rogue.send_multipart(fuzz())
            if n % 500 == 499:
                got += rx.poll(0.0, max_messages=1000)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got += rx.poll(0.05, max_messages=1000)
            rejected = sum(v for k, v in rx.rejected.items() if "/" not in k)
            if len(got) + rejected == total:
                break
        rejected = {k: v for k, v in rx.rejected.items() if "/" not in k}
        assert len(got) + sum(rejected.values()) == total  # each message once: valid or one kind
        assert set(rejected) <= {"frame", "codec", "schema"}
        assert rejected["frame"] == sent["frame"] and rejected["schema"] >= sent["schema"]
        assert sum(rejected.values()) >= sent["frame"] + sent["schema"]
        assert sum(rx.rejected[f"{k}/actor-8"] for k in rejected) == sum(rejected.values())
        sender = TrajectorySender(rx.address, actor_id=3)
        try:
            _settle(rx)  # answers its HELLO
            sender.send(make_trajectory(3, 5), timeout_s=10)
            assert [t.episode_id for _, t, _ in _drain(rx, 1)] == [5]
        finally:
            sender.close(flush_s=0)
    finally:
        rogue.close()
        rx.close()
