"""tests/benchmarks/bench_stream.paired_ratios: the faster raw arm and each round's ratios to it."""

import pytest

from tests.benchmarks.bench_stream import paired_ratios


def test_ratios_are_taken_round_by_round_against_the_faster_raw_arm():
    rates = {
        "raw, copying": [100.0, 200.0, 100.0, 200.0, 100.0],  # median 100
        "raw, zero-copy": [100.0, 200.0, 400.0, 200.0, 100.0],  # median 200: the baseline
        "ours": [90.0, 100.0, 200.0, 150.0, 50.0],  # 0.9 0.5 0.5 0.75 0.5 (to copying's: 0.75)
        "our receiver": [100.0, 200.0, 400.0, 200.0, 100.0],  # 1.0 each round
    }
    fastest, summary = paired_ratios(rates)
    assert fastest == "raw, zero-copy"
    # sorted 0.5 0.5 0.5 0.75 0.9: median 0.5 (the ratio of the medians: 0.45), quartiles
    # (inclusive) 0.5 and 0.75
    assert summary["ours"] == pytest.approx((0.5, 0.5, 0.75))
    assert summary["our receiver"] == pytest.approx((1.0, 1.0, 1.0))


def test_rounds_missing_from_an_arm_are_an_error():
    rates = {"raw, copying": [1.0, 2.0], "raw, zero-copy": [1.0, 2.0], "ours": [1.0],
             "our receiver": [1.0, 2.0]}
    with pytest.raises(ValueError):
        paired_ratios(rates)
