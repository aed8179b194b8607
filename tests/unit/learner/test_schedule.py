"""learner/schedule.py: learning rates by hand."""

import math

import pytest

from learner.schedule import lr_at


def test_constant_and_cosine_by_hand():
    assert [lr_at(s, lr=0.1, steps=5) for s in range(1, 6)] == [0.1] * 5
    # Warm-up 2 of 6 steps: 0.05, 0.1; then cos over the 4 remaining: 1/2 (1 + cos(pi k / 4)).
    cosine = [lr_at(s, lr=0.1, steps=6, schedule="cosine", warmup=2) for s in range(1, 7)]
    expected = [0.05, 0.1] + [0.05 * (1 + math.cos(math.pi * k / 4)) for k in (1, 2, 3, 4)]
    assert cosine == pytest.approx(expected)
    assert cosine[-1] == pytest.approx(0.0, abs=1e-12) and cosine[3] == pytest.approx(0.05)


def test_cosine_to_a_floor_and_past_the_last_step():
    # 4 steps, floor 0.2: 0.2 + 0.8 * 1/2 (1 + cos(pi s / 4)); held at the floor after step 4.
    got = [lr_at(s, lr=1.0, steps=4, schedule="cosine", floor=0.2) for s in range(0, 7)]
    expected = [0.2 + 0.4 * (1 + math.cos(math.pi * min(s, 4) / 4)) for s in range(0, 7)]
    assert got == pytest.approx(expected)
    assert got[0] == pytest.approx(1.0) and got[2] == pytest.approx(0.6) and got[6] == pytest.approx(0.2)


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="schedule"):
        lr_at(1, lr=0.1, steps=5, schedule="linear")
    with pytest.raises(ValueError, match="floor"):
        lr_at(1, lr=0.1, steps=5, schedule="cosine", floor=1.5)
