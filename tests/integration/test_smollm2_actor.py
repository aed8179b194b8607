"""SmolLM2-135M-Instruct (model=smollm2_135m, from the package index) played by the inference
actor on a real vLLM engine against a FrozenLake pool, the episodes streamed to a collector: the
real ChatML template and the real 49k-token vocabulary meet the token-in-token-out context.

- Turn by turn, the tokens the learner receives are the tokens the engine saw: each turn's
  prompt is the trajectory up to that turn's answer, and the answer is the engine's tokens, also
  after an env observation and after an answer cut at ``max_tokens`` (its end-of-turn is then an
  environment token).
- Tokenising the decoded conversation again differs from the trajectory only inside answers (a
  sampled token sequence need not be the tokenizer's own split of its text), never in what the
  template and the env put: the reason the learner takes the engine's ids and not the text.
- vLLM's and transformers' log-probs of the same sampled tokens agree within ``LOGPROB_TOL`` at
  every token (importance ratios at staleness 0 within ``RATIO_TOL`` of 1); the figures print.

``slow`` (about 1.5 min): ``make test`` checks the tokens and the log-probs through the whole
loop on this model instead (tests/integration/test_smollm2_loop.py).
"""

import asyncio
import threading

import numpy as np
import pytest
import torch

from launch.config.compose import compose
from launch.model import packaged
from learner.models import lazy_full_state, token_logprobs
from tests.engine_requests import check_turns, record_requests, turn_spans
from tests.integration.test_actor import started_actor
from transport.weights import WeightPublisher

pytestmark = pytest.mark.slow

EPISODES = 4
MAX_TOKENS = 40
"""Short enough that most of SmolLM2's answers are cut (it writes long ones)."""
TEMPERATURE = 1.0
LOGPROB_TOL = 1e-3
"""Most |vLLM - transformers| of a sampled token's log-prob, float32 on both sides."""
RATIO_TOL = 1e-3
"""Most |exp(difference) - 1| of a sampled token: its importance ratio at staleness 0."""


@pytest.fixture(scope="module")
def smollm2():
    return packaged.obtain(compose(["model=smollm2_135m"]).model.package)


@pytest.fixture(scope="module")
def models(smollm2):
    """The policy of each version: 0 the converted model, 1 the same with its (tied) embeddings
    and one layer's attention scaled by random factors, as a learner's update would move them."""
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    after = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in (after.get_input_embeddings().weight, after.model.layers[3].self_attn.o_proj.weight):
            p.mul_(1 + 0.2 * torch.randn(p.shape, generator=g))
    assert after.get_output_embeddings().weight is after.get_input_embeddings().weight
    return {0: before, 1: after}


@pytest.fixture(scope="module")
def played(smollm2, models):
    """(trajectories, the engine's requests as (prompt ids, answer ids, finish reason)): episodes
    at version 0, then the version 1 weights pushed by a gloo broadcast, then more episodes."""
    requests = []
    config = {
        "engine": "in_process", "actor_id": 0, "run_id": "smollm2", "model_path": str(smollm2),
        "env_name": "frozenlake", "env_pool": {"env_workers": 1, "envs_per_worker": 4},
        "concurrency": 4, "group_size": 2, "temperature": TEMPERATURE, "max_tokens": MAX_TOKENS,
        "max_turns": 3, "max_context": 2048, "kv_cache_bytes": 256 << 20, "seed": 11,
    }
    publisher = WeightPublisher(world_size=2, timeout_s=60)
    try:
        with started_actor(config) as (loop, actor, collector):
            record_requests(actor.engine, requests)

            async def scenario():
                before = await actor.run(num_episodes=EPISODES)
                await actor.join_weight_group(publisher.address, 1, 2, 60.0)
                specs, tensors = lazy_full_state(models[1])  # as the learner publishes: tied once
                pushing = threading.Thread(target=publisher.publish, args=(tensors, 1),
                                           kwargs={"specs": specs})
                pushing.start()
                await actor.update_weights(1)
                pushing.join(60)
                return before, await actor.run(num_episodes=EPISODES)

            before, after = loop.run_until_complete(asyncio.wait_for(scenario(), 600))
            trajectories = collector.wait_for(2 * EPISODES)
    finally:
        publisher.close()
    assert before["episodes_done"] == EPISODES and after["episodes_done"] == 2 * EPISODES
    assert after["episodes_failed"] == 0 and after["version"] == 1
    assert len(trajectories) == 2 * EPISODES
    versions = [set(t.policy_version[t.loss_mask].tolist()) for t in trajectories]
    assert versions == [{0}] * EPISODES + [{1}] * EPISODES
    return trajectories, requests


