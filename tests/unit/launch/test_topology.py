"""launch/topology/: both topologies offer every operation of ``Cluster`` with its parameters,
the factory picks the configured one, the loop calls only the learner half, and the helpers both
share compute what they promise."""

import ast
import inspect
from pathlib import Path
from typing import Protocol

import pytest

from launch.config.compose import compose
from launch.run import loop, supervisor
from launch.topology.combine import combine_evaluations, eval_shares, push_timings
from launch.topology.factory import make_cluster
from launch.topology.local_cluster import LocalCluster
from launch.topology.protocol import Actors, Cluster, Learners, PushError
from launch.topology.ray_cluster import RayCluster


def _members(proto: type) -> dict[str, object]:
    """A Protocol's operations and attributes, its bases' included, by name."""
    out: dict[str, object] = {}
    for cls in reversed(proto.__mro__):
        if cls in (object, Protocol) or not getattr(cls, "_is_protocol", False):
            continue
        out.update({k: None for k in getattr(cls, "__annotations__", {})})
        out.update({k: v for k, v in vars(cls).items() if not k.startswith("_")})
    return out


def _attributes(module) -> set[tuple[str, str]]:
    """Every ``<object>.<attribute>`` in a module's source, as (object's text, attribute)."""
    tree = ast.parse(Path(module.__file__).read_text())
    return {(ast.unparse(n.value), n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def test_the_cluster_is_its_two_halves():
    assert _members(Cluster).keys() == _members(Learners).keys() | _members(Actors).keys()
    assert not _members(Learners).keys() & _members(Actors).keys()


def test_the_loop_makes_no_call_on_the_actors():
    """One owner of the actors' lifecycle: the loop calls the learner half of the cluster and
    reaches the actors only through the supervisor."""
    used = _attributes(loop)
    actor_ops = _members(Actors).keys()
    assert not {(o, a) for o, a in used if a in actor_ops and o != "supervisor"}
    assert not {o for o, a in used if a == "cluster"}  # the loop never holds the whole cluster
    on_learners = {a for o, a in used if o in ("learners", "supervisor.learners")}
    assert on_learners and on_learners <= _members(Learners).keys()


def test_the_supervisor_uses_only_what_the_protocol_offers():
    used = {a for o, a in _attributes(supervisor) if o == "self.cluster"}
    assert used and used <= _members(Cluster).keys()


@pytest.mark.parametrize("impl", [RayCluster, LocalCluster])
def test_each_topology_has_every_operation_with_its_parameters(impl):
    for name, member in _members(Cluster).items():
        if not callable(member) or isinstance(member, property):
            assert hasattr(impl(compose(["topology=local"])), name), (impl.__name__, name)
            continue
        want = list(inspect.signature(member).parameters)
        have = list(inspect.signature(getattr(impl, name)).parameters)
        assert have == want, (impl.__name__, name)
    made = impl(compose(["topology=local"]))  # nothing starts before connect / start
    assert made.actors == [] and made.incarnations == [] and made.running is False


def test_the_factory_builds_the_configured_topology():
    assert type(make_cluster(compose([]))) is RayCluster
    assert type(make_cluster(compose(["topology=local"]))) is LocalCluster


def test_the_recorded_episodes_are_those_of_the_first_seeds():
    seeds = [10, 11, 12, 13, 14, 15, 16]
    assert eval_shares(seeds, 3, 4) == [([10, 13, 16], 2), ([11, 14], 1), ([12, 15], 1)]
    assert eval_shares(seeds, 2, 0) == [([10, 12, 14, 16], 0), ([11, 13, 15], 0)]
    assert eval_shares(seeds[:2], 3, 5) == [([10], 1), ([11], 1), ([], 0)]
    def ep(seed):
        return {"seed": seed, "turns": []}

    def out(seed, sample=-1):
        return {"seed": seed, "sample": sample, "success": 1.0}

    parts = [{"outcomes": [out(10), out(13), out(10, 0), out(13, 0)], "episodes": [ep(10), ep(13)]},
             {"outcomes": [out(11), out(11, 0)], "episodes": [ep(11)]}, {"outcomes": []}]
    # every actor's outcomes, greedy first, each by seed: the same whatever the split
    assert combine_evaluations(parts) == {
        "outcomes": [out(10), out(11), out(13), out(10, 0), out(11, 0), out(13, 0)],
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
    assert "actor 0: " in str(error) and "actor 2: " in str(error)
