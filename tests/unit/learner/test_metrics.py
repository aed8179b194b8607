"""learner/metrics.py's health metrics: turn segments and V-trace's truncation against naive
loops and a hand-computed case."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from learner.metrics import StepMetrics, add_masked_mean, turn_starts, turn_sums, vtrace_metrics


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _naive_turns(x, mask, turn_end):
    sums = []
    for r in range(mask.shape[0]):
        current, open_ = 0.0, False
        for i in range(mask.shape[1]):
            if mask[r, i]:
                current, open_ = current + float(x[r, i]), True
                if turn_end[r, i]:
                    sums.append(current)
                    current, open_ = 0.0, False
        if open_:  # a turn cut short without its end token
            sums.append(current)
    return sums


def test_turn_sums_and_starts_equal_naive_loops_on_random_rows():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        mask = torch.rand(4, 24, generator=g) < 0.6
        mask[:, 0] = False
        turn_end = mask & (torch.rand(4, 24, generator=g) < 0.3)
        x = torch.randn(4, 24, generator=g)
        got = turn_sums(x, mask, turn_end).tolist()
        assert got == pytest.approx(_naive_turns(x, mask, turn_end), abs=1e-5)
        starts = turn_starts(mask)
        for r in range(4):
            for i in range(24):
                assert bool(starts[r, i]) == bool(mask[r, i] and (i == 0 or not mask[r, i - 1]))


def test_vtrace_truncation_by_hand():
    # one row, two turns: tokens 1-2 (ratios 2 and 0.5, end at 2) and 4 (ratio 3, end)
    mask = torch.tensor([[False, True, True, False, True]])
    turn_end = torch.tensor([[False, False, True, False, True]])
    log_rho = torch.log(torch.tensor([[1.0, 2.0, 0.5, 1.0, 3.0]]))
    m = StepMetrics()
    vtrace_metrics(m, torch.where(mask, log_rho, 0.0), mask, turn_end, rho_clip=1.0)
    out = m.reduce("cpu")
    assert out["vtrace/rho_mean"] == pytest.approx((1 + 0.5 + 1) / 3)
    assert out["vtrace/clipped"] == pytest.approx(2 / 3)
    # turn ratios: 2 * 0.5 = 1 (not clipped), 3 (clipped to 1)
    assert out["vtrace/turn_rho_mean"] == pytest.approx(1.0)
    assert out["vtrace/turn_clipped"] == pytest.approx(0.5)


def test_a_masked_mean_with_no_token_adds_its_key_with_no_weight():
    m = StepMetrics()
    add_masked_mean(m, "a", torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    assert math.isnan(m.reduce("cpu")["a"])
    add_masked_mean(m, "a", torch.full((2, 3), 4.0), torch.ones(2, 3, dtype=torch.bool))
    assert m.reduce("cpu")["a"] == 4.0
