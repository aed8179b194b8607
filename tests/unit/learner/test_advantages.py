"""learner/advantages.py: hand-computed cases, equivalence with the naive loops, identities."""

import math

import pytest
import torch

from learner.advantages import (
    bi_level_gae,
    grpo,
    masked_gae,
    masked_mean,
    masked_whiten,
    turn_ends,
    turn_wise_gae,
)
from tests import naive_advantages as naive

NAN = float("nan")


def _two_turn_row():
    """[obs, a, a(end), obs, obs, a, a(end)]: rewards 1 and 2 on the two turn ends.

    Off-mask entries are NaN: they must be ignored.
    """
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1]], dtype=torch.bool)
    turn_end = torch.tensor([[0, 0, 1, 0, 0, 0, 1]], dtype=torch.bool)
    rewards = torch.tensor([[NAN, 0.0, 1.0, NAN, NAN, 0.0, 2.0]], dtype=torch.float64)
    values = torch.tensor([[NAN, 0.5, 0.4, NAN, NAN, 0.3, 0.2]], dtype=torch.float64)
    return rewards, values, mask, turn_end


def _expected(by_position, length=7):
    out = torch.zeros(1, length, dtype=torch.float64)
    for p, x in by_position.items():
        out[0, p] = x
    return out


def test_masked_gae_hand_computed():
    rewards, values, mask, _ = _two_turn_row()
    g, lam = 0.9, 0.8
    # Backwards over policy positions 6, 5, 2, 1; observation tokens 3, 4 are skipped.
    a6 = 2.0 + g * 0.0 - 0.2                      # 1.8
    a5 = (0.0 + g * 0.2 - 0.3) + g * lam * a6     # -0.12 + 0.72 * 1.8 = 1.176
    a2 = (1.0 + g * 0.3 - 0.4) + g * lam * a5     # 0.87 + 0.72 * 1.176 = 1.71672
    a1 = (0.0 + g * 0.4 - 0.5) + g * lam * a2     # -0.14 + 0.72 * 1.71672 = 1.0960384
    adv, ret = masked_gae(rewards, values, mask, gamma=g, lam=lam)
    expected = _expected({1: a1, 2: a2, 5: a5, 6: a6})
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-12)
    assert a1 == pytest.approx(1.0960384)
    torch.testing.assert_close(ret, expected + _expected({1: 0.5, 2: 0.4, 5: 0.3, 6: 0.2}))


def test_bi_level_gae_hand_computed():
    rewards, values, mask, turn_end = _two_turn_row()
    g_turn, lam_turn, g_tok, lam_tok = 0.9, 0.8, 1.0, 0.5
    # Turn level over ends e0 = 2, e1 = 6.
    at1 = 2.0 + 0.0 - 0.2                                   # 1.8
    at0 = (1.0 + g_turn * 0.2 - 0.4) + g_turn * lam_turn * at1  # 0.78 + 1.296 = 2.076
    # Token level inside each turn, seeded with the turn's advantage at its end.
    a6, a2 = at1, at0
    a5 = (0.0 + g_tok * 0.2 - 0.3) + g_tok * lam_tok * a6  # -0.1 + 0.9 = 0.8
    a1 = (0.0 + g_tok * 0.4 - 0.5) + g_tok * lam_tok * a2  # -0.1 + 1.038 = 0.938
    adv, ret = bi_level_gae(rewards, values, mask, turn_end, gamma_token=g_tok,
                            gamma_turn=g_turn, lam_token=lam_tok, lam_turn=lam_turn)
    torch.testing.assert_close(adv, _expected({1: a1, 2: a2, 5: a5, 6: a6}), rtol=0, atol=1e-12)
    assert (a1, a5) == pytest.approx((0.938, 0.8))
    torch.testing.assert_close(ret[0, [1, 2, 5, 6]],
                               torch.tensor([a1 + 0.5, a2 + 0.4, a5 + 0.3, a6 + 0.2], dtype=torch.float64))


