"""launch/hf_episodes.py: FrozenLake episodes played by transformers' generate on the tiny model.

The sampled tokens' log-probs must be those of the distribution they were drawn from (the
learner recomputes the same numbers, so on-policy ratios are 1); greedy play is deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from envs.registry import load_config
from launch.hf_episodes import evaluate_hf, play
from launch.tiny_model import build_tiny_model
from learner.models import token_logprobs

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
