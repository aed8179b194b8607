"""The whole system for a few steps: Ray + real vLLM actors + ZeroMQ stream + gloo broadcast + 2 FSDP
learner ranks. Asserts what the loop promises: weight versions advance at the actors and on the
tokens, staleness stays within the bound, every trajectory an actor sent was received and then
either trained on or dropped, and the run directory holds what a user expects.

``make test`` runs one of them on the ``local`` topology (the same loop in one process; on
``ray`` it is ``slow``, and Ray's wiring is tests/integration/test_multinode.py's), which also
has to learn: the tiny model with random weights on ActionWords
(envs/action_words.py), whose reward rises within a few steps. The FrozenLake runs (async and
sync, images, Ctrl-C) are ``slow``."""

import json
import statistics
from pathlib import Path

import pytest

from launch.config.compose import compose
from launch.run.loop import train
from launch.run.metrics import read_records

SHORT = [
    "train.steps=4", "train.batch_size=8", "train.eval_every=2", "train.eval_seeds=8",
    "train.save_samples=2", "learner.ranks=2", "learner.max_staleness=1", "learner.critic_warmup=1", "actors.num=1",
    "actors.concurrency=8", "actors.group_size=2", "actors.max_tokens=48", "actors.envs_per_worker=8",
    "warm_start.enabled=false", "logger.wandb=false", "ray.num_cpus=4",
]


LEARN = [
    "env=action_words", "algorithm=grpo", "warm_start.enabled=false", "train.steps=25",
    "train.batch_size=32", "train.eval_every=0", "train.eval_seeds=8", "train.save_samples=2",
    "learner.ranks=2", "learner.max_staleness=1", "learner.lr=5e-3", "actors.num=1",
    "actors.concurrency=16", "actors.group_size=8", "actors.max_tokens=12",
    "actors.envs_per_worker=16", "logger.wandb=false", "ray.num_cpus=4",
]


def _run(tmp_path, *overrides):
    return train(compose([*SHORT, *overrides]), tmp_path)


TOPOLOGY = {
    "ray": ([], {"actor-0.log", "learner-0.log", "learner-1.log"}),
    # One process: one learner rank; only the engine's log records go to a file.
    "local": (["topology=local", "learner.ranks=1"], {"engine.log"}),  # LEARN has 2 ranks
}


