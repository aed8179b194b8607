"""Adapter pushes into a real vLLM engine (actors/weight_updates.py, actors/vllm_extension.py):
each version of a LoRA adapter reaches the engine as a new adapter, every answer keeps the
adapter it started with, and after every push the engine proves it samples from the published
policy (the probe). Three faults are planted, one at a time, and each fails the push:
the adapter is received but never registered, the learner sends stale tensors, and the actor
samples from the base model.

The learner's side is learner/lora.py on a transformers model (no FSDP here: the trainer's
publish is tested in tests/unit/learner/test_lora.py), broadcast by a real WeightPublisher.
Every test runs on both engines (the registration fault on the in-process one, whose worker
runs in this process where the fault can be planted).
"""

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from actors.vllm_extension import WeightSyncExtension
from actors.weight_updates import AdapterMismatch, WeightUpdates
from launch.model.tiny_model import build_tiny_model
from learner import lora
from learner.models import Entry, lazy_publish, token_logprobs
from tests.integration.test_actor import started_actor
from transport import adapters
from transport.weights import WeightPublisher

LOGPROB_TOL = 1e-4


class Learner:
    """A tiny Qwen2 with random LoRA adapters (A and B non-zero: it starts away from the base),
    a snapshot of the adapter per published version."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = path
        self.base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.spec = lora.LoraSpec(rank=8, alpha=16, init_seed=1)
        self.model = lora.inject(model, self.spec)
        self.probe = lora.probe_ids(AutoTokenizer.from_pretrained(path))
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def step(self, version: int) -> None:
        """A new adapter: every B moved by noise (an update far larger than a real step's)."""
        gen = torch.Generator().manual_seed(version)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if ".lora_B." in name:
                    p.add_(0.5 * torch.randn(p.shape, generator=gen))
        self.snapshots[version] = {n: p.detach().clone() for n, p in self.model.named_parameters()
                                   if ".lora_" in n}

    def publication(self, version: int, stale_from: int | None = None):
        """``(specs, tensors)`` of ``version``'s adapter publish; ``stale_from``: the tensors of
        that earlier version with this version's probe (a learner sending the wrong tensors)."""
        with self.at(version):
            probe = token_logprobs(self.model, self.probe, 1.0)[0][0, 1:]
            config = lora.peft_config(self.spec, self.model, str(self.path))
        with self.at(stale_from if stale_from is not None else version):
            tensors = [(e.name, e.read().clone()) for e in lora.adapter_entries(self.model)]
        entries = [Entry(n, t.dtype, tuple(t.shape), lambda t=t: t)
                   for n, t in tensors + adapters.extras(config, self.probe, probe)]
        return lazy_publish(entries)

    def at(self, version: int):
        """Within it, the model holds ``version``'s adapter (version 0: the base model)."""
        import contextlib

        @contextlib.contextmanager
        def holding():
            if version == 0:
                with lora.adapters_disabled(self.model):
                    yield
                return
            now = {n: p.detach().clone() for n, p in self.model.named_parameters() if ".lora_" in n}
            self._load(self.snapshots[version])
            try:
                yield
            finally:
                self._load(now)

        return holding()

    def _load(self, state) -> None:
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if n in state:
                    p.copy_(state[n])

    def logprobs(self, version: int, ids) -> np.ndarray:
        with self.at(version), torch.no_grad():
            out = token_logprobs(self.model, torch.as_tensor(np.asarray(ids, np.int64))[None], 1.0)[0]
        return out[0].numpy()


class Rig:
    def __init__(self, loop, actor, collector, learner, engine):
        self.loop, self.actor, self.collector, self.learner, self.engine = loop, actor, collector, learner, engine
        self.publisher = WeightPublisher(world_size=2, timeout_s=30)
        self.run(actor.join_weight_group(self.publisher.address, 1, 2, 30.0))

    def run(self, coro, timeout_s: float = 120.0):
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout_s))

    async def push(self, version: int, stale_from: int | None = None) -> dict:
        """The learner publishes ``version`` while the actor takes it; the update's timings."""
        specs, tensors = self.learner.publication(version, stale_from)
        publishing = threading.Thread(target=self.publisher.publish, args=(tensors, version),
                                      kwargs={"specs": specs})
        publishing.start()
        try:
            return await self.actor.update_weights(version)
        finally:
            publishing.join(30)


