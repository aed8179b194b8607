"""A policy that writes garbage: the tiny model with random weights sampling at temperature 2 (vLLM's highest),
long answers, on FrozenLake through a real vLLM engine and env workers. Nothing crashes, no
answer is ever well-formed, and every episode ends by one of its limits (the turn limit or the
context; rarely the env's end, where a malformed answer still named a move), with every answer
within its token cap.

One batch of episodes by default; ``GARBAGE_MINUTES=10`` runs the ten-minute version
(docs/faults.md)."""

from __future__ import annotations

import os
import time

import pytest

from launch.model.tiny_model import build_tiny_model
from tests.integration.test_actor import started_actor

MAX_TOKENS, MAX_TURNS, MAX_CONTEXT = 96, 5, 1024


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("garbage") / "model", seed=3)


@pytest.mark.slow
def test_random_tokens_at_high_temperature_end_by_their_limits(model):
    minutes = float(os.environ.get("GARBAGE_MINUTES", "0"))
    config = {"engine": "async", "actor_id": 0, "run_id": "garbage", "model_path": str(model),
              "env_name": "frozenlake", "env_pool": {"env_workers": 1, "envs_per_worker": 8},
              "concurrency": 8, "group_size": 1, "temperature": 2.0, "top_p": 1.0,
              "max_tokens": MAX_TOKENS, "max_turns": MAX_TURNS, "max_context": MAX_CONTEXT,
              "kv_cache_bytes": 64 << 20, "seed": 5}
    with started_actor(config) as (loop, actor, collector):
        deadline = time.monotonic() + 60 * minutes
        played = 0
        while True:
            stats = loop.run_until_complete(actor.run(num_episodes=24))
            played += 24
            if time.monotonic() > deadline:
                break
        trajectories = collector.wait_for(stats["episodes_sent"], timeout_s=60)
    assert stats["episodes_started"] == played
    assert stats["episodes_failed"] == 0 and stats["episodes_done"] == played
    assert len(trajectories) == stats["episodes_sent"] == played
    for t in trajectories:
        m = t.metrics
        assert m["format_correct"] == 0.0  # random tokens never make "<think>...</think><answer>...</answer>"
        assert 1 <= m["turns"] <= MAX_TURNS
        last_answer_token = int(t.loss_mask.nonzero()[0].max())
        assert last_answer_token + 1 <= MAX_CONTEXT - 1  # room kept for the end-of-turn
        assert m["turns"] < MAX_TURNS or len(t.token_ids) <= MAX_CONTEXT
        assert m["generated_tokens"] <= m["turns"] * MAX_TOKENS
    # each episode ended by a limit (the turns or the context), or, rarely, by the env: an answer
    # malformed as a whole that still named a move (one in the ten-minute run, at turn 3)
    by_env = sum(t.metrics["turns"] < MAX_TURNS and t.metrics["context_tokens"] + MAX_TOKENS <= MAX_CONTEXT
                 for t in trajectories)
    assert by_env <= max(1, played // 100)
    # garbage runs to the caps: every answer but the last to max_tokens, the last to the context
    capped = sum(t.metrics["generated_tokens"] >= (t.metrics["turns"] - 1) * MAX_TOKENS for t in trajectories)
    assert capped > played / 2
    assert all(t.metrics["context_tokens"] <= MAX_CONTEXT for t in trajectories)