def test_each_turn_trains_on_the_tokens_the_engine_saw(smollm2, played):
    from transformers import AutoTokenizer

    trajectories, requests = played
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns, cut, cut_then_observed = check_turns(trajectories, requests, max_tokens=MAX_TOKENS,
                                                end_of_turn=end_of_turn)
    print(f"\n{turns} turns, {cut} answers cut at {MAX_TOKENS} tokens, {cut_then_observed} of them "
          f"followed by another turn")
    assert turns == len(requests), "every request of the engine is a turn of a trajectory"
    assert cut_then_observed > 0, "no answer was cut and then followed by an observation"


def test_tokenising_the_text_again_differs_only_inside_answers(smollm2, played):
    from transformers import AutoTokenizer

    trajectories, _ = played
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    resplit = 0
    for traj in trajectories:
        ids = traj.token_ids.tolist()
        pieces, at = [], 0
        for start, end in turn_spans(traj):
            pieces += [(ids[at:start], False), (ids[start:end], True)]
            at = end
        pieces.append((ids[at:], False))
        for piece, answer in pieces:
            again = tokenizer.encode(tokenizer.decode(piece), add_special_tokens=False)
            if not answer:
                assert again == piece, "the template's or the env's tokens re-tokenise differently"
            resplit += answer and again != piece
        # Piece by piece is the whole: special tokens bound every piece.
        assert tokenizer.decode(ids) == "".join(tokenizer.decode(p) for p, _ in pieces)
    print(f"\n{resplit} of {sum(len(turn_spans(t)) for t in trajectories)} answers re-tokenise "
          f"differently from how they were sampled")


def test_vllm_and_transformers_log_probs_agree_on_the_sampled_tokens(played, models):
    trajectories, _ = played
    gaps: dict[int, list] = {0: [], 1: []}
    unpushed = []
    for traj in trajectories:
        ids = torch.as_tensor(traj.token_ids, dtype=torch.long)[None]
        mask = traj.loss_mask
        version = int(traj.policy_version[mask][0])
        with torch.no_grad():
            gaps[version].append(traj.behaviour_logprobs[mask]
                                 - token_logprobs(models[version], ids, TEMPERATURE)[0][0].numpy()[mask])
            if version == 1:  # what the engine would have given had the push not reached it
                unpushed.append(traj.behaviour_logprobs[mask]
                                - token_logprobs(models[0], ids, TEMPERATURE)[0][0].numpy()[mask])
    for version, parts in gaps.items():
        d = np.concatenate(parts)
        ratios = np.exp(-d)  # the learner's over the engine's at staleness 0
        print(f"\nversion {version}, {d.size} sampled tokens: |vLLM - transformers| max "
              f"{np.abs(d).max():.2e}, mean {np.abs(d).mean():.2e}; ratio min {ratios.min():.5f}, "
              f"max {ratios.max():.5f}, mean {ratios.mean():.6f}")
        assert np.abs(d).max() < LOGPROB_TOL, f"version {version}"
        assert np.abs(ratios - 1).max() < RATIO_TOL, f"version {version}"
    # The push moved the log-probs far beyond the tolerance: had it not arrived, this test fails.
    assert np.abs(np.concatenate(unpushed)).max() > 10 * LOGPROB_TOL