@pytest.fixture(scope="module", params=["async", "in_process"])
def rig(tmp_path_factory, request):
    path = build_tiny_model(tmp_path_factory.mktemp("lora") / "model", seed=0)
    learner = Learner(path)
    with started_actor({
        "engine": request.param, "actor_id": 2, "run_id": "test", "model_path": str(path),
        "env_name": "frozenlake", "env_pool": {"env_workers": 1, "envs_per_worker": 4},
        "concurrency": 4, "group_size": 2, "temperature": 1.0, "max_tokens": 32, "max_turns": 3,
        "kv_cache_bytes": 64 << 20, "seed": 5, "lora_rank": 8, "lora_keep": 2,
    }) as (loop, actor, collector):
        rig = Rig(loop, actor, collector, learner, request.param)
        try:
            yield rig
        finally:
            rig.publisher.close()


def _answers(traj):
    """Each answer's token positions (the policy tokens between two turn ends)."""
    policy = np.flatnonzero(traj.loss_mask)
    ends = np.flatnonzero(traj.turn_end & traj.loss_mask)
    return [a for a in np.split(policy, np.searchsorted(policy, ends, side="right")) if len(a)]


def test_each_version_arrives_as_an_adapter_that_every_answer_keeps(rig):
    actor, collector, learner = rig.actor, rig.collector, rig.learner
    learner.step(1)

    async def scenario():
        start = len(collector.items)
        running = asyncio.create_task(actor.run())
        try:
            while len(collector.items) < start + 2:  # episodes in flight on the base model
                await asyncio.sleep(0.05)
            first = await rig.push(1)
            while sum(_versions(t) == {1} for t in collector.items[start:]) < 3:
                await asyncio.sleep(0.05)
        finally:
            await actor.stop()
        await running
        return first, collector.items[start:]

    first, trajs = rig.run(scenario(), timeout_s=240)
    assert first["version"] == 1 and first["pause_s"] == 0.0 and first["probe_gap"] < LOGPROB_TOL
    seen = set()
    for traj in trajs:
        for answer in _answers(traj):  # one adapter (one version) per answer, whatever the update
            versions = set(traj.policy_version[answer].tolist())
            assert len(versions) == 1, versions
            seen |= versions
        for v in _versions(traj):  # the engine sampled from the labelled version's policy
            at = traj.loss_mask & (traj.policy_version == v)
            np.testing.assert_allclose(traj.behaviour_logprobs[at],
                                       learner.logprobs(v, traj.token_ids)[at], atol=LOGPROB_TOL)
    assert seen == {0, 1}
    # With nothing in flight, two more versions: the two newest stay registered, the oldest goes.
    held = Path(actor._weights._registered[1].lora_path)
    for v in (2, 3):
        learner.step(v)
        assert rig.run(rig.push(v))["probe_gap"] < LOGPROB_TOL
    assert sorted(actor._weights._registered) == [2, 3] and not held.exists()
    stats = rig.run(actor.stats())
    assert stats["version"] == 3 and stats["weight_update_failures"] == 0


def _versions(traj) -> set[int]:
    return set(traj.policy_version[traj.loss_mask].tolist())


def _failing_push(rig, fault: str, version: int, **kwargs) -> None:
    """A push of ``version`` that must fail with AdapterMismatch naming ``fault``; the actor
    keeps serving the version it served, and the failed version is not registered."""
    served = rig.actor.version
    rig.learner.step(version)
    with pytest.raises(AdapterMismatch, match=fault):
        rig.run(rig.push(version, **kwargs))
    assert rig.actor.version == served and version not in rig.actor._weights._registered


def test_an_adapter_received_but_never_registered_fails_the_push(rig, monkeypatch):
    if rig.engine != "in_process":
        pytest.skip("the fault is planted in the engine's worker, which runs in this process "
                    "only with the in-process engine")
    monkeypatch.setattr(WeightSyncExtension, "_register", lambda self, request: None)
    _failing_push(rig, "holds adapters", 10)


def test_stale_tensors_fail_the_push(rig):
    last = max(rig.learner.snapshots)
    _failing_push(rig, "differ from the learner's", last + 11, stale_from=last)


def test_sampling_from_the_base_model_fails_the_push(rig, monkeypatch):
    monkeypatch.setattr(WeightUpdates, "lora_request", lambda self, version: None)
    _failing_push(rig, "differ from the learner's", max(rig.learner.snapshots) + 12)
