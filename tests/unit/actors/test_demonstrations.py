"""actors/demonstrations.py: solver demonstrations as Trajectories, replayed against fresh envs
(the tiny tokenizer, both grid games, every answer format); with image observations, against
the tiny Qwen2-VL's own processor."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from actors.demonstrations import make_demonstrations, offsets
from envs.formats import FORMATS, parse
from envs.registry import load_config, make, resolve_config
from launch.model.tiny_tokenizer import build_tokenizer
from tests.envs_api import env_reset, env_step
from transport.images import collapse_pads

ENVS = ("frozenlake", "sokoban")
SEEDS = range(12)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(seed=0)


def _answers(traj, tokenizer) -> list[str]:
    """The text of each turn's answer: the loss-mask runs, decoded without the end-of-turn."""
    m = traj.loss_mask
    starts = np.flatnonzero(m & ~np.r_[False, m[:-1]])
    ends = np.flatnonzero(traj.turn_end)
    return [tokenizer.decode(traj.token_ids[s:e + 1].tolist(), skip_special_tokens=True)
            for s, e in zip(starts, ends)]


def _replay(name, config, traj, tokenizer):
    """Step a fresh env with the demonstration's answers; yields (answer, state before, step)."""
    env = make(name, **config)
    env_reset(env, traj.seed)
    for answer in _answers(traj, tokenizer):
        before = env.state_text()
        yield answer, before, env_step(env, answer), env


def _solution_fits(name, config, seed) -> bool:
    env = make(name, **config)
    env_reset(env, seed)
    return len(env.solve()) <= env.max_turns * env.max_actions


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_noiseless_demonstrations_are_well_formed_and_succeed(tokenizer, name, fmt):
    config = {**load_config(name), "format": fmt}
    demos = make_demonstrations(name, config, tokenizer, SEEDS, action_noise=0.0, rng_seed=0)
    assert [d.seed for d in demos] == list(SEEDS)
    for traj in demos:
        rewards = []
        for answer, before, step, env in _replay(name, config, traj, tokenizer):
            parsed = parse(answer, fmt, action_sep=env.action_sep, max_actions=env.max_actions)
            assert parsed.format_correct and step.info["actions_valid"], answer
            if "grounding" in fmt:
                assert parsed.observation == before
            if "worldmodeling" in fmt:
                assert parsed.prediction == env.state_text()
            rewards.append(step.reward)
        assert traj.turn_rewards.tolist() == pytest.approx(rewards)
        assert step.done and len(rewards) == len(traj.turn_rewards)
        if _solution_fits(name, config, traj.seed):
            assert step.info["success"] and traj.metrics["success"] == 1.0


@pytest.mark.parametrize("player, pos, expected", [
    ((3, 1), (1, 2), "2 rows up and 1 column right"),
    ((0, 0), (1, 0), "1 row down"),
    ((2, 2), (2, 0), "2 columns left"),
    ((0, 3), (3, 0), "3 rows down and 3 columns left"),
    ((1, 1), (1, 1), "at the player"),
])
def test_offsets_by_hand(player, pos, expected):
    assert offsets(player, pos) == expected


@pytest.mark.parametrize("name", ENVS)
def test_offsets_reasoning_counts_from_the_true_state(tokenizer, name):
    """reasoning="offsets": each turn's <reasoning> gives the first object's rows and columns
    from the player in the state the turn was answered from; the rest of the answer is the same
    as with the relation reasoning."""
    config = load_config(name)
    kwargs = dict(action_noise=0.5, rng_seed=0, mistake="habit")
    demos = make_demonstrations(name, config, tokenizer, SEEDS, reasoning="offsets", **kwargs)
    plain = make_demonstrations(name, config, tokenizer, SEEDS, **kwargs)
    turns = 0
    for traj, other in zip(demos, plain):
        env = make(name, **config)
        env_reset(env, traj.seed)
        for answer, relation_answer in zip(_answers(traj, tokenizer), _answers(other, tokenizer)):
            player, objects = env.game.objects()
            kind, pos = objects[0]
            reasoning = re.search(r"<reasoning>(.*?)</reasoning>", answer).group(1)
            assert reasoning.startswith(f"The {kind} is {offsets(player, pos)}, ")
            assert re.sub(r"<reasoning>.*?</reasoning>", "", answer) == \
                re.sub(r"<reasoning>.*?</reasoning>", "", relation_answer)
            env_step(env, answer)
            turns += 1
    assert turns > len(SEEDS)
    with pytest.raises(ValueError, match="reasoning"):
        make_demonstrations(name, config, tokenizer, SEEDS, reasoning="plan", **kwargs)


