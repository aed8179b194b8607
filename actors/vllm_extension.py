"""The actor's vLLM worker extension: receive the learner's weight broadcast inside the worker.

vLLM mixes this class into its Worker when an engine is built with
``worker_extension_cls="actors.vllm_extension.WeightSyncExtension"``; the actor reaches these
methods through ``collective_rpc``. Receiving inside the worker process is what makes the update
cheap: the broadcast lands bucket by bucket in flat buffers there and ``reload_weights`` loads
views of each bucket as it arrives, with no tensor ever crossing the engine's RPC (only the
group's address and the version do).

Invariants: one subscriber per worker, ranks given by the actor (1..world_size-1; the learner's
rank 0 is the source); every wait is bounded by the group's timeout, never by a timeout on
``collective_rpc`` (that leaves the worker blocked in the receive and kills the engine
later). After ``receive_weights`` the caller resets the prefix cache (and the encoder
cache for VLMs, actors/vision.py): KV computed with the old weights must not be reused.
"""

from __future__ import annotations

import logging

from transport import heap
from transport.channels import WeightSink, weight_sink

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class RotaryCacheFilter(logging.Filter):
    """Drops vLLM's "RotaryEmbedding: Failed to load weights" warning, printed at every reload:
    the rotary embedding's cos/sin cache is computed from the model's config and is in no
    checkpoint (Hugging Face's included), so vLLM puts the computed cache back. Harmless: after
    every update the engine's outputs equal transformers' on the new weights
    (tests/integration/test_vllm_weight_sync.py). Any other layer's warning still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args == ("RotaryEmbedding",))


class WeightSyncExtension:
    _weight_subscriber: WeightSink | None = None
    _weights_torn = False

    def join_weight_group(self, address: str, rank: int, world_size: int,
                          timeout_s: float = 60.0) -> None:
        """Connect this worker to the learner's weight channel at ``address`` (also after a
        restart): ``tcp://host:port``, the broadcast group's store; ``inproc://name``, the
        in-process channel of an engine in the learner's process (transport/channels.py).
        ``rank`` is the engine's first rank: a tensor-parallel engine's workers (vLLM's
        ``self.rank``: 0..tp-1) take ``rank + self.rank``, each receiving every tensor, of
        which its weight loaders keep its shard."""
        reload_log = logging.getLogger(RELOAD_LOGGER)
        if not any(isinstance(f, RotaryCacheFilter) for f in reload_log.filters):
            reload_log.addFilter(RotaryCacheFilter())
        self.leave_weight_group()
        self._weight_subscriber = weight_sink(address, rank=rank + getattr(self, "rank", 0),
                                              world_size=world_size, timeout_s=timeout_s)

    def receive_weights(self) -> int:
        """Block until the next broadcast, load it into the model bucket by bucket as it
        arrives; returns its version. If it fails after the first tensor was loaded, the model
        holds a mix of two versions until the next complete receive (``weights_intact``)."""
        if self._weight_subscriber is None:
            raise RuntimeError("join_weight_group first")
        version, named_tensors = self._weight_subscriber.receive()
        self.reload_weights(weights_iterator=self._loading(named_tensors))
        self._weights_torn = False
        heap.trim()  # what the reload freed, the received buckets included (transport/heap.py)
        return version

    def _loading(self, named_tensors):
        for item in named_tensors:
            self._weights_torn = True
            yield item

    def weights_intact(self) -> bool:
        """False after a receive that failed half-way: generating now would use a mix of two
        versions' weights."""
        return not self._weights_torn

    def leave_weight_group(self) -> None:
        if self._weight_subscriber is not None:
            self._weight_subscriber.close()
            self._weight_subscriber = None