@pytest.mark.parametrize("topology", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_the_real_loop_learns_and_keeps_its_promises(tmp_path, topology):
    """Asynchronous GRPO on ActionWords, 25 steps of 32 episodes: the reward rises by more than
    its noise; every group is trained whole; nothing is lost on the wire; the processes' output
    (the engine's log included) is in <run dir>/logs, not on the console."""
    overrides, log_files = TOPOLOGY[topology]
    summary = train(compose([*LEARN, *overrides]), tmp_path)
    train_rows = [r for r in read_records(tmp_path) if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, 26))
    rewards = [r["rollout/reward"] for r in train_rows]
    first, last = statistics.mean(rewards[:3]), statistics.mean(rewards[-3:])
    noise = max(statistics.stdev(rewards[:3]), statistics.stdev(rewards[-3:]), 0.02)
    assert last > first + 3 * noise and last > first + 0.15, rewards
    for r in train_rows:
        assert r["policy/staleness_max"] <= 1
        assert r["rollout/tokens"] > 0 and r["buffer/partial_groups"] == 0
    (actor,) = summary["actors"]
    assert actor["version"] == 25 and actor["weight_updates"] == 25 and actor["episodes_held"] >= 0
    ((name, acc),) = summary["accounting"].items()
    assert acc["received"] == actor["episodes_sent"] and acc["taken"] == 25 * 32
    assert acc["taken"] + acc["dropped"] <= acc["received"]
    # every episode started is accounted for, each counter read on its own side; none lost
    ep = summary["episodes"]
    assert ep["episodes/in_flight"] == 0 and ep["episodes/lost"] == 0  # the stop cancelled the rest
    assert ep["episodes/started"] == ep["episodes/done"] + ep["episodes/failed"] + ep["episodes/cancelled"]
    assert ep["episodes/done"] == ep["episodes/sent"] + ep["episodes/unsent"] + ep["episodes/held"]
    assert ep["episodes/sent"] == acc["received"] + ep["episodes/in_transit"] and ep["episodes/in_transit"] == 0
    assert all("episodes/started" in r and r["faults/actors_replaced"] == 0 for r in train_rows)
    logs = {p.name: p.read_text() for p in (tmp_path / "logs").glob("*.log")}
    assert set(logs) == log_files
    engine_log = logs["actor-0.log" if topology == "ray" else "engine.log"]
    assert "vllm" in engine_log.lower()  # the engine's own lines went to the file


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_short_run_keeps_its_promises(tmp_path, mode):
    summary = _run(tmp_path, f"train.mode={mode}")
    rows = read_records(tmp_path)
    train_rows = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    assert [r["step"] for r in evals] == [0, 2, 4] and all(e["n"] == 8 for e in evals)
    assert all(0 <= e["observation_score"] <= 1 for e in evals)  # the reasoning judge's, per eval
    for r in train_rows:
        assert r["policy/staleness_max"] <= 1  # the bound (on_stale=drop)
        for key in ("loss/value", "rollout/success", "rollout/reward", "rollout/observation_score",
                    "weights/push_s"):
            assert key in r and r[key] == r[key]  # present and not NaN
        # critic warm-up: step 1 trains only the critic, the policy from step 2 on
        assert ("loss/policy" in r) == (r["step"] > 1) and ("optim/grad_norm" in r) == (r["step"] > 1)
    # The actor applied every pushed version, and later batches hold tokens of later versions.
    (actor,) = summary["actors"]
    assert actor["version"] == 4 and actor["weight_updates"] == 4
    assert max(r["policy/version_max"] for r in train_rows) >= 2
    # sent == received == taken + dropped + still buffered (nothing lost on the wire).
    ((name, acc),) = summary["accounting"].items()
    assert acc["received"] == actor["episodes_sent"]
    assert acc["taken"] == 4 * 8 and acc["taken"] + acc["dropped"] <= acc["received"]
    # Every process of the run (Ray, 2 learner ranks, the actor with its vLLM engine, env workers).
    assert 0.5 < summary["memory"]["memory/peak_total_gib"] < 8
    assert (tmp_path / "learning_curve.png").exists() and (tmp_path / "final-model" / "config.json").exists()
    assert "[policy v" in (tmp_path / "samples.txt").read_text()


