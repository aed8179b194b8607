"""The env client interface actors use, and the env service that serves a pool over ZeroMQ.

Callers: actors hold an ``EnvClient`` and nothing else: ``LocalEnvClient`` around an in-process
``EnvPool`` (envs/pool.py), or envs/failover.py's ``FailoverEnvClient`` over one
``RemoteEnvClient`` per ``EnvServer`` (each run by envs/main.py in its own process).

Wire: one msgpack frame per message (transport/codec.py). Request ``{"op", "id": int, ...}`` with
op reset (slots, seeds), step (slots, texts), system_prompt / state_text (slot), stats, ping.
Reply ``{"id", "ok": true, "results": [to_wire(result), ...]}`` (or ``"stats"`` / ``"ping"``),
or ``{"id", "ok": false, "error": str}``; results use the codec of envs/wire.py.

Why ROUTER on the server and DEALER on the client: ROUTER serves many clients on one socket and
lets the server answer out of order (requests touching different workers run concurrently);
DEALER lets one client keep many requests in flight, matched by id, and a lost reply costs a
timeout, not a socket stuck in REQ's send/recv lockstep. The server echoes every frame before the
payload, so REQ clients (a quick probe) work too.

Invariants:
- A malformed request (bad msgpack, wrong types, unknown op, missing fields, bad slots) gets an
  ``ok: false`` reply and is counted in ``malformed_requests``; the server keeps serving.
- A remote reset/step that gets no reply within ``timeout_s`` ends its slots with
  ``EpisodeFailure("service_timeout")``; an error reply raises ``EnvServiceError``.
- With CurveZMQ keys (transport/security.py: the server's from ``python -m envs.main --curve DIR``,
  the actors' from ``actors.env_curve=DIR``), a client without an allowed key never gets a request
  through; ``stats`` counts the refused handshakes (``refused/<reason>``).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import zmq
import zmq.asyncio

from envs.pool import EnvPool
from envs.protocol import Observation, StepResult
from envs.wire import EpisodeFailure, from_wire, to_wire
from transport.codec import CodecError, decode, encode
from transport.security import ClientKeys, CurveServer, ServerKeys, curve_client

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "tcp://127.0.0.1:5555"
MAX_REQUEST_BYTES = 16 << 20
MAX_REPLY_BYTES = 1 << 30
SERVICE_TIMEOUT = "service_timeout"


class EnvServiceError(RuntimeError):
    """The env service answered a request with an error."""


class EnvClient(Protocol):
    """What an actor sees of its envs: batched, awaitable, per-slot results or failures."""

    async def ping(self) -> dict[str, int]:
        """``{"num_slots": N}``."""
        ...

    async def reset(self, slots: list[int], seeds: list[int]) -> list[Observation | EpisodeFailure]: ...

    async def step(self, slots: list[int], texts: list[str]) -> list[StepResult | EpisodeFailure]: ...

    async def system_prompt(self, slot: int) -> str | EpisodeFailure: ...

    async def state_text(self, slot: int) -> str | EpisodeFailure: ...

    async def stats(self) -> dict[str, int]: ...

    async def close(self) -> None:
        """Release the client's own resources (threads, sockets); the pool stays with its owner."""
        ...


class LocalEnvClient:
    """An ``EnvClient`` over an in-process pool: each call runs in a thread (one per worker)."""

    def __init__(self, pool: EnvPool) -> None:
        self.pool = pool
        self._executor = ThreadPoolExecutor(pool.num_workers, thread_name_prefix="env-pool")

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def ping(self) -> dict[str, int]:
        return {"num_slots": self.pool.num_slots}

    async def reset(self, slots, seeds):
        return await self._run(self.pool.reset, slots, seeds)

    async def step(self, slots, texts):
        return await self._run(self.pool.step, slots, texts)

    async def system_prompt(self, slot):
        return await self._run(self.pool.system_prompt, slot)

    async def state_text(self, slot):
        return await self._run(self.pool.state_text, slot)

    async def stats(self) -> dict[str, int]:
        return self.pool.stats()

    async def close(self) -> None:
        self._executor.shutdown(wait=False)


