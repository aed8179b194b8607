"""actors.actor over several env services (envs/failover.py), with tests/unit/actors/
test_actor_unit.py's fake engine and real ``python -m envs.main`` processes
(tests/unit/envs/test_failover.py's ``services``): the start needs one service of two, a service
killed mid-run ends its episodes as ``failed/service_down`` (once each) while the run goes on, the
stats count the services, and with none answering the start fails after the grace period,
naming every address."""

from __future__ import annotations

import asyncio
import logging
import socket
from types import SimpleNamespace

import pytest

from actors import actor as actor_mod
from actors.actor import InferenceActor
from envs.failover import EnvServicesDown
from launch.model.tiny_tokenizer import build_tokenizer
from tests.unit.actors.test_actor_unit import ANSWER, FakeEngine
from tests.unit.envs.test_failover import services

FAST = {"env_heartbeat_s": 0.2, "env_timeout_s": 30.0}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(seed=0)


@pytest.fixture(autouse=True)
def no_vllm(monkeypatch):
    monkeypatch.setattr(actor_mod, "sampling_params", lambda **kw: SimpleNamespace(**kw))


def _actor(tokenizer, addresses, **cfg) -> InferenceActor:
    """Actor 1 of a run: its 4 slots are 4..7 of each 8-slot service."""
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    cfg = {"model_path": "unused", "actor_id": 1, "env_pool": {"envs_per_worker": 4},
           "env_address": addresses, "env_slot_offset": 4, "concurrency": 4, "max_tokens": 16,
           **FAST, **cfg}
    engine = FakeEngine(tokenizer.encode(ANSWER, add_special_tokens=False) + [eos])
    return InferenceActor(cfg, engine=engine, tokenizer=tokenizer)


def _unused_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_an_actor_starts_and_plays_with_one_of_its_two_services_down(tokenizer):
    with services(2) as (a, b):
        b.kill()

        async def run():
            actor = _actor(tokenizer, [a.address, b.address], env_grace_s=10.0)
            try:
                await actor.start()
                return await asyncio.wait_for(actor.run(num_episodes=8), 20)
            finally:
                await actor.close()

        stats = asyncio.run(run())
    assert stats["episodes_done"] == 8 and stats["episodes_failed"] == 0
    assert (stats["env_services_live"], stats["env_services_down"]) == (1, 1)


def test_a_service_killed_mid_run_ends_its_episodes_once_each_and_the_run_goes_on(tokenizer):
    with services(2, "--env-latency-s", "0.3") as (a, b):
        async def run():
            actor = _actor(tokenizer, [a.address, b.address])
            try:
                await actor.start()
                client = actor._services
                running = asyncio.create_task(actor.run())
                deadline = asyncio.get_running_loop().time() + 10
                # episodes past their reset on both (resets in flight would move, not fail)
                while not {a.address, b.address} <= {client.address_of(s) for s in range(4, 8)}:
                    assert asyncio.get_running_loop().time() < deadline
                    await asyncio.sleep(0.02)
                a.kill()
                while actor.counts["failed/service_down"] == 0:
                    assert asyncio.get_running_loop().time() < deadline
                    await asyncio.sleep(0.02)
                done = actor.counts["episodes_done"]
                while actor.counts["episodes_done"] < done + 6:  # the run goes on, on b
                    assert asyncio.get_running_loop().time() < deadline
                    await asyncio.sleep(0.02)
                await actor.stop()
                return await running, client.counts["episodes_lost"], client.health()
            finally:
                await actor.close()

        stats, lost, health = asyncio.run(run())
    assert 1 <= stats["failed/service_down"] <= 4  # at most its share of 4 episodes in flight
    assert stats["failed/service_down"] == lost == stats["episodes_failed"]  # once each
    assert (stats["env_services_live"], stats["env_services_down"]) == (1, 1)
    assert health["live"] == [b.address]


def test_with_no_service_answering_the_start_waits_then_fails_naming_every_address(tokenizer, caplog):
    addresses = [_unused_address(), _unused_address()]

    async def run():
        actor = _actor(tokenizer, addresses, env_grace_s=1.0)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(EnvServicesDown) as info:
            await actor.start()
        return str(info.value), loop.time() - t0

    with caplog.at_level(logging.WARNING, logger="envs.failover"):
        message, took = asyncio.run(run())
    assert all(a in message for a in addresses) and 1.0 <= took < 3.0
    assert any("waiting for an env service" in r.message and all(a in r.message for a in addresses)
               for r in caplog.records)
