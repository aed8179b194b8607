"""The inference actor's weight updates: its vLLM workers join the learner's weight group and
receive each publish in flight (actors/vllm_extension.py does the receiving inside the workers).

Two kinds of update. Full weights: generation pauses, the new weights load in place, answers in
flight continue on them (split at the version boundary). Adapters (the learner trains LoRA,
learner/lora.py): each version arrives as a new adapter registered beside the last ones, no
pause; every request is sampled with the adapter that was newest when it started and keeps it
to its end, so each of its tokens carries that adapter's version. The ``keep`` newest adapters
stay registered (the staleness bound + 1), older ones as long as a request uses them.

Proof of delivery (adapters): after every update each worker reports the adapters it holds,
and the engine's log-probs of the publish's probe, sampled through the same path as every
answer, must equal the learner's within ``probe_tolerance`` (largest difference of a token's
log-prob); otherwise the update fails with ``AdapterMismatch`` and the adapter is never used.

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
import contextlib
import logging
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from actors.engine import sampling_params
from actors.vllm_extension import adapter_name

T = TypeVar("T")

log = logging.getLogger(__name__)


HEALTH_POLL_S = 0.5
"""How often a call into the engine checks that the engine is still alive."""


class WeightUpdateError(RuntimeError):
    """A weight update failed; ``update_weights`` says which weights the engine serves then."""


class AdapterMismatch(WeightUpdateError):
    """The engine does not serve the adapter the learner published: a worker does not hold it,
    or the engine's log-probs of the probe differ from the learner's beyond the tolerance."""


@dataclass(frozen=True)
class AdapterUpdates:
    """How an actor takes adapters (actors/config.py's ``lora_*`` keys)."""

    keep: int = 2
    """Adapters kept registered: the newest ``keep`` (and older ones while a request uses them)."""
    probe_tolerance: float = 1e-3
    """The largest difference of a probe token's log-prob (engine vs learner) that passes."""


class EngineDead(RuntimeError):
    """The actor's engine is dead (its engine core process is gone): the actor must be replaced;
    no weight group can be joined and no update received through it."""


class WeightUpdates:
    """One engine's weight group membership and weight updates, and the version it serves."""

    def __init__(self, engine, *, actor_id: int, version: int, vision: bool,
                 counts: Counter[str], times: Counter[str], adapters: AdapterUpdates | None = None) -> None:
        """``engine``: the actor's AsyncLLM (or its in-process stand-in), serving ``version``.
        ``vision``: the model is a VLM, whose answers in flight finish before an update and
        whose encoder cache is reset after one. ``counts`` and ``times``: the actor's counters,
        shared, not copied. ``actor_id`` labels errors and warnings. ``adapters``: updates are
        adapters (the engine was built with LoRA); ``version`` then has none (the base model)."""
        self.engine, self.actor_id, self.vision = engine, actor_id, vision
        self.version = version
        """The version the engine serves: the last one it received in full."""
        self.counts, self.times = counts, times
        self._lock = asyncio.Lock()
        self.adapters = adapters
        self._registered: dict[int, Any] = {}  # version -> its LoRARequest
        self._users: Counter[int] = Counter()  # version -> requests in flight with its adapter
        self._root: Path | None = None
        if adapters is not None:  # where the workers write adapters: memory-backed where there is one
            shm = Path("/dev/shm")
            self._root = Path(tempfile.mkdtemp(prefix=f"adapters-actor{actor_id}-",
                                               dir=shm if shm.is_dir() else None))

    def lora_request(self, version: int):
        """The engine's request for version ``version``'s adapter; None for the base weights
        (full-weight updates, or a version before the first adapter)."""
        return self._registered.get(version)

    @contextlib.asynccontextmanager
    async def serving(self, version: int | None = None) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """``(version, extra)`` for one request to the engine: the version it is sampled with
        (the one served now unless given) and the keyword arguments that make the engine's
        ``generate`` use its adapter (``{}``: the engine's own weights). The adapter stays
        registered while inside."""
        version = self.version if version is None else version
        self._users[version] += 1
        try:
            lora = self.lora_request(version)
            yield version, {} if lora is None else {"lora_request": lora}
        finally:
            self._users[version] -= 1
            if not self._users[version]:
                del self._users[version]

    def close(self) -> None:
        """Delete the adapters' directory (the engine is shut down first)."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

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
            if self.adapters is not None:
                return await self._update_adapter(version)
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

    async def _update_adapter(self, version: int) -> dict[str, float]:
        async with self._lock:
            t0 = time.perf_counter()
            try:
                received = await self._watched(self.engine.collective_rpc(
                    "receive_adapter", args=(str(self._root),)))
            except EngineDead:
                self.times["weights_s"] += time.perf_counter() - t0
                raise
            except Exception as e:  # nothing registered: the engine serves what it served
                self.counts["weight_update_failures"] += 1
                self.times["weights_s"] += time.perf_counter() - t0
                raise WeightUpdateError(f"actor {self.actor_id}: receiving adapter {version} "
                                        f"failed, still serving version {self.version}: {e}") from e
            t1 = time.perf_counter()
            first = received[0]
            got = int(first["version"])
            from vllm.lora.request import LoRARequest

            self._registered[got] = LoRARequest(adapter_name(got), got, first["path"])
            try:
                missing = [r for r in received if got not in r["held"] or int(r["version"]) != got]
                if missing:
                    raise AdapterMismatch(f"actor {self.actor_id}: after the update to version {got} "
                                          f"a worker holds adapters {missing[0]['held']} (received "
                                          f"version {missing[0]['version']})")
                gap = await self._probe(got, first["probe_ids"], first["probe_logprobs"])
            except Exception:
                self.counts["weight_update_failures"] += 1
                self.times["weights_s"] += time.perf_counter() - t0
                if got != self.version:  # never served (a version pushed again stays: it is)
                    await self._drop(got)
                raise
            self.version = got
            await self._drop_unused()
            t2 = time.perf_counter()
        self.counts["weight_updates"] += 1
        self.times["weights_s"] += t2 - t0
        return {"version": got, "pause_s": 0.0, "receive_s": t1 - t0, "total_s": t2 - t0,
                "probe_s": t2 - t1, "probe_gap": gap}

    async def _probe(self, version: int, ids: list[int], want: list[float]) -> float:
        """The largest difference between the engine's log-probs of the probe's tokens under
        ``version`` (through ``serving``, as every answer) and the learner's; AdapterMismatch
        beyond the tolerance."""
        params = sampling_params(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        final = None
        async with self.serving(version) as (_, extra):
            async for out in self.engine.generate({"prompt_token_ids": ids}, params,
                                                  f"probe-actor{self.actor_id}-v{version}", **extra):
                final = out
        got = [d[t].logprob for d, t in zip(final.prompt_logprobs[1:], ids[1:])]
        gap = max(abs(g - w) for g, w in zip(got, want, strict=True))
        if not gap <= self.adapters.probe_tolerance:
            raise AdapterMismatch(
                f"actor {self.actor_id}: the engine's log-probs of the probe under adapter {version} "
                f"differ from the learner's by up to {gap:.3g} nats (tolerance "
                f"{self.adapters.probe_tolerance:g}): it does not sample from the published policy")
        return gap

    async def _drop(self, version: int) -> None:
        request = self._registered.pop(version, None)
        if request is not None:
            await self._watched(self.engine.collective_rpc("drop_adapter", args=(version, request.lora_path)))

    async def _drop_unused(self) -> None:
        """Unregister the adapters older than the newest ``keep`` that no request uses."""
        newest = sorted(self._registered, reverse=True)[:self.adapters.keep]
        for version in [v for v in self._registered if v not in newest and not self._users[v]]:
            await self._drop(version)

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
