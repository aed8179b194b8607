"""envs/failover.py against real env services (``python -m envs.main`` processes, as
tests/unit/envs/test_service.py starts them) killed by SIGKILL, frozen by SIGSTOP and restarted at
the same address: episodes stick to their service, a lost service ends only its episodes (once
each, at the heartbeat, not at the call timeout), new episodes go to the live ones, a service that
answers again is used again, and with none live a reset waits, then fails naming every address.
Timeouts and heartbeats are tenths of a second, so each test takes a few seconds."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from envs.failover import EnvServicesDown, FailoverEnvClient
from envs.protocol import Observation, StepResult
from envs.wire import EpisodeFailure
from tests.unit.envs.test_service import ROOT, _descendants

ANSWER = "<think>x</think><answer>Up</answer>"
FAST = {"timeout_s": 30.0, "heartbeat_s": 0.2, "backoff_s": (0.1, 0.5), "grace_s": 10.0}
"""A service silent for 0.6 s is marked down (long before a call's timeout); a down one is probed
every 0.1 to 0.5 s; with none live for 10 s a reset fails (no test waits longer)."""


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/<pid>/stat), None once it is gone or a zombie:
    with it a pid is only signalled while it is still the process recorded."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def _die_with_parent() -> None:
    """In the service's process before exec: SIGKILL when the test's process dies (Linux's
    PR_SET_PDEATHSIG), so that a test killed by pytest's timeout leaves no service behind."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


class Service:
    """``python -m envs.main`` serving FrozenLake (8 slots) on loopback. ``kill`` SIGKILLs it;
    ``start`` starts it again at the same address. ``close`` kills, by pid, every process it
    started (the service, its forkserver and env workers) that is still there."""

    def __init__(self, *flags: str) -> None:
        self.flags, self.address = flags, "tcp://127.0.0.1:*"
        self.proc: subprocess.Popen | None = None
        self.started: dict[int, str] = {}  # pid -> start time, of every process seen
        self.start()

    def start(self) -> None:
        cmd = [sys.executable, "-m", "envs.main", "--bind", self.address, "--env", "frozenlake",
               "--env-workers", "1", "--envs-per-worker", "8", *self.flags]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                     preexec_fn=_die_with_parent)
        self._seen()
        assert select.select([self.proc.stdout], [], [], 20)[0], "the service did not start"
        line = self.proc.stdout.readline()
        assert line.startswith("env service on tcp://127.0.0.1:"), line
        self.address = line.split()[3]
        self._seen()

    def _seen(self) -> None:
        for pid in {self.proc.pid} | _descendants(self.proc.pid):
            when = _start_time(pid)
            if when is not None:
                self.started.setdefault(pid, when)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        self._seen()
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        deadline = time.monotonic() + 5  # orphaned workers end when their pipes close
        while time.monotonic() < deadline and any(
                _start_time(pid) == when for pid, when in self.started.items()):
            time.sleep(0.05)
        for pid, when in self.started.items():
            if _start_time(pid) == when:
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def services(n: int, *flags: str):
    started: list[Service] = []
    try:
        for _ in range(n):
            started.append(Service(*flags))
        yield started
    finally:
        for service in started:
            if service.proc.poll() is None:
                os.kill(service.pid, signal.SIGCONT)  # a frozen one too
            service.close()


