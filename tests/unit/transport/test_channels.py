"""transport/channels.py: the backends satisfy the Protocols, and keep the same contract.

Trajectory contract tests run over both backends the factory picks: ZeroMQ (real sockets on
loopback) and in-process. Weight contract tests run over the in-process backend and, in one
test, a real gloo group whose subscribers are threads of this process. Senders run in threads
while the test polls, as actor and learner do (ZeroMQ grants a window only once ``poll`` has
seen the sender's HELLO).
"""

from __future__ import annotations

import inspect
import itertools
import threading
import time

import numpy as np
import pytest
import torch

from tests.unit.transport.trajectories import make_trajectory
from transport.channels import (
    TrajectorySink,
    TrajectorySource,
    WeightSink,
    WeightSource,
    trajectory_sink,
    trajectory_source,
    weight_sink,
    weight_source,
)
from transport.codec import CodecError
from transport.inprocess import InProcessTrajectoryChannel, InProcessWeights
from transport.stream import TrajectoryReceiver, TrajectorySender
from transport.weights import WeightPublisher, WeightSubscriber, WeightSyncError

_names = itertools.count()


def _inproc(kind: str) -> str:
    return f"inproc://test-{kind}-{next(_names)}"


@pytest.fixture(params=["zmq", "inproc"])
def source_at(request):
    """Makes trajectory sources of the parametrised backend; closes them after the test."""
    made = []

    def make(window_bytes: int = 1 << 20) -> TrajectorySource:
        address = "tcp://127.0.0.1:0" if request.param == "zmq" else _inproc("stream")
        made.append(trajectory_source(address, window_bytes=window_bytes))
        return made[-1]

    yield make
    for source in made:
        source.close()


def _size(trajectory) -> int:
    return len(trajectory.to_bytes())