def test_loss_mask_covers_exactly_the_answers_and_their_end_of_turn(tokenizer):
    config = load_config("frozenlake")
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    for traj in make_demonstrations("frozenlake", config, tokenizer, SEEDS, action_noise=0.5,
                                    rng_seed=1):
        answers = _answers(traj, tokenizer)
        expected = [t for a in answers for t in tokenizer.encode(a, add_special_tokens=False) + [eos]]
        assert traj.token_ids[traj.loss_mask].tolist() == expected
        assert all(a.startswith("<think><observation>") and a.endswith("</answer>") for a in answers)
        # The whole sequence is the chat template of the conversation (system, observations,
        # answers), up to the glue after the last answer.
        env = make("frozenlake", **config)
        msgs = [{"role": "system", "content": env.system_prompt()},
                {"role": "user", "content": env_reset(env, traj.seed).text}]
        for a in answers:
            step = env_step(env, a)
            msgs.append({"role": "assistant", "content": a})
            if not step.done:
                msgs.append({"role": "user", "content": step.observation.text})
        whole = tokenizer.apply_chat_template(msgs, tokenize=False)
        assert whole == tokenizer.decode(traj.token_ids.tolist()) + "\n"
        assert np.all(traj.policy_version[traj.loss_mask] == 0)
        assert np.all(traj.behaviour_logprobs == 0)
        assert np.all(traj.token_ids[traj.turn_end] == eos)


@pytest.mark.parametrize("name", ENVS)
def test_full_noise_gives_random_actions(tokenizer, name):
    config = load_config(name)
    seeds = range(40)
    demos = make_demonstrations(name, config, tokenizer, seeds, action_noise=1.0, rng_seed=0)
    assert all(d.metrics["random_action_share"] == 1.0 for d in demos)
    first = []
    for traj in demos:
        answer, *_ = next(_replay(name, config, traj, tokenizer))
        first.append(parse(answer, config["format"]).actions[0])
    counts = np.array([first.count(a) for a in make(name, **config).action_names])
    assert counts.min() >= 4  # 40 uniform draws over 4 actions: each seen (p of failing < 1e-3)
    assert np.mean([d.metrics["success"] for d in demos]) < 0.5


def test_noise_is_the_share_of_random_actions_and_costs_success(tokenizer):
    config = load_config("frozenlake")
    demos = make_demonstrations("frozenlake", config, tokenizer, range(60), action_noise=0.4,
                                rng_seed=0)
    share = np.mean([d.metrics["random_action_share"] for d in demos])
    assert 0.3 < share < 0.5
    assert 0.3 < np.mean([d.metrics["success"] for d in demos]) < 1.0


_REVERSE = {"Left": "Right", "Right": "Left", "Up": "Down", "Down": "Up"}
_MISTAKE = {  # (the solver's move, the episode's previous action, the action space) -> mistake
    "reverse": lambda move, previous, space: _REVERSE[move],
    "repeat": lambda move, previous, space: previous or move,
    "habit": lambda move, previous, space: space[0],
}


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("mistake", sorted(_MISTAKE))
def test_systematic_mistakes_are_the_named_error_and_nothing_else(tokenizer, name, mistake):
    """Each action is the solver's move from the state it is played in, or the named mistake
    (the move reversed, the previous action again, the first action of the space); at noise 1
    always the mistake (while a solution exists). Replayed move by move on a copy of the game."""
    config = load_config(name)
    for noise in (0.5, 1.0):
        demos = make_demonstrations(name, config, tokenizer, range(30), action_noise=noise,
                                    rng_seed=0, mistake=mistake)
        wrong, chosen = [], []  # per action: the mistake, and whether it was played (if it differs)
        for traj in demos:
            env = make(name, **config)
            env_reset(env, traj.seed)
            previous = None
            for answer in _answers(traj, tokenizer):
                sim = copy.deepcopy(env.game)
                for action in parse(answer, config["format"]).actions:
                    plan = sim.solve()
                    if plan:
                        mistake_action = _MISTAKE[mistake](plan[0], previous, sim.action_space)
                        assert action in (plan[0], mistake_action)
                        wrong.append(action == mistake_action)
                        if mistake_action != plan[0]:
                            chosen.append(action == mistake_action)
                    sim.move(action)
                    previous = action
                env_step(env, answer)
        if noise == 1.0:
            assert all(wrong)
        else:
            assert 0.35 < np.mean(chosen) < 0.65 and len(chosen) > 40


