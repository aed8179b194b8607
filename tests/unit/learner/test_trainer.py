"""learner/trainer.py on the tiny Qwen2 (launch/model/tiny_model.py) over real gloo groups on CPU.

One world-size-1 group serves the module; the two-rank test spawns its own processes (joined,
and killed if they hang) and compares them with world size 1 on the same trajectories.
"""

from __future__ import annotations

import functools
import math
import multiprocessing as mp
import socket
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import yaml

from launch.model.tiny_model import build_tiny_model
from learner.config import TrainerConfig
from learner.models import token_logprobs
from learner.trainer import Trainer
from transport.schema import Trajectory

ALGORITHMS = Path(__file__).resolve().parents[3] / "configs" / "algorithm"
GOOD = 7  # the rewarded token
TEMPERATURE = 0.7
WAIT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def hf_model(model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the spawned ranks of the two-rank test take the other cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    torch.set_num_threads(threads)


def _hf_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """Reference: log_softmax(logits / T) of a plain HF model, position i - 1 scoring token i."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float() / TEMPERATURE, dim=-1)
    out = torch.zeros(ids.shape)
    out[:, 1:] = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return out


def _trajectory(rng, model, *, group_id: int, good: bool, turns: int,
                replies: list[int] | None = None) -> Trajectory:
    """Env tokens, then per turn a reply (3 tokens, or ``replies[t]``) and a 2-token observation.
    Good episodes reply with GOOD only and earn 1 per turn; the others reply with random tokens
    and earn 0."""
    replies = replies or [3] * turns
    ids = list(rng.integers(20, 1000, size=int(rng.integers(3, 6))))
    mask = [False] * len(ids)
    for t in range(turns):
        reply = [GOOD] * replies[t] if good else list(rng.integers(20, 1000, size=replies[t]))
        ids += reply + ([] if t == turns - 1 else list(rng.integers(20, 1000, size=2)))
        mask += [True] * replies[t] + ([] if t == turns - 1 else [False] * 2)
    ids, mask = np.array(ids, dtype=np.int32), np.array(mask)
    policy = np.flatnonzero(mask)
    ends = np.zeros_like(mask)
    ends[policy[np.cumsum(replies) - 1]] = True
    behaviour = _hf_logprobs(model, torch.from_numpy(ids).long()[None])[0].numpy()
    return Trajectory(
        run_id="test", actor_id=0, episode_id=int(rng.integers(1 << 30)), env_name="synthetic",
        seed=group_id, group_id=group_id, token_ids=ids, loss_mask=mask, turn_end=ends,
        behaviour_logprobs=np.where(mask, behaviour, 0.0).astype(np.float32),
        policy_version=np.where(mask, 0, -1).astype(np.int32),
        turn_rewards=np.full(turns, 1.0 if good else 0.0, dtype=np.float32))


def _batch(model, n: int, seed: int = 0) -> list[Trajectory]:
    """n trajectories of 1-3 turns in groups of two, one good and one not, in random order."""
    rng = np.random.default_rng(seed)
    good = [g for _ in range(0, n, 2) for g in rng.permutation([True, False])]
    return [_trajectory(rng, model, group_id=i // 2, good=good[i], turns=int(rng.integers(1, 4)))
            for i in range(n)]


def _algorithm(path: Path) -> dict:
    """An algorithm preset's TrainerConfig keys (its reasoning_reward is an env setting)."""
    keys = yaml.safe_load(path.read_text())
    del keys["reasoning_reward"]
    return keys


def _config(model_path: str, algorithm: str | None = None, **overrides) -> TrainerConfig:
    keys = _algorithm(ALGORITHMS / f"{algorithm}.yaml") if algorithm else {}
    return TrainerConfig.from_dict({"model_path": model_path, "temperature": TEMPERATURE, **keys,
                                    **overrides})


def _padded_ids(trajectories) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(t.token_ids) for t in trajectories)
    ids = torch.zeros(len(trajectories), length, dtype=torch.long)
    mask = torch.zeros(len(trajectories), length, dtype=torch.bool)
    for i, t in enumerate(trajectories):
        ids[i, :len(t.token_ids)] = torch.from_numpy(t.token_ids).long()
        mask[i, :len(t.token_ids)] = torch.from_numpy(t.loss_mask)
    return ids, mask


