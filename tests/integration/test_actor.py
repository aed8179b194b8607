"""InferenceActor against real parts: a vLLM engine with the weight-sync worker extension, a
FrozenLake EnvPool (1 worker), a TrajectoryReceiver and a WeightPublisher.

Every test runs on both engines: vLLM's AsyncLLM (its engine core in a child process) and
actors/local_engine.py's InProcessEngine (the single-process topology's), which must keep the
same contract. One actor per engine serves the whole module (an engine takes 5-10 s to start);
its event loop lives in the fixture and each test runs its coroutine on it. Behaviour log-probs are
checked token by token against transformers' log-softmax on the model of the version each token is labelled with.
"""

import asyncio
import contextlib
import os
import signal
import threading
from collections import defaultdict

import numpy as np
import pytest

from actors.actor import InferenceActor
from actors.groups import GROUP_STRIDE
from actors.weight_updates import WeightUpdateError
from launch.model.tiny_model import build_tiny_model
from tests.collector import Collector
from transport.weights import WeightPublisher

LOGPROB_TOL = 1e-4
ACTOR_ID = 3


class Rig:
    def __init__(self, loop, actor, collector, old, new):
        self.loop, self.actor, self.collector, self.old, self.new = loop, actor, collector, old, new

    def run(self, coro, timeout_s: float = 120.0):
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout_s))


