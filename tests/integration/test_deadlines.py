"""Nothing the driver asks of a Ray actor waits forever (launch/topology/ray_cluster.py).

On a real local Ray cluster: a call past its deadline is a ``CallTimeout`` naming the call; an
actor whose event loop is blocked, whose engine is dead or whose engine stalled is found by
``hung_actors`` without the driver waiting; a learner rank stuck in a call is reported with
what it is doing and its threads' stacks, asked on its own concurrency group while the call
hangs (a real ``LearnerWorker`` on the tiny model, waiting for a batch no actor sends); a stop
request ends an evaluation at once, and the wait for the warm start's task, whose task it
cancels."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest
import ray

from actors.config import ActorConfig
from actors.weight_updates import EngineDead
from launch.config.builders import worker_config
from launch.config.compose import compose
from launch.model.tiny_model import build_tiny_model
from launch.topology.placement import Slot
from launch.topology.protocol import ActorsFailed, CallTimeout, LearnerHung
from launch.topology.ray_cluster import RayCluster, WeightGroup, is_dead, learner_actor_class


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


class _Actor:
    """Answers liveness as told: ``blocked`` blocks its event loop for good."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    async def ready(self) -> bool:
        return True

    async def liveness(self) -> dict:
        if self.kind == "blocked":
            time.sleep(60)  # the point: the event loop is blocked, nothing answers
        return {"requests": 2 if self.kind == "stalled" else 0,
                "stalled_s": 100.0 if self.kind == "stalled" else 0.0,
                "engine_dead": self.kind == "engine_dead"}

    async def evaluate(self, seeds: list[int], record: int = 0, samples: int = 0, blind: bool = False) -> dict:
        await asyncio.sleep(60 if self.kind == "slow" else 0)
        return {"outcomes": [{"seed": s, "sample": -1, "failure": None, "success": 1.0} for s in seeds]}


def _cluster(*overrides: str) -> RayCluster:
    return RayCluster(compose(["logger.wandb=false", "ray.call_timeout_s=1", "ray.stall_s=50",
                               "ray.eval_timeout_s=2", *overrides]))


def test_hung_actors_finds_a_blocked_loop_a_dead_engine_and_a_stall_without_waiting(local_ray):
    cluster = _cluster()
    kinds = ["fine", "blocked", "engine_dead", "stalled"]
    cluster.actors = [ray.remote(_Actor).remote(k) for k in kinds]
    try:
        ray.get([a.ready.remote() for a in cluster.actors])  # their processes are up
        t0 = time.monotonic()
        hung = cluster.hung_actors()  # asks; answers come later
        assert time.monotonic() - t0 < 0.5
        while set(hung) != {1, 2, 3} and time.monotonic() - t0 < 20:
            time.sleep(0.2)  # past call_timeout_s the blocked one is hung; the others answer
            hung.update(cluster.hung_actors())
        assert set(hung) == {1, 2, 3}, hung
        assert isinstance(hung[1], CallTimeout) and "liveness" in str(hung[1])
        assert isinstance(hung[2], EngineDead)
        assert isinstance(hung[3], CallTimeout) and "100.0 s" in str(hung[3])
        assert all(is_dead(e) for e in hung.values())
        # stall_s=0 turns the stall check off; the blocked actor stays hung (its call is still out)
        cluster.cfg.ray.stall_s = 0
        time.sleep(0.2)
        again = cluster.hung_actors()
        assert 3 not in again and 1 in again
    finally:
        for a in cluster.actors:
            ray.kill(a)


def test_an_evaluation_past_its_deadline_fails_only_the_slow_actor(local_ray):
    cluster = _cluster()
    cluster.actors = [ray.remote(_Actor).remote(k) for k in ("fine", "slow")]
    try:
        ray.get([a.ready.remote() for a in cluster.actors])  # started: the deadline is the call's
        t0 = time.monotonic()
        with pytest.raises(ActorsFailed) as info:
            cluster.evaluate(list(range(8)))
        assert 2 <= time.monotonic() - t0 < 10
        assert set(info.value.errors) == {1}
        assert isinstance(info.value.errors[1], CallTimeout) and "evaluate" in str(info.value.errors[1])
    finally:
        for a in cluster.actors:
            ray.kill(a)


def test_a_stop_request_ends_an_evaluation_at_once(local_ray):
    from launch.run.loop import Interrupted, Stop  # here: the actors import this module

    cluster = _cluster("ray.eval_timeout_s=60")
    cluster.actors = [ray.remote(_Actor).remote(k) for k in ("fine", "slow")]
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    try:
        t0 = time.monotonic()
        with Stop() as stop:
            timer.start()
            with pytest.raises(Interrupted, match="the evaluation"), stop.interruptible("the evaluation"):
                cluster.evaluate(list(range(8)))
        assert time.monotonic() - t0 < 10
    finally:
        timer.cancel()
        for a in cluster.actors:
            ray.kill(a)


def test_a_learner_rank_stuck_in_a_call_is_reported_with_its_op_and_stacks(local_ray, tmp_path):
    model = build_tiny_model(tmp_path / "model", seed=0)
    cfg = compose(["logger.wandb=false", "learner.ranks=1", "ray.call_timeout_s=5"])
    cluster = RayCluster(cfg)
    worker = learner_actor_class().options(num_cpus=1).remote(
        0, 1, worker_config(cfg, str(model)))
    cluster.learners = [worker]
    try:
        cluster._learners([worker.setup.remote(None)], "setup", 120)
        # no actor sends: rank 0 waits 30 s for its batch; the driver's deadline is 2 s
        with pytest.raises(LearnerHung) as info:
            cluster._learners([worker.train_step.remote(4, 30.0)], "train_step", 2.0)
        report = str(info.value)
        assert "no answer to train_step within 2 s" in report
        assert "rank 0" in report and "in train_step for" in report
        assert "in take" in report  # the rank's stack: Inbox.take, waiting for the batch
    finally:
        ray.kill(worker)


