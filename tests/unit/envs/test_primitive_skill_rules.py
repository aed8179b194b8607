"""PrimitiveSkill's rules that need no simulator: the action parser, the stage value, the position
judge (envs/primitive_skill/game.py)."""

import pytest

from envs.primitive_skill.game import describe, judge_score, parse_action, stage_value

WORKSPACE = {"x": (-100, 150), "y": (-200, 200), "z": (10, 200)}


@pytest.mark.parametrize("text, want", [
    ("pick(-42,57,20)", "pick(-42,57,20)"),
    ("  Pick ( -42 , 57, 20 ) ", "pick(-42,57,20)"),
    ("place(+80,-100,25)", "place(80,-100,25)"),
    ("push(0,0,20,100,0,20)", "push(0,0,20,100,0,20)"),
    ("pick(-120,57,5)", "pick(-100,57,10)"),        # within 50 mm outside: clipped onto the edge
    ("place(199,250,250)", "place(150,200,200)"),
])
def test_valid_actions_are_canonical_and_clipped(text, want):
    assert parse_action(text, WORKSPACE) == (want, "")


@pytest.mark.parametrize("text, why", [
    ("pick(1,2)", "pick takes 3 integers, got 2"),
    ("push(1,2,3)", "push takes 6 integers, got 3"),
    ("pick(1.5,2,3)", "pick takes integer millimetres"),
    ("grab(1,2,3)", "'grab' is not one of pick, place, push"),
    ("pick(-151,0,20)", "x=-151 is outside the workspace [-100, 150]"),
    ("place(0,0,251)", "z=251 is outside the workspace [10, 200]"),
    ("pick 1 2 3", "not of the form name(numbers)"),
    ("pick(1,2,3))", "not of the form name(numbers)"),
    ("", "not of the form name(numbers)"),
])
def test_malformed_actions_say_why(text, why):
    assert parse_action(text, WORKSPACE) == (None, why)


def test_stage_value_is_vagens():
    assert stage_value(False, [False, False, False]) == 0.0
    assert stage_value(False, [True, False, False]) == 2.0
    assert stage_value(False, [True, True, False]) == 4.0
    assert stage_value(False, [False, True, False]) == 4.0   # the highest completed stage counts
    assert stage_value(False, [True, True, True]) == 6.0
    assert stage_value(True, [False, False]) == 10.0


TRUTH = describe({"red_cube": (0, 0, 20), "green_cube": (100, 0, 20)})


def test_describe_writes_one_line_per_object():
    assert TRUTH == "red_cube: (0, 0, 20)\ngreen_cube: (100, 0, 20)"


@pytest.mark.parametrize("description, want", [
    ("red_cube: (0, 0, 20)\ngreen_cube: (100, 0, 20)", 1.0),
    ("{'red_cube': (0, 0, 20), 'green_cube': '(100, 0, 20)'}", 1.0),         # the dict form
    ("red_cube: (30, 40, 20), green_cube: (100, 0, 20)", (0.0 + 1.0) / 2),  # 50 mm off: 0
    ("red_cube: (3, 4, 20) green_cube: (100, 0, 45)", (0.9 + 0.5) / 2),     # 5 and 25 mm off
    ("red_cube: (0, 0, 20)", 0.5),                                         # green not stated
    ("red_cube: (0, 0, 20) red_cube: (500, 0, 0) blue_cube: (1, 1, 1)", 0.5),  # first counts
    ("the red cube is somewhere", 0.0),
])
def test_the_position_judge_scores_by_distance(description, want):
    assert judge_score(description, TRUTH) == pytest.approx(want)
