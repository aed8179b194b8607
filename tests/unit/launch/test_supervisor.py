"""launch/supervisor.py's decisions when an actor or a weight push fails.

The process operations (launch/controller.py: restart_actor, reform_weights, push_weights) are
replaced by recorders and Ray's get/wait by identities, so each failure is injected exactly where
the test wants it. The real operations on real processes are tests/integration/test_actor_restart.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray
import ray.exceptions

from launch import supervisor as sup
from launch.config import ActorsConfig, LearnerConfig, TrainConfig
from launch.controller import Processes, PushError

BATCH, GROUP, ACTORS = 8, 4, 2


class _Remote:
    """A fake remote method: records (name, args) and returns ``result``."""

    def __init__(self, log: list, name: str, result=None) -> None:
        self.log, self.name, self.result = log, name, result

    def remote(self, *args):
        self.log.append((self.name, args))
        return self.result


class _Actor:
    def __init__(self, log: list, name: str) -> None:
        self.name = name
        self.set_episode_budget = _Remote(log, f"{name}.budget")
        self.run = _Remote(log, f"{name}.run", result=f"{name}.run-ref")


@pytest.fixture
def world(monkeypatch):
    """(supervisor, call log, push outcomes to play in order) in async mode after 5 steps."""
    log: list = []
    outcomes: list = []  # each push_weights / reform_weights call pops one: a dict or an exception
    cfg = SimpleNamespace(  # the parts of a RunConfig the supervisor reads
        train=TrainConfig(batch_size=BATCH),
        actors=ActorsConfig(num=ACTORS, group_size=GROUP, run_ahead=1, max_restarts=3),
        learner=LearnerConfig(max_staleness=2))
    procs = Processes(actors=[_Actor(log, f"a{i}.0") for i in range(ACTORS)],
                      restarts=[0] * ACTORS)

    def play(name, version):
        log.append((name, version))
        result = outcomes.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    def restart(p, index, max_restarts, error):
        log.append(("restart", index, type(error).__name__))
        p.restarts[index] += 1
        p.actors[index] = _Actor(log, f"a{index}.{p.restarts[index]}")

    monkeypatch.setattr(sup, "push_weights", lambda p, v: play("push", v))
    monkeypatch.setattr(sup, "reform_weights", lambda p, v: play("reform", v))
    monkeypatch.setattr(sup, "restart_actor", restart)
    monkeypatch.setattr(ray, "get", lambda refs: refs)
    s = sup.Supervisor(cfg, procs)
    s.start_runs(step=5)
    log.clear()
    return s, log, outcomes


def _budget(step: int) -> int:
    return sup.episode_budget(step, batch_size=BATCH, run_ahead=1, max_staleness=2, dropped=0,
                              actors=ACTORS, group_size=GROUP)


def test_a_push_that_succeeds_touches_nothing_else(world):
    s, log, outcomes = world
    outcomes.append({"weights/push_s": 0.1})
    assert s.push(6) == {"weights/push_s": 0.1}
    assert log == [("push", 6)]


def test_a_push_failed_by_a_dead_actor_replaces_it_and_pushes_to_all_again(world):
    s, log, outcomes = world
    outcomes += [PushError(6, {1: ray.exceptions.RayActorError()}, []), {"weights/push_s": 0.2}]
    out = s.push(6)
    assert out["weights/reformed"] == 1.0 and out["weights/push_s"] == 0.2
    # Only actor 1 is restarted; the group is re-formed once, with the same version.
    assert log[:3] == [("push", 6), ("restart", 1, "RayActorError"), ("reform", 6)]
    # The replacement's budget is a fresh run's (it does not make up for its predecessor's
    # episodes) and its run starts; actor 0 keeps its run.
    assert log[3:] == [("a1.1.budget", (_budget(0),)), ("a1.1.run", ())]
    assert s.offsets == [0, _budget(5) - _budget(0)]
    assert s.procs.runs == ["a0.0.run-ref", "a1.1.run-ref"]
    assert s.restarts == 1


def test_a_push_failed_without_a_death_reforms_the_group_and_restarts_no_one(world):
    s, log, outcomes = world
    outcomes += [PushError(6, {0: TimeoutError("gloo timeout")}, []), {"weights/push_s": 0.3}]
    out = s.push(6)
    assert out == {"weights/push_s": 0.3, "weights/reformed": 1.0}
    assert log == [("push", 6), ("reform", 6)]
    assert s.restarts == 0


def test_a_second_failure_in_the_new_generation_ends_the_run(world):
    s, log, outcomes = world
    second = PushError(6, {}, [RuntimeError("learner broadcast failed")])
    outcomes += [PushError(6, {0: TimeoutError("gloo timeout")}, []), second]
    with pytest.raises(PushError) as info:
        s.push(6)
    assert info.value is second
    assert log == [("push", 6), ("reform", 6)]


def test_check_replaces_exactly_the_actors_whose_run_ended(world, monkeypatch):
    s, log, outcomes = world
    ended = s.procs.runs[0]
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns, timeout: ([ended], refs[1:]))

    def get(ref):
        if ref == ended:
            raise RuntimeError("env pool lost")
        return ref

    monkeypatch.setattr(ray, "get", get)
    outcomes.append({"weights/push_s": 0.1})
    s.check(version=6)
    assert log[:2] == [("restart", 0, "RuntimeError"), ("reform", 6)]
    assert s.procs.runs == ["a0.1.run-ref", "a1.0.run-ref"]
    assert s.restarts == 1