def test_turn_wise_gae_hand_computed():
    rewards, values, mask, turn_end = _two_turn_row()
    at1 = 2.0 - 0.2
    at0 = (1.0 + 0.9 * 0.2 - 0.4) + 0.9 * 0.8 * at1  # 2.076
    adv, ret = turn_wise_gae(rewards, values, mask, turn_end, gamma_turn=0.9, lam_turn=0.8)
    torch.testing.assert_close(adv, _expected({1: at0, 2: at0, 5: at1, 6: at1}), rtol=0, atol=1e-12)
    assert ret[0, 2].item() == pytest.approx(at0 + 0.4) and ret[0, 6].item() == pytest.approx(at1 + 0.2)


def test_vtrace_hand_computed():
    rewards, values, mask, turn_end = _two_turn_row()
    log_rho = torch.tensor([[NAN, math.log(3.0), 0.0, NAN, NAN, math.log(2.0), math.log(0.5)]],
                           dtype=torch.float64)
    g, lam = 0.9, 0.8
    # rho = c = min(1, ratio): 1, 1, 1, 0.5 at positions 1, 2, 5, 6.
    a6 = 0.5 * (2.0 - 0.2)                               # 0.9
    a5 = (g * 0.2 - 0.3) + g * lam * 1.0 * a6            # -0.12 + 0.648 = 0.528
    a2 = (1.0 + g * 0.3 - 0.4) + g * lam * a5            # 0.87 + 0.38016 = 1.25016
    a1 = (g * 0.4 - 0.5) + g * lam * a2                  # -0.14 + 0.9001152 = 0.7601152
    adv, _ = masked_gae(rewards, values, mask, gamma=g, lam=lam, log_rho=log_rho)
    torch.testing.assert_close(adv, _expected({1: a1, 2: a2, 5: a5, 6: a6}), rtol=0, atol=1e-12)

    # Bi-level: turn 0's ratio is 3 * 1 = 3 (clipped to 1); turn 1's is 2 * 0.5 = 1.
    at1 = 1.0 * (2.0 - 0.2)
    at0 = 1.0 * (1.0 + 0.9 * 0.2 - 0.4) + 0.9 * 0.8 * 1.0 * at1
    # Inside turn 1, token 5 has rho = c = min(1, 2) = 1; inside turn 0, token 1 has min(1, 3) = 1.
    a5 = (1.0 * 0.2 - 0.3) + 1.0 * 0.5 * at1
    a1 = (1.0 * 0.4 - 0.5) + 1.0 * 0.5 * at0
    adv, _ = bi_level_gae(rewards, values, mask, turn_end, gamma_token=1.0, gamma_turn=0.9,
                          lam_token=0.5, lam_turn=0.8, log_rho=log_rho)
    torch.testing.assert_close(adv, _expected({1: a1, 2: at0, 5: a5, 6: at1}), rtol=0, atol=1e-12)

    # With rho_clip = c_clip = 4, turn 0's ratio 3 passes unclipped and token 5's ratio 2 too.
    at0 = 3.0 * (1.0 + 0.9 * 0.2 - 0.4) + 0.9 * 0.8 * 3.0 * at1
    a5 = 2.0 * (0.2 - 0.3) + 0.5 * 2.0 * at1
    adv, _ = bi_level_gae(rewards, values, mask, turn_end, gamma_token=1.0, gamma_turn=0.9,
                          lam_token=0.5, lam_turn=0.8, log_rho=log_rho, rho_clip=4.0, c_clip=4.0)
    assert adv[0, 2].item() == pytest.approx(at0) and adv[0, 5].item() == pytest.approx(a5)