def _bytes_kept_for_backward(forward) -> int:
    """Bytes of the tensors autograd saves for the backward of ``forward()``."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return total


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.state_dict_for_publish().items()}


# --- 1. log-probs: the shift and the temperature ------------------------------------------------


def test_proximal_logprobs_match_hf_on_policy_tokens(model_path, hf_model):
    trajectories = _batch(hf_model, 4)
    trainer = Trainer(_config(model_path, estimator="grpo", loss="decoupled_ppo", lr=1e-3,
                              whiten_advantages=False))
    ids, mask = _padded_ids(trajectories)
    got = trainer.policy_logprobs(ids)
    want = _hf_logprobs(hf_model, ids)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)

    # In train_step: behaviour (recorded from the HF model) == proximal (recomputed) gives
    # weights of exactly 1, and before the first optimizer step pi == pi_prox.
    metrics = trainer.train_step(trajectories, version=0)
    assert metrics["policy/behav_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["policy/behaviour_kl"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["policy/approx_kl"] == pytest.approx(0.0, abs=1e-9)


# --- 2. a learning signal --------------------------------------------------------------------


@pytest.mark.parametrize("algorithm, loss", [
    ("grpo", "ppo"), ("vagen_full", "ppo"), ("vagen_base", "tis"), ("turn_ppo", "decoupled_ppo")])
def test_train_steps_raise_the_rewarded_tokens_probability(model_path, hf_model, algorithm, loss):
    trajectories = _batch(hf_model, 8)
    trainer = Trainer(_config(model_path, algorithm, loss=loss, loss_args={}, lr=1e-3,
                              critic_lr=1e-3, num_minibatches=2, kl_loss={"kind": "k3", "coef": 0.01}))
    ids, mask = _padded_ids(trajectories)
    rewarded = torch.tensor([t.turn_rewards.sum() > 0 for t in trajectories])[:, None] & mask
    before = trainer.policy_logprobs(ids)
    for step in range(3):
        metrics = trainer.train_step(trajectories, version=step)
    gain = trainer.policy_logprobs(ids) - before
    assert gain[rewarded].mean() > 0.5, gain[rewarded].mean()
    assert gain[mask & ~rewarded].mean() < gain[rewarded].mean() - 0.5

    expected = {"loss/policy", "loss/entropy", "loss/kl", "policy/entropy", "policy/approx_kl",
                "policy/staleness_mean", "policy/staleness_max", "optim/grad_norm", "rollout/score_mean",
                "rollout/tokens", "timing/step_s", "timing/prepare_s", "policy/behaviour_kl", "ref/kl_in_reward"}
    if loss != "tis":
        expected.add("policy/clip_frac")
    if algorithm != "grpo":
        expected |= {"loss/value", "critic/explained_variance", "optim/critic_grad_norm"}
    assert expected <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["policy/staleness_max"] == 2.0
    assert metrics["rollout/score_mean"] == pytest.approx(np.mean([t.turn_rewards.sum() for t in trajectories]))


def test_micro_batches_accumulate_to_the_same_update(model_path, hf_model):
    """Micro-batches (rows sorted by length inside each mini-batch, each cut to its longest row)
    give the whole mini-batch's update, computing less padding."""
    trajectories = _batch(hf_model, 8)
    weights, padding = [], []
    for micro in (0, 1, 2):
        trainer = Trainer(_config(model_path, "vagen_full", lr=1e-3, critic_lr=1e-3,
                                  num_minibatches=2, micro_batch_size=micro))
        padding.append(trainer.train_step(trajectories, version=0)["learner/padding"])
        weights.append(_weights(trainer))
    for w in weights[1:]:
        for k, v in w.items():
            torch.testing.assert_close(v, weights[0][k], atol=1e-5, rtol=0, msg=k)
    lengths = np.array([len(t.token_ids) for t in trajectories])
    halves = (slice(0, 4), slice(4, 8))  # one forward each, as wide as its longest row
    assert padding[0] == pytest.approx(1 - lengths.sum() / sum(4 * lengths[h].max() for h in halves))
    assert padding[1] == 0.0 and 0.0 <= padding[2] < padding[0]


