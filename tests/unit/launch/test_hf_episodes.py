"""launch/model/playback.py: FrozenLake episodes played by transformers' generate on the tiny model.

The sampled tokens' log-probs must be those of the distribution they were drawn from (the
learner recomputes the same numbers, so on-policy ratios are 1); greedy play is deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from envs.registry import load_config
from launch.model.playback import evaluate_hf, play
from launch.model.tiny_model import build_tiny_model
from learner.models import token_logprobs
from tests.envs_api import env_reset, env_step

ENV = load_config("frozenlake") | {"prompt": "brief"}


@pytest.fixture(scope="module")
def model_and_tokenizer(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_are_the_policys_at_the_temperature(model_and_tokenizer, temperature):
    model, tokenizer = model_and_tokenizer
    torch.manual_seed(0)
    results, _ = play(model, tokenizer, "frozenlake", ENV, [3, 3, 5], max_new_tokens=12,
                      batch_size=2, temperature=temperature, group_ids=[0, 0, 1], version=4)
    trajectories = [r.trajectory for r in results]
    assert [t.group_id for t in trajectories] == [0, 0, 1]
    for t in trajectories:
        mask = t.loss_mask
        assert mask.sum() > 0 and set(t.policy_version[mask].tolist()) == {4}
        ids = torch.as_tensor(t.token_ids, dtype=torch.long)[None]
        with torch.no_grad():
            expected = token_logprobs(model, ids, temperature)[0][0].numpy()
        # Rows were left-padded in batches of 2 when sampled, unpadded here.
        np.testing.assert_allclose(t.behaviour_logprobs[mask], expected[mask], atol=2e-4)
        assert np.all(t.behaviour_logprobs[~mask] == 0)
    # A random tiny model's samples differ between the two rollouts of seed 3.
    assert not np.array_equal(trajectories[0].token_ids, trajectories[1].token_ids)


def test_greedy_evaluation_is_deterministic_and_counts_every_episode(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    runs = [evaluate_hf(model, tokenizer, "frozenlake", ENV, range(4), max_new_tokens=8,
                        batch_size=3) for _ in range(2)]
    for run in runs:
        del run["seconds"]
    assert runs[0] == runs[1] and runs[0]["episodes"] == 4.0
    # A random model never answers in format: every turn is out of format, no success.
    assert runs[0]["format_correct"] == 0.0 and runs[0]["success"] == 0.0


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from actors.vision import VisionTokens

    path = str(build_tiny_model(tmp_path_factory.mktemp("vl"), vision=True, seed=0))
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return path, model, AutoTokenizer.from_pretrained(path), VisionTokens.from_pretrained(path)


IMAGE_ENV = ENV | {"render": "image", "image_size": 56}


def test_image_episodes_are_sampled_with_their_images(vlm):
    """Sampled with the pictures: each token's log-prob is the model's on the trajectory with
    its images (the learner's inputs), not without them."""
    from learner.vision import ImageInputs

    path, model, tokenizer, vision = vlm
    torch.manual_seed(0)
    results, _ = play(model, tokenizer, "frozenlake", IMAGE_ENV, [3, 5, 6], max_new_tokens=10,
                      batch_size=2, temperature=1.0, vision=vision)
    images = ImageInputs(path)
    for t in (r.trajectory for r in results):
        assert len(t.images) == len(t.turn_rewards) == 3
        ids = torch.as_tensor(t.token_ids, dtype=torch.long)[None]
        inputs = images.model_inputs(images.encode([t]), ids)
        mask = t.loss_mask
        with torch.no_grad():
            seen = token_logprobs(model, ids, 1.0, inputs=inputs)[0][0].numpy()
            blind = token_logprobs(model, ids, 1.0)[0][0].numpy()
        np.testing.assert_allclose(t.behaviour_logprobs[mask], seen[mask], atol=2e-4)
        assert np.abs(t.behaviour_logprobs[mask] - blind[mask]).max() > 1e-3


def test_greedy_image_evaluation_is_deterministic_and_needs_the_vision_tokens(vlm):
    _, model, tokenizer, vision = vlm
    runs = [evaluate_hf(model, tokenizer, "frozenlake", IMAGE_ENV, range(3), max_new_tokens=8,
                        batch_size=2, vision=vision) for _ in range(2)]
    for run in runs:
        del run["seconds"]
    assert runs[0] == runs[1] and runs[0]["episodes"] == 3.0
    with pytest.raises(ValueError, match="no image processor"):
        evaluate_hf(model, tokenizer, "frozenlake", IMAGE_ENV, range(1), max_new_tokens=8)


def test_left_padded_image_rows_are_sampled_as_alone(vlm):
    """A short context (one picture) left-padded beside a long one (two pictures) in one batch:
    the M-RoPE positions skip the padding, so every sampled token's log-prob is the model's on
    its own row, unpadded, with its images."""
    from actors.episode import ChatContext, Generation
    from envs.registry import make
    from launch.model.playback import Batcher

    _, model, tokenizer, vision = vlm
    env = make("frozenlake", **IMAGE_ENV)
    obs = env_reset(env, 3)
    short, long = (ChatContext(tokenizer, env.system_prompt(), vision) for _ in range(2))
    short.add_observation(obs.text, obs.images)
    long.add_observation(obs.text, obs.images)
    answer = tokenizer.encode("<answer>Left</answer>", add_special_tokens=False)
    long.add_generation(Generation(answer, [0.0] * len(answer), [0] * len(answer), stopped=False))
    second = env_step(env, "<answer>Left</answer>").observation
    long.add_observation(second.text, second.images)
    rows = [short, long]
    assert len(long.token_ids) > len(short.token_ids) + 10
    torch.manual_seed(0)
    batcher = Batcher(model, tokenizer, 12, batch_size=2, live=2, temperature=1.0, vision=vision)
    gens = batcher._generate([c.token_ids for c in rows], [c.images for c in rows], [None] * len(rows))
    for ctx, gen in zip(rows, gens):
        ids = torch.as_tensor(ctx.token_ids + gen.token_ids)[None]
        px = vision.image_processor(images=ctx.images, return_tensors="pt")
        inputs = {"pixel_values": px["pixel_values"], "image_grid_thw": px["image_grid_thw"],
                  "mm_token_type_ids": (ids == vision.pad_id).long()}
        with torch.no_grad():
            logp = token_logprobs(model, ids, 1.0, inputs=inputs)[0][0, len(ctx.token_ids):]
        np.testing.assert_allclose(gen.logprobs, logp.numpy(), atol=2e-4)
