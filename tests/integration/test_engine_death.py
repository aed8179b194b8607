"""A dead vLLM engine core inside a living actor: a weight update or a group join on it ends
with ``EngineDead`` within seconds (the supervisor then replaces the actor) instead of waiting
forever on the dead process; and the Ray topology counts that actor as dead.

A real AsyncLLM on the tiny model; its engine core process is killed with SIGKILL."""

import os
import signal
import time

import psutil
import pytest
import ray.exceptions

from actors.weight_updates import EngineDead, WeightUpdateError
from launch.model.tiny_model import build_tiny_model
from launch.topology.ray_cluster import is_dead
from tests.integration.test_actor import started_actor


def _engine_cores() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True)
            if "EngineCore" in " ".join([p.name(), *p.cmdline()])]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("engine_death") / "model", seed=0)


def test_an_update_and_a_join_on_a_dead_engine_raise_engine_dead_within_seconds(model):
    config = {"engine": "async", "actor_id": 1, "run_id": "test", "model_path": str(model),
              "env_name": "frozenlake", "env_pool": {"env_workers": 1, "envs_per_worker": 2},
              "concurrency": 2, "max_tokens": 16, "max_context": 1024, "kv_cache_bytes": 32 << 20}
    with started_actor(config) as (loop, actor, _):
        cores = _engine_cores()
        assert len(cores) == 1, [p.name() for p in cores]
        os.kill(cores[0].pid, signal.SIGKILL)
        cores[0].wait(10)
        t0 = time.monotonic()
        with pytest.raises(EngineDead):
            loop.run_until_complete(actor.update_weights(1))
        with pytest.raises(EngineDead):
            loop.run_until_complete(actor.join_weight_group("tcp://127.0.0.1:1", 1, 2, 5.0))
        assert time.monotonic() - t0 < 10
        assert (loop.run_until_complete(actor.stats()))["weight_update_failures"] == 1
        # what the supervisor's liveness check reads (launch/topology/ray_cluster.py's hung_actors)
        assert loop.run_until_complete(actor.liveness())["engine_dead"] is True


def test_the_ray_topology_replaces_an_actor_whose_engine_died_and_rejoins_one_that_failed():
    assert is_dead(EngineDead("x")) and is_dead(ray.exceptions.RayActorError())
    assert not is_dead(WeightUpdateError("a receive failed; the engine lives"))