@contextlib.contextmanager
def started_actor(config: dict):
    """(event loop, a started InferenceActor of ``config`` streaming to a Collector, the
    Collector); everything is closed on exit, also on failure."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("VLLM_NO_USAGE_STATS", "1")
        collector = Collector()
        loop = asyncio.new_event_loop()
        actor = InferenceActor({**config, "learner_address": collector.address})
        try:
            loop.run_until_complete(asyncio.wait_for(actor.start(), 180))
            yield loop, actor, collector
        finally:
            try:
                loop.run_until_complete(asyncio.wait_for(actor.close(), 60))
            finally:
                loop.close()
                collector.close()


@pytest.fixture(scope="module", params=["async", "in_process"])
def rig(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("actor")
    old, new = build_tiny_model(tmp / "old", seed=0), build_tiny_model(tmp / "new", seed=1)
    with started_actor({
        "engine": request.param,
        "actor_id": ACTOR_ID, "run_id": "test", "model_path": str(old), "env_name": "frozenlake",
        "env_pool": {"env_workers": 1, "envs_per_worker": 4}, "concurrency": 4, "group_size": 2,
        "temperature": 1.0, "max_tokens": 48, "max_turns": 3, "max_context": 2048,
        "kv_cache_bytes": 64 << 20, "seed": 7,
    }) as (loop, actor, collector):
        yield Rig(loop, actor, collector, old, new)


@pytest.fixture(scope="module")
def hf_models(rig):
    import torch
    from transformers import AutoModelForCausalLM

    return {v: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            for v, path in ((0, rig.old), (1, rig.new))}


def _hf_logprobs(model, token_ids) -> np.ndarray:
    """log p(token_i | tokens < i) under ``model`` at temperature 1; entry 0 is 0."""
    import torch

    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64))[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    out = np.zeros(len(token_ids))
    out[1:] = logp[:-1].gather(1, ids[0, 1:, None])[:, 0].numpy()
    return out


def _check_tokens(traj, hf_models) -> None:
    """Policy tokens: finite log-probs <= 0 equal to the labelled version's model, versions never
    going back; environment tokens: version -1, log-prob 0; every turn ends on the end-of-turn
    token, generated or (for a truncated answer) appended as an environment token."""
    mask = traj.loss_mask
    ends = np.flatnonzero(traj.turn_end)
    eos = hf_models[0].generation_config.eos_token_id
    ids, env_tok = np.append(traj.token_ids, -1), np.append(~mask, False)
    assert np.all((ids[ends] == eos) | ((ids[ends + 1] == eos) & env_tok[ends + 1]))
    lp, versions = traj.behaviour_logprobs, traj.policy_version
    assert mask.any() and np.all(np.isfinite(lp)) and np.all(lp[mask] <= 0)
    assert np.all(versions[~mask] == -1) and np.all(lp[~mask] == 0) and np.all(versions[mask] >= 0)
    assert np.all(np.diff(versions[mask]) >= 0)
    for v in np.unique(versions[mask]):
        at = mask & (versions == v)
        np.testing.assert_allclose(lp[at], _hf_logprobs(hf_models[int(v)], traj.token_ids)[at],
                                   atol=LOGPROB_TOL)


def test_episodes_stream_in_groups_token_consistent(rig, hf_models):
    before = len(rig.collector.items)
    stats = rig.run(rig.actor.run(num_episodes=8))
    assert stats["episodes_done"] == stats["episodes_sent"] == 8 and stats["episodes_failed"] == 0
    trajs = rig.collector.wait_for(before + 8)[before:]
    assert len(trajs) == 8
    groups = defaultdict(list)
    for t in trajs:
        assert t.actor_id == ACTOR_ID and t.run_id == "test" and t.env_name == "frozenlake"
        assert t.group_id // GROUP_STRIDE == ACTOR_ID
        assert set(t.policy_version[t.loss_mask].tolist()) == {0}
        groups[t.group_id].append(t.seed)
    assert len(groups) == 4 and all(len(s) == 2 and s[0] == s[1] for s in groups.values())
    assert len({s[0] for s in groups.values()}) == 4
    for t in trajs[:2]:
        _check_tokens(t, hf_models)
    assert stats["tokens_generated"] >= sum(int(t.loss_mask.sum()) for t in trajs)


def test_weights_update_in_flight(rig, hf_models):
    actor, collector = rig.actor, rig.collector
    publisher = WeightPublisher(world_size=2, timeout_s=30)
    new_weights = list(hf_models[1].state_dict().items())

    async def scenario():
        await actor.join_weight_group(publisher.address, 1, 2, 30.0)
        start = len(collector.items)
        running = asyncio.create_task(actor.run())
        try:
            while len(collector.items) < start + 2:  # episodes are in flight on version 0
                await asyncio.sleep(0.05)
            pushing = threading.Thread(target=publisher.publish, args=(new_weights, 1))
            pushing.start()
            timings = await actor.update_weights(1)
            pushing.join(30)
            while sum(_all_version(t, 1) for t in collector.items[start:]) < 4:
                await asyncio.sleep(0.05)
        finally:
            await actor.stop()
        return timings, await running, collector.items[start:]

    try:
        timings, stats, trajs = rig.run(scenario())
    finally:
        publisher.close()
    assert timings["version"] == 1 and 0 < timings["total_s"] < 30
    assert stats["version"] == 1 and stats["weight_updates"] == 1 and stats["time/weights_s"] > 0
    old = [t for t in trajs if _all_version(t, 0)]
    new = [t for t in trajs if _all_version(t, 1)]
    spanning = [t for t in trajs if set(t.policy_version[t.loss_mask].tolist()) == {0, 1}]
    assert old and new and len(old) + len(new) + len(spanning) == len(trajs)
    for t in [new[-1], *spanning[:2]]:
        _check_tokens(t, hf_models)
    print(f"\nupdate {timings}; {len(spanning)} of {len(trajs)} trajectories span both versions")


def _all_version(traj, v: int) -> bool:
    return bool(np.all(traj.policy_version[traj.loss_mask] == v))


def test_a_failed_update_keeps_serving_the_old_weights(rig):
    actor = rig.actor
    silent = WeightPublisher(world_size=2, timeout_s=2)  # never publishes
    try:
        version = rig.run(actor.stats())["version"]
        rig.run(actor.join_weight_group(silent.address, 1, 2, 2.0))
        with pytest.raises(WeightUpdateError, match=f"still serving version {version}"):
            rig.run(actor.update_weights(version + 1), timeout_s=30)
    finally:
        silent.close()
    before = len(rig.collector.items)
    stats = rig.run(actor.run(num_episodes=2))
    trajs = rig.collector.wait_for(before + 2)[before:]
    assert stats["version"] == version and stats["weight_update_failures"] == 1
    assert len(trajs) == 2 and all(_all_version(t, version) for t in trajs)


def test_an_env_worker_crash_loses_only_its_episodes(rig):
    actor = rig.actor
    before = rig.run(actor.stats())

    async def scenario():
        running = asyncio.create_task(actor.run(num_episodes=16))
        while (await actor.stats())["episodes_done"] < before["episodes_done"] + 2:
            await asyncio.sleep(0.01)
        os.kill(actor._pool.worker_pids()[0], signal.SIGKILL)  # the pool's only worker
        return await running

    after = rig.run(scenario())
    failed = after["episodes_failed"] - before.get("episodes_failed", 0)
    done = after["episodes_done"] - before["episodes_done"]
    crashed = after["failed/worker_crashed"] - before.get("failed/worker_crashed", 0)
    assert 1 <= crashed == failed <= 4  # at most the episodes in flight on that worker
    assert done + failed == 16 and after["env/worker_restarts"] >= 1
