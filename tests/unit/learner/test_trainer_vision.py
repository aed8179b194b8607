"""The trainer on a vision-language policy (the tiny Qwen2-VL) over a real gloo group on CPU:
trajectories recorded with images (as the actor records them: actors.episode.ChatContext on
FrozenLake rendered as pictures) are scored by the trainer exactly as transformers scores them
with the images, the update reaches the vision tower, and wrong inputs are refused."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import yaml

import envs
from actors.episode import ChatContext, Generation
from actors.vision import VisionTokens
from envs.registry import load_config
from launch.model.tiny_model import build_tiny_model
from learner.config import TrainerConfig
from learner.trainer import Trainer
from tests.envs_api import env_reset, env_step
from transport.images import decode_image

ALGORITHMS = Path(__file__).resolve().parents[3] / "configs" / "algorithm"
TEMPERATURE = 0.7


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def vl_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("vl"), vision=True, seed=0))


@pytest.fixture(scope="module")
def hf(vl_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(vl_path, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(vl_path)


def _hf_logprobs(hf, traj) -> np.ndarray:
    model, processor = hf
    ids = torch.as_tensor(traj.token_ids.astype(np.int64))[None]
    inputs = {}
    if traj.images:
        px = processor.image_processor(images=[decode_image(i) for i in traj.images], return_tensors="pt")
        inputs = {"pixel_values": px["pixel_values"], "image_grid_thw": px["image_grid_thw"],
                  "mm_token_type_ids": torch.as_tensor(processor.create_mm_token_type_ids(ids.tolist()))}
    with torch.no_grad():
        logits = model(input_ids=ids, **inputs).logits[0].float() / TEMPERATURE
    out = np.zeros(ids.shape[1], dtype=np.float32)
    out[1:] = torch.log_softmax(logits, -1)[:-1].gather(1, ids[0, 1:, None])[:, 0].numpy()
    return out


def _episodes(vl_path, hf, n: int, *, render: str = "image") -> list:
    """n FrozenLake episodes (2 turns: "Left" then "Right" or "Down") recorded token in / token
    out with images, behaviour log-probs from transformers; reward 1 on the turns that said Down."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vl_path)
    vision = VisionTokens.from_pretrained(vl_path)
    env = envs.make("frozenlake", **(load_config("frozenlake") | {"render": render, "image_size": 56}))
    out = []
    for k in range(n):
        obs = env_reset(env, k)
        ctx = ChatContext(tokenizer, env.system_prompt(), vision)
        rewards = []
        for answer in ("Left", "Down" if k % 2 else "Right"):
            ctx.add_observation(obs.text, obs.images)
            ids = tokenizer.encode(f"<answer>{answer}</answer>", add_special_tokens=False)
            ids.append(tokenizer.convert_tokens_to_ids(tokenizer.eos_token))
            ctx.add_generation(Generation(ids, [0.0] * len(ids), [0] * len(ids), stopped=True))
            rewards.append(float(answer == "Down"))
            obs = env_step(env, f"<answer>{answer}</answer>").observation
        traj = ctx.to_trajectory(rewards, run_id="t", actor_id=0, episode_id=k, env_name="frozenlake",
                                 seed=k, group_id=k // 2)
        lp = np.where(traj.loss_mask, _hf_logprobs(hf, traj), 0.0).astype(np.float32)
        out.append(replace(traj, behaviour_logprobs=lp))
    return out


def _config(path: str, algorithm: str, **overrides) -> TrainerConfig:
    keys = yaml.safe_load((ALGORITHMS / f"{algorithm}.yaml").read_text())
    del keys["reasoning_reward"]  # an env setting
    return TrainerConfig.from_dict({"model_path": path, "temperature": TEMPERATURE, **keys,
                                    "critic_warmup": 0, **overrides})


def test_trainer_scores_image_episodes_as_transformers_does(vl_path, hf):
    trajs = _episodes(vl_path, hf, 4)
    assert all(len(t.images) == 2 for t in trajs)
    text_only = _episodes(vl_path, hf, 1, render="text")  # a row without images in the batch
    trainer = Trainer(_config(vl_path, "vagen_full", micro_batch_size=2, lr=1e-3))
    before = {k: v.clone() for k, v in trainer.state_dict_for_publish().items()}
    metrics = trainer.train_step(trajs + text_only, version=0)
    # behaviour (transformers with the images) == proximal (the trainer): KL ~ 0 on every token.
    assert abs(metrics["policy/behaviour_kl"]) < 1e-5
    assert all(np.isfinite(v) for v in metrics.values())
    after = trainer.state_dict_for_publish()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("model.visual.") for k in moved)  # the vision tower learns too
    assert any(k.startswith("model.language_model.") for k in moved)
    # what a publish reads, tensor by tensor: the same names and values, vision tower included
    specs, lazy, _ = trainer.weights_for_publish()
    lazy = dict(lazy)
    assert [n for n, _, _ in specs] == list(lazy) == list(after)
    assert all(torch.equal(lazy[k], after[k]) for k in after)


def test_without_image_inputs_the_scores_differ(vl_path, hf):
    """The check above can fail: the same ids scored without their images are another model."""
    traj = _episodes(vl_path, hf, 1)[0]
    blind = replace(traj, images=[])
    mask = traj.loss_mask
    assert np.abs(_hf_logprobs(hf, blind)[mask] - traj.behaviour_logprobs[mask]).max() > 1e-3


def test_bad_image_inputs_are_refused(vl_path, hf, tmp_path):
    trajs = _episodes(vl_path, hf, 2)
    trainer = Trainer(_config(vl_path, "grpo"))
    with pytest.raises(ValueError, match="image-pad runs"):
        trainer.train_step([trajs[0], replace(trajs[1], images=trajs[1].images[:1])], version=0)
    text_trainer = Trainer(_config(str(build_tiny_model(tmp_path / "text", seed=0)), "grpo"))
    with pytest.raises(ValueError, match="not a vision-language model"):
        text_trainer.train_step(trajs, version=0)