def test_trailing_tokens_without_turn_end_form_a_turn():
    # Two turns, the second never closed: [a, a(end), obs, a, a].
    mask = torch.tensor([[1, 1, 0, 1, 1]], dtype=torch.bool)
    turn_end = torch.tensor([[0, 1, 0, 0, 0]], dtype=torch.bool)
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0, 3.0]], dtype=torch.float64)
    values = torch.tensor([[0.1, 0.2, 0.0, 0.3, 0.4]], dtype=torch.float64)
    adv, _ = turn_wise_gae(rewards, values, mask, turn_end, gamma_turn=1.0, lam_turn=1.0)
    at1 = 3.0 - 0.4
    at0 = 1.0 + 0.4 - 0.2 + at1
    torch.testing.assert_close(adv, torch.tensor([[at0, at0, 0.0, at1, at1]], dtype=torch.float64))


ESTIMATORS = {
    "masked_gae": (masked_gae, naive.masked_gae, False, dict(gamma=0.97, lam=0.9)),
    "bi_level_gae": (bi_level_gae, naive.bi_level_gae, True,
                     dict(gamma_token=0.99, gamma_turn=0.9, lam_token=0.8, lam_turn=0.95)),
    "turn_wise_gae": (turn_wise_gae, naive.turn_wise_gae, True, dict(gamma_turn=0.9, lam_turn=0.7)),
}
CORRECTIONS = {
    "none": {},
    "vtrace": {"rho_clip": 1.0, "c_clip": 1.0},
    "vtrace-loose": {"rho_clip": 2.0, "c_clip": 0.9},
}


@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 9), (8, 40), (5, 300), (4, 1500)])
def test_matches_naive_loop_on_random_episodes(name, correction, shape):
    fast, slow, needs_turns, kwargs = ESTIMATORS[name]
    g = torch.Generator().manual_seed(hash((name, correction, shape)) % 2**31)
    for _ in range(3):
        rewards, values, mask, turn_end, log_rho = naive.random_episode_batch(*shape, generator=g)
        kw = dict(kwargs, **CORRECTIONS[correction])
        if correction != "none":
            kw["log_rho"] = log_rho
        args = (rewards, values, mask, turn_end) if needs_turns else (rewards, values, mask)
        adv, ret = fast(*args, **kw)
        adv_ref, ret_ref = slow(*args, **kw)
        assert adv.dtype == values.dtype and adv.shape == values.shape
        torch.testing.assert_close(adv.double(), adv_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ret.double(), ret_ref, rtol=1e-5, atol=1e-5)
        # Zeros off the mask, whatever the inputs held there (NaN).
        assert torch.all(adv[~mask] == 0) and torch.all(ret[~mask] == 0)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_zero_log_rho_is_exactly_uncorrected(name):
    fast, _, needs_turns, kwargs = ESTIMATORS[name]
    g = torch.Generator().manual_seed(7)
    rewards, values, mask, turn_end, _ = naive.random_episode_batch(16, 200, generator=g)
    args = (rewards, values, mask, turn_end) if needs_turns else (rewards, values, mask)
    plain = fast(*args, **kwargs)
    corrected = fast(*args, **kwargs, log_rho=torch.zeros_like(rewards))
    assert torch.equal(plain[0], corrected[0]) and torch.equal(plain[1], corrected[1])


def test_bi_level_turn_end_gets_turn_advantage():
    g = torch.Generator().manual_seed(3)
    rewards, values, mask, turn_end, log_rho = naive.random_episode_batch(32, 256, generator=g)
    kw = dict(gamma_turn=0.95, lam_turn=0.9, log_rho=log_rho)
    bi, _ = bi_level_gae(rewards, values, mask, turn_end, gamma_token=1.0, lam_token=0.7, **kw)
    turn, _ = turn_wise_gae(rewards, values, mask, turn_end, **kw)
    ends = turn_end & mask
    assert ends.any()
    torch.testing.assert_close(bi[ends], turn[ends], rtol=0, atol=0)


