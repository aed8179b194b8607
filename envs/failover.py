"""An ``EnvClient`` over several env services that fails over: ``FailoverEnvClient``.

Callers: actors/actor.py builds one from ``actors.env_address`` (one address or several; every
service is sized for all actors: an actor uses the same slots [offset, offset + n) on each) and
plays its episodes through it as through any ``EnvClient`` (envs/service.py). It owns one
``RemoteEnvClient`` per live service, a heartbeat task per service, and which service each slot's
episode lives on.

Invariants:
- An episode (a reset on a slot) goes to the live service with the fewest episodes (ties taken
  in turn) and stays there until its slot's next reset: its steps and ``state_text`` go to that
  service. A reset or ``system_prompt`` whose service goes down before it answers is moved to
  another live service; a step cannot be moved (the episode's state is on the lost service).
- A service is marked down when a call to it gets no reply within ``timeout_s``, its socket
  fails, or it answers no ping for ``SILENT_HEARTBEATS`` heartbeats (pinged every
  ``heartbeat_s``). Then every episode on it ends with ``EpisodeFailure("service_down: <address>")``
  (calls in flight return it at once, not at their timeout), reported once per episode: the slot's
  next step returns ``no_episode``, as the pool's do after a failure.
- A down service is probed (a fresh socket each time, so requests queued for the lost peer are
  dropped with the old one, and its replies to old request ids can reach no one) after waits
  that double from ``backoff_s[0]`` to ``backoff_s[1]``; the first ping that answers makes it live
  again for new episodes. Its old episodes stay failed (a slot's service generation must match).
- With no live service, resets and system prompts wait (woken when a service answers, logging
  which addresses they wait for at doubling intervals), and ``health()`` says since when; after
  ``grace_s`` without a live service they raise ``EnvServicesDown`` naming every address. So does
  ``ping``, which the actor's start awaits: the start needs one service, not all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from envs.pool import NO_EPISODE
from envs.protocol import Observation, StepResult
from envs.service import SERVICE_TIMEOUT, RemoteEnvClient
from envs.wire import EpisodeFailure
from transport.security import ClientKeys

log = logging.getLogger(__name__)

SERVICE_DOWN = "service_down"
SILENT_HEARTBEATS = 3
"""A live service that answers no ping for this many heartbeats is marked down."""
BACKOFF_S = (0.5, 8.0)
"""A down service's probes: the first wait, and the cap of the doubling waits."""


class EnvServicesDown(RuntimeError):
    """No env service answered for the grace period. Not an ``EnvServiceError``: it fails the
    actor (the supervisor restarts it or fails the run), not one episode."""


@dataclass(eq=False)
class _Service:
    """One address's state; ``generation`` counts its revivals, ``dead`` is set when the current
    one goes down."""

    address: str
    dead: asyncio.Future
    client: RemoteEnvClient | None = None
    live: bool = False
    generation: int = 0
    num_slots: int = 0
    slots: set[int] = field(default_factory=set)
    """Slots whose current episode lives here (the load)."""
    retry_s: float = 0.0


class _Down:
    """A call's outcome when its service went (or was found) down before it answered."""


DOWN = _Down()


