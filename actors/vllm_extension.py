"""The actor's vLLM worker extension: receive the learner's weight broadcast inside the worker.

vLLM mixes this class into its Worker when an engine is built with
``worker_extension_cls="actors.vllm_extension.WeightSyncExtension"``; the actor reaches these
methods through ``collective_rpc``. Receiving inside the worker process is what makes the update
cheap: the broadcast lands bucket by bucket in flat buffers there and ``reload_weights`` loads
views of each bucket as it arrives, with no tensor ever crossing the engine's RPC (only the
group's address and the version do).

With LoRA the learner publishes an adapter instead (transport/adapters.py): ``receive_adapter``
writes it as a PEFT directory and registers it with the worker's LoRA manager under the
version's id; ``drop_adapter`` unregisters it. The base weights never change then.

Invariants: one subscriber per worker, ranks given by the actor (1..world_size-1; the learner's
rank 0 is the source); every wait is bounded by the group's timeout, never by a timeout on
``collective_rpc`` (that leaves the worker blocked in the receive and kills the engine
later). After ``receive_weights`` the caller resets the prefix cache (and the encoder
cache for VLMs, actors/vision.py): KV computed with the old weights must not be reused. An
adapter needs no reset: each version has a name of its own, which keys its prefix cache.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from transport import adapters, heap
from transport.channels import WeightSink, weight_sink

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class ReloadWarningFilter(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" warning, printed at every reload, for the
    layers named in ``expected``: the rotary embedding's cos/sin cache is computed from the
    model's config and is in no checkpoint (Hugging Face's included), so vLLM puts the computed
    cache back; a tied output layer's table arrives under the input embeddings' name
    (``WeightSyncExtension._prepare_tied``). Harmless: after every update the engine's outputs
    equal transformers' on the new weights (tests/integration/test_vllm_weight_sync.py,
    tests/integration/test_smollm2_actor.py). Any other layer's warning still shows."""

    def __init__(self) -> None:
        super().__init__()
        self.expected = {"RotaryEmbedding"}

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and len(record.args or ()) == 1
                    and record.args[0] in self.expected)


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
        warnings = next((f for f in reload_log.filters if isinstance(f, ReloadWarningFilter)), None)
        if warnings is None:
            reload_log.addFilter(warnings := ReloadWarningFilter())
        # a tied table arrives under the first of its layers' names; the others load nothing
        warnings.expected |= {type(m).__name__ for group in self._tied_groups() for m in group[1:]}
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
        self._prepare_tied()
        self._weights_torn = False
        heap.trim()  # what the reload freed, the received buckets included (transport/heap.py)
        return version

    def receive_adapter(self, root: str) -> dict:
        """Block until the next broadcast, an adapter publish (transport/adapters.py); write it
        under ``root`` (``root/v<version>``, whole or not at all) and register it as LoRA id
        ``version``. Returns the version, the directory, the probe the publish carried, and the
        LoRA ids the worker holds now. A publish that is not an adapter's raises (nothing is
        registered: the engine serves what it served)."""
        from vllm.lora.request import LoRARequest

        if self._weight_subscriber is None:
            raise RuntimeError("join_weight_group first")
        version, named_tensors = self._weight_subscriber.receive()
        if version < 1:
            raise ValueError(f"adapter version {version}: version 0 is the base model")
        publish = adapters.split(named_tensors)  # read to the end: the group stays in step
        path = adapters.write_adapter(Path(root) / f"v{version}", publish.config, publish.tensors)
        self._register(LoRARequest(adapter_name(version), version, str(path), load_inplace=True))
        heap.trim()
        return {"version": version, "path": str(path), "probe_ids": publish.probe_ids,
                "probe_logprobs": publish.probe_logprobs, "held": sorted(self.list_loras())}

    def _register(self, request) -> None:
        """Load the adapter of ``request`` into the worker's LoRA manager (in place of one of
        the same id: a version pushed again)."""
        self.add_lora(request)

    def drop_adapter(self, version: int, path: str) -> None:
        """Unregister adapter ``version`` and delete its directory."""
        self.remove_lora(version)
        shutil.rmtree(path, ignore_errors=True)

    def _tied_groups(self) -> list[list]:
        """The model's layers that hold one weight together (a tied output layer and its input
        embeddings), a list per weight, in the model's order."""
        owners: dict[int, list] = {}
        for module in self.model_runner.get_model().modules():
            weight = module._parameters.get("weight")
            if weight is not None:
                owners.setdefault(id(weight), []).append(module)
        return [group for group in owners.values() if len(group) > 1]

    def _prepare_tied(self) -> None:
        """Prepare again, from the new weights, the kernels of the tied layers the table did not
        arrive for (all but the first of each group). vLLM's in-place reload prepares a layer
        only when weights arrive under its own name, and a tied output layer never gets any (the
        table is sent once, under the input embeddings' name, and vLLM's loaders skip a tied
        ``lm_head``): its table holds the new values, but a kernel prepared from it at load time
        still holds the old ones. On CPU that is every linear layer's, lm_head's included (vLLM
        packs its weight for oneDNN), so the engine would go on sampling from the first
        version's output layer. On GPU the call changes nothing."""
        for module in (m for group in self._tied_groups() for m in group[1:]):
            method = getattr(module, "quant_method", None)
            if method is not None:
                method.process_weights_after_loading(module)

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


def adapter_name(version: int) -> str:
    """The engine's name of the adapter of ``version``: a name per version keeps their prefix
    caches apart."""
    return f"policy-v{version}"