class LatencyEnvClient:
    """An ``EnvClient`` whose reset and step answers come ``latency_s`` late, as a remote
    simulator's do: the wait is an asyncio sleep after the call, so it holds no env worker and
    no thread, and calls from many episodes wait at once. Everything else passes through.
    ``latency_s`` may be changed between calls (benchmarks sweep it on one client)."""

    def __init__(self, client: EnvClient, latency_s: float) -> None:
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self.client, self.latency_s = client, float(latency_s)

    async def _late(self, call):
        results = await call
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return results

    async def ping(self) -> dict[str, int]:
        return await self.client.ping()

    async def reset(self, slots, seeds):
        return await self._late(self.client.reset(slots, seeds))

    async def step(self, slots, texts):
        return await self._late(self.client.step(slots, texts))

    async def system_prompt(self, slot):
        return await self.client.system_prompt(slot)

    async def state_text(self, slot):
        return await self.client.state_text(slot)

    async def stats(self) -> dict[str, int]:
        return await self.client.stats()

    async def close(self) -> None:
        await self.client.close()


class RequestError(ValueError):
    """A request that does not follow the wire format above."""


def parse_request(msg: Any, num_slots: int) -> tuple[int, str, tuple]:
    """Check a decoded request; returns (id, op, call arguments) or raises ``RequestError``."""
    if not isinstance(msg, dict) or type(msg.get("id")) is not int:
        raise RequestError("a request is a map with an int id")
    op = msg.get("op")

    def slot_list() -> list[int]:
        slots = msg.get("slots")
        if not (isinstance(slots, list) and all(type(s) is int and 0 <= s < num_slots for s in slots)
                and len(set(slots)) == len(slots)):
            raise RequestError(f"slots must be a list of distinct ints in [0, {num_slots})")
        return slots

    def values(key: str, kind: type, n: int) -> list:
        items = msg.get(key)
        if not (isinstance(items, list) and len(items) == n and all(type(x) is kind for x in items)):
            raise RequestError(f"{key} must be a list of {n} {kind.__name__}")
        return items

    if op in ("ping", "stats"):
        return msg["id"], op, ()
    if op in ("reset", "step"):
        slots = slot_list()
        return msg["id"], op, (slots, values("seeds", int, len(slots)) if op == "reset"
                               else values("texts", str, len(slots)))
    if op in ("system_prompt", "state_text"):
        slot = msg.get("slot")
        if type(slot) is not int or not 0 <= slot < num_slots:
            raise RequestError(f"slot must be an int in [0, {num_slots})")
        return msg["id"], op, (slot,)
    raise RequestError(f"unknown op {op!r:.40}")


class EnvServer:
    """Serves an ``EnvClient`` (normally a ``LocalEnvClient``) on a ROUTER socket."""

    def __init__(self, client: EnvClient, num_slots: int, address: str = DEFAULT_ADDRESS, *,
                 curve: ServerKeys | None = None) -> None:
        self.client, self.num_slots = client, num_slots
        self.counters = {"requests": 0, "malformed_requests": 0, "failed_requests": 0,
                         "malformed/codec": 0, "malformed/request": 0}
        """Requests; those refused as malformed (in all, and by kind: not a message of the codec,
        or not a request this service knows); those whose env call raised."""
        self._ctx = zmq.asyncio.Context()
        self._socket = self._ctx.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        # An oversize request is refused by ZeroMQ from its header, never read (the decode's own
        # bound, below, stays as the second line).
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        self._curve = None if curve is None else CurveServer(self._socket, curve)
        self._socket.bind(address)
        self.address = self._socket.getsockopt(zmq.LAST_ENDPOINT).decode()

    async def serve(self, stop: asyncio.Event, grace_s: float = 5.0) -> None:
        """Answer requests until ``stop`` is set; then let in-flight ones finish (up to grace_s)."""
        tasks: set[asyncio.Task] = set()
        while not stop.is_set():
            if not await self._socket.poll(50):
                continue
            frames = await self._socket.recv_multipart()
            task = asyncio.create_task(self._handle(frames))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)

    async def _handle(self, frames: list[bytes]) -> None:
        self.counters["requests"] += 1
        rid, msg = None, None
        try:
            msg = decode(frames[-1], max_bytes=MAX_REQUEST_BYTES)
            rid = msg.get("id") if isinstance(msg, dict) and type(msg.get("id")) is int else None
            reply = await self._answer(*parse_request(msg, self.num_slots))
        except (CodecError, RequestError) as e:
            self.counters["malformed_requests"] += 1
            self.counters["malformed/codec" if isinstance(e, CodecError) else "malformed/request"] += 1
            reply = {"id": rid, "ok": False, "error": f"malformed request: {e}"}
        except Exception as e:
            log.exception("env service request %r failed", msg if rid is None else rid)
            self.counters["failed_requests"] += 1
            reply = {"id": rid, "ok": False, "error": f"{type(e).__name__}: {e}"}
        await self._socket.send_multipart(frames[:-1] + [encode(reply)])

    async def _answer(self, rid: int, op: str, args: tuple) -> dict:
        if op == "ping":
            return {"id": rid, "ok": True, "ping": {"num_slots": self.num_slots}}
        if op == "stats":
            refused = {f"refused/{k}": v for k, v in self.refused().items()}
            return {"id": rid, "ok": True,
                    "stats": {**await self.client.stats(), **self.counters, **refused}}
        results = await getattr(self.client, op)(*args)
        results = results if op in ("reset", "step") else [results]
        return {"id": rid, "ok": True, "results": [to_wire(r) for r in results]}

    def refused(self) -> dict[str, int]:
        """Failed CurveZMQ handshakes by reason (empty without CURVE)."""
        return {} if self._curve is None else dict(self._curve.drain())

    def close(self) -> None:
        if self._curve is not None:
            self._curve.close()
        self._socket.close(linger=0)
        self._ctx.term()


