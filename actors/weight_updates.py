"""The inference actor's weight updates: its vLLM workers join the learner's weight group and
receive each publish in flight (actors/vllm_extension.py does the receiving inside the workers).

Held by actors/actor.py's ``InferenceActor``, which builds one when it starts (once its engine
exists) and delegates its ``join_weight_group`` and ``update_weights`` to it. ``WeightUpdates``
owns the version the engine serves and the lock that lets one update run at a time; it adds to
the actor's counters (``weight_updates``, ``weight_update_failures``, ``weights_torn``,
``weights_s``), which the actor reports in its stats.

Invariant: no call into the engine outlives the engine. A call into a dead engine core may never
return (vLLM's pending utility calls are not failed when its process dies), so every call here
is watched: once the engine reports itself dead (``errored``), the call is cancelled and
``EngineDead`` raised, which tells the supervisor to replace the actor rather than ask the dead
engine to join the weight group again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


HEALTH_POLL_S = 0.5
"""How often a call into the engine checks that the engine is still alive."""


class WeightUpdateError(RuntimeError):
    """A weight update failed; ``update_weights`` says which weights the engine serves then."""


class EngineDead(RuntimeError):
    """The actor's engine is dead (its engine core process is gone): the actor must be replaced;
    no weight group can be joined and no update received through it."""


class WeightUpdates:
    """One engine's weight group membership and weight updates, and the version it serves."""

    def __init__(self, engine, *, actor_id: int, version: int, vision: bool,
                 counts: Counter[str], times: Counter[str]) -> None:
        """``engine``: the actor's AsyncLLM (or its in-process stand-in), serving ``version``.
        ``vision``: the model is a VLM, whose answers in flight finish before an update and
        whose encoder cache is reset after one. ``counts`` and ``times``: the actor's counters,
        shared, not copied. ``actor_id`` labels errors and warnings."""
        self.engine, self.actor_id, self.vision = engine, actor_id, vision
        self.version = version
        """The version the engine serves: the last one it received in full."""
        self.counts, self.times = counts, times
        self._lock = asyncio.Lock()

    async def join_group(self, address: str, rank: int, world_size: int, timeout_s: float) -> None:
        """Connect the engine's worker to the learner's weight channel at ``address`` (again
        after a failure): see actors/vllm_extension.py. ``EngineDead`` if the engine is."""
        await self._watched(self.engine.collective_rpc(
            "join_weight_group", args=(address, rank, world_size, timeout_s)))

    @property
    def engine_dead(self) -> bool:
        """The engine reports itself dead (vLLM's ``errored``; an engine without it never is)."""
        return bool(getattr(self.engine, "errored", False))

    async def _watched(self, call: Awaitable[T]) -> T:
        """``call``'s result, or ``EngineDead`` as soon as the engine is (the call cancelled)."""
        if self.engine_dead:
            _close(call)
            raise EngineDead(f"actor {self.actor_id}: its engine is dead")
        task = asyncio.ensure_future(call)
        while True:
            done, _ = await asyncio.wait({task}, timeout=HEALTH_POLL_S)
            if done:
                try:
                    return task.result()
                except Exception as e:
                    if self.engine_dead or type(e).__name__ == "EngineDeadError":  # vLLM's
                        raise EngineDead(f"actor {self.actor_id}: its engine died: {e}") from e
                    raise
            if self.engine_dead:
                task.cancel()
                raise EngineDead(f"actor {self.actor_id}: its engine died during the call")

    async def update(self, version: int) -> dict[str, float]:
        """Receive the learner's publish of ``version`` in flight; returns timings in seconds.

        Requests in flight are kept: they pause, and continue on the new weights with their KV
        recomputed. The learner publishes concurrently (the receive blocks until it does, at most
        the group's timeout). Raises ``WeightUpdateError`` on failure: generation resumes on the
        old weights if none of the new ones was loaded; if some were (the weights arrive and
        load bucket by bucket), it stays paused (``weights_torn`` counts it) until the next
        complete update. Either way: re-form the group, ``join_group`` and update again.
        Raises ``EngineDead`` instead, within a second of it, if the engine dies (before or
        during the update): the actor must be replaced, not asked to join again.
        """
        try:
            return await self._update(version)
        except EngineDead:
            self.counts["weight_update_failures"] += 1
            raise

    async def _update(self, version: int) -> dict[str, float]:
        async with self._lock:
            t0 = time.perf_counter()
            # A VLM's answers in flight finish first: none is preempted (actors/vision.py says why).
            await self._watched(self.engine.pause_generation(mode="wait" if self.vision else "keep"))
            t1 = time.perf_counter()
            try:
                received = await self._watched(self.engine.collective_rpc("receive_weights"))
            except EngineDead:
                self.times["weights_s"] += time.perf_counter() - t0
                raise
            except Exception as e:
                self.counts["weight_update_failures"] += 1
                self.times["weights_s"] += time.perf_counter() - t0
                if await self._weights_intact():
                    await self._watched(self.engine.resume_generation())
                    raise WeightUpdateError(f"actor {self.actor_id}: receiving version "
                                            f"{version} failed, still serving version "
                                            f"{self.version}: {e}") from e
                self.counts["weights_torn"] += 1  # part of the new weights is loaded: stay paused
                raise WeightUpdateError(f"actor {self.actor_id}: receiving version {version} "
                                        f"failed half-way; generation stays paused until a "
                                        f"complete update: {e}") from e
            t2 = time.perf_counter()
            got = int(received[0])
            if got != version:  # label the truth: the tokens are sampled with what arrived
                log.warning("actor %d asked for version %d, received %d", self.actor_id, version, got)
            await self._watched(self.engine.reset_prefix_cache(reset_running_requests=True))
            if self.vision:  # the old vision tower's image embeddings
                await self._watched(self.engine.reset_encoder_cache())
            await self._watched(self.engine.update_weight_version(str(got)))
            self.version = got
            await self._watched(self.engine.resume_generation())
            t3 = time.perf_counter()
        self.counts["weight_updates"] += 1
        self.times["weights_s"] += t3 - t0
        return {"version": got, "pause_s": t1 - t0, "receive_s": t2 - t1, "total_s": t3 - t0}

    async def _weights_intact(self) -> bool:
        try:
            return all(await self._watched(self.engine.collective_rpc("weights_intact")))
        except EngineDead:
            raise
        except Exception:  # noqa: BLE001 - a worker that cannot say is not trusted
            return False


def _close(call: Awaitable) -> None:
    """Close a coroutine that will not be awaited (no 'never awaited' warning)."""
    if asyncio.iscoroutine(call):
        call.close()
