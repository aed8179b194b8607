"""launch/run/baselines.py on a gymnasium env that draws and renders no text (MiniGrid): the
scripted floors, which play in ``render: text`` where an env has text, play it in its pictures."""

from __future__ import annotations

import importlib.util

import pytest

from envs import splits
from envs.registry import make, resolve_config
from launch.run import baselines


@pytest.mark.skipif(importlib.util.find_spec("minigrid") is None, reason="needs minigrid")
def test_the_random_and_constant_floors_play_a_minigrid_env_in_its_pictures():
    config = resolve_config("gym", {"id": "MiniGrid-Empty-5x5-v0", "render": "image", "image_size": 32,
                                    "success": "positive_reward", "format": "no_think", "task": ""})
    seeds = splits.seeds_of("validation", 6)
    results = baselines.run_scripted(lambda **c: make("gym", **c), config, seeds)
    (constant,) = [name for name in results if name.startswith("constant:")]
    assert set(results) == {"random", constant}
    assert constant.split(":")[1] in ("left", "right", "forward", "pickup", "drop", "toggle", "done")
    for outcomes in results.values():
        assert [o["seed"] for o in outcomes] == seeds
        assert all(o["failure"] is None and o["format_correct"] == 1.0 and o["turns"] >= 1 for o in outcomes)
    # no constant action reaches the goal (it needs a turn), and each episode plays all 5 turns
    assert all(o["success"] == 0.0 and o["turns"] == 5.0 for o in results[constant])
