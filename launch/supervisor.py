"""Keeps a run's actors going: episode budgets, crash detection and restart, weight pushes that
survive a dead actor, sync-mode rollouts.

Called by launch/loop.py between and during learner steps; the process operations themselves
(start, restart, weight group, push) are launch/controller.py's.

Invariants:
- a failed actor (its process died, or its ``run`` raised) is replaced by its next incarnation on
  the same placement slot, at most ``actors.max_restarts`` times per actor; past that the run
  fails with the actor's error. Its episodes in flight are lost; those it sent are kept;
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

from launch.controller import Processes, PushError, push_weights, reform_weights, restart_actor

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(self, cfg, procs: Processes) -> None:
        self.cfg, self.procs = cfg, procs
        self.budget = 0
        """The last episode budget of an actor that never restarted."""
        self.offsets = [0] * len(procs.actors)
        """Per actor: what its budget is lowered by (the budget when it was replaced)."""

    @property
    def restarts(self) -> int:
        return sum(self.procs.restarts)

    # --- async mode ---------------------------------------------------------------------------
    def start_runs(self, step: int) -> None:
        """Budgets for ``step`` batches taken, then every actor's background ``run``."""
        self.set_budgets(step, dropped=0)
        self.procs.runs = [a.run.remote() for a in self.procs.actors]

    def set_budgets(self, step: int, *, dropped: int) -> None:
        import ray

        self.budget = self._budget(step, dropped)
        ray.get([a.set_episode_budget.remote(self.budget - off)
                 for a, off in zip(self.procs.actors, self.offsets)])

    def _budget(self, step: int, dropped: int) -> int:
        c = self.cfg
        return episode_budget(step, batch_size=c.train.batch_size, run_ahead=c.actors.run_ahead,
                              max_staleness=c.learner.max_staleness, dropped=dropped,
                              actors=len(self.procs.actors), group_size=c.actors.group_size)

    def check(self, version: int) -> None:
        """Replace every actor whose background run ended (runs end only by ``stop``)."""
        import ray

        runs = self.procs.runs
        if not runs:
            return
        done, _ = ray.wait(runs, num_returns=len(runs), timeout=0)
        failed = {}
        for i, ref in enumerate(runs):
            if ref in done:
                try:
                    ray.get(ref)
                    failed[i] = RuntimeError(f"actor {i}'s run returned without a stop")
                except Exception as e:  # noqa: BLE001 - the actor's failure, handled by a restart
                    failed[i] = e
        if failed:
            self._replace(failed, version)

    # --- both modes ---------------------------------------------------------------------------
    def push(self, version: int) -> dict[str, float]:
        """``push_weights``; on failure, dead actors replaced and one retry in a new generation."""
        import ray

        try:
            return push_weights(self.procs, version)
        except PushError as e:
            log.warning("%s: re-forming the weight group", e)
            dead = {i: err for i, err in e.errors.items() if isinstance(err, ray.exceptions.RayActorError)}
            if dead:
                return self._replace(dead, version)
            return {**reform_weights(self.procs, version), "weights/reformed": 1.0}

    def rollout(self, version: int) -> None:
        """Sync mode: whole GRPO groups adding up to a batch, a failed actor replaced and rerun."""
        import ray

        counts = _episodes_per_actor(self.cfg)
        refs = [a.run.remote(num_episodes=n) for a, n in zip(self.procs.actors, counts)]
        for i, ref in enumerate(refs):
            while True:
                try:
                    ray.get(ref)
                    break
                except Exception as e:  # noqa: BLE001 - the actor's failure, handled by a restart
                    self._replace({i: e}, version)
                    ref = self.procs.actors[i].run.remote(num_episodes=counts[i])

    def _replace(self, failed: dict[int, BaseException], version: int) -> dict[str, float]:
        """Restart the ``failed`` actors, re-form the weight group and push ``version`` to all;
        in async mode give the new actors a fresh budget and start their runs."""
        import ray

        t0 = time.perf_counter()
        for i, error in failed.items():
            restart_actor(self.procs, i, self.cfg.actors.max_restarts, error)
        out = reform_weights(self.procs, version)
        if self.procs.runs:
            fresh = self._budget(0, 0)  # what a run starting now would get
            for i in failed:
                self.offsets[i] = max(0, self.budget - fresh)
                actor = self.procs.actors[i]
                ray.get(actor.set_episode_budget.remote(self.budget - self.offsets[i]))
                self.procs.runs[i] = actor.run.remote()
        log.warning("replaced actors %s in %.1f s", sorted(failed), time.perf_counter() - t0)
        return {**out, "weights/reformed": 1.0, "timing/restart_s": time.perf_counter() - t0}


def episode_budget(step: int, *, batch_size: int, run_ahead: int, max_staleness: int,
                   dropped: int, actors: int, group_size: int) -> int:
    """Per actor: the most training episodes it may have started (and not failed) once the
    learner has taken ``step`` batches: ``1 + run_ahead`` batches beyond them (run_ahead capped
    at max_staleness), plus what the buffer dropped (so the learner never starves), split over
    the actors in whole GRPO groups. run_ahead 1: the actors fill the next batch while the
    learner trains on this one, so trajectories are about one version stale."""
    total = (step + 1 + min(run_ahead, max_staleness)) * batch_size + dropped
    return -(-total // (actors * group_size)) * group_size


def _episodes_per_actor(cfg) -> list[int]:
    """Sync mode: whole GRPO groups per actor adding up to at least the batch size."""
    groups = -(-cfg.train.batch_size // cfg.actors.group_size)
    n = cfg.actors.num
    return [(groups // n + (i < groups % n)) * cfg.actors.group_size for i in range(n)]
