"""The Navigation env's rules without a simulator (envs/navigation/game.py): moves on the
lattice, directions, what is in view, and the rule judge, on hand-computed cases."""

import math
from dataclasses import dataclass

import numpy as np
import pytest

from envs.navigation.game import PITCH_LIMITS_DEG, Pose, in_view, judge_score, offsets, sector, step


@dataclass(frozen=True)
class Thing:
    name: str
    pos: tuple[float, float]
    radius: float = 0.3
    height: float = 0.6


def test_moves_follow_the_heading_and_turns_keep_the_place():
    start = Pose(0, 0, 0, origin=(2.0, 3.0))  # facing +x, right is +z
    assert (step(start, "moveahead").x, step(start, "moveahead").z) == (2.5, 3.0)
    assert (step(start, "moveright").x, step(start, "moveright").z) == (2.0, 3.5)
    assert (step(start, "moveleft").x, step(start, "moveback").x) == (2.0, 1.5)
    left = step(start, "rotateleft")  # facing -z (MiniWorld: left adds to the angle), right is +x
    assert (left.i, left.j, left.heading) == (0, 0, 1)
    assert (step(left, "moveahead").z, step(left, "moveright").x) == (2.5, 2.5)
    assert step(step(start, "rotateright"), "rotateleft") == start
    back = step(step(left, "rotateleft"), "rotateleft")
    assert back.heading == 3 and step(back, "moveahead").z == 3.5
    # the same place by two routes is the same pose, exactly
    assert step(step(start, "moveahead"), "moveright") == step(step(start, "moveright"), "moveahead")


def test_pitch_moves_by_30_degrees_within_its_limits():
    pose = Pose(0, 0, 0)
    down = [pose]
    for _ in range(4):
        down.append(step(down[-1], "lookdown"))
    assert [p.pitch for p in down] == [0, -30, -60, -60, -60] and PITCH_LIMITS_DEG[0] == -60
    up = step(step(pose, "lookup"), "lookup")
    assert up.pitch == 30 == PITCH_LIMITS_DEG[1]


@pytest.mark.parametrize("heading,point,expected", [
    (0, (3.0, 0.0), "ahead"), (0, (0.0, -3.0), "left"), (0, (0.0, 3.0), "right"),
    (0, (-3.0, 0.0), "back"), (0, (3.0, 2.9), "ahead"), (0, (3.0, 3.1), "right"),
    (1, (0.0, -3.0), "ahead"), (1, (3.0, 0.0), "right"), (2, (0.0, -1.0), "right"),
])
def test_sectors_are_quarters_around_the_facing(heading, point, expected):
    assert sector(Pose(0, 0, heading), point) == expected


def test_offsets_are_ahead_and_to_the_right():
    assert offsets(Pose(0, 0, 0), (2.0, -1.0)) == (2.0, -1.0)
    ahead, right = offsets(Pose(0, 0, 1), (2.0, -1.0))  # facing -z: right is +x
    assert (ahead, right) == (1.0, 2.0)


def test_in_view_is_the_cone_of_the_camera_and_its_pitch():
    pose = Pose(0, 0, 0)
    assert in_view(pose, Thing("a", (3.0, 0.0)), 90)
    assert not in_view(pose, Thing("a", (-3.0, 0.0)), 90)
    assert in_view(pose, Thing("a", (3.0, 2.9)), 90)  # 44 degrees right
    assert not in_view(pose, Thing("a", (3.0, 4.0)), 90)  # 53 degrees, past the radius's 3
    # 0.3 m tall, 1 m ahead: its top is 50 degrees below the eye, the view reaches 45 down
    near = Thing("a", (1.0, 0.0), height=0.3, radius=0.1)
    assert not in_view(pose, near, 90)
    assert in_view(step(pose, "lookdown"), near, 90)
    assert not in_view(step(pose, "lookup"), Thing("a", (2.0, 0.0), height=0.3), 90)


TRUTH = "target red ball: 3.58 m ahead\nbarrel: 2.21 m left"


def test_the_judge_scores_direction_and_distance_per_object():
    assert judge_score(TRUTH, TRUTH) == 1.0
    assert judge_score("The red ball is 3.58 m ahead and the barrel 2.21 m left.", TRUTH) == 1.0
    # the ball: right direction, 0.5 m off (0.5 + 0.25); the barrel: wrong direction, exact
    assert judge_score("red ball: 3.08 m ahead, barrel: 2.21 m right", TRUTH) == pytest.approx(
        (0.75 + 0.5) / 2)
    assert judge_score("red ball: 9 m back", TRUTH) == 0.0  # and the barrel is not named
    assert judge_score("nothing here", TRUTH) == judge_score(TRUTH, "no state") == 0.0
    assert judge_score("red ball ahead", TRUTH) == pytest.approx(0.25)


def test_the_judge_is_bounded_on_random_text():
    rng = np.random.default_rng(0)
    words = ["red", "ball", "barrel", "ahead", "left", "m", "3.5", "2", ":", "\n", "back"]
    for _ in range(200):
        text = " ".join(rng.choice(words, size=int(rng.integers(0, 30))))
        assert 0.0 <= judge_score(text, TRUTH) <= 1.0
    assert math.isclose(judge_score(TRUTH.upper(), TRUTH), 1.0)
