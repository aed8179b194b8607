"""The inference actor's weight updates: its vLLM workers join the learner's weight group and
receive each publish in flight (actors/vllm_extension.py does the receiving inside the workers).

A mixin of actors/actor.py's ``InferenceActor``, which owns the state it uses: ``engine``,
``cfg``, ``vision``, ``version``, ``counts``, ``times``, ``_update_lock`` and
``_require_started``.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


class WeightUpdateError(RuntimeError):
    """A weight update failed; ``update_weights`` says which weights the engine serves then."""


class WeightUpdates:
    """``join_weight_group`` and ``update_weights`` of ``InferenceActor``."""

    async def join_weight_group(self, address: str, rank: int, world_size: int,
                                timeout_s: float = 60.0) -> None:
        """Connect the engine's worker to the learner's weight channel at ``address`` (again
        after a failure): see actors/vllm_extension.py."""
        self._require_started()
        await self.engine.collective_rpc("join_weight_group", args=(address, rank, world_size, timeout_s))

    async def update_weights(self, version: int) -> dict[str, float]:
        """Receive the learner's publish of ``version`` in flight; returns timings in seconds.

        Requests in flight are kept: they pause, and continue on the new weights with their KV
        recomputed. The learner publishes concurrently (the receive blocks until it does, at most
        the group's timeout). Raises ``WeightUpdateError`` on failure: generation resumes on the
        old weights if none of the new ones was loaded; if some were (the weights arrive and
        load bucket by bucket), it stays paused (``weights_torn`` counts it) until the next
        complete update. Either way: re-form the group, ``join_weight_group`` and update again.
        """
        self._require_started()
        async with self._update_lock:
            t0 = time.perf_counter()
            # A VLM's answers in flight finish first: none is preempted (actors/vision.py says why).
            await self.engine.pause_generation(mode="keep" if self.vision is None else "wait")
            t1 = time.perf_counter()
            try:
                received = await self.engine.collective_rpc("receive_weights")
            except Exception as e:
                self.counts["weight_update_failures"] += 1
                self.times["weights_s"] += time.perf_counter() - t0
                if await self._weights_intact():
                    await self.engine.resume_generation()
                    raise WeightUpdateError(f"actor {self.cfg.actor_id}: receiving version "
                                            f"{version} failed, still serving version "
                                            f"{self.version}: {e}") from e
                self.counts["weights_torn"] += 1  # part of the new weights is loaded: stay paused
                raise WeightUpdateError(f"actor {self.cfg.actor_id}: receiving version {version} "
                                        f"failed half-way; generation stays paused until a "
                                        f"complete update: {e}") from e
            t2 = time.perf_counter()
            got = int(received[0])
            if got != version:  # label the truth: the tokens are sampled with what arrived
                log.warning("actor %d asked for version %d, received %d", self.cfg.actor_id, version, got)
            await self.engine.reset_prefix_cache(reset_running_requests=True)
            if self.vision is not None:  # the old vision tower's image embeddings
                await self.engine.reset_encoder_cache()
            await self.engine.update_weight_version(str(got))
            self.version = got
            await self.engine.resume_generation()
            t3 = time.perf_counter()
        self.counts["weight_updates"] += 1
        self.times["weights_s"] += t3 - t0
        return {"version": got, "pause_s": t1 - t0, "receive_s": t2 - t1, "total_s": t3 - t0}

    async def _weights_intact(self) -> bool:
        try:
            return all(await self.engine.collective_rpc("weights_intact"))
        except Exception:  # noqa: BLE001 - a worker that cannot say is not trusted
            return False
