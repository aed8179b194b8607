"""tests/benchmarks/bench_converge.py: the time to success it reports, on a hand-made run log."""

import pytest

from tests.benchmarks.bench_converge import time_to, training_time

# Steps of 5 and 6 s; the eval at step 2 takes 15 s, the one at step 4 takes 10 s.
RECORDS = [
    {"kind": "eval", "step": 0, "time_s": 100.0, "success": 0.2},
    {"kind": "train", "step": 1, "time_s": 105.0},
    {"kind": "train", "step": 2, "time_s": 110.0},
    {"kind": "eval", "step": 2, "time_s": 125.0, "success": 0.5},
    {"kind": "train", "step": 3, "time_s": 131.0},
    {"kind": "train", "step": 4, "time_s": 137.0},
    {"kind": "eval", "step": 4, "time_s": 147.0, "success": 0.65},
]


def test_training_time_leaves_out_the_evals():
    assert training_time(RECORDS) == [(0, 0.2, 0.0), (2, 0.5, 10.0), (4, 0.65, 22.0)]


@pytest.mark.parametrize(("target", "expected"), [(0.5, (2, 10.0)), (0.6, (4, 22.0)),
                                                  (0.1, (0, 0.0)), (0.7, None)])
def test_time_to_is_the_first_eval_at_or_above_the_target(target, expected):
    assert time_to(training_time(RECORDS), target) == expected