def test_activation_checkpointing_and_logit_chunks_give_the_same_update(model_path, hf_model):
    """Layers recomputed in the backward, and logits scored a few positions at a time, change
    what memory holds, not the update: the published weights (HF-named, the same keys) agree
    with the plain step's."""
    trajectories = _batch(hf_model, 6, seed=3)
    ids = _padded_ids(trajectories)[0]
    weights, metrics, kept = [], [], []
    for extra in ({"logit_chunk_mib": 0}, {"activation_checkpointing": True, "logit_chunk_mib": 0.02}):
        trainer = Trainer(_config(model_path, "vagen_full", lr=1e-3, critic_lr=1e-3,
                                  micro_batch_size=2, **extra))
        metrics.append(trainer.train_step(trajectories, version=0))
        weights.append(_weights(trainer))
        kept.append(_bytes_kept_for_backward(functools.partial(
            token_logprobs, trainer.policy, ids, TEMPERATURE, chunk=trainer.logit_chunk)))
    assert kept[1] < kept[0] / 3  # what autograd keeps: the layers' inputs, not their insides
    assert weights[0].keys() == weights[1].keys()
    for k, v in weights[1].items():
        torch.testing.assert_close(v, weights[0][k], atol=1e-5, rtol=0, msg=k)
    initial = hf_model.state_dict()
    assert any(not torch.allclose(v, initial[k]) for k, v in weights[0].items())  # the step moved them
    for key in ("loss/policy", "policy/entropy", "optim/grad_norm", "optim/critic_grad_norm"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-4, abs=1e-6), key


def test_empty_minibatches_are_skipped_and_bf16_trains(model_path, hf_model):
    trainer = Trainer(_config(model_path, "vagen_full", lr=1e-3, critic_lr=1e-3,
                              num_minibatches=4, param_dtype="bfloat16"))
    metrics = trainer.train_step(_batch(hf_model, 2), version=0)  # 2 real rows, 2 dummy rows
    assert trainer.optim.state and {float(s["step"]) for s in trainer.optim.state.values()} == {2.0}
    assert all(math.isfinite(v) for v in metrics.values()), metrics


# --- 3. published weights ----------------------------------------------------------------------


def test_published_state_dict_is_hf_named_and_reproduces_the_trainer(model_path, hf_model):
    from transformers import AutoModelForCausalLM

    trajectories = _batch(hf_model, 4)
    trainer = Trainer(_config(model_path, "grpo", lr=1e-3, kl_in_reward=None))
    trainer.train_step(trajectories, version=0)
    state = trainer.state_dict_for_publish()
    assert set(state) == set(hf_model.state_dict())
    assert all(t.device.type == "cpu" and not isinstance(t, dist.tensor.DTensor) for t in state.values())

    fresh = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    fresh.load_state_dict(state)
    ids, mask = _padded_ids(trajectories)
    assert not torch.allclose(_hf_logprobs(hf_model, ids)[mask], _hf_logprobs(fresh, ids)[mask])
    torch.testing.assert_close(trainer.policy_logprobs(ids), _hf_logprobs(fresh, ids), atol=1e-5, rtol=0)


def test_tied_embeddings_are_published_once_and_stay_tied(tmp_path, hf_model):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path / "tied", tie_word_embeddings=True)
    trainer = Trainer(_config(str(path), "grpo", lr=1e-3, kl_in_reward=None))
    trainer.train_step(_batch(hf_model, 4), version=0)
    state = trainer.state_dict_for_publish()
    specs, lazy, _ = trainer.weights_for_publish()
    published = dict(lazy)
    # The sharded policy still holds one table for both names; it is sent once, under the first.
    assert [n for n, _, _ in specs] == [n for n in state if n != "lm_head.weight"] == list(published)
    assert torch.equal(published["model.embed_tokens.weight"], state["lm_head.weight"])
    fresh = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    fresh.load_state_dict(published, strict=False)  # what an engine does with the publish
    ids, _ = _padded_ids(_batch(hf_model, 2))
    torch.testing.assert_close(trainer.policy_logprobs(ids), _hf_logprobs(fresh, ids), atol=1e-5, rtol=0)


