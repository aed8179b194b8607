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

    def evaluate(self, seeds, pages=0, samples=0, blind=False):
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


def test_an_actor_dying_while_the_group_re_forms_is_replaced_too_and_the_group_formed_again(world):
    """Actor 1 failed; while the group re-forms actor 0 dies (joining or during the push): it
    is retired and replaced as well, and the new group gets both new incarnations' runs."""
    s, log, outcomes, cluster = world
    cluster.actor_stats = lambda: [{"actor_id": i, "incarnation": cluster.incarnations[i],
                                    "episodes_started": 4, "episodes_sent": 4, "episodes_done": 4}
                                   for i in range(ACTORS)]
    s.ledger({"0/0": 4, "1/0": 4})
    cluster.ended = {1: RuntimeError("gone")}
    outcomes += [PushError(6, {0: ray.exceptions.RayActorError()}, [], {0},
                           what="joining the weight group for the push"), {"weights/push_s": 0.1}]
    s.check(version=6)
    assert log[:4] == [("restart", 1, "RuntimeError"), ("reform", 6), ("restart", 0, "RayActorError"),
                       ("reform", 6)]
    assert cluster.runs == ["a0.1.run", "a1.1.run"]
    assert s.faults["actors_replaced"] == 2 and s.faults["weight_group_reformed"] == 1
    assert [(r["actor_id"], r["incarnation"]) for r in s.retired] == [(1, 0), (0, 0)]
    # a failure that names no dead actor still ends the run
    cluster.ended = {0: RuntimeError("gone again")}
    outcomes.append(PushError(6, {1: RuntimeError("bad tensor")}, [], set()))
    with pytest.raises(PushError, match=r"push of version 6 failed: actor 1: RuntimeError: bad tensor"):
        s.check(version=6)


def test_a_replacement_that_fails_to_start_is_replaced_in_turn(world):
    s, log, outcomes, cluster = world
    cluster.runs = []
    starts = [ActorsFailed("start", {1: CallTimeout("no answer to start")})]
    restart = cluster.restart_actor

    def restart_once_failing(index, error):
        restart(index, error)
        if starts:
            raise starts.pop()
    cluster.restart_actor = restart_once_failing
    cluster.ended = {1: RuntimeError("engine dead")}
    outcomes.append({"weights/push_s": 0.1})
    s.rollout(version=3)
    assert [e for e in log if e[0] == "restart"] == [("restart", 1, "RuntimeError"), ("restart", 1, "CallTimeout")]
    assert s.faults["actors_replaced"] == 2 and len(s.retired) == 2


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
    live = {"actor_id": 0, "incarnation": 0, "episodes_started": 40, "episodes_done": 30,
            "episodes_failed": 4, "episodes_cancelled": 2, "episodes_sent": 27, "episodes_unsent": 1,
            "episodes_held": 2, "failed/worker_crashed": 3, "failed/env_timeout": 1}
    # the dead incarnation as last read: 20 started, 2 failed, 15 sent; the learner got 17 from
    # it (two sent after that reading): 17 done, 1 lost
    dead = {"actor_id": 1, "incarnation": 0, "episodes_started": 20, "episodes_done": 16,
            "episodes_failed": 2, "episodes_cancelled": 0, "episodes_sent": 15, "failed/worker_crashed": 2}
    # one that no longer answers (not replaced yet): its last reading; the learner got 1 from it
    silent = {**dict.fromkeys(("episodes_done", "episodes_failed", "episodes_cancelled"), 0),
              "actor_id": 1, "incarnation": 1, "episodes_started": 8, "episodes_sent": 0,
              "unanswered": "CallTimeout: ..."}
    # a checkpoint's incarnation, settled at the resume with what the learner then had from it:
    # more than its reading said it had started (it kept going between the two reads)
    settled = {"actor_id": 0, "incarnation": 0, "episodes_started": 10, "episodes_failed": 1,
               "episodes_cancelled": 0, "episodes_sent": 8, "received": 10}
    received = {"0/0": 25, "1/0": 17, "1/1": 1}
    got = sup.episode_ledger([live, silent], [dead, settled], received)
    assert got == {"episodes/started": 79.0, "episodes/done": 58.0, "episodes/failed": 7.0,
                   "episodes/cancelled": 2.0, "episodes/in_flight": 4.0, "episodes/sent": 55.0,
                   "episodes/unsent": 1.0, "episodes/held": 2.0, "episodes/lost": 8.0,
                   "episodes/in_transit": 2.0, "failed/worker_crashed": 5.0, "failed/env_timeout": 1.0}
    # the identities: every episode started is in exactly one place; every one sent arrived or
    # is in transit
    assert got["episodes/started"] == sum(got[f"episodes/{k}"] for k in
                                          ("sent", "unsent", "held", "failed", "cancelled", "in_flight", "lost"))
    assert got["episodes/sent"] == sum(received.values()) + 10 + got["episodes/in_transit"]


