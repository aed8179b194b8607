"""The method presets (configs/algorithm) decide every reward term and where it lands, as VAGEN's
method table says: the reasoning reward for VAGEN-Full only, turn rewards at turn ends for
Turn-PPO and VAGEN-Full, one episode reward at the last policy token for GRPO and VAGEN-Base.

Each preset is composed as ``python -m launch.train algorithm=<name>`` composes it, its env built
from ``launch.config.builders.env_config`` (what the actors build), and one scripted FrozenLake episode
(perfect observations and predictions, the solver's moves one per turn) played through the real
episode loop and collated by the learner's ``collate``."""

import asyncio

import numpy as np
import pytest

from actors.episode import Generation, run_episode
from envs.registry import make
from launch.config.builders import actor_config, env_config, trainer_config
from launch.config.compose import compose
from launch.model.tiny_tokenizer import build_tokenizer
from learner.batch import collate
from tests.envs_api import env_reset, env_step

SEED = 11
PRESETS = {  # name: (reasoning reward, multi-turn reward, estimator)
    "grpo": (False, False, "grpo"),
    "turn_ppo": (False, True, "turn_wise_gae"),
    "vagen_base": (False, False, "masked_gae"),
    "vagen_full": (True, True, "bi_level_gae"),
}


class OneEnv:
    def __init__(self, env):
        self.env = env

    async def system_prompt(self, slot):
        return self.env.system_prompt()

    async def reset(self, slots, seeds):
        return [env_reset(self.env, seeds[0])]

    async def step(self, slots, texts):
        return [env_step(self.env, texts[0])]


def _answers(config: dict) -> list[str]:
    """One solver move per turn, each answer stating the true state before and after it."""
    env, twin = make("frozenlake", **config), make("frozenlake", **config)
    env_reset(env, SEED), env_reset(twin, SEED)
    out = []
    for move in env.solve()[:3]:
        before = twin.state_text()
        env_step(twin, f"<think><observation>-</observation><reasoning>-</reasoning>"
                  f"<prediction>-</prediction></think><answer>{move}</answer>")
        out.append(f"<think><observation>{before}</observation><reasoning>go</reasoning>"
                   f"<prediction>{twin.state_text()}</prediction></think><answer>{move}</answer>")
    return out


def _episode(cfg, tokenizer):
    config = env_config(cfg)
    answers = _answers({**config, "reasoning_reward": None})
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    turns = []

    async def generate(ids, images, room):
        ids = tokenizer.encode(answers[len(turns)], add_special_tokens=False) + [eos]
        turns.append(ids)
        return Generation(ids, [-0.5] * len(ids), [0] * len(ids), stopped=True)

    result = asyncio.run(run_episode(generate, OneEnv(make("frozenlake", **config)), 0, SEED,
                                     tokenizer, max_turns=cfg.env["max_turns"], max_context=4096))
    return result, turns


@pytest.fixture(scope="module")
def episodes():
    tokenizer = build_tokenizer(seed=0)
    out = {}
    for name in PRESETS:
        cfg = compose([f"algorithm={name}"])
        out[name] = (cfg, *_episode(cfg, tokenizer))
    return out


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_rewards_and_masks(episodes, name):
    reasoning, multi_turn, estimator = PRESETS[name]
    cfg, result, turns = episodes[name]
    assert cfg.algorithm.estimator == estimator
    assert trainer_config(cfg, "/m").multi_turn_reward is multi_turn
    traj = result.trajectory
    assert len(turns) >= 2 and traj.turn_rewards.shape == (len(turns),)

    # The reasoning reward: +1 per turn (0.5 * observation + 0.5 * prediction, both perfect)
    # for VAGEN-Full; nothing for the others, whose turn rewards are the same as each other's.
    base = episodes["vagen_base"][1].trajectory.turn_rewards
    np.testing.assert_allclose(traj.turn_rewards - base, 1.0 if reasoning else 0.0, atol=1e-6)
    # Every preset still scores the descriptions (metrics for comparing methods).
    assert result.metrics["observation_score"] == 1.0 and result.metrics["prediction_score"] == 1.0

    # Masks: policy tokens are exactly the generated ones, each turn ending on its EOS.
    policy = np.flatnonzero(traj.loss_mask)
    assert traj.token_ids[policy].tolist() == [t for turn in turns for t in turn]
    ends = np.flatnonzero(traj.turn_end)
    assert ends.tolist() == list(policy[np.cumsum([len(t) for t in turns]) - 1])

    # Placement: turn rewards at the turn ends (multi-turn), or their sum at the last policy token.
    rewards = collate([traj], multi_turn_reward=cfg.algorithm.multi_turn_reward).token_rewards[0].numpy()
    total = float(traj.turn_rewards.sum()) + traj.final_reward
    if multi_turn:
        expected = np.zeros_like(rewards)
        expected[ends] = traj.turn_rewards
        expected[policy[-1]] += traj.final_reward
    else:
        expected = np.zeros_like(rewards)
        expected[policy[-1]] = total
    np.testing.assert_allclose(rewards, expected, atol=1e-6)
    assert rewards.sum() == pytest.approx(total, abs=1e-5)


def test_an_env_without_a_judge_stays_without_one():
    cfg = compose(["algorithm=vagen_base", "env.reasoning_reward=null"])
    assert env_config(cfg)["reasoning_reward"] is None


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_grpo_alone_has_its_actors_send_whole_groups(name):
    cfg = compose([f"algorithm={name}"])
    assert actor_config(cfg, 0, "/m", "tcp://127.0.0.1:1").whole_groups is (name == "grpo")