def test_save_hf_writes_a_loadable_directory(model_path, hf_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = Trainer(_config(model_path, "grpo", lr=1e-3, kl_in_reward=None))
    trainer.train_step(_batch(hf_model, 4), version=0)
    trainer.save_hf(tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    want = trainer.state_dict_for_publish()
    assert all(torch.equal(v, want[k]) for k, v in loaded.state_dict().items())
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").encode("hello") == \
        AutoTokenizer.from_pretrained(model_path).encode("hello")


@pytest.mark.parametrize("target, start", [(10.0, 0.001), (0.0, 0.001), (0.0, 0.0)])
def test_entropy_coefficient_moves_toward_the_target(model_path, hf_model, target, start):
    trainer = Trainer(_config(model_path, "grpo", lr=1e-3, kl_in_reward=None, entropy_coef=start,
                              entropy_target=target, entropy_adapt_rate=0.01))
    coefs = [start]
    for version in range(2):
        metrics = trainer.train_step(_batch(hf_model, 4, seed=version), version=version)
        assert metrics["policy/entropy_coef"] == coefs[-1]  # the coefficient this step used
        want = coefs[-1] + 0.01 * (target - metrics["policy/entropy"])
        coefs.append(min(max(want, 0.0), 1.0))
        assert trainer.entropy_coef == pytest.approx(coefs[-1], rel=1e-12)
    assert (coefs[-1] > start) if target > 0 else (coefs[-1] == 0.0)


def test_critic_warmup_trains_only_the_critic_for_its_steps(model_path, hf_model):
    trainer = Trainer(_config(model_path, "vagen_full", lr=1e-3, critic_lr=1e-3, critic_warmup=1))
    policy0, critic0 = _weights(trainer), _critic_weights(trainer)
    metrics = trainer.train_step(_batch(hf_model, 4), version=0)
    assert "optim/grad_norm" not in metrics and "optim/critic_grad_norm" in metrics
    assert all(torch.equal(v, policy0[k]) for k, v in _weights(trainer).items())
    assert any(not torch.equal(v, critic0[k]) for k, v in _critic_weights(trainer).items())
    metrics = trainer.train_step(_batch(hf_model, 4, seed=1), version=1)
    assert "optim/grad_norm" in metrics and trainer.steps_done == 2
    assert any(not torch.equal(v, policy0[k]) for k, v in _weights(trainer).items())


def test_cosine_lr_counts_policy_steps_and_reaches_its_floor(model_path, hf_model):
    # 3 train steps, the first the critic's: the policy's 2 steps run at lr * 1/2 (1 + cos(pi/2))
    # and then lr * 0, where AdamW leaves the weights exactly as they are.
    trainer = Trainer(_config(model_path, "vagen_full", lr=1e-3, critic_lr=1e-3, critic_warmup=1,
                              lr_schedule="cosine", lr_steps=3))
    assert "optim/lr" not in trainer.train_step(_batch(hf_model, 4), version=0)
    assert trainer.train_step(_batch(hf_model, 4, seed=1), version=1)["optim/lr"] == pytest.approx(5e-4)
    before = _weights(trainer)
    assert trainer.train_step(_batch(hf_model, 4, seed=2), version=2)["optim/lr"] == pytest.approx(0.0, abs=1e-18)
    assert all(torch.equal(v, before[k]) for k, v in _weights(trainer).items())
    # Without a critic (grpo) no warm-up step is skipped: 2 policy steps, 1/2 then 0.
    grpo = _config(model_path, "grpo", lr=1.0, critic_warmup=1, lr_schedule="cosine", lr_steps=2)
    assert [grpo.policy_lr(s) for s in (0, 1, 5)] == pytest.approx([0.5, 0.0, 0.0], abs=1e-12)
    with pytest.raises(ValueError, match="lr_steps"):
        _config(model_path, "vagen_full", critic_warmup=5, lr_schedule="cosine", lr_steps=5)
    with pytest.raises(ValueError, match="schedule"):
        _config(model_path, "vagen_full", lr_schedule="linear")


def _critic_weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().clone() for k, v in trainer.critic.state_dict().items()}


# --- 4. checkpoints --------------------------------------------------------------------------


def test_checkpoint_round_trip_continues_identically(model_path, hf_model, tmp_path):
    first, second = _batch(hf_model, 4, seed=1), _batch(hf_model, 4, seed=2)
    cfg = _config(model_path, "vagen_full", lr=1e-3, critic_lr=1e-3, entropy_target=10.0,  # > log(vocab)
                  value_norm=True)  # its running statistics must be restored too
    trainer = Trainer(cfg)
    trainer.train_step(first, version=0)
    assert trainer.entropy_coef > cfg.entropy_coef  # adapted, so the checkpoint must carry it
    saved = _weights(trainer)
    streams = [{"incarnation": 1, "groups_drawn": 5}]  # the driver's extra: plain JSON data
    trainer.save_checkpoint(tmp_path / "ckpt", {"step": 1, "actor_streams": streams})
    draws = torch.rand(3), np.random.rand(3)  # the RNG states come back with the checkpoint
    got_coef = trainer.entropy_coef
    want = trainer.train_step(second, version=1)
    want_weights = _weights(trainer)

    resumed = Trainer(cfg)
    extra = resumed.load_checkpoint(tmp_path / "ckpt")
    assert torch.equal(torch.rand(3), draws[0]) and np.array_equal(np.random.rand(3), draws[1])
    fingerprint = extra.pop("optimizer_fingerprint")
    assert extra.pop("optimizer_fingerprint_loaded") == fingerprint and fingerprint[0] > 0
    assert fingerprint != Trainer(cfg).optimizer_fingerprint()  # a fresh optimizer's differs
    assert extra == {"step": 1, "actor_streams": streams}
    assert extra["step"] == 1 and resumed.entropy_coef == got_coef
    assert all(torch.equal(v, saved[k]) for k, v in _weights(resumed).items())
    got = resumed.train_step(second, version=1)
    assert {k: v for k, v in got.items() if not k.startswith("timing/")} == pytest.approx(
        {k: v for k, v in want.items() if not k.startswith("timing/")}, rel=1e-6, abs=1e-7)
    for k, v in _weights(resumed).items():
        torch.testing.assert_close(v, want_weights[k], atol=1e-6, rtol=0)
    for optim in (resumed.optim, resumed.critic_optim):
        assert {float(s["step"]) for s in optim.state.values()} == {2.0}


# --- 5. two ranks == one -----------------------------------------------------------------------

TWO_RANK_RUNS = [  # (config overrides, number of trajectories): even split, and dummy rows
    (dict(algorithm="vagen_full", vtrace=True, num_minibatches=2), 8),
    (dict(algorithm="grpo", num_minibatches=1), 5),
    (dict(algorithm="turn_ppo", num_minibatches=1, critic_warmup=0), 7),  # whitened over turn ends
    # LoRA: adapters on the policy and the critic (random A and B), the reference = adapters off
    (dict(algorithm="vagen_full", num_minibatches=2, critic_warmup=0,
          lora={"rank": 4, "alpha": 8, "init_seed": 3}), 8),
]


def _two_rank_config(model_path, algorithm, **overrides) -> TrainerConfig:
    # A large Adam epsilon keeps each update linear in its gradient: with the default, an
    # element whose gradient is ~0 moves by +-lr on the sign of its summation noise, which
    # differs between one rank and two.
    return _config(model_path, algorithm, lr=1e-3, critic_lr=1e-3, adam_eps=1e-3, **overrides)


def _run(cfg: TrainerConfig, trajectories) -> tuple[dict, dict]:
    trainer = Trainer(cfg)
    metrics = [trainer.train_step(trajectories, version=v) for v in range(2)]
    state = trainer.state_dict_for_publish()
    # what a publish reads: each tensor gathered from its shards when reached, on every rank
    specs, lazy, _ = trainer.weights_for_publish()
    lazy = [(name, t.clone()) for name, t in lazy]
    assert [(n, d, tuple(shape)) for n, d, shape in specs] == [
        (n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in lazy]
    if trainer.rank == 0 and trainer.lora is None:  # with LoRA a publish is the adapter (test_lora.py)
        assert [n for n, _ in lazy] == list(state)
        assert all(torch.equal(t.cpu(), state[n]) for n, t in lazy)
    return metrics[-1], state


def _rank_main(rank, world_size, port, model_path, trajectories, out_dir):
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size)
        for i, (overrides, n) in enumerate(TWO_RANK_RUNS):
            metrics, state = _run(_two_rank_config(model_path, **overrides), trajectories[:n])
            torch.save((metrics, state), Path(out_dir) / f"run{i}-rank{rank}.pt")
        dist.destroy_process_group()
    except BaseException:
        (Path(out_dir) / f"error-rank{rank}.txt").write_text(traceback.format_exc())
        raise


def test_two_ranks_train_like_one(model_path, hf_model, tmp_path):
    trajectories = _batch(hf_model, 8)
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(rank, 2, port, model_path, trajectories, str(tmp_path)))
             for rank in range(2)]
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=WAIT_S)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    errors = [p.read_text() for p in tmp_path.glob("error-*.txt")]
    assert not errors and all(p.exitcode == 0 for p in procs), errors

    for i, (overrides, n) in enumerate(TWO_RANK_RUNS):
        want_metrics, want = _run(_two_rank_config(model_path, **overrides), trajectories[:n])
        metrics0, state0 = torch.load(tmp_path / f"run{i}-rank0.pt", weights_only=True)
        metrics1, state1 = torch.load(tmp_path / f"run{i}-rank1.pt", weights_only=True)
        assert state1 == {} and set(state0) == set(want)
        for k, v in state0.items():
            torch.testing.assert_close(v, want[k], atol=1e-5, rtol=0, msg=f"{overrides}: {k}")
        for m in (metrics0, metrics1, want_metrics):  # padding: each rank's rows are cut apart
            del m["timing/step_s"], m["timing/prepare_s"], m["learner/padding"]
        assert metrics0 == metrics1
        # Clip fractions count tokens on either side of a threshold: one token sitting on it
        # may fall either way under summation noise.
        for k in [k for k in want_metrics if k.endswith("clip_frac")]:
            assert abs(metrics0.pop(k) - want_metrics.pop(k)) <= 1 / 32, k  # > 32 tokens
        assert metrics0 == pytest.approx(want_metrics, rel=1e-4, abs=1e-5, nan_ok=True)


