"""launch/topology/placement.py: a pure, tested placement of learner ranks, actors and env workers."""

import random

import pytest

from launch.topology.placement import Node, PlacementError, Roles, place


def test_single_cpu_machine_default_job():
    p = place([Node("local", "127.0.0.1", cpus=2.5)],
              Roles(learner_ranks=2, learner_cpus=0.5, actors=2, actor_cpus=0.5, env_workers=1))
    assert [s.role for s in p.slots] == ["learner", "learner", "actor", "actor", "env_worker"]
    assert [s.weight_ranks for s in p.of("actor")] == [(1,), (2,)]
    assert p.weight_world_size == 3 and p.learner_address == "127.0.0.1"
    assert p.free["local"] == (0.0, 0)
    assert len(set(p.ports.values())) == 3


def test_gpu_cluster_packs_the_learner_and_spreads_actors():
    nodes = [Node("a", "10.0.0.1", 32, 8), Node("b", "10.0.0.2", 32, 8), Node("c", "10.0.0.3", 32, 4)]
    p = place(nodes, Roles(learner_ranks=8, learner_gpus=1, actors=4, engine_gpus=2,
                           engine_workers=2, env_workers=6))
    assert {s.node for s in p.of("learner")} == {"a"}
    # Round-robin from actor i's own turn, skipping nodes without room (a has no GPU left).
    assert [s.node for s in p.of("actor")] == ["b", "b", "c", "b"]
    assert [s.weight_ranks for s in p.of("actor")] == [(1, 2), (3, 4), (5, 6), (7, 8)]
    assert p.weight_world_size == 9 and p.learner_address == "10.0.0.1"


def test_infeasible_requests_say_why():
    with pytest.raises(PlacementError, match="asks for 2 GPUs"):  # more than the cluster has
        place([Node("n", "h", cpus=2, gpus=1)], Roles(actors=2, engine_gpus=1))
    with pytest.raises(PlacementError, match="asks for 1 GPUs"):
        place([Node("n", "h", cpus=8)], Roles(learner_gpus=1))
    two = [Node("a", "h", cpus=4, gpus=1), Node("b", "h2", cpus=4, gpus=1)]
    with pytest.raises(PlacementError, match="no node has room for actor 0"):  # enough, but split
        place(two, Roles(actors=1, engine_gpus=2))
    with pytest.raises(PlacementError, match="no node has room for learner rank 0"):
        place(two, Roles(learner_gpus=2, actors=1))
    with pytest.raises(PlacementError):
        place([], Roles())
    with pytest.raises(ValueError):
        Roles(actors=0)


def test_random_clusters_never_overcommit():
    rng = random.Random(0)
    for _ in range(300):
        nodes = [Node(f"n{i}", f"h{i}", rng.choice([2, 4, 16]), rng.choice([0, 0, 1, 8]))
                 for i in range(rng.randint(1, 4))]
        roles = Roles(learner_ranks=rng.randint(1, 4), learner_gpus=rng.choice([0, 1]),
                      actors=rng.randint(1, 6), engine_workers=rng.randint(1, 2),
                      engine_gpus=rng.choice([0, 1]), env_workers=rng.randint(0, 8))
        try:
            p = place(nodes, roles)
        except PlacementError:
            continue
        for node in nodes:
            used = [s for s in p.slots if s.node == node.name]
            assert sum(s.cpus for s in used) <= node.cpus + 1e-9
            assert sum(s.gpus for s in used) <= node.gpus
        ranks = [r for s in p.of("actor") for r in s.weight_ranks]
        assert ranks == list(range(1, p.weight_world_size))


def test_bind_cores_gives_the_default_job_a_core_each():
    nodes, roles = [Node("local", "127.0.0.1", cpus=2)], Roles(env_workers=0)
    p = place(nodes, roles, bind_cores=True)
    assert p.of("learner")[0].cores == (1,) and p.of("actor")[0].cores == (0,)
    assert all(s.cores == () for s in place(nodes, roles).slots)  # off by default


def test_bind_cores_counts_cpus_and_skips_nodes_that_do_not_go_round():
    p = place([Node("n", "h", cpus=10)],
              Roles(learner_ranks=2, learner_cpus=2, actors=3, actor_cpus=1.5, env_workers=0),
              bind_cores=True)
    assert [s.cores for s in p.of("learner")] == [(8, 9), (6, 7)]
    assert [s.cores for s in p.of("actor")] == [(0, 1), (2, 3), (4, 5)]
    p = place([Node("n", "h", cpus=9)],
              Roles(learner_ranks=2, learner_cpus=2, actors=3, actor_cpus=1.5, env_workers=0),
              bind_cores=True)
    # 2 + 2 + 3 x 2 = 10 cores wanted on 9: the node is left to the operating system.
    assert all(s.cores == () for s in p.slots)
    p = place([Node("n", "h", cpus=4)],
              Roles(learner_cpus=2, actors=2, actor_cpus=0.5, env_workers=0), bind_cores=True)
    assert p.of("learner")[0].cores == (2, 3)
    assert [s.cores for s in p.of("actor")] == [(0,), (1,)]


def test_bind_cores_leaves_gpu_processes_alone():
    p = place([Node("g", "h", cpus=16, gpus=2)],
              Roles(learner_gpus=1, actors=1, engine_gpus=1), bind_cores=True)
    assert all(s.cores == () for s in p.slots)


def test_bound_cores_never_overlap_on_random_clusters():
    rng = random.Random(1)
    bound = 0
    for _ in range(300):
        nodes = [Node(f"n{i}", f"h{i}", rng.choice([2, 4, 16]), rng.choice([0, 0, 1]))
                 for i in range(rng.randint(1, 3))]
        roles = Roles(learner_ranks=rng.randint(1, 3), learner_cpus=rng.choice([0.5, 1, 2]),
                      learner_gpus=rng.choice([0, 0, 1]), actors=rng.randint(1, 5),
                      actor_cpus=rng.choice([0.5, 1, 1.5]), engine_gpus=rng.choice([0, 0, 1]))
        try:
            p = place(nodes, roles, bind_cores=True)
        except PlacementError:
            continue
        for node in nodes:
            cores = [c for s in p.slots if s.node == node.name for c in s.cores]
            assert len(cores) == len(set(cores)) and all(0 <= c < node.cpus for c in cores)
        for s in p.slots:
            if s.cores:
                bound += 1
                assert not s.gpus and len(s.cores) == max(1, -(-s.cpus // 1))
    assert bound > 50


def test_a_run_larger_than_the_cluster_says_what_it_asks_for():
    roles = Roles(learner_ranks=4, learner_gpus=1, actors=4, engine_gpus=1, env_workers=2,
                  env_worker_cpus=0.5)
    with pytest.raises(PlacementError, match=r"asks for 8 GPUs \(4 learner ranks x 1 \+ 4 actors "
                                             r"x 1\) and 9 CPUs .* has 4 GPUs and 16 CPUs on 1 node"):
        place([Node("a", "h", cpus=16, gpus=4)], roles)


def test_a_gpu_preset_on_a_cpu_machine_fails_before_anything_starts():
    from launch.config.compose import compose
    from launch.topology.ray_cluster import RayCluster

    roles = RayCluster(compose(["experiment=vagen_full_sokoban_3b"]))._roles()
    with pytest.raises(PlacementError, match="asks for 8 GPUs"):
        place([Node("local", "127.0.0.1", cpus=2)], roles)
