"""A vision-language InferenceActor against real parts: vLLM serving the tiny Qwen2-VL, FrozenLake
rendered as images in an EnvPool, trajectories over the ZeroMQ stream, a weight broadcast.

Each observation's image reaches the model as its processor's run of image-pad tokens; the
trajectory carries those ids and the images (PNG), and its behaviour log-probs equal what
transformers' Qwen2-VL computes from the same ids and the decoded images, also for episodes
played after a weight update in flight (new image embeddings, no engine failure). Both engines
(vLLM's AsyncLLM and the single-process topology's InProcessEngine), as in test_actor.py.
"""

import asyncio
import threading

import numpy as np
import pytest

from actors.vision import VisionTokens
from launch.model.tiny_model import build_tiny_model
from tests.integration.test_actor import LOGPROB_TOL, started_actor
from transport.images import collapse_pads, decode_image
from transport.weights import WeightPublisher


@pytest.fixture(scope="module", params=["async", "in_process"])
def rig(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("vl")
    old = str(build_tiny_model(tmp / "old", vision=True, seed=0))
    new = str(build_tiny_model(tmp / "new", vision=True, seed=1))
    with started_actor({
        "engine": request.param,
        "actor_id": 1, "run_id": "vl", "model_path": old, "env_name": "frozenlake",
        "env_config": {"render": "image", "image_size": 64, "prompt": "brief"},
        "env_pool": {"env_workers": 1, "envs_per_worker": 4}, "concurrency": 4, "group_size": 2,
        "max_tokens": 24, "max_turns": 3, "max_context": 2048, "kv_cache_bytes": 64 << 20,
        # Two maps only: episodes after the weight update show images the engine has seen (and
        # encoded) before it, which must not reuse the old vision tower's embeddings.
        "train_seeds": (5, 7), "seed": 3,
    }) as (loop, actor, collector):
        yield loop, actor, collector, old, new


def _hf(path):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(path)


def _hf_logprobs(hf, traj) -> np.ndarray:
    """log p(token_i | tokens < i, images) under transformers' model; entry 0 is 0."""
    import torch

    model, processor = hf
    vision = processor.image_processor(images=[decode_image(im) for im in traj.images],
                                       return_tensors="pt")
    ids = torch.as_tensor(traj.token_ids.astype(np.int64))[None]
    types = torch.as_tensor(processor.create_mm_token_type_ids(ids.tolist()))
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=vision["pixel_values"], mm_token_type_ids=types,
                       image_grid_thw=vision["image_grid_thw"]).logits[0].float()
    out = np.zeros(len(traj.token_ids))
    out[1:] = torch.log_softmax(logits, -1)[:-1].gather(1, ids[0, 1:, None])[:, 0].numpy()
    return out


def _check(traj, hf, vision) -> None:
    ids = traj.token_ids.tolist()
    _, runs = collapse_pads(ids, vision.pad_id)
    assert len(traj.images) == len(runs) >= int(traj.turn_end.sum())  # one per observation seen
    assert runs == [vision.count(decode_image(im)) for im in traj.images]
    assert not traj.loss_mask[np.asarray(ids) == vision.pad_id].any()
    mask = traj.loss_mask
    np.testing.assert_allclose(traj.behaviour_logprobs[mask], _hf_logprobs(hf, traj)[mask],
                               atol=LOGPROB_TOL)


def test_image_episodes_are_recorded_as_the_model_saw_them(rig):
    loop, actor, collector, old, _ = rig
    stats = loop.run_until_complete(asyncio.wait_for(actor.run(num_episodes=8), 180))
    trajs = collector.wait_for(stats["episodes_sent"])
    # The untrained model may write a vision token: that episode fails, by that reason only.
    assert stats["episodes_sent"] + stats["episodes_failed"] == 8 and len(trajs) >= 4
    assert stats["episodes_failed"] == stats.get("failed/vision_token_generated", 0)
    hf, vision = _hf(old), VisionTokens.from_pretrained(old)
    for traj in trajs:
        _check(traj, hf, vision)


def test_weight_update_in_flight_with_images(rig):
    """The update pauses requests that hold images; after it, new episodes see the new vision
    tower (their log-probs are the new model's) and the engine keeps serving."""
    import torch

    loop, actor, collector, old, new = rig
    new_weights = list(_hf(new)[0].state_dict().items())
    publisher = WeightPublisher(world_size=2, timeout_s=30)

    async def scenario():
        await actor.join_weight_group(publisher.address, 1, 2, 30.0)
        start = len(collector.items)
        running = asyncio.create_task(actor.run())
        try:
            while len(collector.items) < start + 2:
                await asyncio.sleep(0.05)
            pushing = threading.Thread(target=publisher.publish, args=(new_weights, 1))
            pushing.start()
            await actor.update_weights(1)
            pushing.join(30)
            while sum(_all_version(t, 1) for t in collector.items[start:]) < 2:
                await asyncio.sleep(0.05)
        finally:
            await actor.stop()
        return await running, collector.items[start:]

    try:
        stats, trajs = loop.run_until_complete(asyncio.wait_for(scenario(), 300))
    finally:
        publisher.close()
    assert stats["version"] == 1 and stats["weight_updates"] == 1
    assert stats["episodes_failed"] == stats.get("failed/vision_token_generated", 0)
    fresh = [t for t in trajs if _all_version(t, 1)]
    hf_new, vision = _hf(new), VisionTokens.from_pretrained(new)
    with torch.no_grad():
        for traj in fresh[-2:]:
            _check(traj, hf_new, vision)


def _all_version(traj, v: int) -> bool:
    return bool(np.all(traj.policy_version[traj.loss_mask] == v))