# --- 6. configuration -------------------------------------------------------------------------


def _opening_each_turn(model, trajectories, tag_id: int) -> list[Trajectory]:
    """The same episodes with every reply's first token replaced by ``tag_id`` (behaviour
    log-probs recomputed): an opening tag never closed, so each whole reply is inside it."""
    out = []
    for t in trajectories:
        ids = t.token_ids.copy()
        ids[np.flatnonzero(t.loss_mask & ~np.r_[False, t.loss_mask[:-1]])] = tag_id
        behaviour = _hf_logprobs(model, torch.from_numpy(ids).long()[None])[0].numpy()
        out.append(replace(t, token_ids=ids,
                           behaviour_logprobs=np.where(t.loss_mask, behaviour, 0.0).astype(np.float32)))
    return out


def test_kl_loss_tags_restrict_the_kl_to_the_tagged_tokens(model_path, hf_model):
    """Two steps each (the KL is 0 before the first): with tags, replies outside every tag add no
    KL; replies wholly inside a tag give exactly the KL of the untagged loss."""
    from transformers import AutoTokenizer

    tag = AutoTokenizer.from_pretrained(model_path).convert_tokens_to_ids("<observation>")
    plain, tagged = _batch(hf_model, 8), _opening_each_turn(hf_model, _batch(hf_model, 8), tag)

    def kl_at_second_step(trajectories, kl_loss):
        trainer = Trainer(_config(model_path, "vagen_full", lr=1e-3, kl_loss=kl_loss))
        trainer.train_step(trajectories, version=0)
        return trainer.train_step(trajectories, version=1)["loss/kl"]

    everywhere = {"kind": "k3", "coef": 0.1}
    only_observation = everywhere | {"tags": ["observation"]}
    assert kl_at_second_step(plain, everywhere) > 1e-4
    assert kl_at_second_step(plain, only_observation) == 0.0
    assert kl_at_second_step(tagged, only_observation) == pytest.approx(
        kl_at_second_step(tagged, everywhere), rel=1e-5)