def test_deterministic_in_rng_seed_and_independent_of_the_other_seeds(tokenizer):
    config = load_config("sokoban")
    a = make_demonstrations("sokoban", config, tokenizer, [3, 4, 5], action_noise=0.5, rng_seed=7)
    b = make_demonstrations("sokoban", config, tokenizer, [5], action_noise=0.5, rng_seed=7)
    c = make_demonstrations("sokoban", config, tokenizer, [3, 4, 5], action_noise=0.5, rng_seed=8)
    assert a[2].token_ids.tolist() == b[0].token_ids.tolist()
    again = make_demonstrations("sokoban", config, tokenizer, [3, 4, 5], action_noise=0.5, rng_seed=7)
    assert [t.token_ids.tolist() for t in a] == [t.token_ids.tolist() for t in again]
    assert [t.token_ids.tolist() for t in a] != [t.token_ids.tolist() for t in c]


def test_actions_per_turn_and_bad_settings(tokenizer):
    config = load_config("frozenlake")
    demos = make_demonstrations("frozenlake", config, tokenizer, SEEDS, action_noise=0.0,
                                rng_seed=0, actions_per_turn=1)
    for traj in demos:
        for answer, *_ in _replay("frozenlake", config, traj, tokenizer):
            assert len(parse(answer, config["format"]).actions) == 1
    with pytest.raises(ValueError, match="actions_per_turn"):
        make_demonstrations("frozenlake", config, tokenizer, [0], action_noise=0.0, rng_seed=0,
                            actions_per_turn=4)
    with pytest.raises(ValueError, match="action_noise"):
        make_demonstrations("frozenlake", config, tokenizer, [0], action_noise=1.5, rng_seed=0)
    with pytest.raises(ValueError, match="mistake"):
        make_demonstrations("frozenlake", config, tokenizer, [0], action_noise=0.5, rng_seed=0,
                            mistake="mirror")


@pytest.fixture(scope="module")
def vl_path(tmp_path_factory):
    from launch.model.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("vl"), vision=True, seed=0))


def _image_config(name):
    return load_config(name) | {"render": "image", "image_size": 56}


@pytest.mark.parametrize("name", ENVS)
def test_image_demonstrations_are_the_processors_ids_of_the_conversation(vl_path, name):
    """The ids are what the model's own processor makes of the whole conversation (system, each
    observation with its picture, each answer), the images are the env's, losslessly, and the
    loss mask covers exactly the answers and their end-of-turn tokens."""
    from transformers import AutoProcessor

    from actors.vision import VisionTokens
    from transport.images import decode_image

    processor = AutoProcessor.from_pretrained(vl_path)
    tok, vision = processor.tokenizer, VisionTokens.from_pretrained(vl_path)
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    config = _image_config(name)
    demos = make_demonstrations(name, config, tok, range(6), action_noise=0.4, rng_seed=0,
                                vision=vision)
    assert sum(len(d.turn_rewards) > 1 for d in demos) >= 2  # multi-image contexts are covered
    for traj in demos:
        answers = _answers(traj, tok)
        env = make(name, **config)
        obs = env_reset(env, traj.seed)
        msgs, images = [{"role": "system", "content": env.system_prompt()}], []
        for a in answers:
            msgs.append({"role": "user", "content": obs.text.replace("<image>", vision.placeholder)})
            msgs.append({"role": "assistant", "content": a})
            images += obs.images
            obs = env_step(env, a).observation
        text = processor.apply_chat_template(msgs, tokenize=False)
        assert text.endswith("<|im_end|>\n")  # the glue after the last answer is not the model's
        expected = processor(text=[text[:-1]], images=images, return_tensors="np")["input_ids"][0]
        assert traj.token_ids.tolist() == expected.tolist()
        assert len(traj.images) == len(answers) == len(images)
        for sent, image in zip(traj.images, images):
            np.testing.assert_array_equal(decode_image(sent), image)
        assert collapse_pads(traj.token_ids.tolist(), vision.pad_id)[1] == [
            vision.count(im) for im in images]
        policy = [t for a in answers for t in tok.encode(a, add_special_tokens=False) + [eos]]
        assert traj.token_ids[traj.loss_mask].tolist() == policy
        assert not set(traj.token_ids[traj.loss_mask].tolist()) & vision.special_ids
        assert np.all(traj.token_ids[traj.turn_end] == eos)


