"""A vision-language InferenceActor against real parts: vLLM serving the tiny Qwen2-VL, FrozenLake
rendered as images in an EnvPool, trajectories over the ZeroMQ stream.

Each observation's image reaches the model as its processor's run of image-pad tokens; the
trajectory carries those ids and the images (PNG), and its behaviour log-probs equal what
transformers' Qwen2-VL computes from the same ids and the decoded images.
"""

import asyncio

import numpy as np
import pytest

from actors.actor import InferenceActor
from actors.vision import VisionTokens
from launch.tiny_model import build_tiny_model
from tests.integration.test_actor import LOGPROB_TOL, Collector
from transport.images import collapse_pads, decode_image


def _hf_logprobs(model, processor, traj) -> np.ndarray:
    """log p(token_i | tokens < i, images) under transformers' model; entry 0 is 0."""
    import torch

    images = [decode_image(im) for im in traj.images]
    vision = processor.image_processor(images=images, return_tensors="pt")
    ids = torch.as_tensor(traj.token_ids.astype(np.int64))[None]
    types = torch.as_tensor(processor.create_mm_token_type_ids(ids.tolist()))
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=vision["pixel_values"], mm_token_type_ids=types,
                       image_grid_thw=vision["image_grid_thw"]).logits[0].float()
    out = np.zeros(len(traj.token_ids))
    out[1:] = torch.log_softmax(logits, -1)[:-1].gather(1, ids[0, 1:, None])[:, 0].numpy()
    return out


def test_image_episodes_are_recorded_as_the_model_saw_them(tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    path = str(build_tiny_model(tmp_path / "vl", vision=True, seed=0))
    collector, loop = Collector(), asyncio.new_event_loop()
    actor = InferenceActor({
        "actor_id": 1, "run_id": "vl", "model_path": path, "env_name": "frozenlake",
        "env_config": {"render": "image", "image_size": 64, "prompt": "brief"},
        "env_workers": 1, "envs_per_worker": 4, "concurrency": 4, "group_size": 2,
        "max_tokens": 24, "max_turns": 3, "max_context": 2048, "kv_cache_bytes": 64 << 20,
        "seed": 3, "learner_address": collector.address})
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
            mp.setenv("HF_HUB_OFFLINE", "1")
            loop.run_until_complete(asyncio.wait_for(actor.start(), 180))
            stats = loop.run_until_complete(asyncio.wait_for(actor.run(num_episodes=4), 180))
        trajs = collector.wait_for(4)
    finally:
        try:
            loop.run_until_complete(asyncio.wait_for(actor.close(), 60))
        finally:
            loop.close()
            collector.close()

    assert stats["episodes_sent"] == 4 and stats["episodes_failed"] == 0 and len(trajs) == 4
    vision = VisionTokens.from_pretrained(path)
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    for traj in trajs:
        ids = traj.token_ids.tolist()
        _, runs = collapse_pads(ids, vision.pad_id)
        turns = int(traj.turn_end.sum())
        assert len(traj.images) == len(runs) >= turns  # one image per observation seen
        assert runs == [vision.count(decode_image(im)) for im in traj.images]
        assert not traj.loss_mask[np.asarray(ids) == vision.pad_id].any()
        mask = traj.loss_mask
        np.testing.assert_allclose(traj.behaviour_logprobs[mask],
                                   _hf_logprobs(model, processor, traj)[mask], atol=LOGPROB_TOL)
