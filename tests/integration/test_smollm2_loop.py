"""SmolLM2-135M-Instruct (model=smollm2_135m, converted from the package index by the install)
through the whole loop in one process (topology=local): the vLLM engine plays FrozenLake (the
brief prompt, 2 turns, answers cut at 24 tokens) while the learner takes two steps of GRPO
(policy and reference) over a 49k-token vocabulary and pushes its weights (the tied embeddings
once) to the engine after each. The staleness bound is 0, so each step trains on tokens of the
version it holds: the first before any push, the second after one.

What it asserts is what a real model adds to the tiny one's loop tests, on what the learner
actually trained on (its batches and the engine's requests are recorded in this process):

- turn by turn, the tokens the learner trains on are the tokens the engine saw: each turn's
  prompt is the trajectory up to that turn's answer and the answer is the engine's tokens, also
  after an env observation and after an answer cut at ``actors.max_tokens`` (its end-of-turn
  follows as an env token, not trained on);
- at both steps the engine's log-probs of those tokens equal the learner's within the float32
  noise of this model (``policy/fresh_gap_max``), so a push reaches the engine whole;
- the run stays within its memory; the final model is the chat model's kind.

tests/integration/test_smollm2_actor.py (``slow``) checks the actor alone against transformers
on weights moved far from the original, and measures how many answers re-tokenise differently."""

import json

import pytest

import actors.actor
from launch.config.compose import compose
from launch.run.loop import train
from launch.run.metrics import read_records
from learner.trainer import Trainer
from tests.engine_requests import check_turns, record_requests

MAX_TOKENS = 24
REAL = [
    "model=smollm2_135m", "topology=local", "algorithm=grpo", "learner.ranks=1", "train.steps=2",
    "train.batch_size=4", "actors.group_size=2", "actors.concurrency=4",
    f"actors.max_tokens={MAX_TOKENS}", "actors.envs_per_worker=4", "env.prompt=brief",
    "env.max_turns=2",
    # Every step trains on the tokens of the version it holds, so the second step checks the
    # engine's log-probs after the first push.
    "learner.max_staleness=0", "warm_start.enabled=false", "train.eval_every=0",
    "train.eval_seeds=1", "train.baselines=false", "train.held_out_check=0", "logger.wandb=false",
]
FRESH_GAP_TOL = 1e-3
"""Most |engine - learner| log-prob of a staleness-0 token: float32 kernels on both sides."""
PEAK_GIB = 12.0
"""The run's processes together: the engine and its KV cache, the policy and the reference with
AdamW's state, activations bounded by the logit chunks."""


@pytest.fixture
def recorded(monkeypatch):
    """(the engine's requests as (prompt ids, answer ids, finish reason), the learner's
    batches as (version, trajectories)), recorded as the run goes."""
    requests, batches = [], []
    build_engine, train_step = actors.actor.build_engine, Trainer.train_step

    def recording_engine(cfg, vision):
        engine = build_engine(cfg, vision)
        record_requests(engine, requests)
        return engine

    def recording_step(self, trajectories, version):
        batches.append((version, list(trajectories)))
        return train_step(self, trajectories, version)

    monkeypatch.setattr(actors.actor, "build_engine", recording_engine)
    monkeypatch.setattr(Trainer, "train_step", recording_step)
    return requests, batches


def test_two_asynchronous_steps_of_the_real_model(tmp_path, recorded):
    from transformers import AutoTokenizer

    summary = train(compose(REAL), tmp_path)
    rows = [r for r in read_records(tmp_path) if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    (actor,) = summary["actors"]
    assert actor["version"] == 2 and actor["weight_updates"] == 2
    assert all(r["policy/staleness_max"] == 0 for r in rows)
    assert [(r["policy/version_min"], r["policy/version_max"]) for r in rows] == [(0, 0), (1, 1)]
    gaps = [r["policy/fresh_gap_max"] for r in rows]  # before any push, and after the first
    assert max(gaps) < FRESH_GAP_TOL, gaps
    assert summary["memory"]["memory/peak_total_gib"] < PEAK_GIB
    config = json.loads((tmp_path / "final-model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]

    requests, batches = recorded
    assert [v for v, _ in batches] == [0, 1] and all(len(b) == 4 for _, b in batches)
    end_of_turn = AutoTokenizer.from_pretrained(tmp_path / "final-model").eos_token_id  # <|im_end|>
    turns, _, cut_then_observed = check_turns([t for _, b in batches for t in b], requests,
                                              max_tokens=MAX_TOKENS, end_of_turn=end_of_turn)
    assert cut_then_observed > 0, "no trained answer was cut and then followed by an observation"
    print(f"\nfresh gap max per step {gaps}; peak {summary['memory']['memory/peak_total_gib']:.1f} GiB; "
          f"step times {[round(r['timing/step_s'], 1) for r in rows]} s; {turns} turns trained, "
          f"{cut_then_observed} cut answers followed by another turn")