class FailoverEnvClient:
    """An ``EnvClient`` over the env services at ``addresses`` (see the module docstring)."""

    def __init__(self, addresses: list[str], *, timeout_s: float = 30.0, heartbeat_s: float = 2.0,
                 grace_s: float = 120.0, curve: ClientKeys | None = None,
                 backoff_s: tuple[float, float] = BACKOFF_S) -> None:
        if not addresses or len(set(addresses)) != len(addresses):
            raise ValueError(f"env service addresses must be distinct and at least one, got {addresses}")
        if min(timeout_s, heartbeat_s, grace_s, *backoff_s) <= 0 or backoff_s[0] > backoff_s[1]:
            raise ValueError("timeout_s, heartbeat_s, grace_s and backoff_s must be > 0, backoff_s "
                             f"(first, cap) with first <= cap; got {timeout_s}, {heartbeat_s}, "
                             f"{grace_s}, {backoff_s}")
        self.addresses = list(addresses)
        self.timeout_s, self.heartbeat_s, self.grace_s = timeout_s, heartbeat_s, grace_s
        self.silent_s = SILENT_HEARTBEATS * heartbeat_s
        self.curve, self.backoff_s = curve, backoff_s
        self.counts: Counter[str] = Counter(dict.fromkeys(
            ("marked_down", "revived", "episodes_lost", "calls_moved", "timeouts"), 0))
        """marked_down / revived: services lost / answering again; episodes_lost: episodes ended
        with service_down (once each); calls_moved: resets and system prompts sent to another
        service after theirs went down; timeouts: calls that got no reply within timeout_s."""
        self._services: list[_Service] = []
        self._home: dict[int, tuple[_Service, int]] = {}
        """slot -> (its episode's service, that service's generation at the reset)."""
        self._watchers: list[asyncio.Task] = []
        self._answered: asyncio.Future | None = None  # set (and replaced) when a service revives
        self._waiting: tuple[float, float] | None = None  # (monotonic, wall) since no service lives
        self._report_s, self._next_report = backoff_s[0], 0.0
        self._turn = 0
        self._closed = False

    # --- the EnvClient calls ------------------------------------------------------------------
    async def ping(self) -> dict[str, int]:
        """``{"num_slots": N}``, the fewest of the live services'; waits for one to answer (up to
        ``grace_s``, then ``EnvServicesDown``)."""
        await self._pick()
        return {"num_slots": min(s.num_slots for s in self._services if s.live)}

    async def reset(self, slots: list[int], seeds: list[int]) -> list[Observation | EpisodeFailure]:
        slots, seeds = list(slots), [int(s) for s in seeds]
        for slot in slots:
            self._leave(slot)
        while True:
            service = await self._pick()
            generation = service.generation
            service.slots.update(slots)  # its load now: resets in flight count for the next pick
            try:
                results = await self._call(service, lambda c: c.reset(slots, seeds))
            except BaseException:
                service.slots.difference_update(slots)
                raise
            if results is DOWN:
                self.counts["calls_moved"] += 1
                continue
            for slot, result in zip(slots, results):
                if isinstance(result, EpisodeFailure):
                    service.slots.discard(slot)
                else:
                    self._home[slot] = (service, generation)
            return results

    async def step(self, slots: list[int], texts: list[str]) -> list[StepResult | EpisodeFailure]:
        results: list[Any] = [None] * len(slots)
        calls: dict[_Service, list[int]] = {}
        for i, slot in enumerate(slots):
            service = self._service_of(slot)
            if service is None:
                results[i] = self._lost(slot)
            else:
                calls.setdefault(service, []).append(i)

        async def on(service: _Service, idx: list[int]) -> None:
            got = await self._call(service, lambda c: c.step([slots[i] for i in idx], [texts[i] for i in idx]))
            for k, i in enumerate(idx):
                if got is DOWN:
                    results[i] = self._lost(slots[i])
                    continue
                results[i] = got[k]
                if isinstance(results[i], EpisodeFailure):  # the pool's: the episode is over
                    self._leave(slots[i])

        await asyncio.gather(*(on(s, idx) for s, idx in calls.items()))
        return results

    async def system_prompt(self, slot: int) -> str | EpisodeFailure:
        """From the slot's service, else (a new episode's, before its reset) from any live one."""
        service = self._service_of(slot)
        if service is not None:
            got = await self._call(service, lambda c: _listed(c.system_prompt(slot)))
            if got is not DOWN:
                return got[0]
        while True:
            service = await self._pick()
            got = await self._call(service, lambda c: _listed(c.system_prompt(slot)))
            if got is not DOWN:
                return got[0]
            self.counts["calls_moved"] += 1

    async def state_text(self, slot: int) -> str | EpisodeFailure:
        service = self._service_of(slot)
        if service is None:
            return self._lost(slot)
        got = await self._call(service, lambda c: _listed(c.state_text(slot)))
        return self._lost(slot) if got is DOWN else got[0]

    async def stats(self) -> dict[str, int]:
        """The live services' counters summed (those answering within timeout_s), and this
        client's as ``failover/<name>`` with ``services_live`` and ``services_down``."""
        self._start()
        out: Counter[str] = Counter()
        for service in [s for s in self._services if s.live]:
            got = await self._call(service, lambda c: _listed(c.stats()))
            if got is not DOWN:
                out.update({k: v for k, v in got[0].items() if isinstance(v, int)})
        health = self.health()
        out.update({f"failover/{k}": v for k, v in self.counts.items()})
        out["services_live"], out["services_down"] = len(health["live"]), len(health["down"])
        return dict(out)

    async def close(self) -> None:
        """Stop the heartbeats and close every socket; calls in flight end as service_down."""
        self._closed = True
        for task in self._watchers:
            task.cancel()
        if self._watchers:
            await asyncio.wait(self._watchers)
        for service in self._services:
            await self._mark_down(service, service.generation, "the client closed", quiet=True)
        if self._answered is not None and not self._answered.done():
            self._answered.set_result(None)

    # --- health -------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """``{"live": [address], "down": [address], "waiting_since": wall time (time.time())
        since when no service is live, or None, "episodes": {address: episodes on it}}``. Before
        the first call every service counts as down (none has answered yet)."""
        if not self._services:
            return {"live": [], "down": list(self.addresses), "waiting_since": None,
                    "episodes": dict.fromkeys(self.addresses, 0)}
        return {"live": [s.address for s in self._services if s.live],
                "down": [s.address for s in self._services if not s.live],
                "waiting_since": None if self._waiting is None else self._waiting[1],
                "episodes": {s.address: len(s.slots) for s in self._services}}

    def address_of(self, slot: int) -> str | None:
        """The address of the live service holding the slot's episode, or None."""
        service = self._service_of(slot)
        return None if service is None else service.address

    # --- routing ------------------------------------------------------------------------------
    def _start(self) -> None:
        """On the first call, in the caller's event loop: every service down, probed at once."""
        if self._services or self._closed:
            if self._closed:
                raise RuntimeError("the env client is closed")
            return
        loop = asyncio.get_running_loop()
        for address in self.addresses:
            dead = loop.create_future()
            dead.set_result(None)
            self._services.append(_Service(address, dead, retry_s=self.backoff_s[0]))
        self._answered = loop.create_future()
        self._waiting = (time.monotonic(), time.time())
        self._watchers = [asyncio.create_task(self._watch(s), name=f"env-heartbeat {s.address}")
                          for s in self._services]

    async def _pick(self) -> _Service:
        """The live service with the fewest episodes (ties in turn); waits while none is live."""
        self._start()
        wait_s = self.backoff_s[0]
        while True:
            if self._closed:
                raise RuntimeError("the env client is closed")
            live = [s for s in self._services if s.live]
            if live:
                self._turn += 1
                n = len(self._services)
                return min(live, key=lambda s: (len(s.slots), (self._services.index(s) - self._turn) % n))
            assert self._waiting is not None and self._answered is not None
            left = self._waiting[0] + self.grace_s - time.monotonic()
            if left <= 0:
                raise EnvServicesDown(
                    f"no env service answered for {self.grace_s:g} s (actors.env_grace_s): "
                    + ", ".join(self.addresses))
            await asyncio.wait({self._answered}, timeout=min(wait_s, left))
            wait_s = min(2 * wait_s, self.backoff_s[1])
            if not any(s.live for s in self._services):
                self._say_waiting()

    def _say_waiting(self) -> None:
        now = time.monotonic()
        if self._waiting is None or now < self._next_report:
            return
        self._next_report = now + self._report_s
        self._report_s = min(2 * self._report_s, self.backoff_s[1])
        log.warning("waiting for an env service (%.1f s of %g s): none answers of %s",
                    now - self._waiting[0], self.grace_s, ", ".join(self.addresses))

    def _service_of(self, slot: int) -> _Service | None:
        """The live service holding the slot's episode; None if it has none there any more."""
        home = self._home.get(slot)
        if home is None or not home[0].live or home[0].generation != home[1]:
            return None
        return home[0]

    def _leave(self, slot: int) -> None:
        home = self._home.pop(slot, None)
        if home is not None:
            home[0].slots.discard(slot)

    def _lost(self, slot: int) -> EpisodeFailure:
        """The failure of a slot whose episode is not on a live service (reported once)."""
        home = self._home.get(slot)
        if home is None:
            return EpisodeFailure(NO_EPISODE)
        self._leave(slot)
        self.counts["episodes_lost"] += 1
        return EpisodeFailure(f"{SERVICE_DOWN}: {home[0].address}")

    async def _call(self, service: _Service, fn: Callable[[RemoteEnvClient], Awaitable[list]]) -> list | _Down:
        """``fn(service's client)``'s results, or DOWN if the service goes down first (then it is
        cancelled). A reply that did not come within timeout_s, or a failed socket, marks the
        service down. An error reply (``EnvServiceError``) propagates: it ends one episode."""
        generation, dead = service.generation, service.dead
        if not service.live or service.client is None:
            return DOWN
        task = await _race(fn(service.client), dead)
        if task is None:  # the service went down meanwhile
            return DOWN
        error = None if task.cancelled() else task.exception()
        if task.cancelled() or isinstance(error, (TimeoutError, zmq.ZMQError)):
            await self._mark_down(service, generation, f"its socket failed: {error!r}")
            return DOWN
        if error is not None:
            raise error
        results = task.result()
        if results and all(r == EpisodeFailure(SERVICE_TIMEOUT) for r in results):
            self.counts["timeouts"] += 1  # RemoteEnvClient's way of saying: no reply in time
            await self._mark_down(service, generation, f"no reply within {self.timeout_s:g} s")
            return DOWN
        return results

    # --- heartbeat and probes -----------------------------------------------------------------
    async def _watch(self, service: _Service) -> None:
        """Pings a live service every heartbeat; probes a down one with backoff until it answers."""
        while True:
            if service.live:
                generation = service.generation
                await asyncio.wait({service.dead}, timeout=self.heartbeat_s)
                if not service.live or service.generation != generation:
                    continue
                assert service.client is not None
                num_slots = _num_slots(await _race(service.client.ping(), service.dead, self.silent_s))
                if num_slots is not None:
                    service.num_slots = num_slots
                else:
                    await self._mark_down(service, generation,
                                          f"no answer to a ping within {self.silent_s:g} s")
                continue
            probe = RemoteEnvClient(service.address, self.timeout_s, curve=self.curve)
            num_slots = None
            try:
                never = asyncio.get_running_loop().create_future()
                num_slots = _num_slots(await _race(probe.ping(), never, self.silent_s))
            finally:
                if num_slots is None:
                    await probe.close()
            if num_slots is not None:
                self._revive(service, probe, num_slots)
                continue
            await asyncio.sleep(service.retry_s)
            service.retry_s = min(2 * service.retry_s, self.backoff_s[1])

    def _revive(self, service: _Service, client: RemoteEnvClient, num_slots: int) -> None:
        service.client, service.live, service.num_slots = client, True, num_slots
        service.generation += 1
        service.dead = asyncio.get_running_loop().create_future()
        service.retry_s = self.backoff_s[0]
        if service.generation > 1:
            self.counts["revived"] += 1
            log.warning("env service %s answers again: new episodes may go to it", service.address)
        self._waiting = None
        self._report_s, self._next_report = self.backoff_s[0], 0.0
        assert self._answered is not None
        self._answered.set_result(None)
        self._answered = asyncio.get_running_loop().create_future()

    async def _mark_down(self, service: _Service, generation: int, why: str, quiet: bool = False) -> None:
        """Mark the service's ``generation`` down (once): its calls in flight return at once."""
        if not service.live or service.generation != generation:
            return
        service.live = False
        service.dead.set_result(None)
        service.slots.clear()  # their episodes are lost: their slots' next calls report it
        client, service.client = service.client, None
        if not any(s.live for s in self._services):
            self._waiting = (time.monotonic(), time.time())
        if not quiet:
            self.counts["marked_down"] += 1
            log.warning("env service %s is down (%s): its episodes end as %s; %d of %d services live",
                        service.address, why, SERVICE_DOWN, sum(s.live for s in self._services),
                        len(self._services))
        if client is not None:
            await client.close()


async def _listed(call: Awaitable[Any]) -> list:
    return [await call]


async def _race(call: Awaitable[Any], dead: asyncio.Future, timeout: float | None = None) -> asyncio.Task | None:
    """Runs ``call`` until it ends, ``dead`` is set or ``timeout`` passes: the finished task (its
    result or error to read), or None, having cancelled it. A cancel from outside cancels it too."""
    task = asyncio.ensure_future(call)
    try:
        await asyncio.wait({task, dead}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            task.add_done_callback(_retrieve)
    return task if task.done() else None


def _num_slots(ping: asyncio.Task | None) -> int | None:
    """A finished ping's ``num_slots``; None if it did not answer, or not as a service does."""
    if ping is None or ping.cancelled() or ping.exception() is not None:
        return None
    reply = ping.result()
    slots = reply.get("num_slots") if isinstance(reply, dict) else None
    return slots if type(slots) is int else None


def _retrieve(task: asyncio.Task) -> None:
    """Reads a cancelled call's outcome, so that asyncio does not report it as never retrieved."""
    if not task.cancelled():
        task.exception()