@pytest.mark.slow
def test_short_vision_language_run(tmp_path):
    """The same loop with a tiny Qwen2-VL on FrozenLake rendered as images: the actors play image
    episodes, the learner ranks train on them (pixel values in every forward) and the weights,
    vision tower included, reach the actors in flight; the final model is a Qwen2-VL."""
    _run(tmp_path, "env.render=image", "env.image_size=56", "model.vision=true",
         "actors.max_tokens=24", "train.eval_every=0")
    rows = read_records(tmp_path)
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    assert all(r["policy/staleness_max"] <= 1 for r in train_rows)
    summary = json.loads((tmp_path / "summary.json").read_text())
    (actor,) = summary["actors"]
    assert actor["version"] == 4 and actor["weight_updates"] == 4 and not any(summary["actor_restarts"])
    failed = {k: v for k, v in actor.items() if k.startswith("failed/")}
    assert set(failed) <= {"failed/vision_token_generated"}  # an untrained VLM may write one
    config = json.loads((tmp_path / "final-model" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2VLForConditionalGeneration"]


@pytest.mark.slow
def test_a_lora_run_of_a_vision_language_model_on_ray(tmp_path):
    """LoRA through the Ray topology on the tiny Qwen2-VL: two FSDP ranks train the adapters of
    its language model, the AsyncLLM engine (its worker in a child process) takes each push over
    the gloo broadcast and passes the probe."""
    summary = _run(tmp_path, "learner.lora.enabled=true", "learner.lr=1e-3", "env.render=image",
                   "env.image_size=56", "model.vision=true", "actors.max_tokens=24", "train.eval_every=0")
    train_rows = [r for r in read_records(tmp_path) if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    assert all(r["weights/probe_gap"] <= 1e-3 and r["weights/actor_pause_s"] == 0.0 for r in train_rows)
    (actor,) = summary["actors"]
    assert actor["version"] == 4 and actor["weight_updates"] == 4 and actor["weight_update_failures"] == 0
    from safetensors import safe_open

    with safe_open(str(tmp_path / "final-model" / "adapter_model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert names and all("language_model" in n and "visual" not in n for n in names)


@pytest.mark.slow
def test_ctrl_c_checkpoints_and_stops_at_the_next_step(tmp_path, monkeypatch):
    """Ctrl-C (SIGINT to the driver) once the first step is logged: the run stops after that
    step as on SIGTERM: no more steps or evals, a checkpoint, summary.json saying so, and
    everything shut down (the next test starts its own Ray)."""
    import os
    import signal

    from launch.run.metrics import RunLogger

    log = RunLogger.log

    def log_then_interrupt(self, kind, step, metrics):
        record = log(self, kind, step, metrics)
        if kind == "train" and step == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return record

    monkeypatch.setattr(RunLogger, "log", log_then_interrupt)
    summary = _run(tmp_path, "train.eval_every=0")
    assert summary["interrupted"] and summary["steps"] == 1
    rows = read_records(tmp_path)
    assert [(r["kind"], r["step"]) for r in rows] == [("eval", 0), ("train", 1)]
    assert (tmp_path / "checkpoints" / "step-000001" / "extra.json").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["interrupted"]


@pytest.mark.slow  # the proof of delivery: test_lora_sync; LoRA resume: the learner's unit tests
def test_a_lora_run_pushes_adapters_the_engine_proves_it_serves_and_resumes(tmp_path):
    """``learner.lora.enabled=true`` on the local topology (VAGEN-Full: policy and critic with
    adapters, the reference = the policy with its adapters off): every push is an adapter a
    small fraction of the model's bytes, and after each the engine's probe log-probs equal
    the learner's; the final model is an adapter directory PEFT loads on its base. The run
    stops after its checkpoint at step 1 and resumes from it to step 2 on the adapters it saved."""
    lora = ["topology=local", "learner.ranks=1", "learner.lora.enabled=true", "learner.lora.rank=8",
            "learner.lr=1e-3", "train.checkpoint_every=1", "train.eval_every=0", "train.steps=2"]
    _run(tmp_path, *lora, "train.steps=1")
    summary = train(compose([*SHORT, *lora, f"train.resume={tmp_path}"]), tmp_path)
    assert summary["resumed_from"]["step"] == 1
    rows = [r for r in read_records(tmp_path) if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    final = tmp_path / "final-model"
    base_path = Path(json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"])
    base_bytes = sum(t.numel() * 4 for t in load_file(base_path / "model.safetensors").values())
    adapter_bytes = sum(t.numel() * 4 for t in load_file(final / "adapter_model.safetensors").values())
    for r in rows:
        assert r["weights/probe_gap"] <= 1e-3 and r["weights/probe_shift"] >= 0
        assert r["weights/bytes"] == adapter_bytes < 0.2 * base_bytes  # the adapter alone travels
        assert r["weights/actor_pause_s"] == 0.0  # an adapter push pauses no answer
    (actor,) = summary["actors"]
    assert actor["version"] == 2 and actor["weight_update_failures"] == 0
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), final)  # names, shapes match
