"""``topology=local``: the whole run in this process, for debugging a new env, estimator or loss.

The same loop (launch/run/loop.py), supervisor, learner (``LearnerWorker`` and its ``Trainer``) and
actor (``InferenceActor``) as ``topology=ray``, without Ray and without sockets of ours: the
learner is a group of one rank on an in-memory store, the trajectories and the weights travel
through transport/inprocess.py's channels, and the actor's vLLM engine runs in this process
(actors/local_engine.py). The actor's coroutines run on an event loop in a thread of their own
while the learner trains in the caller's thread, so the asynchronous mode overlaps generation
and training as it does across processes. A breakpoint anywhere stops everything; one console
shows everything. The env workers are still processes (envs/pool.py).

Limits, checked by the run config: one learner rank and one actor (vLLM keeps one engine's
parallel state per process). An actor that fails is not restarted: its engine shares this
process, and shutting an in-process engine down also tears down torch.distributed's default
group, which the learner uses; the run stops with the actor's error. ``logger.console`` does not
redirect this process's output: only vLLM's log records go to ``<run dir>/logs/engine.log``
(``logger.console=run``, the default), everything else prints to this console.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Coroutine

from actors.weight_updates import EngineDead
from launch.config.builders import actor_config, warm_start_config, worker_config
from launch.config.schema import RunConfig
from launch.model.warm_start import warm_start
from launch.topology.combine import combine_evaluations, eval_shares, push_timings
from launch.topology.protocol import PushError

if TYPE_CHECKING:
    from learner.worker import LearnerWorker  # torch: imported when the learner starts


class _ActorLoop:
    """An asyncio event loop in a thread: the actors' coroutines run there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="actors", daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine) -> Any:
        return self.submit(coro).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class LocalCluster:
    """The ``Cluster`` (launch/topology/protocol.py) of one process: see the module docstring."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.learner: LearnerWorker | None = None
        self.actors: list = []
        self.incarnations: list[int] = []
        self._runs: list[concurrent.futures.Future | None] = []
        self._loop: _ActorLoop | None = None
        self._weights: tuple[str, int] | None = None  # the weight channel's address, its size
        self._name = f"inproc://{cfg.run_name}-{os.getpid()}-{id(self):x}"
        self._environ: dict[str, str | None] = {}  # what start changed, put back by shutdown

    @property
    def _actor_loop(self) -> _ActorLoop:
        if self._loop is None:
            raise RuntimeError("LocalCluster: connect() first (it starts the actors' event loop)")
        return self._loop

    @property
    def _learner(self) -> LearnerWorker:
        if self.learner is None:
            raise RuntimeError("LocalCluster: start() first (it builds the learner)")
        return self.learner

    @property
    def _weight_channel(self) -> tuple[str, int]:
        if self._weights is None:
            raise RuntimeError("LocalCluster: start() first (it opens the weight channel)")
        return self._weights

    # --- the cluster ---------------------------------------------------------------------------
    def connect(self) -> bool:
        """Start the actors' event loop; True: every process of the run descends from this one."""
        self._loop = _ActorLoop()
        return True

    def warm_start(self, model_path: str, out: Path) -> str:
        """SFT on demonstrations (launch/model/warm_start.py), here, with ``warm_start.threads``
        torch threads (null: every core)."""
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(self.cfg.warm_start.threads or os.cpu_count() or 1)
        try:
            return str(warm_start(model_path, str(out), **warm_start_config(self.cfg)))
        finally:
            torch.set_num_threads(threads)

    def start(self, model_path: str, log_dir: Path | None = None,
              streams: list[dict[str, int]] | None = None) -> None:
        """The learner, then the actor (its engine joins the learner's process group rather than
        making one), joined to the weight channel. With ``log_dir``, vLLM's log records go to
        ``log_dir/engine.log`` instead of the console."""
        from actors.actor import InferenceActor
        from learner.worker import LearnerWorker

        cfg = self.cfg
        if log_dir is not None:
            self._environ["VLLM_LOGGING_CONFIG_PATH"] = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
            os.environ["VLLM_LOGGING_CONFIG_PATH"] = _engine_log_config(Path(log_dir) / "engine.log")
        learner = self.learner = LearnerWorker(0, 1, worker_config(cfg, model_path))
        info = learner.setup(None, stream_address=f"{self._name}/trajectories",
                             weight_address=f"{self._name}/weights",
                             weight_world_size=1 + cfg.actors.num, device=cfg.learner.device)
        self._weights = (info["weight_address"], 1 + cfg.actors.num)
        self.incarnations = [0] * cfg.actors.num
        for i in range(cfg.actors.num):
            config = dataclasses.replace(actor_config(cfg, i, model_path, info["stream_address"]),
                                         engine="in_process")
            if streams and i < len(streams):
                self.incarnations[i] = streams[i]["incarnation"]
                config = dataclasses.replace(config, incarnation=streams[i]["incarnation"],
                                             skip_groups=streams[i]["groups_drawn"])
            self.actors.append(InferenceActor(config))
            self._actor_loop.call(self.actors[-1].start())
        self._join_weight_group()

    nodes: dict[str, str] = {}
    """No placement: one process (RayCluster has each process's node)."""
    stream_secured = False
    """The stream is in memory: no socket, no keys (RayCluster's may use CurveZMQ)."""

    def check_room(self) -> None:
        """Nothing to place: one process (see the module docstring)."""

    def shutdown(self) -> None:
        """The actors (their engines tear down the default process group), then the learner, then
        the event loop; each step also when an earlier one failed."""
        try:
            for actor in self.actors:
                if self._loop is not None:
                    self._loop.call(actor.close())
        finally:
            try:
                if self.learner is not None:
                    self.learner.close()
            finally:
                if self._loop is not None:
                    self._loop.close()
                    self._loop = None
                for key, value in self._environ.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value

    # --- the learner ---------------------------------------------------------------------------
    def train_step(self, batch_size: int, timeout_s: float) -> dict[str, float]:
        return self._learner.train_step(batch_size, timeout_s)

    def save_checkpoint(self, path: Path, extra: dict[str, Any]) -> None:
        self._learner.save_checkpoint(str(path), extra)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        return self._learner.load_checkpoint(str(path))

    def read_probe(self, path: Path) -> list[str | None]:
        return [self._learner.read_probe(str(path))]

    def save_final(self, run_dir: Path, samples: int) -> None:
        self._learner.save_hf(str(run_dir / "final-model"))
        (run_dir / "samples.txt").write_text(self._learner.samples_text(samples))

    def accounting(self) -> dict[str, dict[str, int]]:
        return self._learner.accounting()

    def received_by_origin(self) -> dict[str, int]:
        return self._learner.received_by_origin()

    # --- the actors ----------------------------------------------------------------------------
    def actor_stats(self) -> list[dict[str, Any]]:
        return [self._actor_loop.call(a.stats()) for a in self.actors]

    def set_budgets(self, budgets: list[int]) -> None:
        for actor, budget in zip(self.actors, budgets):
            self._actor_loop.call(actor.set_episode_budget(budget))

    def start_runs(self, indices: list[int] | None = None) -> None:
        if not self._runs:
            self._runs = [None] * len(self.actors)
        for i in range(len(self.actors)) if indices is None else indices:
            self._runs[i] = self._actor_loop.submit(self.actors[i].run())

    @property
    def running(self) -> bool:
        return bool(self._runs)

    def ended_runs(self) -> dict[int, BaseException]:
        failed: dict[int, BaseException] = {}
        for i, run in enumerate(self._runs):
            if run is not None and run.done():
                error = run.exception()
                failed[i] = error or RuntimeError(f"actor {i}'s run returned without a stop")
        return failed

    def hung_actors(self) -> dict[int, BaseException]:
        """None is ever reported: a call in this process cannot be cut short, and a failed actor
        is not replaced here (see the module docstring); the ``ray.*`` deadlines are Ray's."""
        return {}

    def stop_runs(self) -> None:
        if self.running:
            for actor in self.actors:
                self._actor_loop.call(actor.stop())
            concurrent.futures.wait([r for r in self._runs if r is not None])
        self._runs = []

    def rollout(self, counts: dict[int, int]) -> dict[int, BaseException]:
        runs = {i: self._actor_loop.submit(self.actors[i].run(num_episodes=n)) for i, n in counts.items()}
        concurrent.futures.wait(list(runs.values()))
        errors = {i: run.exception() for i, run in runs.items()}
        return {i: e for i, e in errors.items() if e is not None}

    def restart_actor(self, index: int, error: BaseException) -> None:
        """Not here: see the module docstring. The run stops with the actor's error."""
        raise RuntimeError(f"actor {index} failed ({type(error).__name__}: {error}); topology=local "
                           "restarts no actor: its engine shares the learner's process") from error

    def evaluate(self, seeds: list[int], pages: int = 0, samples: int = 0,
                 blind: bool = False) -> dict[str, Any]:
        shares = eval_shares(seeds, len(self.actors), pages)
        return combine_evaluations([self._actor_loop.call(a.evaluate(share, record=k, samples=samples, blind=blind))
                                    for a, (share, k) in zip(self.actors, shares)])

    # --- weights -------------------------------------------------------------------------------
    def push_weights(self, version: int) -> dict[str, float]:
        """Publish (the in-process channel keeps a copy), then every actor takes it in flight."""
        t0 = time.perf_counter()
        try:
            published = self._learner.publish_weights()
        except Exception as e:
            raise PushError(version, {}, [e]) from e
        updates, errors = [], {}
        for i, actor in enumerate(self.actors):
            try:
                updates.append(self._actor_loop.call(actor.update_weights(version)))
            except Exception as e:  # noqa: BLE001 - sorted out by the supervisor
                errors[i] = e
        if errors:  # a dead engine: the supervisor's restart says this topology has none
            raise PushError(version, errors, [], {i for i, e in errors.items() if isinstance(e, EngineDead)})
        return push_timings(published, updates, lambda: time.perf_counter() - t0)

    def reform_weights(self, version: int) -> dict[str, float]:
        self._learner.reform_weight_group(self._weight_channel[1])
        self._join_weight_group()
        return self.push_weights(version)

    def _join_weight_group(self) -> None:
        address, world_size = self._weight_channel
        for i, actor in enumerate(self.actors):
            self._actor_loop.call(actor.join_weight_group(address, 1 + i, world_size,
                                                    self.cfg.transport.weight_timeout_s))


def _engine_log_config(path: Path) -> str:
    """A logging configuration (its file's path) that sends vLLM's log records (its ``vllm``
    logger tree) to ``path``, not to the console: vLLM applies it when its engine is built, as
    VLLM_LOGGING_CONFIG_PATH."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {"engine": {"class": "logging.FileHandler", "filename": str(path.resolve()),
                                "formatter": "plain"}},
        "loggers": {"vllm": {"handlers": ["engine"], "level": "INFO", "propagate": False}},
    }
    config_path = path.with_suffix(".logging.json")
    config_path.write_text(json.dumps(config, indent=1))
    return str(config_path.resolve())