class RemoteEnvClient:
    """An ``EnvClient`` for an ``EnvServer``; many requests may be in flight at once."""

    def __init__(self, address: str = DEFAULT_ADDRESS, timeout_s: float = 60.0, *,
                 curve: ClientKeys | None = None) -> None:
        self.address, self.timeout_s = address, timeout_s
        self._ctx = zmq.asyncio.Context()
        self._socket = self._ctx.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
        if curve is not None:
            curve_client(self._socket, curve)
        self._socket.connect(address)
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._reader: asyncio.Task | None = None

    async def _request(self, op: str, **fields) -> dict:
        """The ok reply; raises TimeoutError without one in time, EnvServiceError on an error reply."""
        if self._reader is None:
            self._reader = asyncio.create_task(self._read())
        rid, self._next_id = self._next_id, self._next_id + 1
        future = self._pending[rid] = asyncio.get_running_loop().create_future()
        try:
            await self._socket.send(encode({"op": op, "id": rid, **fields}))
            reply = await asyncio.wait_for(future, self.timeout_s)
        finally:
            self._pending.pop(rid, None)
        if reply.get("ok") is not True:
            raise EnvServiceError(str(reply.get("error")))
        return reply

    async def _read(self) -> None:
        while True:
            data = await self._socket.recv()
            try:
                reply = decode(data, max_bytes=MAX_REPLY_BYTES)
                future = self._pending.get(reply["id"]) if isinstance(reply, dict) else None
            except (CodecError, KeyError, TypeError) as e:
                log.warning("dropped a malformed reply from %s: %s", self.address, e)
                continue
            if future is not None and not future.done():  # else: it timed out already
                future.set_result(reply)

    async def _results(self, op: str, n: int, **fields) -> list:
        try:
            reply = await self._request(op, **fields)
        except TimeoutError:
            return [EpisodeFailure(SERVICE_TIMEOUT)] * n
        results = reply.get("results")
        if not isinstance(results, list) or len(results) != n:
            raise EnvServiceError(f"{op} reply carries {results!r:.60} for {n} slots")
        return [from_wire(r) for r in results]

    async def ping(self) -> dict[str, int]:
        return (await self._request("ping"))["ping"]

    async def reset(self, slots, seeds):
        return await self._results("reset", len(slots), slots=list(slots), seeds=[int(s) for s in seeds])

    async def step(self, slots, texts):
        return await self._results("step", len(slots), slots=list(slots), texts=list(texts))

    async def system_prompt(self, slot):
        return (await self._results("system_prompt", 1, slot=slot))[0]

    async def state_text(self, slot):
        return (await self._results("state_text", 1, slot=slot))[0]

    async def stats(self) -> dict[str, int]:
        return (await self._request("stats"))["stats"]

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        self._socket.close(linger=0)
        self._ctx.term()