def test_a_replaced_actor_is_retired_with_its_last_reading(world):
    s, log, outcomes, cluster = world
    readings = [{"actor_id": 0, "incarnation": 0, "episodes_started": 8, "episodes_sent": 6, "episodes_done": 6},
                {"actor_id": 1, "incarnation": 0, "episodes_started": 4, "episodes_sent": 1, "episodes_done": 1}]
    cluster.actor_stats = lambda: [dict(r) for r in readings]
    received = {"0/0": 6, "1/0": 1}
    assert s.ledger(received)["episodes/lost"] == 0
    cluster.ended = {1: RuntimeError("gone")}
    outcomes.append({"weights/push_s": 0.1})
    s.check(version=6)
    readings[1] = {"actor_id": 1, "incarnation": 1, "episodes_started": 0}  # the new incarnation
    ledger = s.ledger(received)
    assert ledger["episodes/lost"] == 3 and ledger["episodes/started"] == 12
    assert ledger["faults/actors_replaced"] == 1 and ledger["faults/actors_hung"] == 0
    received["1/0"] = 2  # one more of the dead one's arrived: done, not lost
    ledger = s.ledger(received)
    assert ledger["episodes/lost"] == 2 and ledger["episodes/sent"] == 8 and ledger["episodes/in_transit"] == 0


def test_a_resumed_run_budgets_its_fresh_actors_as_a_fresh_run_and_continues_the_ledger():
    """At a resume the actors count from zero: their budgets at step N are a fresh run's plus
    what the learner takes from then on (the checkpoint's drops already replaced), so they run
    ahead of the learner exactly as before, not by N batches more; the ledger carries on."""
    log: list = []
    cfg = SimpleNamespace(train=TrainConfig(batch_size=BATCH),
                          actors=ActorsConfig(num=ACTORS, group_size=GROUP, run_ahead=1, max_restarts=3),
                          learner=LearnerConfig(max_staleness=2))
    s = sup.Supervisor(cfg, FakeCluster(log, []))
    s.carry({"retired": [{"actor_id": 0, "incarnation": 0, "episodes_started": 50, "episodes_sent": 48,
                          "episodes_failed": 2}], "faults": {"actors_replaced": 1}}, {"0/0": 48})
    s.start_runs(step=20, dropped=12)
    assert log[0] == ("budgets", (_budget(0),) * ACTORS)
    s.set_budgets(21, dropped=12 + 4)  # one more batch taken, four more dropped
    fresh_next = sup.episode_budget(1, batch_size=BATCH, run_ahead=1, max_staleness=2, dropped=4,
                                    actors=ACTORS, group_size=GROUP)
    (tag, budgets) = log[-1]
    assert tag == "budgets" and all(fresh_next - GROUP <= b <= fresh_next for b in budgets)  # whole groups
    s.cluster.actor_stats = lambda: [{"actor_id": i, "incarnation": 0, "episodes_started": 0}
                                     for i in range(ACTORS)]
    # the resumed actor 0 is incarnation 0 again: what the learner gets from it now is its own
    ledger = s.ledger({"0/0": 0})
    assert ledger["episodes/started"] == 50 and ledger["faults/actors_replaced"] == 1
    assert ledger["episodes/lost"] == 0  # the checkpoint's incarnation had sent or failed them all
    assert ledger["episodes/sent"] == 48 and ledger["episodes/in_transit"] == 0
