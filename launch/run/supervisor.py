"""The one owner of a run's actors: starts and stops the processes, keeps the actors going
(episode budgets, crash detection and restart, weight pushes that survive a dead actor,
sync-mode rollouts) and evaluates through them.

Called by launch/run/loop.py, which makes no call on the actors itself (``Supervisor.learners``
is the half of the cluster it may call: launch/topology/protocol.py's ``Learners``). Policy
only: how each operation is done on the processes is the topology's (launch/topology/).

Invariants:
- a failed actor (its process died, its ``run`` raised, it is hung, or it failed an evaluation)
  is replaced by its next incarnation on the same placement slot, at most
  ``actors.max_restarts`` times per actor; past that the run fails with the actor's error. Its
  episodes in flight are lost; those it sent are kept; an evaluation it failed runs again;
- after a replacement the weight group is re-formed with every actor and the learner's current
  weights are pushed to all before the new actor plays a training episode, so a restarted actor
  never sends trajectories sampled with the model path's weights;
- a replacement's episode budget starts where a fresh run's does (its counters start at zero): it
  does not race ahead to make up for its predecessor's episodes;
- a weight push that fails is retried once in a new generation of the group (with the dead actors
  replaced); a second failure ends the run.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from launch.config.schema import RunConfig
from launch.topology.protocol import ActorsFailed, Cluster, Learners, PushError

log = logging.getLogger(__name__)

FAULTS = ("actors_replaced", "actors_hung", "weight_group_reformed", "evaluations_rerun")
"""The fault events the supervisor counts (``faults/<name>`` in every step's metrics)."""


class Supervisor:
    def __init__(self, cfg: RunConfig, cluster: Cluster) -> None:
        self.cfg, self.cluster = cfg, cluster
        self.budget = 0
        """The last episode budget of an actor that never restarted."""
        self.offsets = [0] * len(cluster.actors)
        """Per actor: what its budget is lowered by (the budget when it was replaced)."""
        self.version = 0
        """The policy version last pushed to the actors (what a replacement gets)."""
        self.readings: list[dict[str, Any]] = []
        """Per actor: its counters as last read (``ledger``), what a replaced one is retired with."""
        self.retired: list[dict[str, Any]] = []
        """The last readings of the replaced incarnations."""
        self.faults: Counter[str] = Counter(dict.fromkeys(FAULTS, 0))
        """Fault events so far, as ``faults/<name>`` in the ledger."""

    @property
    def learners(self) -> Learners:
        """The cluster's learner half: what the loop calls directly."""
        return self.cluster

    # --- the processes ------------------------------------------------------------------------
    def start(self, model_path: str, log_dir: Path | None = None,
              streams: list[dict[str, int]] | None = None) -> None:
        """Start the learner ranks and the actors from ``model_path`` (``streams``: a resumed
        run's seed streams per actor)."""
        self.cluster.start(model_path, log_dir=log_dir, streams=streams)
        self.offsets = [0] * len(self.cluster.actors)

    def shutdown(self) -> None:
        """Stop every process the cluster started (also after a failed ``start``)."""
        self.cluster.shutdown()

    @property
    def restarts(self) -> int:
        return sum(self.cluster.incarnations)

    @property
    def incarnations(self) -> list[int]:
        """Per actor: times it was restarted."""
        return list(self.cluster.incarnations)

    def actor_stats(self) -> list[dict[str, Any]]:
        """Each actor's counters (episodes, failures, its seed stream's position)."""
        return self.cluster.actor_stats()

    def actor_streams(self) -> list[dict[str, int]]:
        """Per actor: where its seed stream is (``incarnation``, ``groups_drawn``), for a
        checkpoint from which a resumed run continues it."""
        return [{"incarnation": int(s["incarnation"]), "groups_drawn": int(s["groups_drawn"])}
                for s in self.cluster.actor_stats()]

    def ledger_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the ledger: every incarnation's last reading (a resumed
        run's actors are new incarnations), read now, and the fault counts."""
        self.readings = self.cluster.actor_stats()
        return {"retired": [*self.retired, *self.readings], "faults": dict(self.faults)}

    def carry(self, saved: dict[str, Any], received: Mapping[str, int]) -> None:
        """Continue the ledger of a checkpoint's ``ledger_state``, with what the learner had
        received from each incarnation when it was written (its buffer counters'
        ``received_by_origin``): every incarnation of the checkpoint is retired with its count."""
        self.retired = [r if "received" in r else {**r, "received": received.get(origin(r), 0)}
                        for r in saved.get("retired", [])]
        self.faults.update(saved.get("faults", {}))

    def ledger(self, received: Mapping[str, int]) -> dict[str, float]:
        """Where every training episode went, from the actors' counters read now (a replaced
        incarnation's as last read) and what the learner ``received`` from each incarnation
        (read before them): ``episodes/*`` (see ``episode_ledger``), ``failed/<reason>``, and
        ``faults/*`` (the events counted here, and the env services the actors find down)."""
        self.readings = self.cluster.actor_stats()
        out = episode_ledger(self.readings, self.retired, received)
        out.update({f"faults/{k}": float(v) for k, v in self.faults.items()})
        out["faults/env_services_down"] = float(sum(r.get("env_services_down", 0) for r in self.readings))
        return out

    def evaluate(self, seeds: list[int], pages: int = 0, samples: int = 0,
                 blind: bool = False) -> dict[str, Any]:
        """A greedy and ``samples`` sampled episodes on each of ``seeds`` across the actors (the
        topology's ``evaluate``; ``blind``: the model sees every picture white). Actors that
        fail during it are replaced and the evaluation runs again (each episode seeded: the
        same episodes), within the actors' restart limit."""
        while True:
            try:
                return self.cluster.evaluate(seeds, pages, samples, blind)
            except ActorsFailed as e:
                log.warning("%s: replacing them and evaluating again", e)
                self.faults["evaluations_rerun"] += 1
                self._replace(e.errors, self.version)

    # --- async mode ---------------------------------------------------------------------------
    def start_runs(self, step: int, *, dropped: int = 0) -> None:
        """Budgets for ``step`` batches taken (and ``dropped`` trajectories replaced), then every
        actor's background ``run``. The actors' counters start at zero (a resumed run's too), so
        each budget is lowered by what a run at ``step`` has had: they run ahead as a fresh run's."""
        fresh = self._budget(0, 0)
        self.offsets = [max(0, self._budget(step, dropped) - fresh)] * len(self.offsets)
        self.set_budgets(step, dropped=dropped)
        self.cluster.start_runs()

    def set_budgets(self, step: int, *, dropped: int) -> None:
        self.budget = self._budget(step, dropped)
        self.cluster.set_budgets([self.budget - off for off in self.offsets])

    def _budget(self, step: int, dropped: int) -> int:
        c = self.cfg
        return episode_budget(step, batch_size=c.train.batch_size, run_ahead=c.actors.run_ahead,
                              max_staleness=c.learner.max_staleness, dropped=dropped,
                              actors=len(self.cluster.actors), group_size=c.actors.group_size)

    @property
    def running(self) -> bool:
        """Async mode: the actors' background runs are started (and not stopped)."""
        return self.cluster.running

    def stop_runs(self) -> None:
        """End the actors' background runs (their episodes in flight end unsent)."""
        self.cluster.stop_runs()

    def check(self, version: int) -> None:
        """Replace every actor whose background run ended (runs end only by ``stop_runs``) or
        that the topology finds hung (``hung_actors``: no answer, a dead or stalled engine)."""
        failed = self.cluster.ended_runs()
        hung = {i: e for i, e in self.cluster.hung_actors().items() if i not in failed}
        self.faults["actors_hung"] += len(hung)
        failed.update(hung)
        if failed:
            self._replace(failed, version)

    # --- both modes ---------------------------------------------------------------------------
    def push(self, version: int) -> dict[str, float]:
        """``push_weights``; on failure, dead actors replaced and one retry in a new generation.
        Also after a resume: the engines start from the model path, not the checkpoint."""
        self.version = version
        try:
            return self.cluster.push_weights(version)
        except PushError as e:
            log.warning("%s: re-forming the weight group", e)
            self.faults["weight_group_reformed"] += 1
            if e.dead_actors:
                return self._replace(e.dead_actors, version)
            return {**self.cluster.reform_weights(version), "weights/reformed": 1.0}

    def rollout(self, version: int) -> None:
        """Sync mode: whole GRPO groups adding up to a batch, a failed actor replaced and rerun."""
        todo = dict(enumerate(_episodes_per_actor(self.cfg)))
        while todo:
            failed = self.cluster.rollout(todo)
            if failed:
                self._replace(failed, version)
            todo = {i: todo[i] for i in failed}

    def _replace(self, failed: Mapping[int, BaseException], version: int) -> dict[str, float]:
        """Restart the ``failed`` actors, re-form the weight group and push ``version`` to all;
        actors that die meanwhile (joining, or during the push) are replaced too and the group
        formed again (each round restarts one at least: bounded by ``actors.max_restarts``); in
        async mode give the new actors a fresh budget and start their runs."""
        t0 = time.perf_counter()
        replaced: set[int] = set()
        while True:
            for i, error in failed.items():
                self._retire(i)
                self.faults["actors_replaced"] += 1
                self._restart(i, error)
            replaced.update(failed)
            try:
                out = self.cluster.reform_weights(version)
                break
            except PushError as e:
                if not e.dead_actors:
                    raise
                log.warning("%s: replacing them and re-forming the weight group", e)
                self.faults["weight_group_reformed"] += 1
                failed = e.dead_actors
        if self.cluster.running:
            fresh = self._budget(0, 0)  # what a run starting now would get
            for i in replaced:
                self.offsets[i] = max(0, self.budget - fresh)
            self.cluster.set_budgets([self.budget - off for off in self.offsets])
            self.cluster.start_runs(sorted(replaced))
        log.warning("replaced actors %s in %.1f s", sorted(replaced), time.perf_counter() - t0)
        return {**out, "weights/reformed": 1.0, "timing/restart_s": time.perf_counter() - t0}

    def _retire(self, i: int) -> None:
        """Actor ``i``'s incarnation leaves the ledger's live ones with its last reading (its
        episodes in flight are lost: the ledger says how many); one never read yet is retired
        by name, for what the learner received from it."""
        reading = self.readings[i] if i < len(self.readings) else {}
        self.retired.append(reading or {"actor_id": i, "incarnation": self.cluster.incarnations[i]})
        if i < len(self.readings):
            self.readings[i] = {}

    def _restart(self, i: int, error: BaseException) -> None:
        """Its next incarnation; one that fails to start is itself retired and restarted
        (within ``actors.max_restarts``: past it the cluster raises)."""
        while True:
            try:
                return self.cluster.restart_actor(i, error)
            except ActorsFailed as e:
                error = e.errors[i]
                self._retire(i)
                self.faults["actors_replaced"] += 1


def episode_budget(step: int, *, batch_size: int, run_ahead: int, max_staleness: int,
                   dropped: int, actors: int, group_size: int) -> int:
    """Per actor: the most training episodes it may have started (and not failed) once the
    learner has taken ``step`` batches: ``1 + run_ahead`` batches beyond them (run_ahead capped
    at max_staleness), plus what the buffer dropped (so the learner never starves), split over
    the actors in whole GRPO groups. run_ahead 1: the actors fill the next batch while the
    learner trains on this one, so trajectories are about one version stale."""
    total = (step + 1 + min(run_ahead, max_staleness)) * batch_size + dropped
    return -(-total // (actors * group_size)) * group_size


def _episodes_per_actor(cfg: RunConfig) -> list[int]:
    """Sync mode: whole GRPO groups per actor adding up to at least the batch size."""
    groups = -(-cfg.train.batch_size // cfg.actors.group_size)
    n = cfg.actors.num
    return [(groups // n + (i < groups % n)) * cfg.actors.group_size for i in range(n)]


def origin(reading: Mapping[str, Any]) -> str:
    """An actor's reading's incarnation as the learner names it (``Trajectory.origin``)."""
    return f"{reading.get('actor_id')}/{reading.get('incarnation')}"


def episode_ledger(current: list[dict[str, Any]], retired: list[dict[str, Any]],
                   received: Mapping[str, int]) -> dict[str, float]:
    """Sums over the actors' counters (actors/actor.py's ``COUNTS``) of the live incarnations
    (``current``) and the replaced ones (``retired``, as last read), with what the learner
    ``received`` from each (``Trajectory.origin``; a checkpoint's incarnations carry theirs as
    ``received``):

    - ``episodes/started`` = done + failed + cancelled + in_flight + lost;
      done = sent + unsent + held; sent = what the learner received + ``in_transit``;
    - a live incarnation's counts are its own; ``in_transit`` is what it sent and the learner
      has not received yet (the learner is read first, so never negative);
    - a gone incarnation (replaced, or not answering): what the learner received from it is its
      done and sent; ``lost`` what else it had started and neither failed nor cancelled (in
      flight, held or queued). It may have started and sent episodes after its last reading:
      those the learner received count as started; those it had not sent are counted nowhere
      (at most what it started in its last step);
    - ``failed/<reason>`` summed over all."""
    out: Counter[str] = Counter(dict.fromkeys(
        ("started", "done", "failed", "cancelled", "in_flight", "sent", "unsent", "held", "lost",
         "in_transit"), 0))
    for r, gone in [*((r, "unanswered" in r) for r in current), *((r, True) for r in retired)]:
        started, failed = r.get("episodes_started", 0), r.get("episodes_failed", 0)
        cancelled, sent = r.get("episodes_cancelled", 0), r.get("episodes_sent", 0)
        arrived = r.get("received", received.get(origin(r), 0))
        out.update(failed=failed, cancelled=cancelled)
        for key, value in r.items():
            if key.startswith("failed/"):
                out[key] += value
        if gone:
            started = max(started, failed + cancelled + arrived)
            out.update(started=started, done=arrived, sent=arrived,
                       lost=started - failed - cancelled - arrived)
            continue
        done = r.get("episodes_done", 0)
        out.update(started=started, done=done, sent=sent, unsent=r.get("episodes_unsent", 0),
                   held=r.get("episodes_held", 0), in_flight=started - done - failed - cancelled,
                   in_transit=sent - arrived)
    return {(k if k.startswith("failed/") else f"episodes/{k}"): float(v) for k, v in out.items()}
