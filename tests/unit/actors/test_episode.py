"""actors.episode: the token-in/token-out context and the turn loop, against a real FrozenLake env
and the tiny tokenizer, with a scripted model (the unit under test is the bookkeeping); the turns
recorded for the episode pages, against a scripted env."""

import asyncio
import base64
import io
import json

import numpy as np
import pytest

from actors.episode import ChatContext, Generation, run_episode, turn_record
from envs.protocol import Observation, StepResult
from envs.registry import load_config, make
from envs.wire import EpisodeFailure
from launch.model.tiny_tokenizer import build_tokenizer
from tests.envs_api import env_reset, env_step


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(seed=0)


class OneEnvClient:
    """The EnvClient calls run_episode makes, over one in-process env (slot 0)."""

    def __init__(self, env, fail_step_at: int | None = None):
        self.env, self.fail_step_at, self.steps = env, fail_step_at, 0

    async def system_prompt(self, slot):
        return self.env.system_prompt()

    async def reset(self, slots, seeds):
        return [env_reset(self.env, seeds[0])]

    async def step(self, slots, texts):
        self.steps += 1
        if self.steps == self.fail_step_at:
            return [EpisodeFailure("worker_crashed")]
        return [env_step(self.env, texts[0])]


def scripted(tokenizer, answers: list[str], version: int = 7, stop: bool = True):
    """A Generate that answers each turn with the next text (+ EOS when ``stop``)."""
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    seen = []

    async def generate(ids, images, room):
        seen.append(list(ids))
        toks = tokenizer.encode(answers[len(seen) - 1], add_special_tokens=False) + ([eos] if stop else [])
        return Generation(toks, [-0.25] * len(toks), [version] * len(toks), stopped=stop)

    return generate, seen


def _solution_answers(seed: int) -> list[str]:
    env = make("frozenlake", **load_config("frozenlake"))
    env_reset(env, seed)
    moves = env.game.solve()
    return [f"<think><observation>{env.state_text()}</observation><reasoning>go</reasoning>"
            f"<prediction>closer</prediction></think><answer>{','.join(moves[i:i + 1])}</answer>"
            for i in range(len(moves))]


@pytest.mark.parametrize("prompt", ["full", "none"])  # none: no system message at all
def test_context_equals_the_chat_template_of_the_whole_conversation(tokenizer, prompt):
    env = make("frozenlake", **load_config("frozenlake") | {"prompt": prompt})
    answers = ["<think>a</think><answer>Up</answer>", "<think>b</think><answer>Left</answer>",
               "<think>c</think><answer>Down</answer>"]
    generate, seen = scripted(tokenizer, answers)
    result = asyncio.run(run_episode(generate, OneEnvClient(env), 0, 5, tokenizer,
                                     max_turns=3, max_context=4096))
    traj = result.trajectory
    n = int(traj.turn_end.sum())
    # Rebuild the conversation as messages and render it in one go: same text as our ids.
    env2 = make("frozenlake", **load_config("frozenlake") | {"prompt": prompt})
    system = [{"role": "system", "content": env2.system_prompt()}] if prompt != "none" else []
    msgs = [*system, {"role": "user", "content": env_reset(env2, 5).text}]
    for a in answers[:n]:
        msgs.append({"role": "assistant", "content": a})
        step = env_step(env2, a)
        if step.done:
            break
        msgs.append({"role": "user", "content": step.observation.text})
    whole = tokenizer.apply_chat_template(msgs, tokenize=False)
    got = tokenizer.decode(traj.token_ids.tolist())
    assert whole.startswith(got) and whole[len(got):] == "\n"  # only the final glue is missing
    assert got.startswith("<|im_start|>system\n" if prompt == "full" else "<|im_start|>user\nTurn 1 of 3.")
    # Every prompt the model was given is a prefix of the final sequence (nothing re-tokenized).
    for ids in seen:
        assert traj.token_ids[:len(ids)].tolist() == ids
    assert len(seen) == n == len(traj.turn_rewards)


