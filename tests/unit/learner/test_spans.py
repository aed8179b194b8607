"""learner/spans.py: the policy tokens inside tagged sections of the answers, and the KL loss
restricted to them (learner/losses.kl_loss ``only``)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from actors.demonstrations import make_demonstrations
from envs.registry import load_config
from launch.model.tiny_tokenizer import build_tokenizer
from learner import losses
from learner.spans import TagSpans

# A vocabulary whose tags are several pieces, as a hub model's BPE splits "<observation>".
PIECES = ["<", "observation", ">", "</", "a", " b", "<answer>", "Left", "</answer>", "<eos>",
          "reasoning", " c"]
P = {p: i for i, p in enumerate(PIECES)}


def _ids(*pieces: str) -> list[int]:
    return [P[p] for p in pieces]


def test_multi_piece_tags_exact_mask():
    turn = _ids("<", "observation", ">", "a", " b", "</", "observation", ">", "<answer>", "Left",
                "</answer>", "<eos>")
    env = [P["a"], P[" c"]]
    ids = torch.tensor([env + turn])
    loss_mask = torch.tensor([[False] * 2 + [True] * len(turn)])
    got = TagSpans(PIECES, ["observation"]).mask(ids, loss_mask)
    expected = [False] * 2 + [True] * 8 + [False] * 4
    assert got.tolist() == [expected]


def test_spans_stay_inside_their_turn_and_an_unclosed_tag_runs_to_its_end():
    # Turn 1 opens <observation> and stops; the observation tokens between the turns hold the
    # closing tag, which must not close turn 1's span or open anything in turn 2.
    turn1 = _ids("<", "observation", ">", "a", "<eos>")
    between = _ids("</", "observation", ">")
    turn2 = _ids("a", "<answer>", "Left", "</answer>", "<eos>")
    ids = torch.tensor([turn1 + between + turn2])
    loss_mask = torch.tensor([[True] * 5 + [False] * 3 + [True] * 5])
    got = TagSpans(PIECES, ["observation"]).mask(ids, loss_mask)
    assert got.tolist() == [[True] * 5 + [False] * 3 + [False] * 5]


def test_several_tags_and_the_answer_untouched():
    turn = _ids("<", "observation", ">", "a", "</", "observation", ">", "<", "reasoning", ">",
                " c", "</", "reasoning", ">", "<answer>", "Left", "</answer>")
    ids, loss_mask = torch.tensor([turn]), torch.ones(1, len(turn), dtype=torch.bool)
    both = TagSpans(PIECES, ["observation", "reasoning"]).mask(ids, loss_mask)[0].tolist()
    assert both == [True] * 14 + [False] * 3
    only_reasoning = TagSpans(PIECES, ["reasoning"]).mask(ids, loss_mask)[0].tolist()
    assert only_reasoning == [False] * 7 + [True] * 7 + [False] * 3


@pytest.mark.parametrize("bad", [[], [""], ["<observation>"], ["a b"]])
def test_bad_tag_names_are_refused(bad):
    with pytest.raises(ValueError, match="tags"):
        TagSpans(PIECES, bad)


def test_tiny_tokenizer_demonstrations_mask_exactly_the_tagged_text():
    """Against the text: on real demonstrations (the tags are single added tokens here), the
    masked tokens of each turn decode to exactly that turn's <observation>...</observation> and
    <prediction>...</prediction> sections, and nothing outside the loss mask is masked."""
    tokenizer = build_tokenizer(seed=0)
    config = load_config("frozenlake") | {"format": "grounding_worldmodeling"}
    demos = make_demonstrations("frozenlake", config, tokenizer, range(6), action_noise=0.3, rng_seed=0)
    spans = TagSpans.from_tokenizer(tokenizer, ["observation", "prediction"])
    width = max(len(t.token_ids) for t in demos)
    ids = torch.full((len(demos), width), tokenizer.pad_token_id)
    loss_mask = torch.zeros(len(demos), width, dtype=torch.bool)
    for r, t in enumerate(demos):
        ids[r, :len(t.token_ids)] = torch.from_numpy(t.token_ids.astype(np.int64))
        loss_mask[r, :len(t.token_ids)] = torch.from_numpy(t.loss_mask)
    got = spans.mask(ids, loss_mask)
    assert not (got & ~loss_mask).any()
    for r, t in enumerate(demos):
        answers = "".join(tokenizer.decode(t.token_ids[t.loss_mask].tolist(), skip_special_tokens=False))
        expected = "".join(re.findall(r"<observation>.*?</observation>|<prediction>.*?</prediction>",
                                      answers, re.DOTALL))
        masked = tokenizer.decode(ids[r][got[r]].tolist(), skip_special_tokens=False)
        assert masked == expected and expected.count("<observation>") == int(t.turn_end.sum())


def test_kl_loss_only_counts_the_chosen_tokens():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 6, generator=g).requires_grad_(True)
    logp_ref = torch.randn(3, 6, generator=g)
    mask = torch.rand(3, 6, generator=g) > 0.2
    only = torch.rand(3, 6, generator=g) > 0.5
    loss, _ = losses.kl_loss(logp, logp_ref, mask, kind="k3", only=only)
    d = (logp - logp_ref).detach()
    k3 = torch.exp(-d) + d - 1
    assert float(loss.detach()) == pytest.approx(float(k3[mask & only].sum() / mask.sum()), rel=1e-6)
    loss.backward()
    assert (logp.grad[~(mask & only)] == 0).all() and (logp.grad[mask & only] != 0).all()
    full, _ = losses.kl_loss(logp, logp_ref, mask, kind="k3")
    assert float(full.detach()) == pytest.approx(float(k3[mask].sum() / mask.sum()), rel=1e-6)
