"""learner/lora.py through learner/trainer.py on the tiny Qwen2 (and the tiny Qwen2-VL), FSDP2
over a gloo group of one rank: what trains, the reference, the publishes, checkpoints and the
final model's directories."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from launch.model.tiny_model import build_tiny_model
from learner import lora
from learner.lora import LoraSpec
from learner.trainer import Trainer
from tests.unit.learner.test_trainer import _batch, _config, _free_port, _hf_logprobs
from transport import adapters

RANDOM = {"rank": 4, "alpha": 8, "init_seed": 3}  # A and B random: the policy starts away from the base


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def hf_model(model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _full(state) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in state.items()}


def _ids(hf_model) -> torch.Tensor:
    return torch.from_numpy(_batch(hf_model, 2, seed=5)[0].token_ids).long()[None]


def test_a_step_trains_the_adapters_and_the_critic_head_and_nothing_else(model_path, hf_model):
    trainer = Trainer(_config(model_path, "vagen_full", lora={"rank": 4, "alpha": 8}, lr=1e-2,
                              critic_lr=1e-2, critic_warmup=0))
    assert trainer.ref is None  # the reference is the policy with its adapters off
    trainable = [n for n, p in trainer.policy.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    policy, critic = _full(trainer.policy.state_dict()), _full(trainer.critic.state_dict())
    trainer.train_step(_batch(hf_model, 8), 0)
    policy_after, critic_after = _full(trainer.policy.state_dict()), _full(trainer.critic.state_dict())
    moved = {k for k in policy if not torch.equal(policy[k], policy_after[k])}
    assert moved and all(".lora_B." in k for k in moved)  # B moves first (B = 0: A's gradient is 0)
    critic_moved = {k for k in critic if not torch.equal(critic[k], critic_after[k])}
    assert {"head.weight", "head.bias"} <= critic_moved
    assert all(".lora_" in k for k in critic_moved - {"head.weight", "head.bias"})


def test_the_reference_is_the_base_model(model_path, hf_model):
    trainer = Trainer(_config(model_path, "vagen_full", lora=RANDOM))
    ids = _ids(hf_model)
    base = _hf_logprobs(hf_model, ids)
    ref = trainer._ref_logprobs(ids, {})
    np.testing.assert_allclose(ref.numpy(), base.numpy(), atol=1e-5)
    assert (trainer.policy_logprobs(ids) - base)[0, 1:].abs().max() > 0.05  # the adapter is on


def test_an_adapter_publish_is_a_peft_adapter_with_the_learners_probe(model_path, hf_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer = Trainer(_config(model_path, "grpo", lora=RANDOM))
    specs, tensors, stats = trainer.weights_for_publish()
    names = [s[0] for s in specs]
    assert names[-3:] == [adapters.CONFIG, adapters.PROBE_IDS, adapters.PROBE_LOGPROBS]
    assert all(n.startswith("base_model.model.") and ".lora_" in n for n in names[:-3])
    publish = adapters.split(tensors)
    assert stats["weights/bytes"] == sum(t.numel() * 4 for t in publish.tensors.values())
    assert publish.config["r"] == 4 and publish.config["lora_alpha"] == 8
    probe = trainer.probe_ids
    np.testing.assert_allclose(publish.probe_logprobs,
                               trainer.policy_logprobs(probe, temperature=1.0)[0, 1:].numpy(), atol=1e-6)
    with lora.adapters_disabled(trainer.policy):
        base = trainer.policy_logprobs(probe, temperature=1.0)[0, 1:]
    shift = float((base - torch.tensor(publish.probe_logprobs)).abs().max())
    assert stats["weights/probe_shift"] == pytest.approx(shift)
    path = adapters.write_adapter(tmp_path / "v1", publish.config, publish.tensors)
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_path), path).eval()
    ids = _ids(hf_model)
    np.testing.assert_allclose(_hf_logprobs(peft, ids).numpy(), trainer.policy_logprobs(ids).numpy(), atol=1e-5)


def test_a_merged_publish_is_the_base_model_with_scale_b_a_added(model_path, hf_model):
    from transformers import AutoModelForCausalLM

    trainer = Trainer(_config(model_path, "grpo", lora={**RANDOM, "merge": True}))
    specs, tensors, stats = trainer.weights_for_publish()
    state = dict(tensors)
    base = hf_model.state_dict()
    assert set(state) <= set(base) and "weights/probe_shift" not in stats
    assert set(base) - set(state) <= {"lm_head.weight"}  # a tied table comes once
    merged = AutoModelForCausalLM.from_pretrained(model_path).eval()
    merged.load_state_dict(state, strict=False)
    ids = _ids(hf_model)
    np.testing.assert_allclose(_hf_logprobs(merged, ids).numpy(), trainer.policy_logprobs(ids).numpy(), atol=1e-4)
    q = "model.layers.0.self_attn.q_proj"
    layer = dict(lora.adapted_layers(trainer.policy))[q]
    want = base[f"{q}.weight"] + 2.0 * (layer.lora_B["default"].weight.full_tensor()
                                        @ layer.lora_A["default"].weight.full_tensor())
    torch.testing.assert_close(state[f"{q}.weight"], want)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_checkpoint_holds_the_adapters_and_their_optimizer_and_resumes(model_path, hf_model, tmp_path, tied):
    """Only the adapters, the critic's head and their optimizer states; with tied embeddings
    (SmolLM2's) the frozen table stays out under its second name too."""
    if tied:
        model_path = str(build_tiny_model(tmp_path / "tied", tie_word_embeddings=True))
    cfg = _config(model_path, "vagen_full", lora=RANDOM, critic_warmup=0)
    trainer = Trainer(cfg)
    trainer.train_step(_batch(hf_model, 8), 0)
    trainer.save_checkpoint(tmp_path / "ck", {"version": 1})
    saved = dcp.FileSystemReader(str(tmp_path / "ck" / "dcp")).read_metadata().state_dict_metadata
    weights = [k for k in saved if k.startswith(("policy.", "critic."))]
    assert weights and all(".lora_" in k or k.startswith("critic.head.") for k in weights)
    assert any(k.startswith("policy_optim.state.") and "exp_avg" in k for k in saved)
    resumed = Trainer(_config(model_path, "vagen_full", lora={**RANDOM, "init_seed": 9}, critic_warmup=0))
    extra = resumed.load_checkpoint(tmp_path / "ck")
    assert extra["optimizer_fingerprint"] == extra["optimizer_fingerprint_loaded"]
    adapters_trained = sum(p.requires_grad for p in trainer.policy.parameters())
    assert extra["optimizer_fingerprint"][0] == adapters_trained  # a step's count on each, restored
    ids = _ids(hf_model)
    torch.testing.assert_close(resumed.policy_logprobs(ids), trainer.policy_logprobs(ids))
    assert resumed.steps_done == 1


def test_the_final_model_is_an_adapter_directory_and_a_merged_model(model_path, hf_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer = Trainer(_config(model_path, "grpo", lora={**RANDOM, "save_merged": True}))
    out = tmp_path / "final-model"
    trainer.save_hf(out)
    config = json.loads((out / adapters.CONFIG_FILE).read_text())
    assert config["base_model_name_or_path"] == model_path and not (out / "config.json").exists()
    ids = _ids(hf_model)
    want = trainer.policy_logprobs(ids).numpy()
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_path), out).eval()
    np.testing.assert_allclose(_hf_logprobs(peft, ids).numpy(), want, atol=1e-5)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final-model-merged").eval()
    np.testing.assert_allclose(_hf_logprobs(merged, ids).numpy(), want, atol=1e-4)


