"""The inference actor: one vLLM engine (actors/engine.py builds it: an AsyncLLM, or its in-process
stand-in) playing many multi-turn episodes at once.

launch/topology/ray_cluster.py wraps ``InferenceActor`` as an async Ray actor and drives it
(launch/topology/local_cluster.py runs it on an event loop thread of the learner's process): ``start``,
``join_weight_group``, ``run`` in the background (or ``run(num_episodes=n)`` per step in sync
mode), ``update_weights`` whenever the learner publishes, ``evaluate``, ``stats``, ``close``. No
Ray here: every method is a plain coroutine, so tests drive the class with ``asyncio`` directly.
The weight group and the updates are actors/weight_updates.py's ``WeightUpdates``, which the actor
builds when it starts and hands ``join_weight_group`` and ``update_weights`` to.

Invariants:
- Token in, token out: episodes are actors/episode.py's ``run_episode``; the engine gets the
  context's token ids (a VLM's images too, actors/vision.py; vLLM's expanded prompt is checked
  against the context) and returns the sampled ids with their ``processed_logprobs``
  (log-softmax of logits / T: the distribution sampled from). Nothing is re-tokenized. Batching
  across episodes is the engine's: each episode keeps one request in flight.
- Every policy token carries the weight version that sampled it, read from vLLM's per-request
  ``weight_versions`` spans; a weight update in flight therefore splits an answer cleanly.
- An env failure (crashed or hung worker, env exception, service timeout, a service found down)
  loses one episode and is counted by reason; it never stops the actor. Engine errors do
  propagate out of ``run``, and so does ``EnvServicesDown``: with remote envs
  (envs/failover.py's ``FailoverEnvClient`` over ``env_address``'s services) no service live for
  ``env_grace_s``. The start needs one service to answer, not all.
- GRPO groups (actors/groups.py): ``group_size`` consecutive episodes share a seed and a
  ``group_id`` that is unique across actors and restarts (``actor_id * GROUP_STRIDE +
  incarnation * INCARNATION_STRIDE + k``). Seeds come from a stream fixed by (``seed``,
  ``actor_id``, ``incarnation``), within ``train_seeds`` (keep it clear of the evaluation seeds).
  With ``whole_groups`` a group's finished trajectories are held until its last member has ended
  (sent or failed), then sent together, each stamped with how many were sent (a group that lost
  a member says so).
- Each episode holds one env slot (training and evaluation episodes share them). Backpressure:
  a trajectory is sent from one sender thread and its episode counts against ``concurrency``
  until the learner has granted the credit to send it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from actors.config import ActorConfig
from actors.engine import build_engine, cpu_thread_binding, sampling_params
from actors.episode import REWARD_PARTS, EpisodeResult, Generate, Generation, run_episode
from actors.groups import GroupHolder, GroupStream
from actors.vision import VisionTokens, vllm_prompt
from actors.weight_updates import AdapterUpdates, WeightUpdates
from envs.failover import FailoverEnvClient
from envs.pool import EnvPool
from envs.registry import resolve_config
from envs.service import EnvServiceError, LatencyEnvClient, LocalEnvClient
from transport import heap
from transport.channels import TrajectorySink, trajectory_sink
from transport.cores import bind_cores
from transport.output import redirect_output
from transport.schema import Trajectory
from transport.security import read_client

log = logging.getLogger(__name__)

COUNTS = ("episodes_started", "episodes_done", "episodes_failed", "episodes_cancelled",
          "episodes_unsent", "tokens_generated", "weight_updates", "weight_update_failures",
          "weights_torn")
"""Counters in ``stats()``, next to ``failed/<reason>`` per failure reason, ``episodes_sent``,
and (whole_groups) ``groups_partial`` and ``episodes_held`` (actors/groups.py), and (remote
envs) ``env_services_live`` and ``env_services_down``. Every training episode started ends in
exactly one of done, failed (with a reason) and cancelled (by ``stop``, or beside an episode
whose error ended ``run``); every done one is sent, unsent (the actor closed before the learner
gave credit) or held (its group not ended yet)."""
TIMES = ("engine_start_s", "generate_s", "env_s", "weights_s", "idle_s", "send_s")
"""Seconds in ``stats()`` as ``time/<name>``: generate_s / env_s summed over training episodes
(they overlap), weights_s in ``update_weights``, idle_s with no request in the engine, send_s
in the sender thread sending trajectories, most of it waiting for the learner's credit."""