def test_lam_token_only_changes_non_end_tokens():
    g = torch.Generator().manual_seed(4)
    rewards, values, mask, turn_end, _ = naive.random_episode_batch(16, 128, generator=g)
    kw = dict(gamma_token=1.0, gamma_turn=0.95, lam_turn=0.9)
    a, _ = bi_level_gae(rewards, values, mask, turn_end, lam_token=0.0, **kw)
    b, _ = bi_level_gae(rewards, values, mask, turn_end, lam_token=1.0, **kw)
    ends = turn_end & mask
    assert torch.equal(a[ends], b[ends]) and not torch.equal(a[mask & ~ends], b[mask & ~ends])


def test_single_turn_bi_level_with_gamma_one_equals_masked_gae():
    # One turn, gamma_token = 1, lam_token = lam: the turn's return seeds its end token, and the
    # token recursion is the plain masked GAE with gamma = 1.
    g = torch.Generator().manual_seed(5)
    rewards = torch.randn(4, 30, generator=g, dtype=torch.float64)
    values = torch.randn(4, 30, generator=g, dtype=torch.float64)
    mask = torch.zeros(4, 30, dtype=torch.bool)
    mask[:, 10:25] = True
    turn_end = torch.zeros_like(mask)
    turn_end[:, 24] = True
    bi, _ = bi_level_gae(rewards, values, mask, turn_end, gamma_token=1.0, gamma_turn=0.9,
                         lam_token=0.8, lam_turn=0.5)
    flat, _ = masked_gae(rewards, values, mask, gamma=1.0, lam=0.8)
    torch.testing.assert_close(bi, flat)


def test_empty_rows_and_empty_batches():
    mask = torch.zeros(3, 5, dtype=torch.bool)
    x = torch.randn(3, 5)
    for adv, ret in (masked_gae(x, x, mask, gamma=1.0, lam=1.0),
                     bi_level_gae(x, x, mask, mask, gamma_token=1.0, gamma_turn=1.0,
                                  lam_token=1.0, lam_turn=1.0),
                     turn_wise_gae(x, x, mask, mask, gamma_turn=1.0, lam_turn=1.0)):
        assert torch.equal(adv, torch.zeros_like(x)) and torch.equal(ret, torch.zeros_like(x))
    empty = torch.zeros(0, 0)
    adv, ret = masked_gae(empty, empty, empty.bool(), gamma=1.0, lam=1.0)
    assert adv.shape == (0, 0)


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError):
        masked_gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool),
                   gamma=1.0, lam=1.0)


def test_grpo_hand_computed():
    scores = torch.tensor([1.0, 3.0, 5.0, 2.0, 7.0])
    groups = torch.tensor([4, 4, 4, 9, 2])
    adv = grpo(scores, groups, eps=0.0)
    # Group 4: mean 3, unbiased std sqrt(((-2)^2 + 0 + 2^2) / 2) = 2. Groups 9 and 2 are alone.
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0]))


def test_grpo_matches_naive_and_is_normalised():
    g = torch.Generator().manual_seed(11)
    scores = torch.randn(200, generator=g, dtype=torch.float64)
    groups = torch.randint(0, 30, (200,), generator=g)
    adv = grpo(scores, groups)
    torch.testing.assert_close(adv, naive.grpo(scores, groups))
    for gid in groups.unique():
        members = adv[groups == gid]
        if len(members) > 1:
            assert abs(members.mean().item()) < 1e-9
            assert members.std().item() == pytest.approx(1.0, abs=1e-4)


def test_grpo_unscaled_keeps_the_scale_of_each_group():
    # Group 4: mean 3 -> deviations -2, 0, 2; group 1 (all failed, format rewards 0.5 apart): mean
    # 0.75 -> -0.25, 0.25. Scaled, both groups would give +-1 at their extremes.
    scores = torch.tensor([1.0, 3.0, 5.0, 0.5, 1.0])
    groups = torch.tensor([4, 4, 4, 1, 1])
    adv = grpo(scores, groups, scale=False)
    torch.testing.assert_close(adv, torch.tensor([-2.0, 0.0, 2.0, -0.25, 0.25]))
    g = torch.Generator().manual_seed(12)
    scores = torch.randn(100, generator=g, dtype=torch.float64)
    groups = torch.randint(0, 20, (100,), generator=g)
    torch.testing.assert_close(grpo(scores, groups, scale=False),
                               naive.grpo(scores, groups, scale=False))


