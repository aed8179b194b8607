"""The env worker pool: N worker processes x M envs each = N*M env slots, driven in batches.

Called by actors (through ``LocalEnvClient`` or, across machines, the env service in
envs/service.py). This module is the parent side only: the worker process is envs/worker.py, the
result types and their wire form are envs/wire.py. A slot is a global index ``s``; it lives in
worker ``s // M`` as env ``s % M``.

Invariants:
- A batched call sends one request to each worker involved, then collects: workers run in
  parallel. Calls from several threads run in parallel when they touch different workers (one lock
  per worker, taken in order); calls on one worker are serialised.
- Every slot of a call gets a result or an ``EpisodeFailure``, never silence: an env that raises
  -> ``"env_error: <ExcType>: <msg>"`` (the worker lives on; the env is reset on its next reset);
  a worker that dies -> ``"worker_crashed"``; a worker that does not answer within the call's
  timeout -> ``"timeout"``. A dead or hung worker is SIGKILLed by pid (only processes this pool
  started) and replaced before the call returns. Its other active episodes end too: their next
  step or state_text returns the same failure, after which the slot needs a reset.
- A replacement that does not start (its envs fail to build, or take longer than
  ``start_timeout_s``) leaves the worker down, counted in ``worker_start_failures``: calls on
  its slots return ``EpisodeFailure("worker_down")`` and the next call touching it tries again
  (at most once every ``start_timeout_s``). Only the pool's first start raises.
- Stepping a slot without an episode (never reset, or after its failure was reported) returns
  ``EpisodeFailure("no_episode")`` without touching the worker.

Why multiprocessing Pipes and not ZeroMQ PAIR over ipc: one peer per channel is all we need;
``multiprocessing.connection.wait`` waits on the pipes *and* the process sentinels at once, so a
dead worker is noticed at once, not at the timeout; and there are no socket files to clean up.
Only bytes cross the pipe (``send_bytes``/``recv_bytes`` of transport/codec.py msgpack); pickle
is used only by multiprocessing to start a worker (the factory spec: a name and a config dict).
The default start method is forkserver: a worker is a fork of a small clean server (no threads,
no sockets, no CUDA state inherited), so restarting one costs milliseconds, not an interpreter.
Like every spawn/forkserver user, a script that builds a pool needs an ``if __name__ ==
"__main__":`` guard (each worker imports the main module).
"""

from __future__ import annotations

import multiprocessing as mp
import operator
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from envs.registry import EnvFactory
from envs.wire import EpisodeFailure, from_wire
from envs.worker import MAX_PIPE_BYTES, worker_main
from transport.codec import CodecError, decode, encode

STATS = ("resets", "steps", "env_errors", "timeouts", "worker_crashes", "worker_restarts",
         "worker_start_failures", "failed_episodes")
"""resets/steps: successful ones; env_errors: env exceptions; timeouts / worker_crashes: workers
killed for hanging / found dead; worker_restarts: replacements started; worker_start_failures:
replacements that did not start (the worker stays down until one does); failed_episodes: episodes
(or requested resets) that ended in an EpisodeFailure, counted once when they fail."""
ACTIVE = "active"
WORKER_CRASHED, TIMEOUT, NO_EPISODE = "worker_crashed", "timeout", "no_episode"
WORKER_DOWN = "worker_down"


class EnvPoolError(RuntimeError):
    """The pool cannot work: a worker failed to start, or the pool is closed."""


@dataclass
class _Worker:
    process: Any
    conn: Any


