"""envs/service.py and envs/main.py: real ZeroMQ sockets on loopback, a server in a thread and one
in its own process; round trips equal in-process envs, bad frames get error replies, shutdown is
clean."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from envs.formats import format_example
from envs.pool import EnvPool
from envs.registry import load_config, make
from envs.service import EnvServer, EnvServiceError, LatencyEnvClient, LocalEnvClient, RemoteEnvClient
from envs.wire import EpisodeFailure
from tests.envs_api import env_reset, env_step
from tests.unit.envs.fake_envs import CounterEnv, assert_same
from transport import security
from transport.codec import decode, encode

ROOT = Path(__file__).resolve().parents[3]


class ServerThread:
    """An EnvServer on an ephemeral loopback port, in its own thread and event loop."""

    def __init__(self, pool: EnvPool, address: str = "tcp://127.0.0.1:*") -> None:
        self.pool, self.bind = pool, address
        self.ready = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    async def _main(self) -> None:
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        client = LocalEnvClient(self.pool)
        server = EnvServer(client, self.pool.num_slots, self.bind)
        self.address = server.address
        self.ready.set()
        try:
            await server.serve(self.stop)
        finally:
            server.close()
            await client.close()

    def shutdown(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture(scope="module")
def server():
    with EnvPool(("tests.unit.envs.fake_envs:CounterEnv", {"image": True}), num_workers=2,
                 envs_per_worker=2, step_timeout_s=2.0, reset_timeout_s=2.0) as pool:
        s = ServerThread(pool)
        yield s
        s.shutdown()


async def _with_client(address: str, fn, timeout_s: float = 5.0):
    client = RemoteEnvClient(address, timeout_s=timeout_s)
    try:
        return await fn(client)
    finally:
        await client.close()


def test_round_trip_equals_in_process(server):
    local = [CounterEnv(image=True) for _ in range(4)]

    async def run(c: RemoteEnvClient):
        assert await c.ping() == {"num_slots": 4}
        for got, env, seed in zip(await c.reset([0, 1, 2, 3], [5, 6, 7, 8]), local, [5, 6, 7, 8]):
            assert_same(got, env_reset(env, seed))
        for texts in (["a", "bb", "", "dddd"], ["x", "y", "z", "w"]):
            for got, env, text in zip(await c.step([0, 1, 2, 3], texts), local, texts):
                assert_same(got, env_step(env, text))
        assert await c.system_prompt(3) == local[3].system_prompt()
        assert await c.state_text(2) == local[2].state_text()
        stats = await c.stats()
        assert stats["steps"] >= 8 and stats["requests"] >= 7 and "worker_crashes" in stats

    asyncio.run(_with_client(server.address, run))


def test_many_requests_in_flight(server):
    async def run(c: RemoteEnvClient):
        await c.reset([0, 1, 2, 3], [0, 0, 0, 0])
        calls = [c.step([slot], ["ab"]) for slot in (0, 2)] + [c.ping() for _ in range(10)]
        calls += [c.state_text(slot) for slot in (1, 3)]
        out = await asyncio.gather(*calls)
        assert [r[0].observation.text for r in out[:2]] == ["value=2 <image>"] * 2
        assert out[-2:] == ["the counter is at 0"] * 2

    asyncio.run(_with_client(server.address, run))


def test_latency_delays_each_answer_and_calls_from_many_episodes_wait_at_once():
    """Eight episodes on one worker process, 0.3 s a call: serialised they would take 2.4 s a
    round; waiting without holding the worker, a round takes one latency. Answers are unchanged."""
    with EnvPool(("tests.unit.envs.fake_envs:CounterEnv", {}), num_workers=1, envs_per_worker=8,
                 step_timeout_s=5.0, reset_timeout_s=5.0) as pool:
        plain = LocalEnvClient(pool)
        late = LatencyEnvClient(LocalEnvClient(pool), 0.3)
        local = [CounterEnv() for _ in range(8)]

        async def run():
            t0 = time.perf_counter()
            resets = await asyncio.gather(*(late.reset([s], [s]) for s in range(8)))
            t1 = time.perf_counter()
            steps = await asyncio.gather(*(late.step([s], ["ab" * s]) for s in range(8)))
            t2 = time.perf_counter()
            prompt = await late.system_prompt(0)
            t3 = time.perf_counter()
            assert await late.ping() == await plain.ping() == {"num_slots": 8}
            return resets, steps, (t1 - t0, t2 - t1, t3 - t2), prompt

        try:
            resets, steps, (reset_s, step_s, prompt_s), prompt = asyncio.run(run())
        finally:
            asyncio.run(late.close())
            asyncio.run(plain.close())
        for s, env in enumerate(local):
            assert_same(resets[s][0], env_reset(env, s))
            assert_same(steps[s][0], env_step(env, "ab" * s))
        assert prompt == local[0].system_prompt()
        assert 0.3 <= reset_s < 1.2 and 0.3 <= step_s < 1.2  # one latency, not eight
        assert prompt_s < 0.3  # only resets and steps are late
    with pytest.raises(ValueError, match="latency_s"):
        LatencyEnvClient(plain, -1.0)


BAD_FRAMES = [
    b"\xc1",  # not msgpack
    bytes(random.Random(0).randbytes(50)),
    msgpack.packb([1, 2, 3]),
    msgpack.packb({"op": "step"}),  # no id
    msgpack.packb({"op": "nope", "id": 1}),
    msgpack.packb({"op": "step", "id": 2}),  # no slots
    msgpack.packb({"op": "step", "id": 3, "slots": [99], "texts": ["a"]}),
    msgpack.packb({"op": "step", "id": 4, "slots": [0, 0], "texts": ["a", "b"]}),
    msgpack.packb({"op": "reset", "id": 5, "slots": [0], "seeds": ["x"]}),
    msgpack.packb({"op": "reset", "id": 6, "slots": [0], "seeds": [1, 2]}),
    msgpack.packb({"op": "state_text", "id": 7, "slot": -1}),
    msgpack.packb({"op": "ping", "id": "8"}),
]


def test_malformed_frames_get_error_replies(server):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(server.address)
    try:
        sock.send(encode({"op": "stats", "id": 100}))
        before = decode(sock.recv())["stats"]["malformed_requests"]
        for frame in BAD_FRAMES:
            sock.send(frame)
            reply = decode(sock.recv())
            assert reply["ok"] is False and isinstance(reply["error"], str), frame
        sock.send_multipart([b"extra", b"\xc1"])  # two frames: the last is the (bad) payload
        frames = sock.recv_multipart()
        assert frames[0] == b"extra" and decode(frames[-1])["ok"] is False
        sock.send(encode({"op": "nope", "id": 9}))
        assert decode(sock.recv())["id"] == 9
        sock.send(encode({"op": "stats", "id": 101}))
        reply = decode(sock.recv())
        assert reply["id"] == 101 and reply["stats"]["malformed_requests"] == before + len(BAD_FRAMES) + 2
    finally:
        sock.close()
        ctx.term()


def test_an_oversize_request_is_refused_before_it_is_read(server):
    """ZMQ_MAXMSGSIZE on the service's socket: a request over MAX_REQUEST_BYTES disconnects its
    sender (no reply, not even counted as malformed: nothing of it was read) and the service
    goes on answering."""
    from envs.service import MAX_REQUEST_BYTES

    ctx = zmq.Context()
    rogue, sock = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    for s in (rogue, sock):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 5000)
    events = rogue.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    rogue.connect(server.address)
    sock.connect(server.address)
    try:
        sock.send(encode({"op": "stats", "id": 1}))
        before = decode(sock.recv())["stats"]["malformed_requests"]
        rogue.send(bytes(MAX_REQUEST_BYTES + 1))
        assert events.poll(5000), "the oversize sender was not disconnected"
        sock.send(encode({"op": "stats", "id": 2}))
        reply = decode(sock.recv())
        assert reply["id"] == 2 and reply["stats"]["malformed_requests"] == before
    finally:
        rogue.disable_monitor()
        for s in (events, rogue, sock):
            s.close()
        ctx.term()


def test_ten_thousand_fuzzed_requests_each_get_one_error_reply_and_one_count(server):
    """Noise, cut and bit-flipped requests, and well-formed msgpack that is no request: each gets
    exactly one error reply, is counted once as malformed, by kind, and none reaches an env
    (no failed request); the service answers a real request afterwards."""
    rng = random.Random(7)
    valid = encode({"op": "step", "id": 1, "slots": [0], "texts": ["a"]})

    def fuzz() -> bytes:
        kind = rng.randrange(4)
        if kind == 0:
            return b"\xc1" + rng.randbytes(rng.randrange(0, 200))  # 0xc1: never valid msgpack
        if kind == 1:
            return valid[:rng.randrange(0, len(valid))]  # cut short
        if kind == 2:  # msgpack, but no request: a wrong op, id, slot or shape
            return rng.choice(BAD_FRAMES[2:])
        return encode({"op": rng.choice(["step", "reset", "nope"]), "id": "x" * rng.randrange(5)})

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10000)
    sock.connect(server.address)
    total, batch = 10_000, 500
    try:
        sock.send(encode({"op": "stats", "id": 0}))
        before = decode(sock.recv())["stats"]
        for _ in range(total // batch):
            for _ in range(batch):
                sock.send(fuzz())
            replies = [decode(sock.recv()) for _ in range(batch)]
            assert all(r["ok"] is False and "malformed request" in r["error"] for r in replies)
        sock.send(encode({"op": "stats", "id": 1}))
        after = decode(sock.recv())["stats"]
        assert after["malformed_requests"] - before["malformed_requests"] == total
        kinds = sum(after[k] - before[k] for k in ("malformed/codec", "malformed/request"))
        assert kinds == total and after["malformed/codec"] > before["malformed/codec"]
        assert after["failed_requests"] == before["failed_requests"]
        sock.send(encode({"op": "ping", "id": 2}))
        assert decode(sock.recv())["ok"] is True
    finally:
        sock.close()
        ctx.term()


def test_req_socket_works(server):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(server.address)
    try:
        sock.send(encode({"op": "ping", "id": 1}))
        assert decode(sock.recv()) == {"id": 1, "ok": True, "ping": {"num_slots": 4}}
    finally:
        sock.close()
        ctx.term()


def test_error_reply_raises(server):
    async def run(c: RemoteEnvClient):
        with pytest.raises(EnvServiceError, match="slots"):
            await c.step([99], ["a"])
        assert await c.ping() == {"num_slots": 4}

    asyncio.run(_with_client(server.address, run))


def test_silent_server_gives_service_timeouts():
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)  # accepts requests, never answers
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind("tcp://127.0.0.1:*")

    async def run(c: RemoteEnvClient):
        assert await c.reset([0, 1], [1, 2]) == [EpisodeFailure("service_timeout")] * 2
        assert await c.state_text(0) == EpisodeFailure("service_timeout")
        with pytest.raises(TimeoutError):
            await c.ping()

    try:
        asyncio.run(_with_client(silent.getsockopt(zmq.LAST_ENDPOINT).decode(), run, timeout_s=0.2))
    finally:
        silent.close()
        ctx.term()


def test_shutdown_frees_the_port(server):
    s = ServerThread(server.pool)
    address = s.address
    s.shutdown()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    try:
        sock.bind(address)  # raises EADDRINUSE if the server kept it
    finally:
        sock.close(linger=0)
        ctx.term()


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@contextlib.contextmanager
def service_process(*flags: str, env: str = "frozenlake"):
    """``python -m envs.main`` serving ``env`` on loopback: (the process, the first line it
    printed); it must stop cleanly on SIGTERM, and is killed if the test fails first."""
    cmd = [sys.executable, "-m", "envs.main", "--bind", "tcp://127.0.0.1:*", "--env", env, *flags]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([proc.stdout], [], [], 20)[0], "the service did not start"
        line = proc.stdout.readline()
        assert line.startswith("env service on tcp://127.0.0.1:"), line
        yield proc, line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_service_process_serves_frozenlake_and_stops_on_sigterm():
    with service_process("--env-workers", "2", "--envs-per-worker", "1", "--env-latency-s", "0.2",
                          "--set", "max_turns=2") as (proc, line):
        address = line.split()[-1]
        children = _descendants(proc.pid)
        local = make("frozenlake", **{**load_config("frozenlake"), "max_turns": 2})
        answer = format_example("grounding_worldmodeling", action_example="Right,Down")

        async def run(c: RemoteEnvClient):
            t0 = time.perf_counter()
            assert_same((await c.reset([1], [11]))[0], env_reset(local, 11))
            assert time.perf_counter() - t0 >= 0.2  # --env-latency-s
            assert_same((await c.step([1], [answer]))[0], env_step(local, answer))
            assert await c.system_prompt(0) == local.system_prompt()

        asyncio.run(_with_client(address, run, timeout_s=10))
    deadline = time.monotonic() + 5
    while any(os.path.exists(f"/proc/{pid}") for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(children) >= 2 and not any(os.path.exists(f"/proc/{pid}") for pid in children)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    try:
        sock.bind(address)
    finally:
        sock.close(linger=0)
        ctx.term()


def test_a_curve_service_serves_its_clients_and_refuses_and_counts_strangers(tmp_path):
    keys = security.write(tmp_path / "keys")
    with service_process("--env-workers", "1", "--envs-per-worker", "1",
                          "--curve", str(keys)) as (_, line):
        assert "(CurveZMQ)" in line, line
        address = line.split()[3]
        stranger = security.generate()[1]
        strangers = [None, security.ClientKeys(stranger.public, stranger.secret,
                                               security.read_client(keys).server_public)]

        async def refused(client) -> int:
            return sum(v for k, v in (await client.stats()).items() if k.startswith("refused/"))

        async def run():
            client = RemoteEnvClient(address, timeout_s=10, curve=security.read_client(keys))
            try:
                assert (await client.ping()) == {"num_slots": 1}
                counts = [await refused(client)]
                for curve in strangers:  # no keys, a key the service does not know
                    stranger = RemoteEnvClient(address, timeout_s=1.0, curve=curve)
                    try:  # nothing gets in
                        assert await stranger.reset([0], [3]) == [EpisodeFailure("service_timeout")]
                    finally:
                        await stranger.close()
                    deadline = time.monotonic() + 10  # the handshake's failure is reported apart
                    while await refused(client) == counts[-1] and time.monotonic() < deadline:
                        await asyncio.sleep(0.1)
                    counts.append(await refused(client))
                return counts, await client.stats()
            finally:
                await client.close()

        counts, stats = asyncio.run(run())
        assert counts[0] == 0 and counts[0] < counts[1] < counts[2]  # each stranger counted
        # a refused socket retries until it closes: a mismatch, or a handshake cut off at close
        assert set(stats) & {"refused/no_curve", "refused/bad_handshake"}
        assert stats["refused/unknown_key"] >= 1
        # no stranger's request arrived: no reset reached the envs, nothing was malformed
        assert stats["resets"] == 0 and stats["malformed_requests"] == 0


@pytest.mark.parametrize("bind, served", [
    ("tcp://127.0.0.1:5555", True), ("tcp://[::1]:5555", True), ("tcp://localhost:5555", True),
    ("ipc:///tmp/envs", True), ("tcp://0.0.0.0:5555", False), ("tcp://*:5555", False),
    ("tcp://10.1.2.3:5555", False), ("tcp://node7:5555", False),
])
def test_a_network_address_is_served_only_with_keys_or_knowingly_open(bind, served):
    from envs.main import _loopback, main

    assert _loopback(bind) == served
    if not served:
        with pytest.raises(SystemExit, match="give --curve DIR"):
            main(["--bind", bind, "--env", "frozenlake"])
