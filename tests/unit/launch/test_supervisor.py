"""launch/run/supervisor.py's decisions when an actor or a weight push fails.

The cluster (launch/topology/protocol.py's ``Cluster``) is replaced by a recorder whose push, reform and run outcomes a
test plays in order, so each failure is injected exactly where the test wants it. The real
operations on real processes are tests/integration/test_actor_restart.py's.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray.exceptions

from launch.config.schema import ActorsConfig, LearnerConfig, TrainConfig
from launch.run import supervisor as sup
from launch.topology.protocol import ActorsFailed, CallTimeout, PushError

BATCH, GROUP, ACTORS = 8, 4, 2


class FakeCluster:
    """The RayCluster calls the supervisor makes; ``outcomes`` feeds push_weights and
    reform_weights and evaluate (a dict, or an exception to raise), ``ended`` what ended_runs
    reports, ``hung`` what hung_actors reports (once)."""

    def __init__(self, log: list, outcomes: list) -> None:
        self.log, self.outcomes = log, outcomes
        self.actors = [f"a{i}.0" for i in range(ACTORS)]
        self.incarnations = [0] * ACTORS
        self.runs: list = []
        self.ended: dict = {}
        self.hung: dict = {}

    def _play(self, name, version):
        self.log.append((name, version))
        result = self.outcomes.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    def push_weights(self, version):
        return self._play("push", version)

    def reform_weights(self, version):
        return self._play("reform", version)

    def restart_actor(self, index, error):
        self.log.append(("restart", index, type(error).__name__))
        self.incarnations[index] += 1
        self.actors[index] = f"a{index}.{self.incarnations[index]}"

    def set_budgets(self, budgets):
        self.log.append(("budgets", tuple(budgets)))

    def start_runs(self, indices=None):
        if not self.runs:
            self.runs = [None] * ACTORS
        for i in range(ACTORS) if indices is None else indices:
            self.runs[i] = f"{self.actors[i]}.run"
            self.log.append(("run", self.actors[i]))

    @property
    def running(self):
        return bool(self.runs)

    def ended_runs(self):
        return self.ended

    def hung_actors(self):
        hung, self.hung = self.hung, {}
        return hung

    def evaluate(self, seeds, pages=0):
        return self._play("evaluate", len(seeds))

    def rollout(self, counts):
        self.log.append(("rollout", dict(counts)))
        failed, self.ended = self.ended, {}
        return failed


@pytest.fixture
def world():
    """(supervisor, call log, outcomes to play in order, cluster) in async mode after 5 steps."""
    log: list = []
    outcomes: list = []
    cfg = SimpleNamespace(  # the parts of a RunConfig the supervisor reads
        train=TrainConfig(batch_size=BATCH),
        actors=ActorsConfig(num=ACTORS, group_size=GROUP, run_ahead=1, max_restarts=3),
        learner=LearnerConfig(max_staleness=2))
    cluster = FakeCluster(log, outcomes)
    s = sup.Supervisor(cfg, cluster)
    s.start_runs(step=0)
    s.set_budgets(5, dropped=0)
    log.clear()
    return s, log, outcomes, cluster


def _budget(step: int) -> int:
    return sup.episode_budget(step, batch_size=BATCH, run_ahead=1, max_staleness=2, dropped=0,
                              actors=ACTORS, group_size=GROUP)


def test_a_push_that_succeeds_touches_nothing_else(world):
    s, log, outcomes, _ = world
    outcomes.append({"weights/push_s": 0.1})
    assert s.push(6) == {"weights/push_s": 0.1}
    assert log == [("push", 6)]


def test_a_push_failed_by_a_dead_actor_replaces_it_and_pushes_to_all_again(world):
    s, log, outcomes, cluster = world
    outcomes += [PushError(6, {1: ray.exceptions.RayActorError()}, [], dead={1}), {"weights/push_s": 0.2}]
    out = s.push(6)
    assert out["weights/reformed"] == 1.0 and out["weights/push_s"] == 0.2
    # Only actor 1 is restarted; the group is re-formed once, with the same version.
    assert log[:3] == [("push", 6), ("restart", 1, "RayActorError"), ("reform", 6)]
    # The replacement's budget is a fresh run's (it does not make up for its predecessor's
    # episodes) and its run starts; actor 0 keeps its budget and its run.
    assert log[3:] == [("budgets", (_budget(5), _budget(0))), ("run", "a1.1")]
    assert s.offsets == [0, _budget(5) - _budget(0)]
    assert cluster.runs == ["a0.0.run", "a1.1.run"]
    assert s.restarts == 1


def test_a_push_failed_without_a_death_reforms_the_group_and_restarts_no_one(world):
    s, log, outcomes, _ = world
    outcomes += [PushError(6, {0: TimeoutError("gloo timeout")}, []), {"weights/push_s": 0.3}]
    out = s.push(6)
    assert out == {"weights/push_s": 0.3, "weights/reformed": 1.0}
    assert log == [("push", 6), ("reform", 6)]
    assert s.restarts == 0


def test_a_second_failure_in_the_new_generation_ends_the_run(world):
    s, log, outcomes, _ = world
    second = PushError(6, {}, [RuntimeError("learner broadcast failed")])
    outcomes += [PushError(6, {0: TimeoutError("gloo timeout")}, []), second]
    with pytest.raises(PushError) as info:
        s.push(6)
    assert info.value is second
    assert log == [("push", 6), ("reform", 6)]


def test_check_replaces_exactly_the_actors_whose_run_ended(world):
    s, log, outcomes, cluster = world
    cluster.ended = {0: RuntimeError("env pool lost")}
    outcomes.append({"weights/push_s": 0.1})
    s.check(version=6)
    assert log[:2] == [("restart", 0, "RuntimeError"), ("reform", 6)]
    assert cluster.runs == ["a0.1.run", "a1.0.run"]
    assert s.restarts == 1


def test_sync_rollout_reruns_only_the_actor_that_failed(world):
    s, log, outcomes, cluster = world
    cluster.runs = []  # sync mode: no background runs
    cluster.ended = {1: RuntimeError("engine dead")}  # the first rollout loses actor 1
    outcomes.append({"weights/push_s": 0.1})
    s.rollout(version=3)
    per_actor = BATCH // ACTORS
    assert log == [("rollout", {0: per_actor, 1: per_actor}), ("restart", 1, "RuntimeError"),
                   ("reform", 3), ("rollout", {1: per_actor})]


def test_check_replaces_a_hung_actor_once_and_counts_it(world):
    s, log, outcomes, cluster = world
    cluster.ended = {0: RuntimeError("env pool lost")}
    # actor 0 is both ended and hung: replaced once; actor 1 is hung only
    cluster.hung = {0: CallTimeout("no answer"), 1: CallTimeout("no answer to liveness")}
    outcomes.append({"weights/push_s": 0.1})
    s.check(version=6)
    assert log[:3] == [("restart", 0, "RuntimeError"), ("restart", 1, "CallTimeout"), ("reform", 6)]
    assert cluster.runs == ["a0.1.run", "a1.1.run"]
    assert s.faults["actors_hung"] == 1 and s.faults["actors_replaced"] == 2 and s.restarts == 2


def test_an_evaluation_failed_by_an_actor_replaces_it_and_runs_again(world):
    s, log, outcomes, cluster = world
    outcomes.append({"weights/push_s": 0.1})
    s.push(6)  # the version a replacement gets
    log.clear()
    outcomes += [ActorsFailed("evaluation", {1: CallTimeout("no answer to evaluate")}),
                 {"weights/push_s": 0.1}, {"success": 0.5}]
    assert s.evaluate([1, 2, 3]) == {"success": 0.5}
    assert log[:3] == [("evaluate", 3), ("restart", 1, "CallTimeout"), ("reform", 6)]
    assert log[-1] == ("evaluate", 3)


def test_the_episode_ledger_sums_live_and_retired_incarnations_by_hand():
    live = {"episodes_started": 40, "episodes_done": 30, "episodes_failed": 4, "episodes_cancelled": 2,
            "episodes_sent": 27, "episodes_unsent": 1, "episodes_held": 2, "failed/worker_crashed": 3,
            "failed/env_timeout": 1}
    # the dead incarnation as last read: 20 started, 2 failed, 15 sent -> 3 lost
    dead = {"episodes_started": 20, "episodes_done": 16, "episodes_failed": 2, "episodes_cancelled": 0,
            "episodes_sent": 15, "failed/worker_crashed": 2}
    # an actor that no longer answers (not replaced yet): its last reading, all in flight lost
    silent = {**dict.fromkeys(("episodes_done", "episodes_failed", "episodes_cancelled"), 0),
              "episodes_started": 8, "episodes_sent": 0, "unanswered": "CallTimeout: ..."}
    got = sup.episode_ledger([live, silent], [dead])
    assert got == {"episodes/started": 68.0, "episodes/done": 45.0, "episodes/failed": 6.0,
                   "episodes/cancelled": 2.0, "episodes/in_flight": 4.0, "episodes/sent": 42.0,
                   "episodes/unsent": 1.0, "episodes/held": 2.0, "episodes/lost": 11.0,
                   "failed/worker_crashed": 5.0, "failed/env_timeout": 1.0}
    # the identity: every episode started is in exactly one place
    assert got["episodes/started"] == sum(got[f"episodes/{k}"] for k in
                                          ("sent", "unsent", "held", "failed", "cancelled", "in_flight", "lost"))


def test_a_replaced_actor_is_retired_with_its_last_reading(world):
    s, log, outcomes, cluster = world
    readings = [{"episodes_started": 8, "episodes_sent": 6, "episodes_done": 6},
                {"episodes_started": 4, "episodes_sent": 1, "episodes_done": 1}]
    cluster.actor_stats = lambda: [dict(r) for r in readings]
    assert s.ledger()["episodes/lost"] == 0
    cluster.ended = {1: RuntimeError("gone")}
    outcomes.append({"weights/push_s": 0.1})
    s.check(version=6)
    readings[1] = {"episodes_started": 0}  # the new incarnation
    ledger = s.ledger()
    assert ledger["episodes/lost"] == 3 and ledger["episodes/started"] == 12
    assert ledger["faults/actors_replaced"] == 1 and ledger["faults/actors_hung"] == 0


def test_a_resumed_run_budgets_its_fresh_actors_as_a_fresh_run_and_continues_the_ledger():
    """At a resume the actors count from zero: their budgets at step N are a fresh run's plus
    what the learner takes from then on (the checkpoint's drops already replaced), so they run
    ahead of the learner exactly as before, not by N batches more; the ledger carries on."""
    log: list = []
    cfg = SimpleNamespace(train=TrainConfig(batch_size=BATCH),
                          actors=ActorsConfig(num=ACTORS, group_size=GROUP, run_ahead=1, max_restarts=3),
                          learner=LearnerConfig(max_staleness=2))
    s = sup.Supervisor(cfg, FakeCluster(log, []))
    s.carry({"retired": [{"episodes_started": 50, "episodes_sent": 48, "episodes_failed": 2}],
             "faults": {"actors_replaced": 1}})
    s.start_runs(step=20, dropped=12)
    assert log[0] == ("budgets", (_budget(0),) * ACTORS)
    s.set_budgets(21, dropped=12 + 4)  # one more batch taken, four more dropped
    fresh_next = sup.episode_budget(1, batch_size=BATCH, run_ahead=1, max_staleness=2, dropped=4,
                                    actors=ACTORS, group_size=GROUP)
    (tag, budgets) = log[-1]
    assert tag == "budgets" and all(fresh_next - GROUP <= b <= fresh_next for b in budgets)  # whole groups
    s.cluster.actor_stats = lambda: [{"episodes_started": 0}] * ACTORS
    ledger = s.ledger()
    assert ledger["episodes/started"] == 50 and ledger["faults/actors_replaced"] == 1
    assert ledger["episodes/lost"] == 0  # the checkpoint's incarnation had sent or failed them all