def test_grpo_identical_scores_give_zero():
    adv = grpo(torch.full((4,), 2.5), torch.zeros(4, dtype=torch.long))
    assert torch.equal(adv, torch.zeros(4))


def test_masked_whiten():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, NAN, 4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    out = masked_whiten(x, mask, eps=0.0)
    # Over {1, 2, 3, 4}: mean 2.5, unbiased var 5/3.
    expected = (torch.tensor([1.0, 2.0, 3.0, 4.0]) - 2.5) / math.sqrt(5 / 3)
    torch.testing.assert_close(out[mask], expected)
    assert torch.equal(out[~mask], torch.zeros(2))
    assert masked_mean(x, mask).item() == pytest.approx(2.5)


def test_masked_whiten_over_turn_ends():
    # Row 0: a turn of three tokens (advantage 1) then one of one token (3); row 1: one unclosed
    # turn of two tokens (5), closed by the row's last policy token.
    x = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0, 3.0], [5.0, 5.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1, 1, 0, 1], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    turn_end = torch.tensor([[0, 0, 0, 1, 0, 1], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    ends = turn_ends(mask, turn_end)
    # row 1's turn_end at 0 marks a token of the first turn; its last policy token closes another
    assert ends.tolist() == [[False, False, False, True, False, True],
                             [True, True, False, False, False, False]]
    ends = turn_ends(mask, torch.tensor([[0, 0, 0, 1, 0, 1], [0] * 6], dtype=torch.bool))
    out = masked_whiten(x, mask, over=ends, eps=0.0)
    # One entry per turn, {1, 3, 5}: mean 3, unbiased variance 4; applied to every policy token.
    expected = torch.where(mask, (x - 3.0) / 2.0, 0.0)
    torch.testing.assert_close(out, expected)
    # Per token the long turn would weigh three times: mean 16/6, not 3.
    assert masked_mean(x, mask).item() == pytest.approx(16 / 6)
    with pytest.raises(ValueError, match="turn_end"):
        turn_ends(mask, turn_end[:, :3])


@pytest.mark.parametrize("long_turn", [False, True], ids=["per-turn-layout", "per-row-layout"])
@pytest.mark.parametrize("corrected", [False, True])
def test_bi_level_scan_layouts_agree_with_naive(long_turn, corrected):
    # Many short turns, plus (optionally) one row that is a single long turn: that pads the
    # per-turn layout beyond the per-row one, so the other code path runs.
    from learner.advantages import _Tokens, _Turns

    g = torch.Generator().manual_seed(21)
    batch, length = 8, 200
    mask = torch.zeros(batch, length, dtype=torch.bool)
    turn_end = torch.zeros_like(mask)
    for b in range(batch):
        for start in range(0, length, 10):
            mask[b, start:start + 6] = True
            turn_end[b, start + 5] = True
    if long_turn:
        mask[0], turn_end[0] = True, False
    tokens = _Tokens(mask)
    turns = _Turns(tokens, turn_end)
    assert (turns.tokens.packed_size > tokens.packed_size) == long_turn
    rewards = torch.randn(batch, length, generator=g, dtype=torch.float64)
    values = torch.randn(batch, length, generator=g, dtype=torch.float64)
    kw = dict(gamma_token=0.99, gamma_turn=0.9, lam_token=0.8, lam_turn=0.95)
    if corrected:
        kw["log_rho"] = 0.2 * torch.randn(batch, length, generator=g, dtype=torch.float64)
    adv, ret = bi_level_gae(rewards, values, mask, turn_end, **kw)
    adv_ref, ret_ref = naive.bi_level_gae(rewards, values, mask, turn_end, **kw)
    torch.testing.assert_close(adv, adv_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ret, ret_ref, rtol=1e-10, atol=1e-10)
