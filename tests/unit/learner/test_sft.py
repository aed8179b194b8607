"""learner/sft.py: the SFT loss against hand and naive computations, its mask, and the loop
learning the demonstrations on a tiny Qwen2; on image demonstrations, the loss against
transformers' forward with the images, and the loop learning them on the tiny Qwen2-VL."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from learner.batch import collate
from learner.sft import sft_loss, train_sft
from transport.schema import Trajectory


class Bigram(nn.Module):
    """logits[b, i] = table[token_ids[b, i]]: each prediction sees only the current token."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(table.clone())

    def forward(self, input_ids, use_cache=False):
        self.logits = self.table[input_ids]
        self.logits.retain_grad()  # for the gradient test
        return SimpleNamespace(logits=self.logits)


def _trajectory(tokens, mask, seed=0):
    mask = np.array(mask, dtype=bool)
    ends = mask & ~np.r_[mask[1:], False]
    return Trajectory(
        run_id="t", actor_id=0, episode_id=0, env_name="e", seed=seed, group_id=0,
        token_ids=np.array(tokens, dtype=np.int32), loss_mask=mask, turn_end=ends,
        behaviour_logprobs=np.zeros(len(mask), np.float32),
        policy_version=np.where(mask, 0, -1).astype(np.int32),
        turn_rewards=np.zeros(int(ends.sum()), np.float32))


PROBS = torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [0.6, 0.2, 0.2]])


def test_loss_and_accuracy_by_hand():
    model = Bigram(PROBS.log())
    batch = collate([_trajectory([0, 1, 1, 2], [0, 1, 1, 0]), _trajectory([2, 0], [0, 1])], pad_id=2)
    loss, metrics = sft_loss(model, batch)
    # Targets: 1 after 0 (p .25), 1 after 1 (p .8), 0 after 2 (p .6); the mean over all three.
    expected = -(math.log(0.25) + math.log(0.8) + math.log(0.6)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # Greedy predictions: after 0 -> 0 (wrong), after 1 -> 1 (right), after 2 -> 0 (right).
    assert metrics["sft/token_accuracy"] == pytest.approx(2 / 3)
    assert metrics["sft/tokens"] == 3 and metrics["sft/loss"] == pytest.approx(expected, rel=1e-6)


def test_loss_equals_a_naive_per_token_loop():
    g = torch.Generator().manual_seed(0)
    vocab = 11
    model = Bigram(torch.randn(vocab, vocab, generator=g))
    rng = np.random.default_rng(0)
    trajs = []
    for n in (7, 12, 4):
        mask = rng.random(n) < 0.5
        mask[-1] = True
        trajs.append(_trajectory(rng.integers(vocab, size=n), mask))
    loss, _ = sft_loss(model, collate(trajs, pad_id=0))
    terms = []
    for t in trajs:
        for i in range(1, len(t.token_ids)):
            if t.loss_mask[i]:
                logp = torch.log_softmax(model.table[int(t.token_ids[i - 1])], -1)
                terms.append(-logp[int(t.token_ids[i])].item())
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-5)


def test_tokens_off_the_mask_have_no_influence_as_targets():
    g = torch.Generator().manual_seed(1)
    model = Bigram(torch.randn(5, 5, generator=g))
    tokens, mask = [1, 2, 3, 4, 0, 1, 2], [0, 1, 1, 0, 0, 1, 0]
    base, _ = sft_loss(model, collate([_trajectory(tokens, mask)], pad_id=0))
    # Position 4 is neither a target nor the context of one (position 5's context is token 4):
    # with a bigram model its value cannot matter; nor can anything after the last target.
    changed = list(tokens)
    changed[3], changed[6] = 0, 3
    other, _ = sft_loss(model, collate([_trajectory(changed, mask)], pad_id=0))
    assert other.item() == base.item()
    # No gradient reaches the logits of positions whose next token is off the mask.
    loss, _ = sft_loss(model, collate([_trajectory(tokens, mask)], pad_id=0))
    loss.backward()
    grad_rows = model.logits.grad[0].abs().sum(-1)
    predicts_target = torch.tensor(mask[1:] + [0], dtype=torch.bool)
    assert torch.all(grad_rows[~predicts_target] == 0) and torch.all(grad_rows[predicts_target] > 0)