def test_policy_tokens_are_exactly_the_generated_ones(tokenizer):
    env = make("frozenlake", **load_config("frozenlake"))
    answers = ["<think>x</think><answer>Up,Up</answer>"] * 3
    generate, _ = scripted(tokenizer, answers, version=4)
    traj = asyncio.run(run_episode(generate, OneEnvClient(env), 0, 1, tokenizer,
                                   max_turns=3, max_context=4096)).trajectory
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    one = tokenizer.encode(answers[0], add_special_tokens=False) + [eos]
    m = traj.loss_mask
    assert traj.token_ids[m].tolist() == one * int(traj.turn_end.sum())
    assert np.all(traj.policy_version[m] == 4) and np.all(traj.policy_version[~m] == -1)
    assert np.all(traj.behaviour_logprobs[m] == -0.25) and np.all(traj.behaviour_logprobs[~m] == 0)
    ends = np.flatnonzero(traj.turn_end)
    assert np.all(traj.token_ids[ends] == eos)  # each turn ends on the generated end-of-turn


def test_truncated_answer_gets_the_end_of_turn_as_env_tokens(tokenizer):
    ctx = ChatContext(tokenizer, "sys")
    ctx.add_observation("hello")
    ctx.add_generation(Generation([5, 6], [-1.0, -2.0], [0, 0], stopped=False))
    ctx.add_observation("again")
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    i = ctx.token_ids.index(6)
    assert ctx.token_ids[i + 1] == eos and ctx.loss_mask[i + 1] is False
    assert ctx.turn_end[i] is True and sum(ctx.turn_end) == 1


def test_rewards_and_success_of_a_solved_episode(tokenizer):
    env = make("frozenlake", **load_config("frozenlake"))
    answers = _solution_answers(3)
    generate, _ = scripted(tokenizer, answers)
    result = asyncio.run(run_episode(generate, OneEnvClient(env), 0, 3, tokenizer,
                                     max_turns=3, max_context=4096))
    ref = make("frozenlake", **load_config("frozenlake"))
    env_reset(ref, 3)
    expected = [env_step(ref, a).reward for a in answers[:3]]
    assert result.trajectory.turn_rewards.tolist() == pytest.approx(expected[:len(result.trajectory.turn_rewards)])
    assert result.metrics["success"] == (1.0 if len(answers) <= 3 else 0.0)


def test_env_failure_loses_the_episode_with_its_reason(tokenizer):
    env = make("frozenlake", **load_config("frozenlake"))
    generate, _ = scripted(tokenizer, ["<answer>Up</answer>"] * 3)
    result = asyncio.run(run_episode(generate, OneEnvClient(env, fail_step_at=2), 0, 1, tokenizer,
                                     max_turns=3, max_context=4096))
    assert result.trajectory is None and result.failure == "worker_crashed"


def test_context_budget_ends_the_episode(tokenizer):
    env = make("frozenlake", **load_config("frozenlake"))
    generate, seen = scripted(tokenizer, ["<answer>Up</answer>"] * 3)
    result = asyncio.run(run_episode(generate, OneEnvClient(env), 0, 1, tokenizer,
                                     max_turns=3, max_context=10))
    assert result.trajectory is None and result.failure == "context_overflow" and not seen


def test_generation_from_vllm_labels_each_token_with_its_span_version():
    from types import SimpleNamespace as NS

    ids = [5, 6, 7, 8]
    out = NS(token_ids=ids, finish_reason="length",
             logprobs=[{t: NS(logprob=-0.1 * (i + 1))} for i, t in enumerate(ids)],
             weight_versions=[NS(version="3", start=0, end=1), NS(version="4", start=1, end=4)])
    gen = Generation.from_vllm(out, version=9)
    assert gen.token_ids == ids and not gen.stopped
    assert gen.logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert gen.versions == [3, 4, 4, 4]
    plain = Generation.from_vllm(NS(token_ids=ids[:2], finish_reason="stop", logprobs=None,
                                    weight_versions=None), version=9, logprobs=False)
    assert (plain.logprobs, plain.versions, plain.stopped) == ([0.0, 0.0], [9, 9], True)