EVAL_KEY = 1 << 40
"""Leads an evaluation episode's sampling key: no training episode's group id reaches it."""


def outcome(seed: int, sample: int, result: EpisodeResult) -> dict[str, Any]:
    """An evaluation episode as plain data: what it scored, or the reason it failed (then it
    scored nothing)."""
    failed = result.trajectory is None
    m = {} if failed else result.metrics
    return {"seed": seed, "sample": sample, "failure": (result.failure or "unknown") if failed else None,
            **{k: float(m.get(k, 0.0)) for k in ("success", "reward", "format_correct", "turns", *REWARD_PARTS)},
            **{k: float(v) for k, v in m.items() if k.endswith("_score")}}


def sampling_seed(*key: int) -> int:
    """A 32-bit sampling seed for the answer named by ``key`` (non-negative ints)."""
    return int(np.random.SeedSequence(key).generate_state(1)[0])


class InferenceActor:
    """Plays episodes with a vLLM engine and streams their trajectories to the learner."""

    def __init__(self, config: ActorConfig | Mapping[str, Any], *, engine=None, env=None,
                 tokenizer=None) -> None:
        """Cheap: nothing starts before ``start``. ``engine`` (an AsyncLLM), ``env`` (an EnvClient)
        and ``tokenizer`` are built from the config unless given (fakes in unit tests); given or
        built, ``close`` closes them."""
        self.cfg = config if isinstance(config, ActorConfig) else ActorConfig.from_dict(config)
        self.engine, self.env, self.tokenizer = engine, env, tokenizer
        self.vision: VisionTokens | None = None  # set with the engine: a VLM's image tokens
        self._weights: WeightUpdates | None = None  # set with the engine, by start
        self._pool: EnvPool | None = None
        self._services: FailoverEnvClient | None = None  # set by start with remote envs
        self._sender: TrajectorySink | None = None
        self._send_thread = ThreadPoolExecutor(1, thread_name_prefix=f"actor-{self.cfg.actor_id}-send")
        self._slots: asyncio.Queue[int] | None = None
        self._room: asyncio.Semaphore | None = None
        self._budget: int | None = None
        """Most training episodes that may be live or sent (started - failed); None: no limit."""
        self._budget_changed: asyncio.Event | None = None
        self._driver: asyncio.Task | None = None
        self._started = self._stopping = self._closed = False
        c = self.cfg
        self._stream = GroupStream(seed=c.seed, actor_id=c.actor_id, incarnation=c.incarnation,
                                   group_size=c.group_size, train_seeds=c.train_seeds,
                                   skip_groups=c.skip_groups)
        self._groups_held = GroupHolder(self.cfg.group_size) if self.cfg.whole_groups else None
        self._episode_ids = itertools.count()
        self._request_ids = itertools.count()
        self.counts: Counter[str] = Counter(dict.fromkeys(COUNTS, 0))
        self.times: Counter[str] = Counter(dict.fromkeys(TIMES, 0.0))
        self._requests = 0
        self._idle_since = time.perf_counter()
        self._progress_at = time.perf_counter()
        """When the engine last yielded output (or took a request while it had none)."""

    # --- life cycle ---------------------------------------------------------------------------
    async def start(self) -> dict[str, float]:
        """Build what was not given: the env pool (or service client), the engine, the sender."""
        if self._started:
            return {"start_s": self.times["engine_start_s"]}
        self._started = True
        t0 = time.perf_counter()
        cfg = self.cfg
        redirect_output(cfg.log_file)  # before the engine starts: its processes inherit it
        bound = bind_cores(cfg.cores)  # before the engine and env workers start: they inherit it
        heap.keep_freed()  # sent messages reuse freed blocks (transport/heap.py)
        if bound:  # and the vLLM workers' OpenMP threads go to the same cores
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(bound, cfg.tensor_parallel)
        elif cfg.tensor_parallel > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            # vLLM's CPU backend binds one worker per NUMA node by itself: a core each instead
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding((), cfg.tensor_parallel)
        self._slots = asyncio.Queue()
        for slot in range(cfg.env_slot_offset, cfg.env_slot_offset + cfg.num_slots):
            self._slots.put_nowait(slot)
        self._room = asyncio.Semaphore(cfg.concurrency)
        self._budget_changed = asyncio.Event()
        pool = None
        if self.env is None and not cfg.env_address:  # the pool starts in a thread meanwhile
            pool = asyncio.get_running_loop().run_in_executor(None, self._build_pool)
        try:
            if self.engine is None:
                self._start_engine()
            self._weights = WeightUpdates(
                self.engine, actor_id=cfg.actor_id, version=cfg.initial_version,
                vision=self.vision is not None, counts=self.counts, times=self.times,
                adapters=AdapterUpdates(cfg.lora_keep, cfg.lora_probe_tolerance) if cfg.lora_rank else None)
            await self.engine.update_weight_version(str(self.version))
            if pool is not None:
                self._pool = await pool
                self.env = LocalEnvClient(self._pool)
            elif self.env is None:
                keys = None if cfg.env_curve is None else read_client(cfg.env_curve)
                self.env = self._services = FailoverEnvClient(
                    cfg.env_address, timeout_s=cfg.env_timeout_s, heartbeat_s=cfg.env_heartbeat_s,
                    grace_s=cfg.env_grace_s, curve=keys)
                await self._check_remote_slots()
            if cfg.env_pool.env_latency_s:
                self.env = LatencyEnvClient(self.env, cfg.env_pool.env_latency_s)
            if cfg.learner_address:
                self._sender = trajectory_sink(cfg.learner_address, cfg.actor_id,  # tcp:// or inproc://
                                               curve=cfg.learner_curve)
        except BaseException:
            if pool is not None and self._pool is None:
                await asyncio.wait([pool])  # let the pool finish starting, so close() stops it
                self._pool = None if pool.cancelled() or pool.exception() else pool.result()
            await self.close()
            raise
        self._idle_since = time.perf_counter()
        self.times["engine_start_s"] = time.perf_counter() - t0
        return {"start_s": self.times["engine_start_s"]}

    def _start_engine(self) -> None:
        from transformers import AutoTokenizer

        if self.tokenizer is None:
            self.tokenizer = AutoTokenizer.from_pretrained(self.cfg.model_path)
        self.vision = VisionTokens.from_pretrained(self.cfg.model_path)
        self.engine = build_engine(self.cfg, vision=self.vision is not None)

    def _build_pool(self) -> EnvPool:
        p = self.cfg.env_pool
        return EnvPool((self.cfg.env_name, resolve_config(self.cfg.env_name, self.cfg.env_config)),
                       num_workers=p.env_workers, envs_per_worker=p.envs_per_worker,
                       step_timeout_s=p.step_timeout_s, reset_timeout_s=p.reset_timeout_s,
                       start_timeout_s=p.start_timeout_s)

    async def _check_remote_slots(self) -> None:
        have = (await self.env.ping())["num_slots"]
        need = self.cfg.env_slot_offset + self.cfg.num_slots
        if have < need:
            raise ValueError(f"an env service of {self.cfg.env_address} has {have} slots, "
                             f"this actor needs slots up to {need}")

    async def stop(self) -> None:
        """Stop ``run``: no new episodes; those in flight are dropped (their env slots reset later)."""
        self._stopping = True
        driver = self._driver
        if driver is not None and not driver.done():
            driver.cancel()
            await asyncio.wait([driver])

    async def close(self) -> None:
        """Stop, flush the sender, shut the engine and the env pool down. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.stop()
        await asyncio.get_running_loop().run_in_executor(None, self._close_sender)
        if self.env is not None:
            await self.env.close()
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None  # vLLM's __del__ shuts down again: let it run now, not at exit
        if self._weights is not None:
            self._weights.close()
        if self._pool is not None:
            self._pool.close()

    def _close_sender(self) -> None:
        self._send_thread.shutdown(wait=True)  # the last send gives up within 0.5 s once closed
        if self._sender is not None:  # closed from no other thread than the one that sent
            self._sender.close(flush_s=5.0)

    # --- training episodes --------------------------------------------------------------------
    async def run(self, num_episodes: int | None = None) -> dict[str, Any]:
        """Play training episodes, ``concurrency`` at a time, sending each finished trajectory.
        Returns ``stats()`` after ``num_episodes`` have ended (sent or failed) or when ``stop`` is
        called. Raises what the engine raises; env failures only count."""
        self._require_started()
        if self._driver is not None and not self._driver.done():
            raise RuntimeError("run is already going")
        self._stopping = False
        self._driver = asyncio.create_task(self._drive(num_episodes))
        try:
            await self._driver
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        except BaseExceptionGroup as group:  # an episode's error (the others were cancelled)
            raise group.exceptions[0] from group
        return await self.stats()

    async def _drive(self, num_episodes: int | None) -> None:
        async with asyncio.TaskGroup() as tasks:
            for _ in itertools.count() if num_episodes is None else range(num_episodes):
                await self._within_budget()
                await self._room.acquire()
                seed, group_id = self._stream.next_member()
                self.counts["episodes_started"] += 1  # before the task runs: the budget sees it
                tasks.create_task(self._train_episode(seed, group_id, self._stream.last_member))

    async def set_episode_budget(self, budget: int | None) -> None:
        """Allow at most ``budget`` training episodes started and not failed (None: no limit).
        The supervisor raises it as the learner consumes batches, so the actor runs a few
        batches ahead of the learner at most: its episodes start close to the weights that will
        train on them, instead of filling the buffer with trajectories the staleness bound drops.
        """
        self._budget = budget
        if self._budget_changed is not None:
            self._budget_changed.set()

    async def _within_budget(self) -> None:
        while (self._budget is not None and
               self.counts["episodes_started"] - self.counts["episodes_failed"] >= self._budget):
            self._budget_changed.clear()
            await self._budget_changed.wait()

    async def _train_episode(self, seed: int, group_id: int, member: int) -> None:
        try:
            try:
                result = await self._play(seed, group_id, self.cfg.temperature, self.cfg.top_p,
                                          key=(group_id, member))
            except asyncio.CancelledError:
                self.counts["episodes_cancelled"] += 1
                raise
            except Exception as e:  # the engine's error, which ends run: this episode failed with it
                self.counts["episodes_failed"] += 1
                self.counts[f"failed/engine_{type(e).__name__}"] += 1
                raise
            if result.trajectory is None:
                self.counts["episodes_failed"] += 1
                self._budget_changed.set()  # a failed episode gives its place in the budget back
                self.counts[f"failed/{result.failure.split(':')[0]}"] += 1
            else:
                self.counts["episodes_done"] += 1
                self.times["generate_s"] += result.metrics["generate_s"]
                self.times["env_s"] += result.metrics["env_s"]
            if self._groups_held is not None:
                ready = self._groups_held.ended(group_id, result.trajectory)
            else:
                ready = [result.trajectory] if result.trajectory is not None else []
            if self._sender is not None and ready:
                loop = asyncio.get_running_loop()
                for trajectory in ready:  # sent even if run is stopped meanwhile
                    await asyncio.shield(loop.run_in_executor(self._send_thread, self._send, trajectory))
        finally:
            self._room.release()

    def _send(self, trajectory: Trajectory) -> None:
        """In the sender thread: wait for credit; once the actor is closing, for 0.5 s at most."""
        t0 = time.perf_counter()
        try:
            while True:
                try:
                    self._sender.send(trajectory, timeout_s=0.5)
                    return
                except TimeoutError:
                    if self._closed:
                        self.counts["episodes_unsent"] += 1
                        return
        finally:
            self.times["send_s"] += time.perf_counter() - t0

    async def _play(self, seed: int, group_id: int, temperature: float, top_p: float,
                    logprobs: bool = True, record: list[dict] | None = None, *,
                    key: tuple[int, ...], blind: bool = False) -> EpisodeResult:
        """One episode; ``key`` (non-negative ints) names it among the run's episodes and seeds
        its sampling (``_generator``)."""
        slot = await self._slots.get()
        try:
            return await run_episode(
                self._generator(temperature, top_p, logprobs, key), self.env, slot, seed, self.tokenizer,
                max_turns=self.cfg.max_turns, max_context=self.cfg.max_context, run_id=self.cfg.run_id,
                actor_id=self.cfg.actor_id, episode_id=next(self._episode_ids), group_id=group_id,
                env_name=self.cfg.env_name, vision=self.vision, record=record, blind=blind)
        except EnvServiceError as e:  # the remote service answered with an error: only this episode
            log.warning("env service error on slot %d: %s", slot, e)
            return EpisodeResult(None, failure="env_service_error")
        finally:
            self._slots.put_nowait(slot)

    # --- generation ---------------------------------------------------------------------------
    def _generator(self, temperature: float, top_p: float, logprobs: bool,
                   key: tuple[int, ...]) -> Generate:
        """One episode's answers. Each answer's sampling is seeded by the actor's seed, the
        episode's ``key`` and the turn, so an episode played again (a rerun, a resumed run)
        samples the same tokens wherever the weights and the context are the same."""
        turns = itertools.count()

        async def generate(ids: list[int], images: list[np.ndarray], room: int) -> Generation:
            seed = sampling_seed(self.cfg.seed, *key, next(turns)) if temperature > 0 else None
            params = sampling_params(temperature=temperature, top_p=top_p, detokenize=False,
                                     max_tokens=min(self.cfg.max_tokens, room),
                                     logprobs=0 if logprobs else None, seed=seed)
            request_id, final = f"actor{self.cfg.actor_id}-{next(self._request_ids)}", None
            self._busy(+1)
            try:
                async with self._weights.serving() as (version, extra):
                    async for output in self.engine.generate(vllm_prompt(ids, images, self.vision),
                                                             params, request_id, **extra):
                        final = output  # the stream's last output holds the whole answer
                        self._progress_at = time.perf_counter()
            finally:
                self._busy(-1)
            if images and list(final.prompt_token_ids) != ids:
                raise RuntimeError("vLLM expanded the images into other tokens than the context's")
            self.counts["tokens_generated"] += len(final.outputs[0].token_ids)
            # an adapter's request keeps its adapter to the end: its version, not the engine's spans
            return Generation.from_vllm(final.outputs[0], version, logprobs,
                                        spans=self._weights.adapters is None)

        return generate

    def _busy(self, delta: int) -> None:
        """Counts requests in flight; the engine is idle while there are none."""
        now = time.perf_counter()
        if self._requests == 0:
            self.times["idle_s"] += now - self._idle_since
            self._progress_at = now  # a stall is counted from the first request in flight
        self._requests += delta
        if self._requests == 0:
            self._idle_since = now

    # --- weights ------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The policy version the engine serves (``actors.initial_version`` until an update)."""
        return self.cfg.initial_version if self._weights is None else self._weights.version

    async def join_weight_group(self, address: str, rank: int, world_size: int,
                                timeout_s: float = 60.0) -> None:
        """Connect the engine's worker to the learner's weight channel at ``address`` (again
        after a failure): see actors/vllm_extension.py. Raises ``EngineDead``
        (actors/weight_updates.py) if the engine is dead: the actor must be replaced."""
        self._require_started()
        await self._weights.join_group(address, rank, world_size, timeout_s)

    async def update_weights(self, version: int) -> dict[str, float]:
        """Receive the learner's publish of ``version`` in flight; returns timings in seconds.
        ``WeightUpdates.update`` (actors/weight_updates.py) says how requests in flight pause and
        continue, and what each failure (``WeightUpdateError``, ``EngineDead``) leaves behind."""
        self._require_started()
        return await self._weights.update(version)

    # --- evaluation and statistics ------------------------------------------------------------
    async def evaluate(self, seeds: list[int], record: int = 0, samples: int = 0,
                       blind: bool = False) -> dict[str, Any]:
        """Episodes on held-out ``seeds``, not sent to the learner: one greedy episode a seed, and
        ``samples`` more sampled at the training temperature (``temperature``, ``top_p``), each
        seeded by its seed and its sample's number, so the same seeds give the same episodes on
        any number of actors. Returns every episode's outcome under ``outcomes`` (a failed
        one's too, with its reason: launch/run/evaluation.py counts it as a failure), in seed
        order, greedy first: ``{"seed", "sample" (-1 greedy, else 0..samples-1), "failure"
        (a reason or None), "success", "reward", "format_correct", "turns", the judge's
        ``*_score``}``. With ``record``, the greedy episodes of the first ``record`` seeds come
        back as plain data under ``episodes``, in seed order, failed ones too: ``{"seed",
        "failure", "metrics", "turns"}``, each turn actors/episode.py's ``turn_record``.
        ``blind``: the model sees every picture white (actors/episode.py's ``run_episode``)."""
        self._require_started()
        c = self.cfg
        plays = [(seed, -1) for seed in seeds] + [(seed, j) for seed in seeds for j in range(samples)]
        turns = [[] if sample < 0 and i < record else None for i, (_, sample) in enumerate(plays)]
        results = await asyncio.gather(*(
            self._play(seed, -1, 0.0 if sample < 0 else c.temperature, 1.0 if sample < 0 else c.top_p,
                       False, rec, key=(EVAL_KEY, seed, sample + 1), blind=blind)
            for (seed, sample), rec in zip(plays, turns)))
        out: dict[str, Any] = {"outcomes": [outcome(seed, sample, r) for (seed, sample), r in zip(plays, results)]}
        if record:
            out["episodes"] = [{"seed": seed, "failure": r.failure, "metrics": r.metrics, "turns": t}
                               for (seed, _), r, t in zip(plays[:record], results, turns)]
        return out

    async def stats(self) -> dict[str, Any]:
        """Counters since start: episodes, failures by reason, tokens, version, times (seconds)."""
        idle = self.times["idle_s"]
        if self._requests == 0:
            idle += time.perf_counter() - self._idle_since
        out: dict[str, Any] = {"actor_id": self.cfg.actor_id, "version": self.version,
                               "episodes_sent": self._sender.sent if self._sender else 0,
                               "incarnation": self.cfg.incarnation,
                               "groups_drawn": self._stream.drawn}
        out.update(self.counts)
        held = self._groups_held
        out["groups_partial"] = held.partial if held is not None else 0
        out["episodes_held"] = held.held if held is not None else 0
        out.update({f"time/{k}": v for k, v in self.times.items()})
        out["time/idle_s"] = idle
        if self._services is not None:  # remote envs: how many services answer
            health = self._services.health()
            out["env_services_live"], out["env_services_down"] = len(health["live"]), len(health["down"])
        if self._pool is not None and not self._closed:  # a remote service's stats are its own
            out.update({f"env/{k}": v for k, v in self._pool.stats().items()})
        return out

    async def liveness(self) -> dict[str, Any]:
        """Answered by the actor's event loop, so no answer means the loop is blocked. ``stalled_s``:
        seconds since the engine last yielded output while requests were in flight (0 with none);
        ``engine_dead``: the engine reports itself dead (its requests will never finish)."""
        stalled = time.perf_counter() - self._progress_at if self._requests else 0.0
        return {"requests": self._requests, "stalled_s": round(stalled, 1),
                "engine_dead": self._weights is not None and self._weights.engine_dead}

    def _require_started(self) -> None:
        if not self._started or self._closed:
            raise RuntimeError("the actor is not started (or already closed)")