def test_a_batch_without_targets_is_an_error():
    with pytest.raises(ValueError, match="no policy tokens"):
        sft_loss(Bigram(PROBS.log()), collate([_trajectory([0, 1], [1, 0])]))


def _tiny_qwen(vocab: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=2048, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen2ForCausalLM(config)


def test_train_sft_lowers_the_loss_on_demonstrations_and_is_deterministic():
    from actors.demonstrations import make_demonstrations
    from envs.registry import load_config
    from launch.model.tiny_tokenizer import build_tokenizer

    tokenizer = build_tokenizer(seed=0)
    demos = make_demonstrations("frozenlake", load_config("frozenlake"), tokenizer, range(4),
                                action_noise=0.0, rng_seed=0)
    logged = []
    runs = []
    for _ in range(2):
        model = _tiny_qwen(len(tokenizer))
        runs.append(train_sft(model, demos, steps=20, batch_size=2, lr=3e-3, seed=0,
                              pad_id=tokenizer.pad_token_id, log_every=10, on_log=logged.append))
    history = runs[0]
    losses = [h["sft/loss"] for h in history]
    assert len(history) == 20 and [h["step"] for h in logged] == [10, 20, 10, 20]
    assert np.mean(losses[-3:]) < 0.6 * np.mean(losses[:3])
    assert history[-1]["sft/token_accuracy"] > history[0]["sft/token_accuracy"]
    assert losses == [h["sft/loss"] for h in runs[1]]


@pytest.mark.parametrize("micro", [1, 3])
def test_micro_batches_give_the_same_steps_as_the_whole_batch(micro):
    """Demonstrations of 1-3 turns (rows of unequal length) and a batch of 4: micro-batches of
    ``micro`` rows, longest first, train the same weights with the same metrics as one forward
    of the padded batch, up to float rounding."""
    from actors.demonstrations import make_demonstrations
    from envs.registry import load_config
    from launch.model.tiny_tokenizer import build_tokenizer

    tokenizer = build_tokenizer(seed=0)
    demos = make_demonstrations("frozenlake", load_config("frozenlake"), tokenizer, range(8),
                                action_noise=0.5, rng_seed=0)
    assert len({len(t.token_ids) for t in demos}) > 2
    models, histories = [], []
    for micro_batch_size in (0, micro):
        models.append(_tiny_qwen(len(tokenizer)))
        histories.append(train_sft(models[-1], demos, steps=5, batch_size=4, lr=3e-3, seed=0,
                                   pad_id=tokenizer.pad_token_id, micro_batch_size=micro_batch_size))
    for whole, parts in zip(*histories):
        for key in ("sft/loss", "sft/token_accuracy", "sft/tokens", "optim/grad_norm"):
            assert parts[key] == pytest.approx(whole[key], rel=1e-4), key
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
    assert histories[0][-1]["sft/loss"] < histories[0][0]["sft/loss"]


def test_train_sft_applies_the_schedule_to_the_optimizer():
    model = Bigram(PROBS.log())
    start = model.table.detach().clone()
    tables = []
    history = train_sft(model, [_trajectory([0, 1, 1, 2], [0, 1, 1, 1])], steps=4, batch_size=1,
                        lr=0.2, seed=0, schedule="cosine", warmup=1, log_every=1,
                        on_log=lambda m: tables.append(model.table.detach().clone()))
    assert [h["optim/lr"] for h in history] == pytest.approx([0.2, 0.15, 0.05, 0.0], abs=1e-12)
    # Adam's first step moves every parameter with a gradient by lr (m / sqrt(v) = sign(g)).
    moved = (tables[0] - start).abs()
    assert moved.max().item() == pytest.approx(0.2, rel=1e-4)
    # The last step's lr is 0: it leaves the table as the third step did.
    assert torch.equal(tables[3], tables[2]) and not torch.equal(tables[2], tables[1])


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    """The tiny Qwen2-VL, its processor, image demonstrations of FrozenLake (56 px) played as
    the actor records them, of different lengths (1 to 3 turns, one image each), and one text
    demonstration."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from actors.demonstrations import make_demonstrations
    from actors.vision import VisionTokens
    from envs.registry import load_config
    from launch.model.tiny_model import build_tiny_model

    path = str(build_tiny_model(tmp_path_factory.mktemp("vl"), vision=True, seed=0))
    processor = AutoProcessor.from_pretrained(path)
    config = load_config("frozenlake") | {"render": "image", "image_size": 56, "prompt": "brief"}
    demos = make_demonstrations("frozenlake", config, processor.tokenizer, range(8),
                                action_noise=0.4, rng_seed=0,
                                vision=VisionTokens.from_pretrained(path))

    text = make_demonstrations("frozenlake", config | {"render": "text"}, processor.tokenizer,
                               [100], action_noise=0.4, rng_seed=0)

    def model():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()

    return SimpleNamespace(path=path, processor=processor, demos=demos, text=text, model=model)


def _hand_loss(model, processor, trajectories) -> float:
    """Each trajectory alone, unpadded, through transformers with its images as the processor
    prepares them; the cross-entropy summed over every policy token, over their number."""
    from transport.images import decode_image

    total, count = 0.0, 0
    for t in trajectories:
        ids = torch.as_tensor(t.token_ids.astype(np.int64))[None]
        inputs = {}
        if t.images:
            pictures = [decode_image(i) for i in t.images]
            px = processor.image_processor(images=pictures, return_tensors="pt")
            types = processor.create_mm_token_type_ids(ids.tolist())
            inputs = {"pixel_values": px["pixel_values"], "image_grid_thw": px["image_grid_thw"],
                      "mm_token_type_ids": torch.as_tensor(types)}
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids, **inputs).logits[0].float(), -1)
        mask = torch.as_tensor(t.loss_mask)[1:]
        total -= float(logp[:-1].gather(1, ids[0, 1:, None])[:, 0][mask].sum())
        count += int(mask.sum())
    return total / count


def test_sft_loss_on_an_image_batch_equals_transformers_with_the_images(vlm):
    from learner.sft import image_inputs
    from learner.vision import ImageInputs

    model, images = vlm.model(), ImageInputs(vlm.path)
    # Rows of different lengths and image counts, and one without images: padding, the order in
    # which the images fill the pad runs, and a text row in an image batch.
    trajs = [*sorted(vlm.demos, key=lambda t: len(t.images))[-3:], *vlm.text, vlm.demos[0]]
    assert len({len(t.images) for t in trajs}) >= 3
    batch = collate(trajs, pad_id=vlm.processor.tokenizer.pad_token_id)
    inputs = image_inputs(images, trajs, batch)
    assert inputs["image_grid_thw"].shape[0] == sum(len(t.images) for t in trajs)
    with torch.no_grad():
        loss, metrics = sft_loss(model, batch, inputs)
    assert loss.item() == pytest.approx(_hand_loss(model, vlm.processor, trajs), rel=2e-6)
    assert metrics["sft/tokens"] == sum(int(t.loss_mask.sum()) for t in trajs)
    # The check can fail: the same ids without their images are scored otherwise.
    with torch.no_grad():
        blind, _ = sft_loss(model, batch)
    assert abs(blind.item() - loss.item()) > 1e-4


def test_image_trajectories_need_the_image_inputs(vlm):
    from learner.sft import image_inputs

    batch = collate(vlm.demos[:2])
    with pytest.raises(ValueError, match="image inputs"):
        image_inputs(None, vlm.demos[:2], batch)
    with pytest.raises(ValueError, match="image inputs"):
        train_sft(vlm.model(), vlm.demos, steps=1, batch_size=2, lr=1e-3, seed=0)


def test_train_sft_lowers_the_loss_on_image_demonstrations(vlm):
    from learner.vision import ImageInputs

    model = vlm.model()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    history = train_sft(model, vlm.demos, steps=12, batch_size=4, lr=3e-3, seed=0,
                        pad_id=vlm.processor.tokenizer.pad_token_id, images=ImageInputs(vlm.path))
    losses = [h["sft/loss"] for h in history]
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert any(k.startswith("model.visual.") for k in moved)  # the images reach the gradient
    assert any(k.startswith("model.language_model.") for k in moved)
