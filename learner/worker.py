"""One learner rank: the FSDP process group, the trainer, and on rank 0 the stream and the publisher.

The launcher (launch/topology/ray_cluster.py) wraps ``LearnerWorker`` as a Ray actor, one per rank, and
drives every rank with the same calls in the same order (``train_step``, ``publish_weights``,
``save_checkpoint`` ...): each is collective over the learner's process group. No Ray here.

Rank 0 alone owns the I/O (``Inbox``): a thread that polls the ``TrajectorySource`` without
pause, so actors never wait on the learner's compute for their credit, and feeds the
``TrajectoryBuffer`` (staleness bound). ZeroMQ sockets are not thread-safe, so credit returns
(the buffer's ``release``) are queued to that thread, never sent from the training thread.

Invariants:
- ``version`` = optimizer steps taken = the version of the weights the next publish carries;
  a trajectory's staleness is measured against it when its batch is taken;
- every rank trains on the same list of trajectories, broadcast from rank 0 over a gloo group
  (objects are trusted here: they were validated when they came off the wire);
- accounting, per actor: received == taken + dropped + buffered (see learner/buffer.py), across
  resumes too (a checkpoint carries the counters);
- per incarnation of an actor (``Trajectory.origin``): what this run received from it, for the
  driver's episode ledger (launch/run/supervisor.py). Not carried by a checkpoint: the driver
  settles a checkpoint's with the incarnations it retires. At most ``MAX_ORIGINS`` keys; later
  ones share ``others``.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from learner.buffer import TrajectoryBuffer
from learner.config import WorkerConfig
from learner.door import REASONS, Door
from learner.trainer import Trainer
from transport import heap
from transport.channels import WeightSource, trajectory_source, weight_source
from transport.cores import bind_cores
from transport.liveness import Activity
from transport.output import redirect_output
from transport.receiving import bounded_key
from transport.schema import Trajectory
from transport.security import ServerKeys
from transport.weights import listening_store

log = logging.getLogger(__name__)

MAX_ORIGINS = 4096
"""The most incarnations ``Inbox.by_origin`` counts apart (senders cannot grow it without bound)."""


def _reported(method):
    """Mark a driver's call as this rank's current op while it runs (``LearnerWorker.liveness``)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self.activity.doing(method.__name__):
            return method(self, *args, **kwargs)
    return call


def join_learner_group(backend: str, rank: int, world_size: int, master_addr: str | None,
                       master_port: int, timeout_s: float) -> None:
    """The learner ranks' default process group. Every collective on it fails after
    ``timeout_s`` (``learner.dist_timeout_s``) instead of waiting for a rank that never comes:
    gloo raises; on NCCL torch's watchdog aborts the collective and ends the process (its
    default ``TORCH_NCCL_ASYNC_ERROR_HANDLING``), which the driver sees as a dead rank.
    ``master_addr`` None: a group of one rank on an in-memory store (no socket)."""
    timeout = timedelta(seconds=timeout_s)
    if master_addr is None:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return
    # Rank 0's store listens on master_addr only (init_method=tcp:// would listen on every
    # interface of the node).
    store = (listening_store(master_addr, master_port, timeout_s) if rank == 0
             else dist.TCPStore(master_addr, master_port, is_master=False, timeout=timeout))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