class EnvPool:
    """Env slots in worker processes. Use as a context manager, or call ``close()``."""

    def __init__(self, factory: EnvFactory, *, num_workers: int, envs_per_worker: int,
                 step_timeout_s: float = 30.0, reset_timeout_s: float = 30.0,
                 start_timeout_s: float = 120.0, start_method: str = "forkserver") -> None:
        if num_workers < 1 or envs_per_worker < 1:
            raise ValueError("num_workers and envs_per_worker must be >= 1")
        self.factory = (factory[0], dict(factory[1]))
        self.num_workers, self.envs_per_worker = num_workers, envs_per_worker
        self.num_slots = num_workers * envs_per_worker
        self.step_timeout_s, self.reset_timeout_s = step_timeout_s, reset_timeout_s
        self.start_timeout_s = start_timeout_s
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(["envs.worker"])
        self._locks = [threading.Lock() for _ in range(num_workers)]
        self._stats_lock = threading.Lock()
        self._stats = dict.fromkeys(STATS, 0)
        self._episode: list[str | None] = [None] * self.num_slots  # ACTIVE, None, or a lost reason
        self._workers: list[_Worker] = []
        self._down: dict[int, float] = {}
        """Workers whose replacement did not start: the time of the last try."""
        self._closed = False
        try:
            for _ in range(num_workers):  # start them all, then wait: they start in parallel
                self._workers.append(self._spawn())
            for w in self._workers:
                self._await_ready(w)
        except BaseException:
            self.close()
            raise

    # --- public calls -------------------------------------------------------------------------
    def reset(self, slots: list[int], seeds: list[int]) -> list:
        """Start the episodes ``seeds`` determine. Returns ``Observation | EpisodeFailure`` per slot."""
        return self._call("reset", slots, [int(s) for s in seeds], self.reset_timeout_s)

    def step(self, slots: list[int], texts: list[str]) -> list:
        """One turn per slot. Returns ``StepResult | EpisodeFailure`` per slot."""
        return self._call("step", slots, [str(t) for t in texts], self.step_timeout_s)

    def system_prompt(self, slot: int) -> str | EpisodeFailure:
        return self._call("system_prompt", [slot], [None], self.step_timeout_s)[0]

    def state_text(self, slot: int) -> str | EpisodeFailure:
        return self._call("state_text", [slot], [None], self.step_timeout_s)[0]

    def stats(self) -> dict[str, int]:
        with self._stats_lock:
            return dict(self._stats)

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    # --- batched exchange -----------------------------------------------------------------------
    def _call(self, op: str, slots: list[int], args: list, timeout: float) -> list:
        if self._closed:
            raise EnvPoolError("the pool is closed")
        slots = [operator.index(s) for s in slots]
        if len(slots) != len(args) or len(set(slots)) != len(slots):
            raise ValueError("slots must be distinct and match the arguments one to one")
        if not all(0 <= s < self.num_slots for s in slots):
            raise ValueError(f"slots must be in [0, {self.num_slots})")
        groups: dict[int, list[int]] = {}
        for i, slot in enumerate(slots):
            groups.setdefault(slot // self.envs_per_worker, []).append(i)
        locks = [self._locks[w] for w in sorted(groups)]
        for lock in locks:
            lock.acquire()
        try:
            return self._exchange(op, slots, args, groups, timeout)
        finally:
            for lock in locks:
                lock.release()

    def _exchange(self, op, slots, args, groups, timeout: float) -> list:
        results: list = [None] * len(slots)
        if op in ("step", "state_text"):
            for i, slot in enumerate(slots):
                if self._episode[slot] != ACTIVE:
                    results[i] = self._no_episode(slot)
        requests = {}  # encode them all before sending any: an error then leaves no reply unread
        for w, idxs in groups.items():
            idxs = [i for i in idxs if results[i] is None]
            if idxs and w in self._down and not self._retry(w):
                self._fill(results, idxs, EpisodeFailure(WORKER_DOWN))
                if op == "reset":
                    self._count("failed_episodes", len(idxs))
                continue
            if idxs:
                requests[w] = idxs, encode({"op": op, "envs": [slots[i] % self.envs_per_worker for i in idxs],
                                            "args": [args[i] for i in idxs]})
        pending: dict[int, list[int]] = {}
        deadline = time.monotonic() + timeout  # from the sends: a restart above is not the call's
        for w, (idxs, request) in requests.items():
            try:
                self._workers[w].conn.send_bytes(request)
                pending[w] = idxs
            except OSError:  # its pipe is broken: the worker is dead
                self._fill(results, idxs, self._worker_failed(w, WORKER_CRASHED, op, slots, idxs))
        try:
            self._collect(op, slots, pending, results, deadline)
        except BaseException:  # e.g. KeyboardInterrupt: an unread reply would answer the next call
            for w in pending:
                _stop(self._workers[w], grace_s=0.0)  # so the next call finds it dead and replaces it
            raise
        return results

    def _collect(self, op, slots, pending: dict[int, list[int]], results: list, deadline: float) -> None:
        """Receive the pending workers' replies; pops each worker from ``pending`` once settled."""
        while pending:
            handles = {}
            for w in pending:
                handles[self._workers[w].conn] = handles[self._workers[w].process.sentinel] = w
            ready = wait(list(handles), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for w in {handles[h] for h in ready}:
                replies = self._receive(w, len(pending[w]))
                idxs = pending.pop(w)
                if replies is None:
                    self._fill(results, idxs, self._worker_failed(w, WORKER_CRASHED, op, slots, idxs))
                    continue
                for i, reply in zip(idxs, replies):
                    results[i] = self._settle(op, slots[i], reply)
        while pending:
            w, idxs = pending.popitem()
            self._fill(results, idxs, self._worker_failed(w, TIMEOUT, op, slots, idxs))

    def _receive(self, w: int, n: int) -> list | None:
        """The worker's n replies, or None if it is dead or spoke garbage."""
        conn = self._workers[w].conn
        try:
            if not conn.poll():  # woken by its sentinel with nothing to read: it died
                return None
            replies = [from_wire(d) for d in decode(conn.recv_bytes(), max_bytes=MAX_PIPE_BYTES)]
        except (EOFError, OSError, CodecError, TypeError):
            return None
        return replies if len(replies) == n else None

    def _settle(self, op: str, slot: int, reply):
        if isinstance(reply, EpisodeFailure):
            self._count("env_errors")
            if op != "system_prompt":
                if op == "reset" or self._episode[slot] == ACTIVE:
                    self._count("failed_episodes")
                self._episode[slot] = None
        elif op == "reset":
            self._episode[slot] = ACTIVE
            self._count("resets")
        elif op == "step":
            self._count("steps")
        return reply

    def _no_episode(self, slot: int) -> EpisodeFailure:
        reason = self._episode[slot] or NO_EPISODE  # a lost episode reports why, once
        self._episode[slot] = None
        return EpisodeFailure(reason)

    def _worker_failed(self, w, reason, op, slots, idxs) -> EpisodeFailure:
        """Kill and replace worker w; end every episode it held. Returns the failure for the call."""
        self._count("timeouts" if reason == TIMEOUT else "worker_crashes")
        in_call = {slots[i] for i in idxs}
        for slot in range(w * self.envs_per_worker, (w + 1) * self.envs_per_worker):
            active = self._episode[slot] == ACTIVE
            if active or (slot in in_call and op == "reset"):
                self._count("failed_episodes")
            self._episode[slot] = reason if active and slot not in in_call else None
        self._replace(w)
        return EpisodeFailure(reason)

    @staticmethod
    def _fill(results: list, idxs: list[int], failure: EpisodeFailure) -> None:
        for i in idxs:
            results[i] = failure

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self._stats[key] += n

    # --- worker processes ---------------------------------------------------------------------
    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe()
        process = self._ctx.Process(target=worker_main, daemon=True, name="env-worker",
                                    args=(child_conn, self.factory, self.envs_per_worker))
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn)

    def _await_ready(self, worker: _Worker) -> None:
        try:
            if not worker.conn.poll(self.start_timeout_s):
                raise EnvPoolError(f"env worker did not start within {self.start_timeout_s} s")
            msg = decode(worker.conn.recv_bytes())
        except (EOFError, OSError, CodecError):
            raise EnvPoolError("env worker died while starting") from None
        if "init_error" in msg:
            raise EnvPoolError(f"env factory {self.factory[0]!r} failed: {msg['init_error']}")

    def _replace(self, w: int) -> bool:
        """Stop worker w and start another; False (the worker is down) if it does not start."""
        _stop(self._workers[w], grace_s=0.0)
        if self._closed:
            return False
        self._workers[w] = self._spawn()
        self._count("worker_restarts")
        try:
            self._await_ready(self._workers[w])
        except EnvPoolError:
            _stop(self._workers[w], grace_s=0.0)
            self._count("worker_start_failures")
            self._down[w] = time.monotonic()
            return False
        self._down.pop(w, None)
        return True

    def _retry(self, w: int) -> bool:
        """A down worker: try to start it again once ``start_timeout_s`` has passed since the
        last try. True if it is up."""
        if time.monotonic() - self._down[w] < self.start_timeout_s:
            return False
        return self._replace(w)

    def close(self) -> None:
        """Stop every worker: ask politely, then SIGKILL whoever is still there after 1 s."""
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            try:
                w.conn.send_bytes(encode({"op": "close"}))
            except OSError:
                pass
        deadline = time.monotonic() + 1.0
        for w in self._workers:
            _stop(w, grace_s=max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()


def _stop(worker: _Worker, grace_s: float) -> None:
    """Join the worker, SIGKILL it by pid if it is still alive after ``grace_s``, and reap it."""
    worker.process.join(grace_s)
    if worker.process.is_alive():
        worker.process.kill()
        worker.process.join()
    worker.conn.close()