def test_image_and_text_renders_demonstrate_the_same_answers(vl_path):
    """The answers describe the true state in words whatever the render: the same tokens under
    the loss mask, the same rewards; a text env with ``vision`` is the text demonstration."""
    from transformers import AutoTokenizer

    from actors.vision import VisionTokens

    tok, vision = AutoTokenizer.from_pretrained(vl_path), VisionTokens.from_pretrained(vl_path)
    config = load_config("sokoban")
    kwargs = dict(action_noise=0.5, rng_seed=3)
    text = make_demonstrations("sokoban", config, tok, range(8), **kwargs)
    image = make_demonstrations("sokoban", _image_config("sokoban"), tok, range(8), vision=vision,
                                **kwargs)
    with_vision = make_demonstrations("sokoban", config, tok, range(8), vision=vision, **kwargs)
    for t, i, v in zip(text, image, with_vision):
        assert t.token_ids[t.loss_mask].tolist() == i.token_ids[i.loss_mask].tolist()
        assert t.turn_rewards.tolist() == i.turn_rewards.tolist() and t.metrics == i.metrics
        assert t.token_ids.tolist() == v.token_ids.tolist() and not t.images and not v.images
        assert len(i.images) == len(i.turn_rewards)


def test_image_observations_need_the_models_vision_tokens(tokenizer):
    config = _image_config("frozenlake")
    with pytest.raises(ValueError, match="vision tokens"):
        make_demonstrations("frozenlake", config, tokenizer, [0], action_noise=0.0, rng_seed=0)


def test_an_env_without_a_solver_says_it_has_no_demonstrations(tokenizer):
    # slippery CliffWalking: no solve(), and its table has three outcomes per move
    config = resolve_config("gym", {"id": "CliffWalkingSlippery-v1"})
    with pytest.raises(ValueError, match="no solver to demonstrate with"):
        make_demonstrations("gym", config, tokenizer, [0], action_noise=0.0, rng_seed=0)


def test_a_gymnasium_game_is_demonstrated_by_searching_its_table(tokenizer):
    config = resolve_config("gym", {})  # CliffWalking: a deterministic table, no solve()
    (demo,) = make_demonstrations("gym", config, tokenizer, [0], action_noise=0.0, rng_seed=0)
    # 13 moves (Up, 11 x Right, Down) in turns of 3: -1 x 0.1 a move, +0.5 format a turn, + 10 at
    # the goal (configs/env/gym.yaml's scale)
    assert demo.metrics["success"] == 1.0
    assert demo.turn_rewards.tolist() == pytest.approx([0.5 - 0.3] * 4 + [0.5 - 0.1 + 10])
    answers = tokenizer.decode(demo.token_ids[demo.loss_mask])
    assert "takes 13 moves and starts Up, Right, Right.</think><answer>Up,Right,Right</answer>" in answers
    assert "takes 1 move and starts Down.</think><answer>Down</answer>" in answers


def test_the_svg_env_demonstrates_with_the_targets_own_svg(vl_path, tokenizer):
    from transformers import AutoTokenizer

    from actors.vision import VisionTokens

    tok, vision = AutoTokenizer.from_pretrained(vl_path), VisionTokens.from_pretrained(vl_path)
    config = resolve_config("svg", {"image_size": 56, "targets": "shapes"})
    clean = make_demonstrations("svg", config, tok, range(3), action_noise=0.0, rng_seed=0, vision=vision)
    env = make("svg", **config)
    try:
        for seed, demo in enumerate(clean):
            env.reset(seed=seed)
            assert demo.metrics["success"] == 1.0 and demo.turn_rewards.tolist() == [5.5]
            assert f"<answer>{env.target_svg}</answer>" in tok.decode(demo.token_ids[demo.loss_mask])
            assert len(demo.images) == 1  # the target, once: the first answer drew it
    finally:
        env.close()
    noisy = make_demonstrations("svg", config, tok, range(3), action_noise=1.0, rng_seed=0, vision=vision)
    assert all(d.metrics["random_action_share"] == 1.0 and d.metrics["success"] == 0.0 for d in noisy)
    assert all(len(d.turn_rewards) == 2 for d in noisy)  # VAGEN's two turns, both missed
    with pytest.raises(ValueError, match="vision tokens"):
        make_demonstrations("svg", config, tokenizer, [0], action_noise=0.0, rng_seed=0)
    # its mistakes are its own: a systematic one asked for is refused, not ignored
    with pytest.raises(ValueError, match="warm_start.mistake=habit means nothing there"):
        make_demonstrations("svg", config, tok, [0], action_noise=0.5, rng_seed=0, vision=vision, mistake="habit")