class Inbox:
    """Rank 0's receiving thread: stream -> door -> buffer, with credit returned from this thread
    only. ``door`` (learner/door.py) refuses what the learner cannot train on, at ``version()``
    (the learner's policy version now); None: everything the stream accepts enters."""

    def __init__(self, address: str, *, max_staleness: int, on_stale: str = "drop",
                 window_bytes: int = 8 << 20, group_size: int = 1, partial_groups: str = "train",
                 curve: ServerKeys | None = None, door: Door | None = None,
                 version: Callable[[], int] = lambda: 0) -> None:
        # tcp:// or inproc://; CurveZMQ keys (transport/security.py) on tcp:// only
        self.receiver = trajectory_source(address, window_bytes=window_bytes, curve=curve)
        self.address = self.receiver.address
        self.refused: dict[str, int] = {}
        """Connections the stream refused (no or unknown CurveZMQ keys), by reason."""
        self._releases: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
        self.buffer = TrajectoryBuffer(max_staleness=max_staleness, on_stale=on_stale,
                                       release=lambda actor, n: self._releases.put((actor, n)),
                                       group_size=group_size, partial_groups=partial_groups)
        self.door, self._version = door, version
        self.by_origin: Counter[str] = Counter()
        """Trajectories received per actor incarnation (``Trajectory.origin``), refused ones too."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="learner-inbox", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                items = self.receiver.poll(0.02)
                refused = dict(self.receiver.refused)  # from this thread: it owns the socket
                with self._lock:
                    self.refused = refused
                    for actor, trajectory, nbytes in items:
                        self.by_origin[bounded_key(self.by_origin, trajectory.origin, "others", MAX_ORIGINS)] += 1
                        refusal = self.door and self.door.refusal(trajectory, self._version())
                        if refusal:
                            self._refuse(actor, refusal, nbytes)
                        else:
                            self.buffer.put(actor, trajectory, nbytes)
                while True:
                    try:
                        actor, n = self._releases.get_nowait()
                    except queue.Empty:
                        break
                    self.receiver.release(actor, n)
        finally:
            self.receiver.close()

    def _refuse(self, actor: str, reason: str, nbytes: int) -> None:
        if not any(k.startswith("refused/") for k in self.buffer.dropped):
            log.warning("refusing a trajectory from %s: %s (logged once; counted as "
                        "buffer/refused_<reason>)", actor, reason)
        self.buffer.refuse(actor, reason, nbytes)

    def take(self, n: int, version: int, timeout_s: float) -> list[Trajectory] | None:
        """``n`` trajectories within the staleness bound of ``version``, or None at the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                batch = self.buffer.take(n, version)
            if batch is not None or time.monotonic() > deadline:
                return batch
            time.sleep(0.01)

    def stats(self, version: int) -> dict[str, float]:
        with self._lock:
            b = self.buffer
            staleness = b.staleness(version)
            return {
                "stream/received": float(sum(b.received.values())),  # the checkpoint's too
                "stream/rejected": float(sum(v for k, v in self.receiver.rejected.items() if "/" not in k)),
                "stream/refused": float(sum(self.refused.values())),
                "buffer/taken": float(sum(b.taken.values())),
                "buffer/dropped": float(sum(b.dropped.values())),
                "buffer/dropped_stale": float(b.dropped["stale"]),
                "buffer/dropped_partial_group": float(b.dropped["partial_group"]),
                "buffer/dropped_incomplete_group": float(b.dropped["incomplete_group"]),
                "buffer/dropped_resumed": float(b.dropped["resumed"]),
                "buffer/partial_groups": float(b.partial_groups_taken),
                "buffer/stale_kept": float(b.stale_kept),
                "buffer/size": float(len(b)),
                "buffer/bytes": float(b.bytes),
                "buffer/staleness_max": float(max(staleness, default=0)),
                "buffer/refused": float(sum(b.dropped[f"refused/{r}"] for r in REASONS)),
                **{f"buffer/refused_{r}": float(b.dropped[f"refused/{r}"]) for r in REASONS},
            }

    def per_actor(self) -> dict[str, dict[str, int]]:
        with self._lock:
            b = self.buffer
            return {a: {"received": b.received[a], "taken": b.taken[a],
                        "dropped": b.dropped_by_actor[a]} for a in b.received}

    def received_by_origin(self) -> dict[str, int]:
        with self._lock:
            return dict(self.by_origin)

    def counters(self) -> dict[str, Any]:
        """The buffer's counters and ``received_by_origin`` (which ``carry`` leaves alone)."""
        with self._lock:
            return {**self.buffer.counters(), "received_by_origin": dict(self.by_origin)}

    def carry(self, saved: dict[str, Any]) -> None:
        with self._lock:
            self.buffer.carry(saved)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class LearnerWorker:
    """One learner rank; see the module docstring and learner/config.py's ``WorkerConfig``."""

    def __init__(self, rank: int, world_size: int, config: WorkerConfig) -> None:
        self.rank, self.world_size = rank, world_size
        self.config = config
        self.version = 0
        self.trainer: Trainer | None = None
        self.inbox: Inbox | None = None
        self.publisher: WeightSource | None = None
        self._objects = None
        self._last_batch: list[Trajectory] = []
        self.activity = Activity()

    def liveness(self, stacks: bool = False) -> dict[str, Any]:
        """This rank's op now and for how long (transport/liveness.py), with every thread's
        stack if asked. The Ray topology calls it on a concurrency group of its own, so it is
        answered while a call hangs."""
        return {"rank": self.rank, **self.activity.report(stacks)}

    @_reported
    def setup(self, master_addr: str | None, master_port: int = 0, *,
              stream_address: str | None = None, weight_address: str = "tcp://127.0.0.1:0",
              weight_world_size: int = 1, device: str = "cpu",
              stream_curve: ServerKeys | None = None) -> dict[str, Any]:
        """Join the FSDP group and build the trainer; rank 0 also binds the stream and the weight
        channel (transport/channels.py: ``tcp://`` or ``inproc://`` each) and returns both
        addresses, ports resolved. ``master_addr`` None: a group of one rank on an in-memory
        store (no socket), for the single-process topology. ``stream_curve``: the stream's
        CurveZMQ server keys (transport/security.py), None for none."""
        cfg = self.config
        redirect_output(cfg.log_file)
        backend = "nccl" if device.startswith("cuda") else "gloo"
        timeout = timedelta(seconds=cfg.dist_timeout_s)
        if device.startswith("cuda"):
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        if master_addr is None and self.world_size != 1:
            raise ValueError(f"an in-process group has one rank, not {self.world_size}")
        join_learner_group(backend, self.rank, self.world_size, master_addr, master_port, cfg.dist_timeout_s)
        self._objects = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
        cores = bind_cores(cfg.cores)
        heap.keep_freed()  # the stream's messages reuse freed blocks; train_step trims
        if cfg.threads or cores:
            torch.set_num_threads(cfg.threads or len(cores))
        self.trainer = Trainer(cfg.trainer, device=device)
        out: dict[str, Any] = {"rank": self.rank}
        if self.rank == 0:
            self.inbox = Inbox(stream_address or "tcp://127.0.0.1:0",
                               max_staleness=cfg.max_staleness, on_stale=cfg.on_stale,
                               window_bytes=cfg.window_bytes, group_size=cfg.group_size,
                               partial_groups=cfg.partial_groups, curve=stream_curve,
                               door=Door(self.trainer.vocab_size, cfg.max_tokens),
                               version=lambda: self.version)
            self.publisher = weight_source(weight_address, world_size=weight_world_size,
                                           backend=backend, timeout_s=cfg.weight_timeout_s,
                                           bucket_bytes=cfg.weight_bucket_bytes)
            out.update(stream_address=self.inbox.address, weight_address=self.publisher.address)
        return out

    def free_port(self) -> int:
        """A TCP port free on this rank's node now (rank 0's: the ranks' rendezvous)."""
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    @_reported
    def train_step(self, batch_size: int, timeout_s: float) -> dict[str, float]:
        """Take ``batch_size`` trajectories (rank 0), share them, train; collective.

        Returns {} on every rank when no full batch arrived within the timeout (nothing trained).
        """
        t0 = time.perf_counter()
        box: list[Any] = [None]
        if self.rank == 0:
            box[0] = self.inbox.take(batch_size, self.version, timeout_s)
        if self.world_size > 1:
            dist.broadcast_object_list(box, src=0, group=self._objects)
        trajectories = box[0]
        if trajectories is None:
            return {}
        self.activity.op = "train_step (training on its batch)"
        waited = time.perf_counter() - t0
        metrics = self.trainer.train_step(trajectories, self.version)
        self.version += 1
        self._last_batch = trajectories
        t_trim = time.perf_counter()
        heap.trim()  # this step's (and the last publish's) freed blocks: see transport/heap.py
        metrics["timing/trim_s"] = time.perf_counter() - t_trim
        metrics.update(_episode_metrics(trajectories))
        metrics["timing/wait_batch_s"] = waited
        metrics["learner/version"] = float(self.version)
        if self.inbox is not None:
            metrics.update(self.inbox.stats(self.version))
        return metrics

    @_reported
    def publish_weights(self) -> dict[str, float]:
        """Broadcast the current weights (with LoRA: the adapter and its probe) as
        ``self.version``; collective over the learner ranks (each tensor is gathered from its
        shards as the broadcast reaches it, in buckets of ``weight_bucket_bytes``), and over
        the weight group (the actors receive at once)."""
        t0 = time.perf_counter()
        specs, tensors, stats = self.trainer.weights_for_publish()
        try:
            if self.publisher is not None:
                self.publisher.publish(tensors, self.version, specs=specs)
        finally:  # the other ranks gather with this one to the last tensor, also after a failure
            for _ in tensors:
                pass
        return {**stats, "weights/publish_s": time.perf_counter() - t0,
                "weights/version": float(self.version)}

    @_reported
    def reform_weight_group(self, world_size: int) -> int:
        """After a failed push or an actor restart: a new generation of the weight group."""
        return self.publisher.reform(world_size) if self.publisher is not None else -1

    def accounting(self) -> dict[str, dict[str, int]]:
        return self.inbox.per_actor() if self.inbox is not None else {}

    def received_by_origin(self) -> dict[str, int]:
        """Per actor incarnation (``"<actor_id>/<incarnation>"``): trajectories this run received."""
        return self.inbox.received_by_origin() if self.inbox is not None else {}

    @_reported
    def save_checkpoint(self, path: str, extra: Mapping[str, Any]) -> None:
        """The trainer's checkpoint with ``extra``, the version, and rank 0's buffer counters
        (learner/buffer.py: what is buffered counts as dropped on resume)."""
        own = {"buffer": self.inbox.counters()} if self.inbox is not None else {}
        self.trainer.save_checkpoint(path, {**extra, "version": self.version, **own})

    @_reported
    def load_checkpoint(self, path: str) -> dict[str, Any]:
        extra = self.trainer.load_checkpoint(path)
        self.version = int(extra["version"])
        if self.inbox is not None and "buffer" in extra:
            self.inbox.carry(extra["buffer"])
        return extra

    def read_probe(self, path: str) -> str | None:
        """The text of the file at ``path`` as this rank's node sees it, None where it cannot
        read one: the driver checks that every rank sees the checkpoint directory it writes."""
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except OSError:
            return None

    def samples_text(self, n: int) -> str:
        """The first ``n`` trajectories of the last batch as readable text: the model's tokens
        between [policy v<version>] and [/policy], everything else as the model saw it."""
        if not self._last_batch or n <= 0:
            return ""
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.trainer.cfg.model_path)
        return "\n\n".join(_readable(t, tok) for t in self._last_batch[:n])

    @_reported
    def save_hf(self, path: str) -> None:
        self.trainer.save_hf(path)

    def close(self) -> None:
        if self.inbox is not None:
            self.inbox.close()
            self.inbox = None
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None
        if dist.is_initialized():
            dist.destroy_process_group()


def _episode_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Means of the actors' per-episode metrics (success, reward, turns, ...) over the batch."""
    keys = set().union(*(t.metrics for t in trajectories))
    out = {f"rollout/{k}": sum(t.metrics.get(k, 0.0) for t in trajectories) / len(trajectories)
           for k in sorted(keys)}
    versions = [int(v) for t in trajectories for v in (t.policy_version[t.loss_mask].min(),
                                                         t.policy_version[t.loss_mask].max())
                if t.loss_mask.any()]
    if versions:
        out["policy/version_min"], out["policy/version_max"] = float(min(versions)), float(max(versions))
    return out


def _readable(t: Trajectory, tokenizer) -> str:
    head = (f"=== episode {t.episode_id} (actor {t.actor_id}, seed {t.seed}, group {t.group_id}) "
            f"turn rewards {[round(float(r), 3) for r in t.turn_rewards]} ===\n")
    parts, start = [], 0
    mask = t.loss_mask
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            text = tokenizer.decode(t.token_ids[start:i].tolist())
            if mask[start]:
                text = f"[policy v{int(t.policy_version[start])}]{text}[/policy]"
            parts.append(text)
            start = i
    return head + "".join(parts)