async def _until(condition, timeout_s: float = 5.0) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout_s``."""
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout_s, "timed out waiting"
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


def test_a_killed_service_ends_its_episodes_once_and_new_ones_go_to_the_other():
    with services(2, "--env-latency-s", "0.5") as (a, b):
        async def run():
            client = FailoverEnvClient([a.address, b.address], **FAST)
            try:
                slots = list(range(8))
                assert (await client.ping()) == {"num_slots": 8}
                await _until(lambda: len(client.health()["live"]) == 2)
                first = await asyncio.gather(*(client.reset([s], [s]) for s in slots))
                assert all(isinstance(r[0], Observation) for r in first)
                assert client.health()["episodes"] == {a.address: 4, b.address: 4}  # least loaded
                on_a = [s for s in slots if client.address_of(s) == a.address]
                on_b = [s for s in slots if client.address_of(s) == b.address]
                steps = [asyncio.create_task(client.step([s], [ANSWER])) for s in slots]
                await asyncio.sleep(0.2)  # the steps are in flight: the services answer at 0.5 s
                t0 = time.monotonic()
                a.kill()
                results = dict(zip(slots, [r[0] for r in await asyncio.wait_for(asyncio.gather(*steps), 10)]))
                took = time.monotonic() - t0
                again = [(await client.step([s], [ANSWER]))[0] for s in on_a]
                lost = client.counts["episodes_lost"]
                moved = [(await client.reset([s], [s]))[0] for s in on_a]
                return on_a, on_b, results, took, again, lost, moved, client.health()
            finally:
                await client.close()

        on_a, on_b, results, took, again, lost, moved, health = asyncio.run(run())
    assert len(on_a) == 4 and all(isinstance(results[s], StepResult) for s in on_b)
    assert all(results[s] == EpisodeFailure(f"service_down: {a.address}") for s in on_a)
    assert took < 3.0  # the heartbeat's doing: the call timeout is 30 s
    assert again == [EpisodeFailure("no_episode")] * 4 and lost == 4  # reported once each
    assert all(isinstance(r, Observation) for r in moved)
    assert health["live"] == [b.address] and health["down"] == [a.address]
    assert health["episodes"] == {a.address: 0, b.address: 8}


def test_resets_in_flight_on_a_killed_service_move_to_the_other():
    """A reset starts an episode: losing its service before the answer costs no episode."""
    with services(2, "--env-latency-s", "0.5") as (a, b):
        async def run():
            client = FailoverEnvClient([a.address, b.address], **FAST)
            try:
                await client.ping()
                await _until(lambda: len(client.health()["live"]) == 2)
                resets = [asyncio.create_task(client.reset([s], [s])) for s in range(6)]
                await asyncio.sleep(0.2)
                assert client.health()["episodes"] == {a.address: 3, b.address: 3}  # in flight
                a.kill()
                results = [r[0] for r in await asyncio.wait_for(asyncio.gather(*resets), 10)]
                return results, [client.address_of(s) for s in range(6)], dict(client.counts)
            finally:
                await client.close()

        results, where, counts = asyncio.run(run())
    assert all(isinstance(r, Observation) for r in results) and where == [b.address] * 6
    assert counts["calls_moved"] == 3 and counts["episodes_lost"] == 0


def test_a_service_restarted_at_its_address_is_used_again_but_its_old_episodes_stay_lost():
    with services(2) as (a, b):
        async def run():
            client = FailoverEnvClient([a.address, b.address], **FAST)
            try:
                await client.ping()
                await _until(lambda: len(client.health()["live"]) == 2)
                await asyncio.gather(*(client.reset([s], [s]) for s in (0, 1)))
                old = next(s for s in (0, 1) if client.address_of(s) == a.address)
                a.kill()
                await _until(lambda: client.health()["down"] == [a.address])
                a.start()  # the same address
                back_s = await _until(lambda: len(client.health()["live"]) == 2)
                stale = (await client.step([old], [ANSWER]))[0]
                assert isinstance((await client.reset([2], [2]))[0], Observation)
                fresh = client.address_of(2), (await client.step([2], [ANSWER]))[0]
                return back_s, stale, fresh, dict(client.counts)
            finally:
                await client.close()

        back_s, stale, fresh, counts = asyncio.run(run())
    assert back_s < 3.0 and counts["revived"] == 1 and counts["marked_down"] == 1
    assert stale == EpisodeFailure(f"service_down: {a.address}")  # not sent to the new process
    assert fresh[0] == a.address and isinstance(fresh[1], StepResult)  # the least loaded again


def test_a_call_timeout_marks_a_frozen_service_down_and_its_episodes_stay_lost_when_it_thaws():
    """SIGSTOP: the service keeps its episodes but answers nothing. The heartbeat is slow (15 s of
    silence), so the step's own timeout finds it; once thawed it is used for new episodes, and its
    old episodes (still alive in it) are never stepped again."""
    with services(2) as (a, b):
        async def run():
            client = FailoverEnvClient([a.address, b.address],
                                       **{**FAST, "timeout_s": 0.5, "heartbeat_s": 5.0})
            try:
                await client.ping()
                await _until(lambda: len(client.health()["live"]) == 2)
                await asyncio.gather(*(client.reset([s], [s]) for s in range(4)))
                first, second = [s for s in range(4) if client.address_of(s) == a.address]
                os.kill(a.pid, signal.SIGSTOP)
                t0 = time.monotonic()
                timed_out = (await client.step([first], [ANSWER]))[0]
                took = time.monotonic() - t0
                down = client.health()["down"]
                elsewhere = (await client.reset([4], [4]))[0], client.address_of(4)
                os.kill(a.pid, signal.SIGCONT)
                await _until(lambda: len(client.health()["live"]) == 2)
                stale = (await client.step([second], [ANSWER]))[0]
                return timed_out, took, down, elsewhere, stale, dict(client.counts)
            finally:
                await client.close()

        timed_out, took, down, elsewhere, stale, counts = asyncio.run(run())
    lost = EpisodeFailure(f"service_down: {a.address}")
    assert timed_out == lost and 0.5 <= took < 2.0 and down == [a.address]
    assert isinstance(elsewhere[0], Observation) and elsewhere[1] == b.address
    assert stale == lost and counts["timeouts"] == 1 and counts["episodes_lost"] == 2
    assert counts["marked_down"] == 1 and counts["revived"] == 1


def test_with_every_service_down_a_reset_waits_and_goes_on_when_one_answers(caplog):
    with services(2) as (a, b):
        async def run():
            client = FailoverEnvClient([a.address, b.address], **{**FAST, "grace_s": 30.0})
            try:
                assert isinstance((await client.reset([0], [0]))[0], Observation)
                a.kill()
                b.kill()
                await _until(lambda: not client.health()["live"])
                health = client.health()
                steps = client.counts["episodes_lost"]
                waiting = asyncio.create_task(client.reset([1], [1]))
                await asyncio.sleep(1.5)
                assert not waiting.done()  # waits: not a failure
                b.start()
                result = (await asyncio.wait_for(waiting, 10))[0]
                return health, steps, result, client.address_of(1), client.health()
            finally:
                await client.close()

        with caplog.at_level(logging.WARNING, logger="envs.failover"):
            health, steps, result, where, after = asyncio.run(run())
    assert health["live"] == [] and health["down"] == [a.address, b.address]
    assert health["waiting_since"] is not None and time.time() - health["waiting_since"] < 60
    assert steps == 0 and isinstance(result, Observation) and where == b.address
    assert after["live"] == [b.address] and after["waiting_since"] is None
    assert any("waiting for an env service" in r.message and a.address in r.message
               and b.address in r.message for r in caplog.records)


def test_with_every_service_down_past_the_grace_a_reset_fails_naming_every_address():
    with services(2) as (a, b):
        async def run():
            client = FailoverEnvClient([a.address, b.address], **{**FAST, "grace_s": 1.0})
            try:
                await client.reset([0], [0])
                a.kill()
                b.kill()
                t0 = time.monotonic()
                with pytest.raises(EnvServicesDown) as info:
                    await asyncio.wait_for(client.reset([1], [1]), 10)
                return str(info.value), time.monotonic() - t0
            finally:
                await client.close()

        message, took = asyncio.run(run())
    assert a.address in message and b.address in message and "actors.env_grace_s" in message
    assert 1.0 <= took < 4.0


def test_a_down_service_is_probed_with_doubling_waits_up_to_the_cap():
    """A ROUTER that never answers: each probe is a fresh socket (a new identity), sent after
    waits of 0.2, 0.4, then 0.8 s capped (plus the probe's 0.06 s of patience)."""
    async def run():
        ctx = zmq.asyncio.Context()
        silent = ctx.socket(zmq.ROUTER)
        silent.setsockopt(zmq.LINGER, 0)
        silent.bind("tcp://127.0.0.1:*")
        address = silent.getsockopt(zmq.LAST_ENDPOINT).decode()
        client = FailoverEnvClient([address], heartbeat_s=0.02, backoff_s=(0.2, 0.8), grace_s=30.0)
        seen: dict[bytes, float] = {}
        try:
            waiting = asyncio.create_task(client.ping())
            t0 = time.monotonic()
            while time.monotonic() - t0 < 4.0:
                if await silent.poll(50):
                    identity, *_ = await silent.recv_multipart()
                    seen.setdefault(identity, time.monotonic())
            assert not waiting.done()
            waiting.cancel()
            return sorted(seen.values()), client.health()
        finally:
            await client.close()
            silent.close()
            ctx.term()

    probes, health = asyncio.run(run())
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert 5 <= len(probes) <= 8, gaps  # without backoff (0.2 s each) there would be ~15
    assert gaps[0] < 0.5 and all(0.6 < g < 1.3 for g in gaps[2:]), gaps
    assert health["live"] == [] and health["waiting_since"] is not None


def test_addresses_must_be_distinct():
    with pytest.raises(ValueError, match="distinct"):
        FailoverEnvClient(["tcp://127.0.0.1:1", "tcp://127.0.0.1:1"])
