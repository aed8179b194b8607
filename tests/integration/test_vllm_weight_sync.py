"""The weight broadcast lands inside a real vLLM worker process (multiprocess engine).

The learner side (a WeightPublisher here) broadcasts the weights of a second tiny model, read
lazily and sent in buckets far smaller than the model; the engine's worker receives them
through actors.vllm_extension and reloads each bucket as it arrives; greedy outputs
then equal transformers' on the new weights and differ from the old. The vision-language
variant does the same with the tiny Qwen2-VL on a prompt with an image: the learner's HF-named
weights (vision tower included) load into vLLM's model, and the encoder cache is reset with the
prefix cache. Runs as a child process (`python -m tests.integration.test_vllm_weight_sync OUT
[--vision]`) so its engine dies with it.
"""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
N_NEW = 12
BUCKET_BYTES = 256 << 10  # the tiny models are several MiB: they travel in many buckets


@pytest.mark.parametrize("vision,tp", [
    # text: make test-slow (make test has the vision one, whose checks include the text model's,
    # and tests/integration/test_actor.py's updates in flight into the same worker, both engines)
    pytest.param(False, 1, marks=pytest.mark.slow), (True, 1),
    pytest.param(False, 2, marks=pytest.mark.slow),  # an engine of two workers: make test-slow
], ids=["text", "vision", "tensor-parallel"])
def test_broadcast_reaches_the_vllm_worker(tmp_path, vision, tp):
    """With ``tp`` 2 the engine has two worker processes (vLLM's CPU backend, a core each):
    both join the weight group (ranks 1 and 2 of 3) and each loads its shard of every tensor."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the engine runs in its own process
    if tp > 1:
        from actors.engine import cpu_thread_binding

        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding((), tp)
    args = [sys.executable, "-m", "tests.integration.test_vllm_weight_sync", str(tmp_path)]
    proc = subprocess.run(args + (["--vision"] if vision else []) + [f"--tp={tp}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["versions"] == [1] * tp
    assert result["after"] == result["hf_new"]
    assert result["before"] == result["hf_old"] != result["hf_new"]
    assert result["buckets"] >= result["model_bytes"] // BUCKET_BYTES >= 4
    # one dtype: one bucket at a time (a tensor larger than a bucket travels alone)
    assert result["peak_buffer_bytes"] <= max(BUCKET_BYTES, result["largest_tensor_bytes"])


IMAGE = np.random.default_rng(0).integers(0, 256, (56, 56, 3), dtype=np.uint8)


def _greedy_hf(model_dir, prompt_ids, vision: bool):
    """Greedy continuation by transformers; with ``vision`` the prompt's one image pad stands
    for IMAGE and is expanded as the processor does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    inputs = {"input_ids": torch.tensor([prompt_ids])}
    if vision:
        from actors.vision import VisionTokens
        from transport.images import expand_pads

        tokens = VisionTokens.from_pretrained(str(model_dir))
        px = tokens.image_processor(images=[IMAGE], return_tensors="pt")
        ids = torch.tensor([expand_pads(prompt_ids, tokens.pad_id, [tokens.count(IMAGE)])])
        inputs = {"input_ids": ids, "pixel_values": px["pixel_values"],
                  "image_grid_thw": px["image_grid_thw"],
                  "mm_token_type_ids": (ids == tokens.pad_id).long()}
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    model = auto.from_pretrained(model_dir, dtype=torch.float32)
    out = model.generate(**inputs, max_new_tokens=N_NEW, do_sample=False, min_new_tokens=N_NEW)
    return out[0, inputs["input_ids"].shape[1]:].tolist(), model.state_dict()


def _scenario(out: Path, vision: bool, tp: int) -> None:
    from vllm import LLM, SamplingParams

    from launch.model.tiny_model import build_tiny_model
    from transport.weights import WeightPublisher

    old = build_tiny_model(out / "old", seed=0, vision=vision)
    new = build_tiny_model(out / "new", seed=1, vision=vision)
    prompt = list(range(5, 25))
    request = {"prompt_token_ids": prompt}
    if vision:  # an image in the middle of the prompt: <|vision_start|><|image_pad|><|vision_end|>
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(old)
        marks = tok.convert_tokens_to_ids(["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"])
        prompt = prompt[:10] + marks + prompt[10:]
        request = {"prompt_token_ids": prompt, "multi_modal_data": {"image": [IMAGE]}}
    hf_old, _ = _greedy_hf(old, prompt, vision)
    hf_new, new_weights = _greedy_hf(new, prompt, vision)
    llm = LLM(model=str(old), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 * 2**20,
              max_model_len=256, worker_extension_cls="actors.vllm_extension.WeightSyncExtension",
              tensor_parallel_size=tp,
              **({"limit_mm_per_prompt": {"image": 1, "video": 0}} if vision else {}))
    publisher = WeightPublisher(world_size=1 + tp, timeout_s=60, bucket_bytes=BUCKET_BYTES)
    named = list(new_weights.items())
    specs = [(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in named]
    greedy = SamplingParams(temperature=0.0, max_tokens=N_NEW, min_tokens=N_NEW)
    try:
        before = llm.generate([request], greedy, use_tqdm=False)[0].outputs[0].token_ids
        llm.collective_rpc("join_weight_group", args=(publisher.address, 1, 1 + tp, 60.0))
        pushing = threading.Thread(target=publisher.publish, args=(iter(named), 1),
                                   kwargs={"specs": specs})  # read lazily, as the learner's
        pushing.start()
        versions = llm.collective_rpc("receive_weights")
        pushing.join(60)
        llm.reset_prefix_cache()
        llm.llm_engine.reset_encoder_cache()  # image embeddings made by the old vision tower
        after = llm.generate([request], greedy, use_tqdm=False)[0].outputs[0].token_ids
        llm.collective_rpc("leave_weight_group")
    finally:
        publisher.close()
        llm.llm_engine.engine_core.shutdown()
    (out / "result.json").write_text(json.dumps({
        "versions": versions, "before": list(before), "after": list(after),
        "hf_old": hf_old, "hf_new": hf_new, "buckets": publisher.buckets_sent,
        "model_bytes": sum(t.numel() * t.element_size() for _, t in named),
        "peak_buffer_bytes": publisher.peak_buffer_bytes,
        "largest_tensor_bytes": max(t.numel() * t.element_size() for _, t in named),
    }))


if __name__ == "__main__":
    tp = next((int(a.split("=")[1]) for a in sys.argv[2:] if a.startswith("--tp=")), 1)
    _scenario(Path(sys.argv[1]), vision="--vision" in sys.argv[2:], tp=tp)
