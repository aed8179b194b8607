"""SmolLM2-135M-Instruct (model=smollm2_135m, converted from the package index by the install)
through the whole loop in one process (topology=local): the vLLM engine plays FrozenLake (the
brief prompt, 2 turns, answers cut at 24 tokens) while the learner takes two steps of
VAGEN-Full (critic, reference, bi-level GAE) over a 49k-token vocabulary and pushes its weights
(the tied embeddings once) to the engine after each. The staleness bound is 0, so each step
trains on tokens of the version it holds: the first before any push, the second after one.

What it asserts is what a real model adds to the tiny one's loop tests: at both steps the
engine's log-probs of those tokens equal the learner's within the float32 noise of this model
(``policy/fresh_gap_max``), so the learner trains on what the engine sampled and a push reaches
the engine whole; the run stays within its memory; the final model is the chat model's kind.
The actor-level checks (the tokens of each turn, after an observation and after a cut answer;
the log-probs after a push) are tests/integration/test_smollm2_actor.py's."""

import json

from launch.config.compose import compose
from launch.run.loop import train
from launch.run.metrics import read_records

REAL = [
    "model=smollm2_135m", "topology=local", "learner.ranks=1", "train.steps=2",
    "train.batch_size=4", "actors.group_size=2", "actors.concurrency=4", "actors.max_tokens=24",
    "actors.envs_per_worker=4", "env.prompt=brief", "env.max_turns=2",
    # Every step trains on the tokens of the version it holds, so the second step checks the
    # engine's log-probs after the first push.
    "learner.max_staleness=0", "learner.critic_warmup=0",
    "warm_start.enabled=false", "train.eval_every=0", "train.eval_seeds=2", "train.baselines=false",
    "train.held_out_check=0", "logger.wandb=false",
]
FRESH_GAP_TOL = 1e-3
"""Most |engine - learner| log-prob of a staleness-0 token: float32 kernels on both sides."""
PEAK_GIB = 12.0
"""The run's processes together: the engine and its KV cache, the policy, the critic and the
reference with AdamW's state, activations bounded by the logit chunks."""


def test_two_asynchronous_steps_of_the_real_model(tmp_path):
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
    print(f"\nfresh gap max per step {gaps}; peak {summary['memory']['memory/peak_total_gib']:.1f} GiB; "
          f"step times {[round(r['timing/step_s'], 1) for r in rows]} s")
