"""Weight broadcast (transport/weights.py, transport/packing.py): real gloo groups on loopback.

Subscribers are spawned processes driven through a command queue, the way the actor's driver
drives its vLLM workers; they report fingerprints (dtype, shape, hash of the raw bytes) of what
they received, compared with the publisher's for bit-exact equality. Every process and the store
are shut down at the end of each test, also on failure.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing as mp
import os
import signal
import time
import traceback

import pytest
import torch

from transport.packing import Layout
from transport.weights import WeightPublisher, WeightSubscriber, WeightSyncError

TIMEOUT_S = 3.0
WAIT_S = 60.0  # upper bound for a result from a subscriber process (spawn + torch import included)


def _fingerprint(named) -> list[tuple[str, str, tuple[int, ...], str]]:
    def digest(t: torch.Tensor) -> str:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return hashlib.blake2b(raw, digest_size=16).hexdigest()

    return [(name, str(t.dtype), tuple(t.shape), digest(t)) for name, t in named]


def _prints(named) -> list[tuple[str, str, tuple[int, ...], str]]:
    """Fingerprints by name: a subscriber gets the tensors bucket by bucket (see packing.py)."""
    return sorted(_fingerprint(named))


def _weights(seed: int, *, extra: bool = False) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    named = [
        ("embed.weight", torch.randn(17, 5, generator=g)),
        ("layers.0.attn.bf16", torch.randn(3, 7, 2, generator=g).to(torch.bfloat16)),
        ("special", torch.tensor([math.nan, math.inf, -math.inf, -0.0, 1e-45])),
        ("step", torch.tensor(seed, dtype=torch.int64)),
        ("empty", torch.zeros(0, 3)),
        ("empty.bf16", torch.zeros(2, 0, dtype=torch.bfloat16)),
        ("ids", torch.randint(-2**62, 2**62, (11,), generator=g, dtype=torch.int64)),
        ("scale", torch.tensor(1.5 + seed)),
        ("transposed", torch.randn(6, 4, generator=g).t()),
        ("half", torch.randn(5, generator=g).half()),
        ("mask", torch.rand(9, generator=g) > 0.5),
    ]
    if extra:
        named.append(("lm_head.weight", torch.randn(4, 3, 3, generator=g)))
    return named


def _subscriber_main(port, rank, world_size, generation, commands, results):
    """A subscriber process: runs commands until ("stop",); reports on ``results``."""
    torch.set_num_threads(1)
    try:
        sub = WeightSubscriber("127.0.0.1", port, rank, world_size, generation=generation,
                               timeout_s=TIMEOUT_S)
        results.put(("ready", rank, None, None, None))
        for command, *args in iter(commands.get, ("stop",)):
            if command == "join":
                sub.join(*args)
            elif command == "receive":
                try:
                    version, named = sub.receive()
                    named = list(named)  # each bucket arrives as the list reaches it
                    results.put(("ok", rank, version, _prints(named), sub.layouts_received))
                except WeightSyncError as e:
                    results.put(("error", rank, str(e), None, None))
            elif command == "read_one":  # a reader that stops after the first tensor
                version, named = sub.receive()
                name, _ = next(named)
                results.put(("ok", rank, version, name, sub.layouts_received))
        sub.close()
    except BaseException:  # noqa: BLE001 - the subprocess reports any failure; the test fails with it
        results.put(("crash", rank, traceback.format_exc()))


class Cluster:
    """A publisher and its subscriber processes; ``close`` ends all of them."""

    def __init__(self, world_size: int, timeout_s: float = TIMEOUT_S, bucket_bytes: int = 0):
        self.ctx = mp.get_context("spawn")
        # Per rank (process, commands, results). A queue per process: a process killed while
        # writing to a shared queue would leave its lock held for everyone.
        self.subs: dict[int, tuple[mp.Process, mp.Queue, mp.Queue]] = {}
        self.procs: list[mp.Process] = []
        self.publisher = WeightPublisher("127.0.0.1", 0, world_size, timeout_s=timeout_s,
                                         bucket_bytes=bucket_bytes)

    def spawn(self, *ranks: int, world_size: int | None = None, generation: int | None = None):
        """Start subscriber processes and wait until each has connected to the store.

        Waiting keeps process start-up (seconds on 2 cores) out of the group's timeout.
        """
        for rank in ranks:
            commands, results = self.ctx.Queue(), self.ctx.Queue()
            proc = self.ctx.Process(target=_subscriber_main, daemon=True, args=(
                self.publisher.port, rank, world_size, generation, commands, results))
            proc.start()
            self.subs[rank] = (proc, commands, results)
            self.procs.append(proc)
        for (result,) in self.collect(ranks=ranks).values():
            assert result[0] == "ready", result
        return [self.subs[rank][0] for rank in ranks]

    def tell(self, *command, ranks=None) -> None:
        for rank in ranks or sorted(self.subs):
            self.subs[rank][1].put(command)

    def collect(self, count: int = 1, ranks=None) -> dict[int, list[tuple]]:
        """The next ``count`` results of each rank; a crashed subscriber fails the test."""
        by_rank = {}
        for rank in ranks or sorted(self.subs):
            by_rank[rank] = [self.subs[rank][2].get(timeout=WAIT_S) for _ in range(count)]
            for result in by_rank[rank]:
                assert result[0] != "crash", result[2]
        return by_rank

    def close(self) -> None:
        try:
            self.publisher.close()  # first: subscribers blocked in receive raise at once
        finally:
            for proc, commands, _ in self.subs.values():
                if proc.is_alive():
                    commands.put(("stop",))
            for proc in self.procs:
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=5)


@pytest.fixture
def cluster():
    made: list[Cluster] = []

    def make(world_size: int, timeout_s: float = TIMEOUT_S, bucket_bytes: int = 0) -> Cluster:
        made.append(Cluster(world_size, timeout_s, bucket_bytes))
        return made[-1]

    try:
        yield make
    finally:
        for c in made:
            c.close()


# --- packing, in process --------------------------------------------------------------------

@pytest.mark.parametrize("bucket_bytes", [0, 1, 40, 100, 1 << 20])
def test_pack_unpack_roundtrip_is_bit_exact_and_zero_copy(bucket_bytes):
    named = _weights(0)
    layout = Layout.of(named, bucket_bytes)
    buffers = layout.pack_all([t for _, t in named])
    views = [nv for b, buffer in zip(layout.buckets, buffers) for nv in b.unpack(buffer)]
    order = {name: i for i, (name, _) in enumerate(named)}
    assert _fingerprint(sorted(views, key=lambda nv: order[nv[0]])) == _fingerprint(named)
    storages = {b.untyped_storage().data_ptr() for b in buffers}
    assert all(v.untyped_storage().data_ptr() in storages for _, v in views)


def test_buckets_by_hand():
    """float32 a(3) b(2) c(4), bfloat16 d(5) e(1), float32 f(1); at most 24 bytes a bucket:
    a+b (20 bytes) closes when c would make it 36; c+f (20 bytes) and d+e (12 bytes) are still
    open at the end and close in dtype-name order."""
    specs = [("a", "float32", [3]), ("b", "float32", [2]), ("c", "float32", [4]),
             ("d", "bfloat16", [5]), ("e", "bfloat16", [1]), ("f", "float32", [1])]
    layout = Layout.build(specs, 24)
    got = [(b.dtype, [e.name for e in b.entries], [e.offset for e in b.entries], b.numel, b.last)
           for b in layout.buckets]
    assert got == [("float32", ["a", "b"], [0, 3], 5, 1),
                   ("bfloat16", ["d", "e"], [0, 5], 6, 4),
                   ("float32", ["c", "f"], [0, 4], 5, 5)]
    # a tensor larger than a bucket travels alone; 0 bytes: one bucket per dtype
    alone = Layout.build([("x", "float32", [2]), ("big", "float32", [10]), ("y", "float32", [1])], 16)
    assert [[e.name for e in b.entries] for b in alone.buckets] == [["x"], ["big"], ["y"]]
    whole = Layout.build(specs, 0)
    assert [(b.dtype, len(b.entries)) for b in whole.buckets] == [("bfloat16", 2), ("float32", 4)]


def test_bucket_properties_over_random_layouts():
    rng = torch.Generator().manual_seed(0)
    dtypes = ["float32", "bfloat16", "int64", "bool"]
    for trial in range(200):
        n = int(torch.randint(1, 30, (1,), generator=rng))
        specs = [(f"t{i}", dtypes[int(torch.randint(0, 4, (1,), generator=rng))],
                  [int(torch.randint(0, 50, (1,), generator=rng))]) for i in range(n)]
        bucket_bytes = int(torch.randint(0, 400, (1,), generator=rng))
        layout = Layout.build(specs, bucket_bytes)
        members = [e.name for b in layout.buckets for e in b.entries]
        assert sorted(members) == sorted(name for name, _, _ in specs)  # each exactly once
        position = {name: i for i, (name, _, _) in enumerate(specs)}
        for b in layout.buckets:
            names = [e.name for e in b.entries]
            assert [position[x] for x in names] == sorted(position[x] for x in names)
            assert all(e.dtype == b.dtype and layout.entries[position[e.name]] == e for e in b.entries)
            assert b.last == position[names[-1]]
            if bucket_bytes and len(names) > 1:
                assert b.nbytes <= bucket_bytes
        # A reader of one tensor at a time that sends the head bucket once it is complete holds
        # at most one bucket of each dtype at any time (the publisher's memory bound).
        first = {b.index: position[b.entries[0].name] for b in layout.buckets}
        sent = 0
        for p in range(n):
            while sent < len(layout.buckets) and layout.buckets[sent].last <= p:
                sent += 1
            held = [b.dtype for b in layout.buckets[sent:] if first[b.index] <= p]
            assert len(held) == len(set(held)), (trial, p, held)


def test_layout_json_roundtrip_and_digest():
    layout = Layout.of(_weights(0), 64)
    again = Layout.from_bytes(layout.to_bytes())
    assert again == layout and again.digest == layout.digest and again.bucket_bytes == 64
    assert Layout.of(_weights(1, extra=True), 64).digest != layout.digest
    assert Layout.of(_weights(0), 128).digest != layout.digest
    with pytest.raises(ValueError, match="dtype"):
        Layout.from_bytes(b'{"bucket_bytes":0,"tensors":[["x","complex64",[2]]]}')
    with pytest.raises(ValueError, match="bucket_bytes"):
        Layout.from_bytes(b'[["x","float32",[2]]]')
    with pytest.raises(ValueError, match="twice"):
        Layout.build([("x", "float32", [1]), ("x", "float32", [2])])
    with pytest.raises(ValueError, match="dtype"):
        Layout.of([("c", torch.zeros(2, dtype=torch.complex64))])


def test_publisher_alone_refuses_non_increasing_versions():
    publisher = WeightPublisher("127.0.0.1", 0, 1, timeout_s=TIMEOUT_S)
    try:
        publisher.publish(_weights(0), version=3)
        with pytest.raises(ValueError, match="does not increase"):
            publisher.publish(_weights(0), version=3)
        publisher.publish(_weights(0), version=4)
        assert publisher.layouts_sent == 1 and publisher.last_version == 4
        publisher.reform(1)  # a new generation may get the current version once more, not older
        with pytest.raises(ValueError, match="does not increase"):
            publisher.publish(_weights(0), version=3)
        publisher.publish(_weights(0), version=4)
        with pytest.raises(ValueError, match="does not increase"):
            publisher.publish(_weights(0), version=4)
    finally:
        publisher.close()


# --- broadcast to subscriber processes ------------------------------------------------------

@pytest.mark.parametrize("subscribers,bucket_bytes", [(1, 0), (2, 0), (4, 0), (2, 64)])
def test_broadcast_is_bit_exact(cluster, subscribers, bucket_bytes):
    c = cluster(subscribers + 1, bucket_bytes=bucket_bytes)
    c.spawn(*range(1, subscribers + 1), world_size=subscribers + 1, generation=0)
    c.tell("receive")
    named = _weights(7)
    c.publisher.publish(named, version=1)
    for (status, _, version, prints, _), in c.collect().values():
        assert (status, version, prints) == ("ok", 1, _prints(named))


def test_ten_million_parameters_bit_exact(cluster):
    c = cluster(3)
    c.spawn(1, 2)  # world size and generation read from the publisher's store
    named = [("big.fp32", torch.randn(6_000_000)), ("big.bf16", torch.randn(4_000_000).bfloat16()),
             ("small", torch.arange(3))]
    c.tell("receive")
    c.publisher.publish(named, version=1)
    for (status, _, version, prints, _), in c.collect().values():
        assert (status, version, prints) == ("ok", 1, _prints(named))


def test_a_lazy_publish_reads_one_tensor_at_a_time_and_holds_one_bucket_per_dtype(cluster):
    """A model of 40 tensors of 4 KiB in two dtypes, in buckets of 16 KiB: the publisher reads
    each tensor only when it reaches it (buckets go out in between) and never holds more than a
    bucket per dtype; the subscribers get every tensor bit-exact."""
    g = torch.Generator().manual_seed(3)
    named = [(f"layer{i}.w", torch.randn(1024, generator=g).to(
        torch.float32 if i % 3 else torch.bfloat16)) for i in range(40)]
    c = cluster(3, bucket_bytes=16 << 10)
    c.spawn(1, 2, world_size=3, generation=0)
    sent_when_read = []

    def lazy():
        for name, t in named:
            sent_when_read.append(c.publisher.buckets_sent)
            yield name, t

    specs = [(n, str(t.dtype).removeprefix("torch."), t.shape) for n, t in named]
    c.tell("receive")
    c.publisher.publish(lazy(), version=1, specs=specs)
    for (status, _, version, prints, _), in c.collect().values():
        assert (status, version, prints) == ("ok", 1, _prints(named))
    assert sent_when_read[0] == 0 and sent_when_read[-1] >= 3  # buckets went out while reading
    # float32: 26 tensors of 4 KiB, 4 a bucket; bfloat16: 14 of 2 KiB, 8 a bucket
    assert c.publisher.buckets_sent == len(Layout.build(specs, 16 << 10).buckets) == 7 + 2
    assert c.publisher.peak_buffer_bytes <= (16 << 10) + (16 << 10)  # a bucket of each dtype
    # a tensor that is not what its spec says spends the group
    c.tell("receive")
    wrong = [(n, t.double() if i == 30 else t) for i, (n, t) in enumerate(named)]
    with pytest.raises(WeightSyncError, match="the specs say 'layer30.w'"):
        c.publisher.publish(iter(wrong), version=2, specs=specs)
    assert all(r[0][0] == "error" for r in c.collect().values())


def test_a_reader_that_stops_half_way_must_rejoin(cluster):
    c = cluster(2, bucket_bytes=64)
    c.spawn(1, world_size=2, generation=0)
    c.tell("read_one")
    with pytest.raises(WeightSyncError):  # the subscriber stops receiving after one bucket
        c.publisher.publish(_weights(1), version=1)
    first = Layout.of(_weights(1), 64).buckets[0].entries[0].name
    assert c.collect()[1][0][:4] == ("ok", 1, 1, first)
    c.tell("receive")
    assert "not read to its end" in c.collect()[1][0][2]
    c.tell("join", c.publisher.reform(2), 2)
    c.tell("receive")
    c.publisher.publish(_weights(1), version=1)
    assert c.collect()[1][0][:4] == ("ok", 1, 1, _prints(_weights(1)))


def test_versions_in_order_and_layout_sent_only_when_changed(cluster):
    c = cluster(3)
    c.spawn(1, 2, world_size=3, generation=0)
    plan = [(1, _weights(1)), (2, _weights(2)), (5, _weights(5)), (9, _weights(9, extra=True))]
    for _ in plan:
        c.tell("receive")
    for version, named in plan:
        c.publisher.publish(named, version)
    assert c.publisher.layouts_sent == 2
    for results in c.collect(len(plan)).values():
        assert [r[2] for r in results] == [v for v, _ in plan]
        assert [r[3] for r in results] == [_prints(named) for _, named in plan]
        assert [r[4] for r in results] == [1, 1, 1, 2]  # layouts received so far


def test_silent_subscriber_times_out(cluster):
    c = cluster(2, timeout_s=2.0)
    c.spawn(1, world_size=2, generation=0)

    def publish_times_out(version: int) -> None:
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match=f"publish of version {version} failed"):
            c.publisher.publish(_weights(version), version)
        assert 1.5 < time.monotonic() - start < 2.0 + 1.5

    publish_times_out(1)  # silent at the rendezvous: never told to receive
    with pytest.raises(WeightSyncError, match="re-form"):
        c.publisher.publish(_weights(1), version=1)
    c.tell("join", c.publisher.reform(2), 2)
    c.tell("receive")
    c.publisher.publish(_weights(1), version=1)
    assert c.collect()[1][0][:3] == ("ok", 1, 1)
    publish_times_out(2)  # silent in a formed group: gloo waits for the receiver, even for bytes


def _two_subscribers_with_version(cluster, version: int):
    """A group of the publisher and ranks 1, 2, all holding ``version``; returns (cluster, the
    process of rank 2)."""
    c = cluster(3)
    _, rank2 = c.spawn(1, 2, world_size=3, generation=0)
    c.tell("receive")
    c.publisher.publish(_weights(version), version=version)
    assert all(r[0][0] == "ok" for r in c.collect().values())
    return c, rank2


def _kill(process) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.join(timeout=5)


def test_killed_subscriber_raises_then_new_generation_recovers(cluster):
    c, victim = _two_subscribers_with_version(cluster, 1)
    c.tell("receive", ranks=[1])
    _kill(victim)
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match="publish of version 2 failed"):
        c.publisher.publish(_weights(2), version=2)
    assert time.monotonic() - start < TIMEOUT_S + 1.0
    # The survivor either got all of version 2 before the failure or raises: never hangs.
    (survivor,) = c.collect(ranks=[1])[1]
    assert survivor[0] == "error" or survivor[3] == _prints(_weights(2))

    generation = c.publisher.reform(3)
    assert generation == 1
    c.tell("join", generation, 3, ranks=[1])
    c.spawn(2)  # the restarted worker: reads generation and world size from the store
    c.tell("receive")
    named = _weights(3)
    c.publisher.publish(named, version=3)
    for (status, _, version, prints, _), in c.collect().values():
        assert (status, version, prints) == ("ok", 3, _prints(named))
    assert c.publisher.layouts_sent == 2  # the new group got the layout again


def test_restarted_worker_gets_the_current_version_again(cluster):
    c, victim = _two_subscribers_with_version(cluster, 4)
    _kill(victim)  # dies between publishes: nothing failed yet

    c.tell("join", c.publisher.reform(3), 3, ranks=[1])
    c.spawn(2)
    c.tell("receive")
    c.publisher.publish(_weights(4), version=4)  # the same weights, for the newcomer
    for (status, _, version, prints, _), in c.collect().values():
        assert (status, version, prints) == ("ok", 4, _prints(_weights(4)))


def _listening_on(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} write them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                found.add(local.rsplit(":", 1)[0])
    return found


def test_the_store_listens_on_the_publishers_address_only():
    publisher = WeightPublisher("127.0.0.1", 0, world_size=2, timeout_s=5)
    port = publisher.port
    try:
        # 127.0.0.1, not 0.0.0.0 or :: (every interface: TCPStore's own choice)
        assert _listening_on(port) == {"0100007F"}
    finally:
        publisher.close()
    deadline = time.monotonic() + 5
    while _listening_on(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _listening_on(port)  # the store closed the socket it was handed


def test_the_stores_listen_on_their_host_only():
    """The weight group's store and the learner ranks' rendezvous listen on one address, never
    on every interface, which a TCPStore given only a host and port does."""
    from datetime import timedelta

    import psutil
    import torch.distributed as dist

    from transport.weights import listening_store

    def listening_ips(port: int) -> set[str]:
        return {c.laddr.ip for c in psutil.Process().net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port}

    ours = listening_store("127.0.0.1", 0, timeout_s=10)
    plain = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=10))
    try:
        assert listening_ips(ours.port) == {"127.0.0.1"}
        assert listening_ips(plain.port) & {"0.0.0.0", "::"}  # what the test would catch
        client = dist.TCPStore("127.0.0.1", ours.port, is_master=False, timeout=timedelta(seconds=10))
        client.set("k", "v")
        assert ours.get("k") == b"v"
    finally:
        del ours, plain


def _fuzz_store(port: int, frames: int, seed: int) -> int:
    """``frames`` frames of random bytes (some led by a plausible command byte) at the store on
    ``port``, on as many connections as the store closes; returns how many it closed."""
    import random
    import socket

    rng = random.Random(seed)
    sock, sent, closed = None, 0, 0
    while sent < frames:
        if sock is None:
            sock = socket.create_connection(("127.0.0.1", port), timeout=2)
        data = rng.randbytes(rng.choice([1, 2, 8, 64, 512, 4096]))
        if rng.random() < 0.5:
            data = bytes([rng.randrange(0, 32)]) + data
        try:
            sock.sendall(data)
            sent += 1
        except OSError:
            sock.close()
            sock, closed = None, closed + 1
    if sock is not None:
        sock.close()
    return closed


def test_ten_thousand_garbage_frames_at_the_weight_store_change_nothing(cluster):
    """The weight group's store (torch's TCPStore, on the publisher) refuses malformed messages by
    closing the connection (torch logs each); it stays up and the next publish is bit-exact."""
    import psutil

    c = cluster(2)
    rss = psutil.Process().memory_info().rss
    closed = _fuzz_store(c.publisher.port, 10_000, seed=0)
    assert closed >= 10  # the store hung up on malformed messages (a partial one waits for its rest)
    assert psutil.Process().memory_info().rss - rss < 64 << 20
    c.spawn(1)
    c.tell("receive")
    named = _weights(3)
    c.publisher.publish(named, version=1)
    ((status, _, version, prints, _),) = c.collect()[1]
    assert (status, version, prints) == ("ok", 1, _prints(named))
