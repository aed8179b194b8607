"""The real loop on a Ray cluster of two nodes simulated on this machine (``ray.cluster_utils``:
two raylets, each with its own resources): the learner takes one node, the actor the other, so
every address the actor uses (the trajectory stream, the weight store) is one learner rank 0
chose and advertised on its node, not one the driver assumed; and the stream, on the network now,
takes only the keys the driver made for the run (transport.curve=auto)."""

from __future__ import annotations

import pytest

from launch.config.compose import compose
from launch.run.loop import train


def test_the_loop_runs_with_the_learner_and_the_actor_on_different_nodes(tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        summary = train(compose([
            "env=action_words", "algorithm=grpo", "warm_start.enabled=false", "train.steps=2",
            "train.batch_size=8", "train.eval_every=0", "train.eval_seeds=4",
            "train.save_samples=0", "learner.ranks=1", "learner.cpus=1", "actors.num=1",
            "actors.cpus=1", "actors.concurrency=8", "actors.group_size=4", "actors.max_tokens=8",
            "actors.envs_per_worker=8", "logger.wandb=false", f"ray.address={cluster.address}",
        ]), tmp_path)
    finally:
        ray.shutdown()
        cluster.shutdown()
    # joined a cluster: the stream required the run's CurveZMQ keys, and the actor had them
    assert summary["stream_curve"] is True
    nodes = summary["nodes"]
    assert set(nodes) == {"learner-0", "actor-0"} and nodes["learner-0"] != nodes["actor-0"]
    (actor,) = summary["actors"]
    assert actor["version"] == 2 and actor["weight_updates"] == 2  # weights crossed the nodes
    ((_, acc),) = summary["accounting"].items()  # and every trajectory sent arrived
    assert acc["received"] == actor["episodes_sent"] and acc["taken"] == 2 * 8


pytestmark = pytest.mark.timeout(600)
