"""The run's processes, owned in one place: every Ray call of a training run is in this module.

Called by launch/run/loop.py (the run) and launch/run/supervisor.py (when to restart, what budgets).
``RayCluster`` places (launch/topology/placement.py) and starts, as Ray actors:
- the learner ranks (``learner.worker.LearnerWorker``): FSDP2 over gloo/NCCL; rank 0 binds the
  trajectory stream and hosts the weight group;
- the inference actors (``actors.actor.InferenceActor``, async Ray actors): a vLLM engine each,
  whose worker joins the weight group, and an env pool (or a remote env service).

It holds their handles, the actors' background runs and incarnations, and the weight group,
and offers what the loop and the supervisor do with them: train a step, push weights (every
actor's ``update_weights`` with the learners' ``publish_weights``), evaluate, checkpoint,
restart an actor, shut down.

Invariants: ``shutdown`` stops only the processes this cluster started, also when ``start``
failed half-way, and shuts Ray down only if ``connect`` started it; the warm start runs in a Ray
task whose worker exits after it; a restarted actor is the next incarnation on the same
placement slot, and it joins the weight group only through ``reform_weights``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.config import ActorConfig
from actors.engine import cpu_thread_binding
from actors.weight_updates import EngineDead
from launch.config.builders import actor_config, warm_start_config, worker_config
from launch.config.schema import RunConfig
from launch.model.warm_start import warm_start
from launch.topology.combine import combine_evaluations, eval_shares, push_timings
from launch.topology.placement import Node, Roles, place
from launch.topology.protocol import ActorsFailed, CallTimeout, LearnerHung, PushError
from transport import security

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
WATCH_S = 2.0
"""While actors wait on the learner (a weight push, joining the weight group), the learner ranks
are checked this often: a dead one ends the wait at once."""


@dataclass(frozen=True)
class WeightGroup:
    """The weight channel: its address (the broadcast group's store on learner rank 0's node,
    or an in-process channel), its size (the learner, rank 0, and every engine worker), and how
    long a silent peer is waited for."""

    address: str
    world_size: int
    timeout_s: float


class RayCluster:
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.learners: list = []
        self.actors: list = []
        self.incarnations: list[int] = []
        """Per actor: times it was restarted (this run's, a resumed run's included)."""
        self._runs: list = []
        self._liveness: dict[int, tuple[Any, float]] = {}
        """Per actor: its unanswered liveness call and when it was made."""
        self._stats: dict[int, dict[str, Any]] = {}
        """Per actor: its last answered stats (what ``actor_stats`` reports of one that does not answer)."""
        self._slots: list = []
        self._actor_configs: list[ActorConfig] = []
        self._weights: WeightGroup | None = None
        self._started_ray = False
        self.nodes: dict[str, str] = {}
        """Where each learner rank and actor runs: Ray node ids (the run's summary has them)."""
        self.stream_secured = False
        """The stream requires CurveZMQ keys (transport.curve)."""

    # --- the cluster ---------------------------------------------------------------------------
    def connect(self) -> bool:
        """Attach to ``ray.address`` / RAY_ADDRESS, else start a local cluster. True if started."""
        env_vars = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
                    "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false"}
        if "HF_HUB_OFFLINE" in os.environ:  # launch/model/hub.py's hub_access: set for local models
            env_vars["HF_HUB_OFFLINE"] = os.environ["HF_HUB_OFFLINE"]
        address = self.cfg.ray.address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, runtime_env={"env_vars": env_vars}, log_to_driver=True)
            return False
        needed = self._roles()
        cpus = self.cfg.ray.num_cpus or max(os.cpu_count() or 1, needed.learner_ranks * needed.learner_cpus
                                            + needed.actors * needed.actor_cpus)
        ray.init(num_cpus=cpus, include_dashboard=False, runtime_env={"env_vars": env_vars},
                 _node_ip_address="127.0.0.1", log_to_driver=True)
        self._started_ray = True
        return True

    def check_room(self) -> None:
        """``PlacementError`` now, before the warm start, if the cluster cannot hold the run."""
        place(_nodes(), self._roles())

    def warm_start(self, model_path: str, out: Path) -> str:
        """SFT on demonstrations (launch/model/warm_start.py) in a Ray task that takes a whole node on
        CPU (nothing else runs yet), with ``warm_start.threads`` torch threads (null: the node's
        CPUs); its worker exits after it and gives its memory back. A stop request
        (launch/run/loop.py's ``Stop``) ends the wait at once and cancels the task."""
        cfg = self.cfg
        cpus = cfg.learner.cpus if cfg.learner.gpus else max(
            n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"])
        threads = cfg.warm_start.threads or max(1, int(cpus))
        task = ray.remote(num_cpus=cpus, num_gpus=cfg.learner.gpus, max_calls=1)(_warm_start_task)
        ref = task.remote(threads, model_path, str(out), **warm_start_config(cfg))
        try:
            _wait([ref], None)
            return str(ray.get(ref))
        except BaseException:
            ray.cancel(ref, force=True)
            raise

    def start(self, model_path: str, log_dir: Path | None = None,
              streams: list[dict[str, int]] | None = None) -> None:
        """Place and start the learner ranks and the actors (handles kept as they are created,
        so ``shutdown`` stops them also when starting fails half-way); the actors join the
        weight group. With ``log_dir`` each process's output (an actor's vLLM engine included)
        goes to ``log_dir/learner-<rank>.log`` / ``actor-<index>.log``. ``streams`` (a resumed
        run's: ``incarnation`` and ``groups_drawn`` per actor) continue each actor's seeds."""
        cfg = self.cfg
        placement = place(_nodes(), self._roles(), bind_cores=cfg.ray.bind_cores)
        wcfg = worker_config(cfg, model_path)
        learner_cls = learner_actor_class()
        for slot in placement.of("learner"):
            self.learners.append(learner_cls.options(
                num_cpus=slot.cpus, num_gpus=slot.gpus, scheduling_strategy=_on(slot.node),
            ).remote(slot.index, cfg.learner.ranks, dataclasses.replace(
                wcfg, cores=slot.cores, log_file=_log_file(log_dir, f"learner-{slot.index}"))))
        # Every address is learner rank 0's: its node's (loopback on a cluster started here), a
        # port free there (the rendezvous), ports its stream and weight store bind there.
        remote = bool(cfg.ray.address or os.environ.get("RAY_ADDRESS"))
        host = placement.learner_address if remote else "127.0.0.1"
        port = self._learners([self.learners[0].free_port.remote()], "free_port", cfg.ray.call_timeout_s)[0]
        # CurveZMQ on the stream (transport.curve): the server keys to rank 0, the client keys
        # to every actor; made here for this run unless given by file.
        keys = stream_keys(cfg, networked=remote)
        self.stream_secured = keys is not None
        infos = self._learners([w.setup.remote(
            host, port,
            stream_address=f"tcp://{host}:{cfg.transport.stream_port}",
            weight_address=f"tcp://{host}:{cfg.transport.weight_port}",
            weight_world_size=placement.weight_world_size, device=cfg.learner.device,
            stream_curve=keys[0] if keys and w is self.learners[0] else None,
        ) for w in self.learners], "setup", cfg.ray.start_timeout_s)
        stream = infos[0]["stream_address"]
        self._weights = WeightGroup(infos[0]["weight_address"], placement.weight_world_size,
                                    cfg.transport.weight_timeout_s)
        self._slots = placement.of("actor")
        self.nodes = {f"{s.role}-{s.index}": s.node for s in placement.slots if s.role != "env_worker"}
        self._actor_configs = [dataclasses.replace(
            actor_config(cfg, slot.index, model_path, stream), cores=slot.cores,
            log_file=_log_file(log_dir, f"actor-{slot.index}"), learner_curve=keys[1] if keys else None)
            for slot in self._slots]
        self.incarnations = [0] * len(self._slots)
        for i, stream_at in enumerate((streams or [])[:len(self._slots)]):
            self.incarnations[i] = stream_at["incarnation"]
            self._actor_configs[i] = dataclasses.replace(self._actor_configs[i],
                                                         skip_groups=stream_at["groups_drawn"])
        for i in range(len(self._slots)):
            self.actors.append(self._new_actor(i))
        self._start_actors()
        self._form_weight_group()

    def _start_actors(self) -> None:
        """Start every actor; one that dies or fails while starting is replaced by its next
        incarnation (``restart_actor``, within ``actors.max_restarts``)."""
        answers = self._gather({i: a.start.remote() for i, a in enumerate(self.actors)}, "start",
                               self.cfg.ray.start_timeout_s)
        self._restart_all({i: e for i, e in answers.items() if isinstance(e, BaseException)})

    def _form_weight_group(self) -> None:
        """The started actors join the weight group; one that dies meanwhile is replaced (within
        ``actors.max_restarts``) and the group formed again. Any other failure is raised."""
        while True:
            try:
                return self._join_weight_group(0)
            except PushError as e:
                if len(e.dead_actors) < len(e.errors):
                    raise
                log.warning("%s: replacing actors %s", e, sorted(e.dead_actors))
                self._restart_all(dict(e.dead_actors))
                self._learners([w.reform_weight_group.remote(self._weight_group.world_size)
                                for w in self.learners], "reform_weight_group", self.cfg.ray.step_timeout_s)

    def _restart_all(self, failed: dict[int, BaseException]) -> None:
        """``restart_actor`` each of ``failed``; one whose next incarnation fails to start is
        restarted again (within ``actors.max_restarts``)."""
        while failed:
            i, error = failed.popitem()
            try:
                self.restart_actor(i, error)
            except ActorsFailed as again:
                failed[i] = again.errors[i]

    def shutdown(self) -> None:
        """Stop what was started, in order: actors (engines, env pools, senders), learners, Ray.
        A process that does not close within ``ray.call_timeout_s`` is killed."""
        timeout = self.cfg.ray.call_timeout_s
        closed = self._gather({i: a.close.remote() for i, a in enumerate(self.actors)}, "close", timeout)
        for i, result in closed.items():
            if isinstance(result, BaseException):  # a dead or hung actor is killed below anyway
                log.warning("actor %d close failed: %s", i, result)
        for w in self.learners:
            try:
                ray.get(w.close.remote(), timeout=timeout)
            except Exception as e:  # noqa: BLE001 - a dead or hung rank is killed below anyway
                log.warning("learner close failed: %s", e)
        for h in self.actors + self.learners:
            ray.kill(h)
        if self._started_ray:
            ray.shutdown()

    # --- the learner ---------------------------------------------------------------------------
    def train_step(self, batch_size: int, timeout_s: float) -> dict[str, float]:
        """One learner step on every rank; {} when no full batch arrived within the timeout."""
        refs = [w.train_step.remote(batch_size, timeout_s) for w in self.learners]
        return self._learners(refs, "train_step", timeout_s + self.cfg.ray.step_timeout_s)[0]

    def save_checkpoint(self, path: Path, extra: dict[str, Any]) -> None:
        refs = [w.save_checkpoint.remote(str(path), extra) for w in self.learners]
        self._learners(refs, "save_checkpoint", self.cfg.ray.step_timeout_s)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        refs = [w.load_checkpoint.remote(str(path)) for w in self.learners]
        return self._learners(refs, "load_checkpoint", self.cfg.ray.step_timeout_s)[0]

    def read_probe(self, path: Path) -> list[str | None]:
        """What each learner rank reads at ``path``, by rank; None: no such file on its node, or
        no answer within a minute (a hung network mount)."""
        refs = [w.read_probe.remote(str(path)) for w in self.learners]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=60)
        return [ray.get(r) if r in ready else None for r in refs]

    def save_final(self, run_dir: Path, samples: int) -> None:
        """The policy as a Hugging Face directory, and the last batch's samples as text."""
        timeout = self.cfg.ray.step_timeout_s
        self._learners([w.save_hf.remote(str(run_dir / "final-model")) for w in self.learners], "save_hf", timeout)
        text = self._learners([self.learners[0].samples_text.remote(samples)], "samples_text", timeout)[0]
        (run_dir / "samples.txt").write_text(text)

    def accounting(self) -> dict[str, dict[str, int]]:
        return self._learners([self.learners[0].accounting.remote()], "accounting", self.cfg.ray.call_timeout_s)[0]

    def received_by_origin(self) -> dict[str, int]:
        return self._learners([self.learners[0].received_by_origin.remote()], "received_by_origin",
                              self.cfg.ray.call_timeout_s)[0]

    def _learners(self, refs: list, what: str, timeout_s: float) -> list:
        """The results of a call on learner ranks; ``LearnerHung`` (with every rank's report)
        if any gave no answer within ``timeout_s``; a rank's error is raised as is."""
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if pending:
            raise LearnerHung(self._hang_report(what, timeout_s))
        return ray.get(refs)

    def _hang_report(self, what: str, timeout_s: float) -> str:
        """What each learner rank is doing, for how long, and its threads' stacks."""
        lines = [f"the learner ranks gave no answer to {what} within {timeout_s:g} s "
                 "(the ray.*_timeout_s deadlines); each rank's report:"]
        refs = [w.liveness.options(concurrency_group="liveness").remote(stacks=True) for w in self.learners]
        for rank, ref in enumerate(refs):
            try:
                r = ray.get(ref, timeout=min(30.0, self.cfg.ray.call_timeout_s))
            except Exception as e:  # noqa: BLE001 - a rank that cannot even say is reported as such
                lines.append(f"rank {rank}: no answer to liveness ({type(e).__name__}: {e})")
                continue
            lines.append(f"rank {rank} (node {self.nodes.get(f'learner-{rank}')}, pid {r['pid']}): "
                         f"in {r['doing']} for {r['for_s']} s; its threads:\n{r['stacks']}")
        return "\n".join(lines)

    # --- the actors ----------------------------------------------------------------------------
    def actor_stats(self) -> list[dict[str, Any]]:
        """Each actor's stats; of one that does not answer (dead or hung: the supervisor replaces
        it), its last answered stats with ``unanswered`` (the error) added."""
        answers = self._gather({i: a.stats.remote() for i, a in enumerate(self.actors)},
                               "stats", self.cfg.ray.call_timeout_s)
        out = []
        for i, answer in answers.items():
            if isinstance(answer, BaseException):
                last = self._stats.get(i, {"actor_id": i, "incarnation": self.incarnations[i], "groups_drawn": 0})
                out.append({**last, "unanswered": f"{type(answer).__name__}: {answer}"})
            else:
                self._stats[i] = answer
                out.append(answer)
        return out

    def set_budgets(self, budgets: list[int]) -> None:
        """Each actor's episode budget (launch/run/supervisor.py decides them). An actor that does
        not take it is left to the checks that replace dead and hung actors."""
        answers = self._gather({i: a.set_episode_budget.remote(b) for i, (a, b) in
                                enumerate(zip(self.actors, budgets))}, "set_episode_budget",
                               self.cfg.ray.call_timeout_s)
        for i, answer in answers.items():
            if isinstance(answer, BaseException):
                log.warning("actor %d took no budget: %s", i, answer)

    def start_runs(self, indices: list[int] | None = None) -> None:
        """Async mode: the actors' background ``run`` (all, or those of ``indices``)."""
        if not self._runs:
            self._runs = [None] * len(self.actors)
        for i in range(len(self.actors)) if indices is None else indices:
            self._runs[i] = self.actors[i].run.remote()

    @property
    def running(self) -> bool:
        """Async mode: the background runs were started (and not stopped)."""
        return bool(self._runs)

    def ended_runs(self) -> dict[int, BaseException]:
        """Actors whose background run ended (runs end only by ``stop_runs``): their errors."""
        refs = [r for r in self._runs if r is not None]
        if not refs:
            return {}
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        failed: dict[int, BaseException] = {}
        for i, ref in enumerate(self._runs):
            if ref is not None and ref in done:
                try:
                    ray.get(ref)
                    failed[i] = RuntimeError(f"actor {i}'s run returned without a stop")
                except Exception as e:  # noqa: BLE001 - the actor's failure, handled by a restart
                    failed[i] = e
        return failed

    def hung_actors(self) -> dict[int, BaseException]:
        """Actors found hung (``CallTimeout``), without waiting: each has a liveness call
        outstanding (made by the previous check); one unanswered for ``ray.call_timeout_s`` has a
        blocked event loop; an answer with a dead engine, or an engine stalled for
        ``ray.stall_s``, is a hung actor too."""
        r, now = self.cfg.ray, time.monotonic()
        for i, a in enumerate(self.actors):
            if i not in self._liveness:  # one call out per actor: a blocked one gets no pile
                self._liveness[i] = (a.liveness.remote(), now)
        done, _ = ray.wait([ref for ref, _ in self._liveness.values()], num_returns=len(self._liveness),
                           timeout=0)
        hung: dict[int, BaseException] = {}
        for i, (ref, asked) in list(self._liveness.items()):
            if ref not in done:
                if now - asked > r.call_timeout_s:
                    hung[i] = CallTimeout(f"actor {i} gave no answer to liveness for {now - asked:.0f} s")
                continue
            del self._liveness[i]
            try:
                answer = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - dead: its run's end or the next call tells
                log.debug("actor %d liveness failed: %s", i, e)
                continue
            if answer["engine_dead"]:
                hung[i] = EngineDead(f"actor {i}: its engine is dead")
            elif r.stall_s and answer["stalled_s"] > r.stall_s:
                hung[i] = CallTimeout(f"actor {i}: its engine yielded nothing for {answer['stalled_s']} s "
                                      f"with {answer['requests']} requests in flight")
        return hung

    def stop_runs(self) -> None:
        """End the background runs; an actor that does not stop in time is left to shutdown."""
        if self.running:
            timeout = self.cfg.ray.call_timeout_s
            stopped = self._gather({i: a.stop.remote() for i, a in enumerate(self.actors)}, "stop", timeout)
            ended = self._gather({i: ref for i, ref in enumerate(self._runs) if ref is not None}, "run", timeout)
            for i, answer in [*stopped.items(), *ended.items()]:
                if isinstance(answer, BaseException):
                    log.warning("actor %d did not stop cleanly: %s", i, answer)
        self._runs = []

    def rollout(self, counts: dict[int, int]) -> dict[int, BaseException]:
        """Sync mode: actor i plays ``counts[i]`` episodes, all at once; returns the errors of
        the actors that failed (``CallTimeout`` past ``ray.step_timeout_s``)."""
        refs = {i: self.actors[i].run.remote(num_episodes=n) for i, n in counts.items()}
        answers = self._gather(refs, "run", self.cfg.ray.step_timeout_s)
        return {i: e for i, e in answers.items() if isinstance(e, BaseException)}

    def _gather(self, refs: dict[int, Any], what: str, timeout_s: float,
                watch_learners: bool = False) -> dict[int, Any]:
        """By actor index: the result of its call, or its error (``CallTimeout`` if it gave no
        answer within ``timeout_s``, counted from now for all together). ``watch_learners``: the
        call waits on the learner too (the weight group): a learner rank that dies meanwhile
        raises its error within ``WATCH_S`` instead of leaving the actors to their deadline."""
        if not refs:
            return {}
        deadline = time.monotonic() + timeout_s
        pending = list(refs.values())
        while pending and (left := deadline - time.monotonic()) > 0:
            pending = _wait(pending, min(left, WATCH_S) if watch_learners else left)
            if pending and watch_learners:
                self._learners([w.liveness.options(concurrency_group="liveness").remote() for w in self.learners],
                               "liveness", self.cfg.ray.call_timeout_s)
        finished = set(refs.values()) - set(pending)
        out: dict[int, Any] = {}
        for i, ref in refs.items():
            if ref not in finished:
                out[i] = CallTimeout(f"actor {i} gave no answer to {what} within {timeout_s:g} s")
                continue
            try:
                out[i] = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - returned: the caller decides per operation
                out[i] = e
        return out

    def restart_actor(self, index: int, error: BaseException) -> None:
        """Replace actor ``index`` (dead, or its run failed) with a started one of the next
        incarnation; its episodes in flight are lost. Re-raises past ``actors.max_restarts``.
        The new engine holds the model path's weights: call ``reform_weights`` next."""
        limit = self.cfg.actors.max_restarts
        if self.incarnations[index] >= limit:
            raise RuntimeError(f"actor {index} failed after {limit} restarts") from error
        log.warning("actor %d failed (%s: %s): restarting it", index, type(error).__name__, error)
        ray.kill(self.actors[index], no_restart=True)
        self._liveness.pop(index, None)
        self.incarnations[index] += 1
        # a new incarnation's stream starts afresh
        self._actor_configs[index] = dataclasses.replace(self._actor_configs[index], skip_groups=0)
        self.actors[index] = self._new_actor(index)
        if self._runs:
            self._runs[index] = None
        _all_answered("start", self._gather({index: self.actors[index].start.remote()}, "start",
                                            self.cfg.ray.start_timeout_s))

    def _new_actor(self, index: int):
        from actors.actor import InferenceActor

        slot = self._slots[index]
        env_vars = {}
        # Two CPU engines on one node: one core each. An actor that holds cores of its own
        # (slot.cores) puts its engine on those instead (actors/actor.py).
        if len(self._slots) > 1 and not slot.gpus:
            workers = len(slot.weight_ranks)
            first = slot.index * workers % max(1, os.cpu_count() or 1)
            env_vars["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding([first], workers)
        return ray.remote(InferenceActor).options(
            num_cpus=slot.cpus, num_gpus=slot.gpus, scheduling_strategy=_on(slot.node),
            runtime_env={"env_vars": env_vars} if env_vars else None,
        ).remote(dataclasses.replace(self._actor_configs[index], incarnation=self.incarnations[index]))

    def evaluate(self, seeds: list[int], pages: int = 0, samples: int = 0,
                 blind: bool = False) -> dict[str, Any]:
        """A greedy episode and ``samples`` sampled ones on each of ``seeds``, the seeds split
        across the actors: every episode's outcome, and the greedy episodes of the first
        ``pages`` seeds turn by turn under ``episodes`` (combine.py's ``combine_evaluations``);
        ``blind``: the model sees every picture white."""
        shares = eval_shares(seeds, len(self.actors), pages)
        answers = self._gather({i: a.evaluate.remote(share, record=k, samples=samples, blind=blind)
                                for i, (a, (share, k)) in enumerate(zip(self.actors, shares))},
                               "evaluate", self.cfg.ray.eval_timeout_s)
        return combine_evaluations(list(_all_answered("evaluation", answers).values()))

    # --- weights -------------------------------------------------------------------------------
    def push_weights(self, version: int) -> dict[str, float]:
        """Every actor receives (in flight) the learner's weights of ``version``; returns
        timings. Raises ``PushError`` (after every call returned) if any side failed."""
        t0 = time.perf_counter()
        learner_refs = [w.publish_weights.remote() for w in self.learners]
        answers = self._gather({i: a.update_weights.remote(version) for i, a in enumerate(self.actors)},
                               "update_weights", self.cfg.ray.step_timeout_s, watch_learners=True)
        # then the learners, whose publish gives up on a silent peer (transport.weight_timeout_s)
        _, pending = ray.wait(learner_refs, num_returns=len(learner_refs), timeout=self.cfg.ray.call_timeout_s)
        if pending:
            raise LearnerHung(self._hang_report("publish_weights", self.cfg.ray.step_timeout_s))
        results: list[Any] = []
        for ref in learner_refs:
            try:
                results.append(ray.get(ref))
            except Exception as e:  # noqa: BLE001 - sorted out by the caller from PushError
                results.append(e)
        results += [answers[i] for i in range(len(self.actors))]
        errors = {i: r for i, r in enumerate(results[len(learner_refs):]) if isinstance(r, Exception)}
        learner_errors = [r for r in results[:len(learner_refs)] if isinstance(r, Exception)]
        if errors or learner_errors:
            dead = {i for i, e in errors.items() if is_dead(e)}
            raise PushError(version, errors, learner_errors, dead)
        return push_timings(results[0], results[len(learner_refs):], lambda: time.perf_counter() - t0)

    def reform_weights(self, version: int) -> dict[str, float]:
        """A new generation of the weight group, every actor in it, and ``version`` pushed to
        all (the same version again is allowed: a restarted actor needs the current weights)."""
        self._learners([w.reform_weight_group.remote(self._weight_group.world_size) for w in self.learners],
                       "reform_weight_group", self.cfg.ray.step_timeout_s)
        self._join_weight_group(version)
        return self.push_weights(version)

    @property
    def _weight_group(self) -> WeightGroup:
        if self._weights is None:
            raise RuntimeError("RayCluster: start() first (it forms the weight group)")
        return self._weights

    def _join_weight_group(self, version: int) -> None:
        """Every actor joins the group's current generation, before ``version`` is pushed;
        ``PushError`` (with the dead ones) if some failed."""
        g = self._weight_group
        answers = self._gather(
            {i: a.join_weight_group.remote(g.address, slot.weight_ranks[0], g.world_size, g.timeout_s)
             for i, (a, slot) in enumerate(zip(self.actors, self._slots))},
            "join_weight_group", self.cfg.ray.step_timeout_s, watch_learners=True)
        errors = {i: e for i, e in answers.items() if isinstance(e, Exception)}
        if errors:
            raise PushError(version, errors, [], {i for i, e in errors.items() if is_dead(e)},
                            what="joining the weight group for the push")

    def _roles(self) -> Roles:
        cfg = self.cfg
        return Roles(learner_ranks=cfg.learner.ranks, learner_cpus=cfg.learner.cpus,
                     learner_gpus=cfg.learner.gpus, actors=cfg.actors.num,
                     actor_cpus=cfg.actors.cpus, engine_gpus=cfg.actors.gpus_per_engine,
                     engine_workers=cfg.actors.tp, env_workers=0)


def learner_actor_class():
    """``LearnerWorker`` as a Ray actor whose ``liveness`` runs on a concurrency group of its
    own: it answers while a call on the rank hangs."""
    from learner.worker import LearnerWorker

    return ray.remote(concurrency_groups={"liveness": 1})(LearnerWorker)


def is_dead(error: BaseException) -> bool:
    """Whether a failed call means the actor must be replaced: its process is gone (Ray's
    ``RayActorError``), its engine is (``EngineDead``, which Ray's error wrapping keeps as a
    type of the error it raises), or it is hung (``CallTimeout``)."""
    return isinstance(error, (ray.exceptions.RayActorError, EngineDead, CallTimeout))


def _all_answered(what: str, answers: dict[int, Any]) -> dict[int, Any]:
    """``answers`` if none is an error, else ``ActorsFailed`` with the errors."""
    errors = {i: a for i, a in answers.items() if isinstance(a, BaseException)}
    if errors:
        raise ActorsFailed(what, errors)
    return answers


def stream_keys(cfg: RunConfig, networked: bool):
    """The trajectory stream's CurveZMQ keys, (the learner's, the actors'), or None where
    ``transport.curve`` leaves it open (off; auto on loopback: ``networked`` False)."""
    t = cfg.transport
    if t.curve == "off" or (t.curve == "auto" and not networked):
        return None
    if t.curve_keys:
        return security.read_server(t.curve_keys), security.read_client(t.curve_keys)
    return security.generate()


def _wait(refs: list, timeout_s: float | None) -> list:
    """Those of ``refs`` still pending after at most ``timeout_s`` (None: until all are done).
    A Python wait on their futures, not Ray's: a stop request (launch/run/loop.py's ``Stop``)
    raises from its signal handler wherever the main thread is, and propagates from here,
    where inside ``ray.wait`` Ray turns it into a SystemError and inside ``ray.get`` it is lost
    until the call ends."""
    futures = [ref.future() for ref in refs]
    concurrent.futures.wait(futures, timeout=timeout_s)
    return [ref for ref, future in zip(refs, futures) if not future.done()]


def _warm_start_task(threads: int, *args, **kwargs) -> Path:
    import torch

    torch.set_num_threads(threads)
    return warm_start(*args, **kwargs)


def _nodes() -> list[Node]:
    return [Node(n["NodeID"], n["NodeManagerAddress"], n["Resources"].get("CPU", 0.0),
                 int(n["Resources"].get("GPU", 0))) for n in ray.nodes() if n["Alive"]]


def _log_file(log_dir: Path | None, name: str) -> str | None:
    return None if log_dir is None else str(Path(log_dir).resolve() / f"{name}.log")


def _on(node_id: str):
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