def test_dropout_is_on_in_training_passes_only(model_path, hf_model):
    trainer = Trainer(_config(model_path, "grpo", lora={**RANDOM, "dropout": 0.5}))
    ids = _ids(hf_model)
    torch.testing.assert_close(trainer.policy_logprobs(ids), trainer.policy_logprobs(ids), rtol=0, atol=0)
    with lora.adapter_dropout(trainer.policy, True):
        drops = [d for _, layer in lora.adapted_layers(trainer.policy) for d in layer.lora_dropout.values()]
        assert drops and all(d.training for d in drops)
    assert not any(d.training for d in drops)


def test_a_vision_language_models_adapters_stay_on_its_language_model(tmp_path):
    from transformers import AutoModelForImageTextToText

    path = build_tiny_model(tmp_path / "vl", vision=True)
    model = AutoModelForImageTextToText.from_pretrained(path)
    adapted = [n for n, _ in lora.adapted_layers(lora.inject(model, LoraSpec(target_modules=("qkv", "q_proj")),
                                                             vision=True))]
    assert adapted and all("visual" not in n for n in adapted)
    model = AutoModelForImageTextToText.from_pretrained(path)
    with pytest.raises(ValueError, match="vision-tower"):
        lora.inject(model, LoraSpec(target_modules=r".*\.(qkv|q_proj)"), vision=True)


@pytest.mark.parametrize("keys,error", [
    ({"rank": 0}, "rank >= 1"), ({"alpha": 0}, "alpha > 0"), ({"dropout": 1.0}, "dropout"),
    ({"rank": 4, "ranks": 4}, "unknown learner.lora keys"), ({"target_modules": []}, "empty"),
])
def test_a_wrong_lora_config_is_refused_by_name(keys, error):
    with pytest.raises(ValueError, match=error):
        LoraSpec.from_dict(keys)
