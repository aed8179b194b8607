"""Images in an episode's context: the ids are the model's own processor's ids, turn after turn,
and the vLLM request is the same context with each image's pad run collapsed."""

import asyncio

import numpy as np
import pytest

import envs
from actors.episode import ChatContext, Generation, run_episode
from actors.vision import VisionTokens, vllm_prompt
from envs.registry import load_config
from launch.model.tiny_model import build_tiny_model
from tests.envs_api import env_reset, env_step
from tests.unit.actors.test_episode import OneEnvClient
from transport.images import decode_image


@pytest.fixture(scope="module")
def vl_path(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("vl"), vision=True, seed=0))


@pytest.fixture(scope="module")
def image_env():
    return envs.make("frozenlake", **(load_config("frozenlake") | {"render": "image", "image_size": 64}))


def test_text_model_has_no_vision_tokens(tmp_path):
    assert VisionTokens.from_pretrained(str(build_tiny_model(tmp_path, seed=0))) is None


def test_first_observation_matches_the_processor(vl_path, image_env):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(vl_path)
    vision = VisionTokens.from_pretrained(vl_path)
    obs = env_reset(image_env, 3)
    assert len(obs.images) == 1
    ctx = ChatContext(processor.tokenizer, image_env.system_prompt(), vision)
    ctx.add_observation(obs.text, obs.images)

    messages = [{"role": "system", "content": image_env.system_prompt()},
                {"role": "user", "content": obs.text.replace("<image>", vision.placeholder)}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = processor(text=[text], images=obs.images, return_tensors="np")["input_ids"][0]
    assert ctx.token_ids == expected.tolist()
    assert ctx.token_ids.count(vision.pad_id) == vision.count(obs.images[0]) > 1


def test_images_accumulate_over_turns(vl_path, image_env):
    from transformers import AutoTokenizer

    vision = VisionTokens.from_pretrained(vl_path)
    tokenizer = AutoTokenizer.from_pretrained(vl_path)
    obs = env_reset(image_env, 5)
    ctx = ChatContext(tokenizer, image_env.system_prompt(), vision)
    ctx.add_observation(obs.text, obs.images)
    answer = tokenizer.encode("<answer>Left</answer>", add_special_tokens=False)
    ctx.add_generation(Generation(answer, [-0.5] * len(answer), [0] * len(answer), stopped=False))
    second = env_step(image_env, "<answer>Left</answer>").observation
    ctx.add_observation(second.text, second.images)
    assert len(ctx.images) == 2

    request = vllm_prompt(ctx.token_ids, ctx.images, vision)
    n = vision.count(obs.images[0])
    assert request["prompt_token_ids"].count(vision.pad_id) == 2
    assert len(request["prompt_token_ids"]) == len(ctx.token_ids) - 2 * (n - 1)
    assert len(request["multi_modal_data"]["image"]) == 2
    with pytest.raises(ValueError, match="2 image pad runs in the context for 1 images"):
        vllm_prompt(ctx.token_ids, ctx.images[:1], vision)

    traj = ctx.to_trajectory([0.0], run_id="r", actor_id=0, episode_id=0, env_name="frozenlake",
                             seed=5, group_id=0)
    assert len(traj.images) == 2
    for sent, image in zip(traj.images, (obs.images[0], second.images[0])):
        np.testing.assert_array_equal(decode_image(sent), image)


def test_images_without_a_vision_model_raise(vl_path, image_env):
    from transformers import AutoTokenizer

    obs = env_reset(image_env, 1)
    ctx = ChatContext(AutoTokenizer.from_pretrained(vl_path), None)
    with pytest.raises(ValueError, match="no image processor"):
        ctx.add_observation(obs.text, obs.images)
    with pytest.raises(ValueError, match="no image processor"):
        vllm_prompt([1, 2], obs.images, None)
    vision = VisionTokens.from_pretrained(vl_path)
    with pytest.raises(ValueError, match="placeholders for 2 images"):
        vision.render(obs.text, 2)


def test_an_answer_with_a_vision_token_fails_the_episode(vl_path, image_env):
    """A model that writes an image placeholder: the episode ends as a failure, nothing to train."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vl_path)
    vision = VisionTokens.from_pretrained(vl_path)
    answers = [tokenizer.encode("<answer>Left</answer>", add_special_tokens=False),
               tokenizer.encode("<answer>", add_special_tokens=False) + [vision.pad_id]]

    async def generate(ids, images, room):
        toks = answers[len(images) - 1]
        return Generation(toks, [-0.1] * len(toks), [0] * len(toks), stopped=True)

    result = asyncio.run(run_episode(generate, OneEnvClient(image_env), 0, 5, tokenizer,
                                     max_turns=3, max_context=4096, vision=vision))
    assert result.trajectory is None and result.failure == "vision_token_generated"
    assert {tokenizer.convert_ids_to_tokens(i) for i in vision.special_ids} == {
        "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"}


@pytest.mark.parametrize("blind", [False, True])
def test_a_blind_episode_shows_the_model_white_pictures_and_the_env_scores_the_real_ones(
        vl_path, image_env, blind):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vl_path)
    vision = VisionTokens.from_pretrained(vl_path)
    answer = tokenizer.encode("<think><observation>a</observation><prediction>b</prediction></think>"
                              "<answer>Left</answer>", add_special_tokens=False)
    seen = []

    async def generate(ids, images, room):
        seen.append([im.copy() for im in images])
        return Generation(answer, [-0.1] * len(answer), [0] * len(answer), stopped=True)

    result = asyncio.run(run_episode(generate, OneEnvClient(image_env), 0, 5, tokenizer, max_turns=2,
                                     max_context=4096, vision=vision, blind=blind))
    real = env_reset(image_env, 5).images[0]
    assert result.trajectory is not None and seen
    first = seen[0][0]
    assert first.shape == real.shape
    assert (first == 255).all() if blind else np.array_equal(first, real)
    assert all((decode_image(im) == 255).all() == blind for im in result.trajectory.images)