class _Learner:
    def liveness(self, stacks: bool = False) -> dict:
        return {"rank": 0, "pid": 0, "doing": "publish_weights", "for_s": 0.0}


def test_a_learner_dying_while_the_actors_wait_on_it_ends_the_wait_at_once(local_ray):
    """Joining the weight group or receiving a push waits on learner rank 0 (the group's store):
    if it dies meanwhile, the wait ends with its death in seconds, not at the actors' deadline."""
    import threading

    import ray.exceptions

    cluster = _cluster("ray.call_timeout_s=30")
    cluster.actors = [ray.remote(_Actor).remote("slow")]
    learner = ray.remote(concurrency_groups={"liveness": 1})(_Learner).remote()
    cluster.learners = [learner]
    try:
        ray.get([cluster.actors[0].ready.remote(), learner.liveness.remote()])
        threading.Timer(1.0, ray.kill, (learner,)).start()
        t0 = time.monotonic()
        with pytest.raises(ray.exceptions.RayActorError):
            cluster._gather({0: cluster.actors[0].evaluate.remote([1])}, "evaluate", 60, watch_learners=True)
        assert time.monotonic() - t0 < 10
    finally:
        for a in cluster.actors:
            ray.kill(a)


class _Starting:
    """An actor whose start fails in its first ``fail`` incarnations (its engine killed as it starts)."""

    def __init__(self, incarnation: int, fail: int) -> None:
        self.incarnation, self.fail = incarnation, fail

    async def start(self) -> dict:
        if self.incarnation < self.fail:
            raise RuntimeError("Engine core initialization failed: {'EngineCore': -9}")
        return {"start_s": 0.0}


@pytest.mark.parametrize("fail,limit,ok", [(2, 3, True), (2, 1, False)])
def test_an_actor_that_dies_while_starting_is_replaced_within_its_restarts(local_ray, monkeypatch, fail, limit, ok):
    cluster = _cluster(f"actors.max_restarts={limit}")
    cluster.incarnations = [0, 0]
    cluster._actor_configs = [ActorConfig(model_path="m")] * 2
    monkeypatch.setattr(cluster, "_new_actor", lambda i: ray.remote(_Starting).remote(
        cluster.incarnations[i], fail if i == 1 else 0))
    cluster.actors = [cluster._new_actor(i) for i in range(2)]
    try:
        if ok:
            cluster._start_actors()
            assert cluster.incarnations == [0, fail]  # only the failing one, replaced until it started
        else:
            with pytest.raises(RuntimeError, match="actor 1 failed after 1 restarts"):
                cluster._start_actors()
    finally:
        for a in cluster.actors:
            ray.kill(a)


class _Joining(_Starting):
    """Starts; its first ``fail`` incarnations die (the process exits) while joining the weight group."""

    async def start(self) -> dict:
        return {"start_s": 0.0}

    async def join_weight_group(self, address: str, rank: int, world_size: int, timeout_s: float) -> None:
        if self.incarnation < self.fail:
            os._exit(1)


class _Learner:
    def __init__(self) -> None:
        self.generations = 0

    def reform_weight_group(self, world_size: int) -> int:
        self.generations += 1
        return self.generations

    def liveness(self, stacks: bool = False) -> dict:
        return {}


def test_an_actor_that_dies_joining_the_weight_group_at_start_is_replaced_and_the_group_formed_again(
        local_ray, monkeypatch):
    cluster = _cluster("actors.max_restarts=3")
    cluster.incarnations = [0, 0]
    cluster._actor_configs = [ActorConfig(model_path="m")] * 2
    cluster._slots = [Slot(role="actor", index=i, node="n", cpus=1, gpus=0, weight_ranks=(1 + i,)) for i in range(2)]
    cluster._weights = WeightGroup("tcp://127.0.0.1:1", 3, 5.0)
    learner = ray.remote(concurrency_groups={"liveness": 1})(_Learner).remote()
    cluster.learners = [learner]
    monkeypatch.setattr(cluster, "_new_actor", lambda i: ray.remote(_Joining).remote(
        cluster.incarnations[i], 2 if i == 1 else 0))
    cluster.actors = [cluster._new_actor(i) for i in range(2)]
    try:
        cluster._start_actors()
        cluster._form_weight_group()
        assert cluster.incarnations == [0, 2]  # actor 1 died joining twice, its third joined
        assert ray.get(learner.reform_weight_group.remote(3)) == 3  # two new generations before
    finally:
        for a in [*cluster.actors, learner]:
            ray.kill(a)


@pytest.mark.timeout(180)
def test_a_stop_request_ends_the_warm_start_at_once_and_cancels_its_task(local_ray, tmp_path):
    """Ctrl-C during a warm start that would fine-tune for hours: the driver's wait ends within
    a poll (``ray.get`` alone would hold it until the task ends), and the task is cancelled, its
    CPUs back in the cluster."""
    from launch.run.loop import Interrupted, Stop

    model = build_tiny_model(tmp_path / "model", seed=0)
    cluster = _cluster("warm_start.seeds=64", "warm_start.steps=1000000", "warm_start.threads=1")
    cpus = ray.cluster_resources()["CPU"]
    timer = threading.Timer(4.0, os.kill, (os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    with Stop() as stop:
        timer.start()
        try:
            with pytest.raises(Interrupted, match="the warm start"), stop.interruptible("the warm start"):
                cluster.warm_start(str(model), tmp_path / "out")
        finally:
            timer.cancel()
    assert time.monotonic() - t0 < 20
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < cpus and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("CPU", 0) == cpus