def test_reasoning_scores_are_the_mean_over_turns_of_the_judges(tokenizer):
    """Turn 1 states the true map (observation score 1), turn 2 a wrong one (0), turn 3 is out
    of format (0): the episode's observation_score is 1/3. No judge: no score keys."""
    env = make("frozenlake", **load_config("frozenlake"))
    env_reset(env, 3)
    truth = env.state_text()
    answers = [f"<think><observation>{truth}</observation><reasoning>go</reasoning>"
               "<prediction>closer</prediction></think><answer>Down</answer>",
               "<think><observation>nothing</observation><reasoning>go</reasoning>"
               "<prediction>closer</prediction></think><answer>Up</answer>",
               "<answer>Up</answer>"]
    generate, _ = scripted(tokenizer, answers)
    result = asyncio.run(run_episode(generate, OneEnvClient(make("frozenlake", **load_config("frozenlake"))),
                                     0, 3, tokenizer, max_turns=3, max_context=4096))
    assert result.metrics["turns"] == 3.0
    assert result.metrics["observation_score"] == pytest.approx(1 / 3)
    assert result.metrics["prediction_score"] == 0.0
    assert result.trajectory.metrics == result.metrics  # they travel to the learner's rollout/*
    # the reward is its parts, each summed over the turns: the env's, the format's, the judge's
    m = result.metrics
    assert m["reward"] == pytest.approx(m["reward_env"] + m["reward_format"] + m["reward_reasoning"])
    assert m["reward_format"] > 0 and m["reward_reasoning"] > 0  # turns 1-2 in format, turn 1 true
    assert sum(result.trajectory.turn_rewards) == pytest.approx(m["reward"])
    # the action histogram: what the env executed, counted by name (turn 3 was out of format)
    assert {k: v for k, v in m.items() if k.startswith("action/")} == {"action/down": 1.0, "action/up": 1.0}

    no_judge = make("frozenlake", **(load_config("frozenlake") | {"reasoning_reward": None}))
    generate, _ = scripted(tokenizer, answers)
    plain = asyncio.run(run_episode(generate, OneEnvClient(no_judge), 0, 3, tokenizer,
                                    max_turns=3, max_context=4096))
    assert not any(k.endswith("_score") for k in plain.metrics)


class ScriptedEnvClient:
    """Two turns whose observations, rewards and infos are fixed here, to check what is recorded."""

    INFOS = [{"success": False, "format_correct": True, "actions_valid": True, "actions": ["Up"],
              "metrics": {"env_reward": 0.0, "format_reward": 0.5, "reasoning/observation_score": 1.0}},
             {"success": True, "format_correct": False, "actions_valid": False, "actions": [],
              "metrics": {"env_reward": 10.0, "format_reward": 0.0, "reasoning/observation_score": 0.0}}]

    def __init__(self):
        self.turn = 0

    async def system_prompt(self, slot):
        return "sys"

    async def reset(self, slots, seeds):
        return [Observation(f"map {seeds[0]} <b>")]

    async def step(self, slots, texts):
        info = self.INFOS[self.turn]
        self.turn += 1
        return [StepResult(Observation(f"after turn {self.turn}"), reward=float(self.turn) / 4,
                           done=self.turn == 2, info=info)]