@pytest.mark.parametrize("path", sorted(ALGORITHMS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_algorithm_config_loads(path):
    cfg = TrainerConfig.from_dict({"model_path": "m", **_algorithm(path)})
    assert cfg.estimator == yaml.safe_load(path.read_text())["estimator"]


@pytest.mark.parametrize("bad, match", [
    ({"learning_rate": 1e-6, "epoch": 2}, r"\['epoch', 'learning_rate'\]"),
    ({"estimator": "gae"}, "estimator"),
    ({"estimator": "grpo", "estimator_args": {"gamma": 1.0}}, "gamma"),
    ({"loss_args": {"cap": 2.0}}, "cap"),
    ({"kl_loss": {"kind": "k2", "coef": 0.1}}, "kl_loss"),
    ({"kl_loss": {"kind": "k3", "coef": 0.1, "tags": "observation"}}, "kl_loss.tags"),
    ({"kl_loss": {"kind": "k3", "coef": 0.1, "span": ["observation"]}}, "kl_loss"),
    ({"num_minibatches": 0}, "num_minibatches"),
])
def test_from_dict_rejects_bad_keys(bad, match):
    with pytest.raises(ValueError, match=match):
        TrainerConfig.from_dict({"model_path": "m", **bad})


@pytest.mark.parametrize("algorithm", ["turn_ppo", "vagen_base"])
def test_advantages_are_whitened_per_turn_for_turn_wise_gae_else_per_token(model_path, hf_model,
                                                                           algorithm):
    """Turns of 1 to 9 tokens: turn_wise_gae's advantages have mean 0 and variance 1 over the
    turn ends (one entry per turn, as VAGEN), which token-level whitening would not give; the
    other estimators' over the policy tokens."""
    from learner.advantages import turn_ends
    from learner.batch import collate
    from learner.metrics import StepMetrics
    from learner.rows import take_rows

    rng = np.random.default_rng(3)
    trajectories = [_trajectory(rng, hf_model, group_id=i, good=bool(i % 2), turns=3,
                                replies=[1, 9, 2] if i % 3 else [8, 1, 5]) for i in range(6)]
    trainer = Trainer(_config(model_path, algorithm))
    batch = collate(trajectories, multi_turn_reward=trainer.cfg.multi_turn_reward, pad_id=trainer.pad_id)
    lengths = torch.tensor([len(t.token_ids) for t in trajectories])
    index = trainer._my_rows(len(trajectories))
    rows = take_rows(batch, lengths, index, trainer.pad_id, trainer.device, None)
    adv = trainer._prepare(rows, batch, index, StepMetrics(), 0).advantages
    mask = rows.batch.loss_mask
    ends = turn_ends(mask, rows.batch.turn_end)
    for over, whitened in ((ends, algorithm == "turn_ppo"), (mask, algorithm != "turn_ppo")):
        mean, var = float(adv[over].mean()), float(adv[over].var())
        assert (abs(mean) < 1e-5 and var == pytest.approx(1.0, abs=1e-4)) is whitened, (mean, var)


# --- 7. value normalisation -----------------------------------------------------------------

def test_value_norm_rescales_the_head_without_moving_its_predictions(model_path, hf_model):
    trainer = Trainer(_config(model_path, "vagen_full", value_norm=True))
    ids, mask = _padded_ids(_batch(hf_model, 4))
    returns = torch.where(mask, torch.linspace(0, 6, mask.shape[1]).expand_as(mask), 0.0)
    raw = trainer._values(ids)
    trainer.value_norm.update(returns, mask, trainer.critic.head)  # first batch: stats, no rescaling
    mean, sq, std = trainer.value_norm.stats
    assert mean == pytest.approx(float(returns[mask].double().mean()))
    assert std == pytest.approx(float(returns[mask].double().std(unbiased=False)), rel=1e-6)
    torch.testing.assert_close(trainer._values(ids)[:, 1:], raw[:, 1:] * std + mean)
    assert (trainer._values(ids)[:, 0] == 0).all()  # no prefix, no value
    before = trainer._values(ids)
    trainer.value_norm.update(returns * 3 + 5, mask, trainer.critic.head)  # stats move, predictions stay
    assert trainer.value_norm.stats[0] == pytest.approx(0.9 * mean + 0.1 * (3 * mean + 5))
    torch.testing.assert_close(trainer._values(ids), before, atol=1e-5, rtol=1e-5)


def test_value_norm_lets_a_fresh_critic_fit_returns_of_several_units(model_path, hf_model):
    """Critic-only steps on episodes worth 0 or 10 per turn: with value_norm the values reach the
    returns' scale (explained variance 0.82 after 8 steps); without it 0.11."""
    trajectories = _batch(hf_model, 8)
    for t in trajectories:
        t.turn_rewards = t.turn_rewards * 10
    explained = {}
    for norm in (False, True):
        trainer = Trainer(_config(model_path, "vagen_full", critic_warmup=100, value_norm=norm, critic_lr=1e-3,
                                  kl_in_reward=None))
        for _ in range(8):
            metrics = trainer.train_step(trajectories, version=0)
        explained[norm] = metrics["critic/explained_variance"]
    assert explained[False] < 0.3 and explained[True] > 0.6, explained


def test_the_first_critic_update_clips_against_the_heads_own_old_values(model_path, hf_model):
    """Step 1 with value_norm: the statistics are set from this batch and the head keeps its
    weights, so the old values the clipped value loss compares with must be the head's outputs in
    the statistics' units. In one minibatch and one epoch the critic has not moved when its loss
    is taken: nothing is clipped (before the fix the old values stayed in the head's raw units,
    about 0, and the clip bound most tokens)."""
    trajectories = _batch(hf_model, 8)
    for t in trajectories:
        t.turn_rewards = t.turn_rewards * 10 + 5
    trainer = Trainer(_config(model_path, "vagen_full", critic_warmup=100, value_norm=True, value_clip=0.2,
                              kl_in_reward=None, epochs=1, num_minibatches=1))
    metrics = trainer.train_step(trajectories, version=0)
    assert metrics["critic/clip_frac"] == 0.0
    assert metrics["critic/return_mean"] > 1  # the returns are several units away from the raw head


def test_a_step_reports_the_learners_health(model_path, hf_model):
    """The answer apart from the reasoning (entropy, behaviour KL), advantages before whitening,
    V-trace's truncation, the critic at turn starts: present, finite, and the split right."""
    trainer = Trainer(_config(model_path, "vagen_full", kl_in_reward=None, vtrace=True))
    pieces = trainer.answer_spans.pieces
    opening, closing = pieces.index("<answer>"), pieces.index("</answer>")
    rng = np.random.default_rng(3)
    trajectories = _batch(hf_model, 4)
    reply = [30, 31, opening, GOOD, closing]  # two reasoning tokens, then the answer
    trajectories += [_trajectory(rng, hf_model, group_id=9, good=True, turns=2, replies=[5, 5])
                     for _ in range(2)]
    for t in trajectories[-2:]:
        t.token_ids[t.loss_mask] = reply * 2
        t.behaviour_logprobs = np.where(
            t.loss_mask, _hf_logprobs(hf_model, torch.from_numpy(t.token_ids).long()[None])[0].numpy(), 0.0
        ).astype(np.float32)
    ids, mask = _padded_ids(trajectories[-2:])
    answer = trainer.answer_spans.mask(ids, mask)
    assert answer.sum() == 2 * 2 * 3  # <answer> GOOD </answer> in each turn of each
    metrics = trainer.train_step(trajectories, version=0)
    for key in ("policy/entropy_answer", "policy/entropy_reasoning", "policy/behaviour_kl_answer",
                "policy/behaviour_kl_reasoning", "advantage/mean", "advantage/std", "vtrace/rho_mean",
                "vtrace/clipped", "vtrace/turn_rho_mean", "vtrace/turn_clipped",
                "critic/explained_variance_turn_start"):
        assert math.isfinite(metrics[key]), key
    # the behaviour log-probs are the model's own: no drift on either part, nothing clipped much
    assert abs(metrics["policy/behaviour_kl_answer"]) < 1e-4 and abs(metrics["policy/behaviour_kl_reasoning"]) < 1e-4
    assert metrics["vtrace/rho_mean"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["advantage/std"] > 0


def test_the_fresh_gap_is_the_engines_drift_on_tokens_of_the_learners_version(model_path, hf_model):
    """|behaviour - proximal| on staleness-0 tokens only: a planted drift on one fresh token is
    the max, a larger one on a stale token is not counted, and with no fresh token it is absent."""
    trajectories = _batch(hf_model, 4)
    for t in trajectories:  # sampled by version 1, the one the learner holds
        t.policy_version[t.loss_mask] = 1
    fresh, stale = trajectories[0], trajectories[1]
    fresh.behaviour_logprobs[np.flatnonzero(fresh.loss_mask)[0]] -= 0.5
    stale.policy_version[stale.loss_mask] = 0
    stale.behaviour_logprobs[np.flatnonzero(stale.loss_mask)[0]] -= 3.0
    trainer = Trainer(_config(model_path, "grpo", kl_in_reward=None))
    metrics = trainer.train_step(trajectories, version=1)
    n_fresh = sum(int(t.loss_mask.sum()) for t in trajectories) - int(stale.loss_mask.sum())
    assert metrics["policy/fresh_gap_max"] == pytest.approx(0.5, abs=1e-4)
    assert metrics["policy/fresh_gap_mean"] == pytest.approx(0.5 / n_fresh, abs=1e-4)
    later = trainer.train_step(trajectories, version=2)  # every token is stale now
    assert "policy/fresh_gap_max" not in later and "policy/fresh_gap_mean" not in later
