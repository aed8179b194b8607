"""The inference actor's vLLM engine: how it is built and how one request is sampled.

Called by actors/actor.py (``InferenceActor.start`` and its generator). The engine is always
built the same way on CPU and GPU: eager mode, an explicit KV-cache size (on CPU vLLM would
otherwise reserve most of the host's memory), ``processed_logprobs`` (log-softmax of logits / T:
the distribution actually sampled from, which importance ratios need) and the worker extension
through which weight broadcasts arrive (actors/vllm_extension.py). vLLM is imported on call, so
importing this module stays cheap.
"""

from __future__ import annotations

import typing

from actors.config import ActorConfig
from actors.vision import engine_image_args

EXTENSION = "actors.vllm_extension.WeightSyncExtension"
MIN_BATCHED_TOKENS = 4096
"""On CPU: the tokens one engine step may prefill at least (whole prompts, up to max_context)."""


def build_engine(cfg: ActorConfig, vision: bool):
    """The engine for ``cfg``'s model (``vision``: it takes up to max_turns x images_per_turn
    images a prompt):
    an AsyncLLM (its core in a child process), or with ``cfg.engine == "in_process"`` an
    actors/local_engine.py ``InProcessEngine`` (everything in this process)."""
    from vllm import AsyncEngineArgs
    from vllm.platforms import current_platform

    images = engine_image_args(cfg.max_turns * cfg.images_per_turn) if vision else {}
    # On CPU no prompt is prefilled in chunks: vLLM rewinds a seeded request's random generator
    # after each partial prefill, which a CPU generator cannot do (the engine core dies with
    # "CPU Generator does not use offset"), and every answer here is seeded.
    whole = ({"enable_chunked_prefill": False, "max_num_batched_tokens": max(cfg.max_context, MIN_BATCHED_TOKENS)}
             if current_platform.is_cpu() else {})
    lora = {}
    if cfg.lora_rank:  # adapters of up to this rank; as many in one batch as versions kept
        from vllm.config.lora import MaxLoRARanks

        rank = min((r for r in typing.get_args(MaxLoRARanks) if r >= cfg.lora_rank), default=None)
        if rank is None:
            raise ValueError(f"LoRA rank {cfg.lora_rank} exceeds the engine's largest, "
                             f"{max(typing.get_args(MaxLoRARanks))}")
        lora = {"enable_lora": True, "max_lora_rank": rank, "max_loras": cfg.lora_keep,
                "max_cpu_loras": 2 * cfg.lora_keep + 2}
    args = AsyncEngineArgs(
        model=cfg.model_path, dtype=cfg.dtype, enforce_eager=True, seed=cfg.seed,
        kv_cache_memory_bytes=cfg.kv_cache_bytes, max_model_len=cfg.max_context,
        max_num_seqs=cfg.num_slots, logprobs_mode="processed_logprobs",
        tensor_parallel_size=cfg.tensor_parallel,
        worker_extension_cls=EXTENSION, disable_log_stats=True, **whole, **images, **lora)
    if cfg.engine == "in_process":
        if cfg.tensor_parallel != 1:
            raise ValueError("an in-process engine has one worker: tensor_parallel must be 1")
        from actors.local_engine import InProcessEngine

        args.distributed_executor_backend = "uni"
        return InProcessEngine(args)
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(args)


def cpu_thread_binding(cores, workers: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for a CPU engine of ``workers`` worker processes on
    ``cores``: one group of cores per worker, ``|`` between groups (vLLM's format); with fewer
    cores than workers, the next cores of the machine, one each, from the first one given."""
    import os

    cores, n = list(cores), max(1, os.cpu_count() or 1)
    if len(cores) < workers:
        start = cores[0] if cores else 0
        cores = [(start + k) % n for k in range(workers)]
    groups = [cores[k::workers] for k in range(workers)]
    return "|".join(",".join(map(str, sorted(g))) for g in groups)


def sampling_params(**kwargs):
    """vllm.SamplingParams(**kwargs)."""
    from vllm import SamplingParams

    return SamplingParams(**kwargs)
