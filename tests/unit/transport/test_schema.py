"""transport/schema.py: a valid trajectory round-trips; every malformed field is a SchemaError."""

import random

import numpy as np
import pytest

from transport.schema import SCHEMA_VERSION, EncodedImage, SchemaError, Trajectory


def _trajectory(**overrides):
    # [prompt x3, turn 0 x2 (end), obs x2, turn 1 x3 (end)]
    mask = np.array([0, 0, 0, 1, 1, 0, 0, 1, 1, 1], dtype=bool)
    ends = np.array([0, 0, 0, 0, 1, 0, 0, 0, 0, 1], dtype=bool)
    fields = dict(
        run_id="run", actor_id=1, episode_id=7, env_name="frozenlake", seed=3, group_id=2,
        token_ids=np.arange(10, dtype=np.int32),
        loss_mask=mask,
        turn_end=ends,
        behaviour_logprobs=np.where(mask, -0.5, 0.0).astype(np.float32),
        policy_version=np.where(mask, [0, 0, 0, 4, 4, 0, 0, 5, 5, 5], -1).astype(np.int32),
        turn_rewards=np.array([0.5, 10.5], dtype=np.float32),
        final_reward=1.0,
        images=[EncodedImage(png=b"\x89PNG...", height=4, width=6)],
        metrics={"success": 1.0, "turns": 2},
        created_at=123.5,
    )
    fields.update(overrides)
    return Trajectory(**fields)


def test_round_trip_and_staleness_anchor():
    t = _trajectory()
    back = Trajectory.from_wire(t.to_wire())
    for name in ("token_ids", "loss_mask", "turn_end", "behaviour_logprobs", "policy_version", "turn_rewards"):
        assert np.array_equal(getattr(back, name), getattr(t, name))
    assert back.images == t.images and back.metrics == t.metrics and back.seed == 3
    assert t.min_policy_version == 4


@pytest.mark.parametrize("overrides, message", [
    ({"token_ids": np.arange(9, dtype=np.int32)}, "length"),
    ({"token_ids": np.arange(10, dtype=np.int64)}, "int32"),
    ({"loss_mask": np.ones(10, dtype=np.uint8)}, "bool"),
    ({"behaviour_logprobs": [0.0] * 10}, "array"),
    ({"policy_version": np.zeros((2, 5), dtype=np.int32)}, "1-D"),
    ({"turn_rewards": np.array([1.0], dtype=np.float32)}, "turn ends"),
    ({"turn_rewards": np.array([1.0, np.nan], dtype=np.float32)}, "finite"),
    ({"turn_end": np.ones(10, dtype=bool)}, "outside loss_mask"),
    ({"actor_id": "1"}, "actor_id"),
    ({"seed": True}, "seed"),
    ({"metrics": {"x": "high"}}, "metrics"),
    ({"group_size": -1}, "group_size"),
    ({"group_size": 1 << 13}, "group_size"),
    ({"group_size": 2.0}, "group_size"),
])
def test_malformed_fields_are_rejected(overrides, message):
    with pytest.raises(SchemaError, match=message):
        _trajectory(**overrides)


def test_malformed_wire_messages_are_rejected():
    good = _trajectory().to_wire()
    cases = [
        None, [], "x", {},
        dict(good, schema_version=SCHEMA_VERSION + 1),
        dict(good, extra=1),
        {k: v for k, v in good.items() if k != "token_ids"},
        dict(good, images=[{"png": "not bytes", "height": 1, "width": 1}]),
        dict(good, images="nope"),
    ]
    for msg in cases:
        with pytest.raises(SchemaError):
            Trajectory.from_wire(msg)


def test_random_field_corruption_only_ever_raises_schema_error():
    rng = random.Random(0)
    junk = [None, 1, -1, 1.5, "s", b"b", [], {}, True, np.zeros(3), np.zeros(10, dtype=np.float16),
            np.zeros(2**21, dtype=np.int32)]
    good = _trajectory().to_wire()
    for _ in range(500):
        msg = dict(good)
        for key in rng.sample(sorted(msg), rng.randint(1, 3)):
            msg[key] = rng.choice(junk)
        try:
            Trajectory.from_wire(msg)
        except SchemaError:
            pass