def test_recorded_turns_are_what_the_model_saw_and_what_the_env_said(tokenizer):
    answers = ["<think>one</think><answer>Up</answer>", "<script>x()</script>"]
    generate, _ = scripted(tokenizer, answers)
    turns = []
    result = asyncio.run(run_episode(generate, ScriptedEnvClient(), 0, 9, tokenizer, max_turns=3,
                                     max_context=4096, record=turns))
    assert result.metrics["turns"] == 2.0
    assert turns == [
        {"observation": "map 9 <b>", "images": [], "answer": answers[0], "reward": 0.25,
         "metrics": {"env_reward": 0.0, "format_reward": 0.5, "reasoning/observation_score": 1.0},
         "scores": {"observation_score": 1.0}, "format_correct": True, "actions_valid": True,
         "actions": ["Up"], "success": False, "done": False},
        {"observation": "after turn 1", "images": [], "answer": answers[1], "reward": 0.5,
         "metrics": {"env_reward": 10.0, "format_reward": 0.0, "reasoning/observation_score": 0.0},
         "scores": {"observation_score": 0.0}, "format_correct": False, "actions_valid": False,
         "actions": [], "success": True, "done": True}]


def test_a_recorded_turn_carries_its_images_as_png_and_is_plain_data():
    from PIL import Image

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((6, 5, 3), (4, 4, 3))]
    info = {"success": np.bool_(True), "format_correct": True, "actions": ["Left"],
            "metrics": {"env_reward": np.float32(1.5)}}
    turn = turn_record(Observation("<image> and <image>", images), "<answer>Left</answer>",
                       StepResult(Observation("next"), np.float64(2.0), True, info))
    assert json.loads(json.dumps(turn)) == turn  # plain data: Ray and the page need no numpy
    for b64, image in zip(turn["images"], images):
        np.testing.assert_array_equal(np.array(Image.open(io.BytesIO(base64.b64decode(b64)))), image)
    assert (turn["reward"], turn["metrics"], turn["scores"], turn["actions_valid"]) == (
        2.0, {"env_reward": 1.5}, {}, False)


def test_an_answer_cut_short_at_the_context_leaves_room_for_its_end_of_turn(tokenizer):
    """The answer may fill the context less the end-of-turn token that closes an answer cut
    short, so the trajectory never passes ``max_context``; a generator that gives more is refused."""
    env = make("frozenlake", **load_config("frozenlake"))
    probe, seen = scripted(tokenizer, ["<answer>Up</answer>"] * 3)
    asyncio.run(run_episode(probe, OneEnvClient(env), 0, 1, tokenizer, max_turns=1, max_context=4096))
    first = len(seen[0])  # the context when the first answer is asked for
    rooms = []

    async def greedy_filler(ids, images, room):
        rooms.append(room)
        return Generation([7] * room, [-0.1] * room, [0] * room, stopped=False)  # cut at the room

    result = asyncio.run(run_episode(greedy_filler, OneEnvClient(env), 0, 1, tokenizer,
                                     max_turns=3, max_context=first + 6))
    assert rooms == [5]  # 6 free tokens, one kept for the end-of-turn
    t = result.trajectory  # then the next observation, which ends the episode (it is no answer's)
    assert t.loss_mask[first:first + 5].all() and t.loss_mask.sum() == 5
    assert not t.loss_mask[first + 5] and t.token_ids[first + 5] == tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    async def overflowing(ids, images, room):
        return Generation([7] * (room + 1), [-0.1] * (room + 1), [0] * (room + 1), stopped=False)

    with pytest.raises(ValueError, match="where 5 fit"):
        asyncio.run(run_episode(overflowing, OneEnvClient(env), 0, 1, tokenizer, max_turns=3,
                                max_context=first + 6))


def test_action_names_are_their_leading_word_within_a_bound():
    from actors.episode import MAX_ACTION_NAMES, action_name

    assert action_name("pick(10, 20, 30)", {}) == "pick" and action_name("Left", {}) == "left"
    assert action_name("(1, 2)", {}) == "other" and action_name(3, {}) == "other"
    full = {f"a{i}": 1.0 for i in range(MAX_ACTION_NAMES)}
    assert action_name("a3", full) == "a3" and action_name("new", full) == "other"
