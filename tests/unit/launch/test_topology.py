"""launch/topology.py: both topologies offer every operation of ``Cluster`` with its parameters,
the factory picks the configured one, and the helpers both share compute what they promise."""

import inspect

import pytest

from launch.cluster import RayCluster
from launch.local import LocalCluster
from launch.topology import (Cluster, PushError, combine_evaluations, eval_shares, make_cluster,
                             push_timings, weighted_means)
from launch.train import compose


@pytest.mark.parametrize("impl", [RayCluster, LocalCluster])
def test_each_topology_has_every_operation_with_its_parameters(impl):
    for name, member in vars(Cluster).items():
        if name.startswith("_") or not callable(member):
            continue
        want = list(inspect.signature(member).parameters)
        have = list(inspect.signature(getattr(impl, name)).parameters)
        assert have == want, (impl.__name__, name)
    made = impl(compose(["topology=local"]))  # nothing starts before connect / start
    assert made.actors == [] and made.incarnations == [] and made.running is False


def test_the_factory_builds_the_configured_topology():
    assert type(make_cluster(compose([]))) is RayCluster
    assert type(make_cluster(compose(["topology=local"]))) is LocalCluster


def test_evaluations_are_weighted_by_episodes():
    parts = [{"success": 1.0, "turns": 2.0, "n": 3}, {"success": 0.0, "turns": 4.0, "n": 1},
             {"success": 0.5, "n": 0}]  # an actor that finished no episode has no weight
    assert weighted_means(parts) == {"success": 0.75, "turns": 2.5, "n": 4.0}


def test_the_recorded_episodes_are_those_of_the_first_seeds():
    seeds = [10, 11, 12, 13, 14, 15, 16]
    assert eval_shares(seeds, 3, 4) == [([10, 13, 16], 2), ([11, 14], 1), ([12, 15], 1)]
    assert eval_shares(seeds, 2, 0) == [([10, 12, 14, 16], 0), ([11, 13, 15], 0)]
    assert eval_shares(seeds[:2], 3, 5) == [([10], 1), ([11], 1), ([], 0)]
    def ep(seed):
        return {"seed": seed, "turns": []}

    parts = [{"success": 1.0, "n": 2, "episodes": [ep(10), ep(13)]},
             {"success": 0.0, "n": 2, "episodes": [ep(11)]}, {"success": 0.0, "n": 0}]
    assert weighted_means(parts) == {"success": 0.5, "n": 4.0}  # the episodes are no metric
    assert combine_evaluations(parts) == {"success": 0.5, "n": 4.0,
                                          "episodes": [ep(10), ep(11), ep(13)]}
    assert "episodes" not in combine_evaluations(parts[2:])


def test_push_timings_take_the_slowest_actor():
    out = push_timings({"weights/publish_s": 0.1}, [{"pause_s": 0.2, "total_s": 0.5},
                                                   {"pause_s": 0.4, "total_s": 0.3}], lambda: 0.9)
    assert out == {"weights/publish_s": 0.1, "weights/push_s": 0.9, "weights/actor_pause_s": 0.4,
                   "weights/actor_receive_s": 0.0, "weights/actor_total_s": 0.5}


def test_a_push_error_names_only_the_dead_actors_as_dead():
    gone, late = RuntimeError("gone"), TimeoutError("late")
    error = PushError(3, {0: gone, 2: late}, [], dead={0})
    assert error.dead_actors == {0: gone} and error.errors == {0: gone, 2: late}
    assert "actors [0, 2]" in str(error)