def _sending(sink, trajectories, *, close: bool = False) -> threading.Thread:
    """An actor's sender thread: sends each trajectory (waiting up to 5 s for credit)."""
    def run():
        for t in trajectories:
            sink.send(t, timeout_s=5)
        if close:
            sink.close(flush_s=2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _drain(source, want: int, timeout_s: float = 5.0, *, release: bool = True) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        items = source.poll(0.02)
        got += items
        for actor, _, nbytes in items if release else ():
            source.release(actor, nbytes)
    return got


def _signature_fits(impl, protocol) -> None:
    """Every protocol member is on ``impl``; methods take the protocol's parameters (same names,
    kinds and defaults) and any others only with a default."""
    for name, member in vars(protocol).items():
        if name.startswith("_"):
            continue
        assert hasattr(impl, name), f"{type(impl).__name__} lacks {name}"
        if isinstance(member, property):
            continue
        want = inspect.signature(member).parameters
        have = inspect.signature(getattr(type(impl), name)).parameters
        for p in want.values():
            assert p.name in have, f"{type(impl).__name__}.{name} lacks {p.name}"
            assert (have[p.name].kind, have[p.name].default) == (p.kind, p.default), (name, p.name)
        for p in have.values():
            optional = p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            assert p.name in want or optional, f"{type(impl).__name__}.{name} needs {p.name}"


def test_every_backend_satisfies_its_protocol():
    zmq_source = trajectory_source("tcp://127.0.0.1:0")
    zmq_sink = trajectory_sink(zmq_source.address, 0)
    inproc_source = trajectory_source(_inproc("stream"))
    inproc_sink = trajectory_sink(inproc_source.address, 0)
    dist_source = weight_source("tcp://127.0.0.1:0", world_size=2, timeout_s=3)
    dist_sink = weight_sink(dist_source.address, rank=1, world_size=2, timeout_s=3)
    inproc_weights = weight_source(_inproc("weights"), world_size=2)
    inproc_sub = weight_sink(inproc_weights.address, rank=1)
    try:
        assert (type(zmq_source), type(zmq_sink)) == (TrajectoryReceiver, TrajectorySender)
        assert (type(dist_source), type(dist_sink)) == (WeightPublisher, WeightSubscriber)
        assert type(inproc_source) is InProcessTrajectoryChannel
        assert type(inproc_weights) is InProcessWeights
        for impl, protocol in [(zmq_source, TrajectorySource), (inproc_source, TrajectorySource),
                               (zmq_sink, TrajectorySink), (inproc_sink, TrajectorySink),
                               (dist_source, WeightSource), (inproc_weights, WeightSource),
                               (dist_sink, WeightSink), (inproc_sub, WeightSink)]:
            assert isinstance(impl, protocol)
            _signature_fits(impl, protocol)
    finally:
        for end in (zmq_sink, zmq_source, inproc_sink, inproc_source, dist_sink, dist_source,
                    inproc_sub, inproc_weights):
            end.close()


def test_each_trajectory_arrives_once_and_in_order_per_actor(source_at):
    source = source_at()
    sinks = [trajectory_sink(source.address, a) for a in range(3)]
    sent = {(a, e): make_trajectory(a, e, length=64 + 16 * e, seed=10 * a + e)
            for a in range(3) for e in range(20)}
    threads = [_sending(s, [sent[(a, e)] for e in range(20)]) for a, s in enumerate(sinks)]
    got = _drain(source, 60)
    for thread in threads:
        thread.join(5)
    got += source.poll(0.1)  # nothing more may come
    try:
        assert len(got) == 60
        for a in range(3):
            assert [t.episode_id for actor, t, _ in got if actor == f"actor-{a}"] == list(range(20))
            assert source.received[f"actor-{a}"] == sinks[a].sent == 20
        for actor, t, nbytes in got:
            ref = sent[(t.actor_id, t.episode_id)]
            assert actor == f"actor-{t.actor_id}" and nbytes == _size(ref)
            for field in ("token_ids", "loss_mask", "behaviour_logprobs", "policy_version"):
                assert np.array_equal(getattr(t, field), getattr(ref, field))
                assert not np.shares_memory(getattr(t, field), getattr(ref, field))
        assert not any(source.rejected.values())
    finally:
        for s in sinks:
            s.close()


def test_a_full_window_blocks_the_sender_until_the_learner_releases(source_at):
    one = _size(make_trajectory(length=256))
    source = source_at(window_bytes=3 * one)
    sink = trajectory_sink(source.address, 0)
    try:
        thread = _sending(sink, [make_trajectory(episode_id=e, length=256) for e in range(3)])
        held = _drain(source, 3, release=False)
        thread.join(5)
        assert len(held) == 3 and sink.sent == 3
        with pytest.raises(TimeoutError):
            sink.send(make_trajectory(episode_id=3, length=256), timeout_s=0.3)
        assert sink.sent == 3
        actor, _, nbytes = held[0]
        source.release(actor, nbytes)
        sink.send(make_trajectory(episode_id=4, length=256), timeout_s=5)
        assert [t.episode_id for _, t, _ in _drain(source, 1, release=False)] == [4]
        with pytest.raises(TimeoutError):  # the released bytes are in flight again
            sink.send(make_trajectory(episode_id=5, length=256), timeout_s=0.3)
    finally:
        sink.close(flush_s=0)


def test_one_message_always_fits_an_empty_window(source_at):
    big = make_trajectory(length=1024)
    source = source_at(window_bytes=_size(big) // 4)
    sink = trajectory_sink(source.address, 0)
    try:
        thread = _sending(sink, [big])
        held = _drain(source, 1, release=False)
        thread.join(5)
        assert len(held) == 1
        with pytest.raises(TimeoutError):
            sink.send(big, timeout_s=0.3)
        actor, _, nbytes = held[0]
        source.release(actor, nbytes)
        sink.send(big, timeout_s=5)
        assert len(_drain(source, 1)) == 1 and sink.sent == 2
    finally:
        sink.close(flush_s=0)


def test_bad_trajectories_fail_where_they_would_over_the_wire(source_at):
    good = make_trajectory(length=256)
    source = source_at(window_bytes=_size(good) // 2)  # each message alone fills the window
    sink = trajectory_sink(source.address, 0)
    unencodable = make_trajectory(episode_id=1)
    unencodable.metrics["x"] = object()  # past __post_init__: caught by the codec, sender side
    off_schema = make_trajectory(episode_id=2, length=256)
    off_schema.group_size = -1  # past __post_init__: caught by the schema, learner side
    try:
        with pytest.raises(CodecError):
            sink.send(unencodable, timeout_s=1)
        assert sink.sent == 0
        # The rejected message's bytes come back at once, so the good one still gets through.
        thread = _sending(sink, [off_schema, good])
        got = _drain(source, 1)
        thread.join(5)
        assert [t.episode_id for _, t, _ in got] == [0] and sink.sent == 2
        assert source.rejected["schema"] == source.rejected["schema/actor-0"] == 1
        assert source.received["actor-0"] == 1
    finally:
        sink.close(flush_s=0)


def test_what_was_sent_before_close_arrives(source_at):
    source = source_at()
    sink = trajectory_sink(source.address, 5)
    thread = _sending(sink, [make_trajectory(5, e, seed=e) for e in range(5)], close=True)
    got = _drain(source, 5)
    thread.join(5)
    assert [t.episode_id for _, t, _ in got] == list(range(5))
    assert source.received["actor-5"] == 5


def test_in_process_addresses_name_one_open_source():
    address = _inproc("stream")
    with pytest.raises(ConnectionError):
        trajectory_sink(address, 0)
    source = trajectory_source(address, window_bytes=1 << 20)
    sink = trajectory_sink(address, 0)
    with pytest.raises(ValueError):
        trajectory_source(address)
    with pytest.raises(ValueError):
        trajectory_source("inproc://")
    source.close()
    with pytest.raises(TimeoutError):  # a closed source gives no credit, like a dead learner
        sink.send(make_trajectory(), timeout_s=0.1)
    with pytest.raises(ConnectionError):
        trajectory_sink(address, 1)
    again = trajectory_source(address)  # the name is free again
    again.close()


def _weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(17, 5, generator=g)),
        ("layers.0.bf16", torch.randn(3, 7, generator=g).to(torch.bfloat16)),
        ("special", torch.tensor([float("nan"), float("inf"), -0.0, 1e-45])),
        ("transposed", torch.randn(6, 4, generator=g).t()),
        ("step", torch.tensor(seed, dtype=torch.int64)),
        ("mask", torch.rand(9, generator=g) > 0.5),
    ]


def _bits(named) -> list[tuple[str, str, tuple, bytes]]:
    def raw(t: torch.Tensor) -> bytes:
        return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()

    # by name: over gloo the tensors come bucket by bucket (transport/packing.py)
    return sorted((name, str(t.dtype), tuple(t.shape), raw(t)) for name, t in named)


def _receiving(sinks) -> tuple[list[threading.Thread], dict]:
    """A thread per sink, receiving once into ``results[i]``: (version, bits) or the error."""
    results = {}

    def run(rank, sink):
        try:
            version, named = sink.receive()
            results[rank] = (version, _bits(named))
        except WeightSyncError as e:
            results[rank] = e

    threads = [threading.Thread(target=run, args=(r, s), daemon=True) for r, s in enumerate(sinks)]
    for thread in threads:
        thread.start()
    return threads, results


@pytest.mark.parametrize("kind", ["gloo", "inproc"])
def test_every_subscriber_gets_each_version_in_order_bit_exact(kind):
    address = "tcp://127.0.0.1:0" if kind == "gloo" else _inproc("weights")
    source = weight_source(address, world_size=4, timeout_s=5)
    sinks = [weight_sink(source.address, rank=r, world_size=4, timeout_s=5) for r in (1, 2, 3)]
    try:
        for version in range(3):
            named = _weights(seed=version)
            threads, results = _receiving(sinks)
            source.publish(named, version)
            for thread in threads:
                thread.join(5)
            assert results == {rank: (version, _bits(named)) for rank in range(3)}
    finally:
        for end in sinks + [source]:
            end.close()


@pytest.mark.parametrize("kind", ["gloo", "inproc"])
def test_a_receive_without_a_publish_raises_weight_sync_error_at_the_timeout(kind):
    address = "tcp://127.0.0.1:0" if kind == "gloo" else _inproc("weights")
    source = weight_source(address, world_size=2, timeout_s=5)
    sink = weight_sink(source.address, rank=1, world_size=2, timeout_s=0.3)
    try:
        start = time.monotonic()
        with pytest.raises(WeightSyncError):
            sink.receive()
        assert 0.25 < time.monotonic() - start < 3
    finally:
        sink.close()
        source.close()


def test_in_process_publish_keeps_copies_and_versions_increase():
    source = weight_source(_inproc("weights"), world_size=2)
    sink = weight_sink(source.address, rank=1, timeout_s=0.2)
    named = _weights(seed=0)
    expected = _bits(named)
    source.publish(named, 0)
    named[0][1].zero_()  # the learner steps on: what was published must not change
    version, received = sink.receive()
    assert version == 0 and _bits(received) == expected
    with pytest.raises(WeightSyncError):  # nothing newer than version 0
        sink.receive()
    for stale in (0, -1):
        with pytest.raises(ValueError):
            source.publish(named, stale)
    generation = source.reform(2)
    assert source.reform(2) == generation + 1
    source.publish(_weights(seed=0), 0)  # a repeat is allowed first after a reform
    version, received = sink.receive()
    assert version == 0 and _bits(received) == expected
    source.publish(_weights(seed=1), 1)
    source.publish(_weights(seed=2), 2)
    assert sink.receive()[0] == 2  # one that fell behind gets the latest
    late = weight_sink(source.address, rank=2, timeout_s=0.2)  # a restarted worker
    assert late.receive()[0] == 2
    source.close()


def test_closing_the_in_process_publisher_wakes_its_subscribers():
    source = weight_source(_inproc("weights"), world_size=3)
    sinks = [weight_sink(source.address, rank=r, timeout_s=5) for r in (1, 2)]
    threads, results = _receiving(sinks)
    time.sleep(0.1)
    start = time.monotonic()
    source.close()
    for thread in threads:
        thread.join(5)
    assert time.monotonic() - start < 1
    assert all(isinstance(results[rank], WeightSyncError) for rank in range(2))
    with pytest.raises(ConnectionError):
        weight_sink(source.address, rank=1)
