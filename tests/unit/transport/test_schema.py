"""transport/schema.py: a valid trajectory round-trips; every malformed field is a SchemaError."""

import random

import msgpack
import numpy as np
import pytest

from transport import wire
from transport.codec import CodecError
from transport.schema import SCHEMA_VERSION, EncodedImage, SchemaError, Trajectory


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def flags_path(request, monkeypatch):
    """Every test runs with the compiled flags kernels and with their numpy fallback."""
    if request.param == "numpy":
        monkeypatch.setattr(wire, "_wire", None)


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
    back = Trajectory.from_bytes(t.to_bytes())
    for name in ("token_ids", "loss_mask", "turn_end", "behaviour_logprobs", "policy_version", "turn_rewards"):
        assert np.array_equal(getattr(back, name), getattr(t, name))
        assert getattr(back, name).dtype == getattr(t, name).dtype
    assert back.images == t.images and back.metrics == t.metrics and back.seed == 3
    assert type(back.metrics["turns"]) is int and back.final_reward == 1.0
    assert t.min_policy_version == back.min_policy_version == 4


def test_round_trips_equal_the_original_on_random_trajectories():
    """Property: any valid trajectory (random lengths, turns, flags, values) comes back equal."""
    rng = np.random.default_rng(0)
    reused = bytearray(b"stale bytes of a longer earlier message" * 100)
    for _ in range(200):
        length = int(rng.integers(0, 300))
        mask = rng.random(length) < 0.5
        ends = mask & (rng.random(length) < 0.2)
        t = _trajectory(
            token_ids=rng.integers(-2**31, 2**31, length, dtype=np.int32), loss_mask=mask,
            turn_end=ends, behaviour_logprobs=rng.normal(size=length).astype(np.float32),
            policy_version=rng.integers(-1, 9, length, dtype=np.int32),
            turn_rewards=rng.normal(size=int(ends.sum())).astype(np.float32),
            images=[], metrics={"m": float(rng.normal())}, group_size=int(rng.integers(0, 9)))
        back = Trajectory.from_bytes(t.to_bytes())
        t.encode_into(reused)  # a sender's buffer: grows and shrinks with the messages
        assert reused == t.to_bytes()
        for name in ("token_ids", "loss_mask", "turn_end", "behaviour_logprobs", "policy_version",
                     "turn_rewards"):
            assert np.array_equal(getattr(back, name), getattr(t, name)), name
        assert back.to_wire() == t.to_wire()


def test_a_trajectory_that_cannot_be_encoded_is_a_codec_error_either_way():
    t = _trajectory()
    t.metrics["when"] = object()  # changed after the checks at construction
    with pytest.raises(CodecError, match="cannot encode"):
        t.to_bytes()
    buffer = bytearray(b"kept")
    with pytest.raises(CodecError, match="cannot encode"):
        t.encode_into(buffer)


def _packed(msg) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


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
    cases = {
        "Expected `object`": [None, [], "x"],
        "missing required field `token_ids`": [
            {k: v for k, v in good.items() if k != "token_ids"}],
        "schema_version None, expected 4": [{}],
        "schema_version 5, expected 4": [dict(good, schema_version=SCHEMA_VERSION + 1)],
        "schema_version 3, expected 4": [{"schema_version": 3, "token_ids": [1, 2]}],
        "unknown field": [dict(good, extra=1)],
        "images": [dict(good, images=[{"png": "not bytes", "height": 1, "width": 1}]),
                   dict(good, images="nope")],
        "token_ids has length 9, flags has 10": [dict(good, token_ids=good["token_ids"][:36])],
        "policy_version has length 10.5": [dict(good, policy_version=good["policy_version"] + b"xy")],
        "turn_rewards for 2 turn ends": [dict(good, turn_rewards=good["turn_rewards"][:4])],
        "turn_rewards has 7 bytes, not float32s": [dict(good, turn_rewards=good["turn_rewards"][:7])],
        "flags must be 0, 1 or 2": [dict(good, flags=b"\x07" * 10),
                                    dict(good, flags=b"\x00" * 9 + b"\x03")],
        "finite": [dict(good, behaviour_logprobs=np.full(10, np.inf, "<f4").tobytes()),
                   dict(good, turn_rewards=np.array([1, np.nan], "<f4").tobytes())],
        "group_size": [dict(good, group_size=-1), dict(good, group_size=1 << 13)],
        "`int`, got `bool`": [dict(good, seed=True)],
        "metrics": [dict(good, metrics={"x": "high"})],
    }
    for message, msgs in cases.items():
        for msg in msgs:
            with pytest.raises(SchemaError, match=message):
                Trajectory.from_bytes(_packed(msg))
    for junk in (b"", b"\xc1", _packed(good)[:-3]):
        with pytest.raises(CodecError, match="malformed"):
            Trajectory.from_bytes(junk)


def test_random_field_corruption_only_ever_raises_schema_error():
    rng = random.Random(0)
    junk = [None, 1, -1, 1.5, "s", b"b", [], {}, True, b"\x00" * 10, b"\x03" * 10, b"\x02" * 40,
            np.zeros(2**21, dtype=np.int32).tobytes(), 2**64 - 1]
    good = _trajectory().to_wire()
    for _ in range(500):
        msg = dict(good)
        for key in rng.sample(sorted(msg), rng.randint(1, 3)):
            msg[key] = rng.choice(junk)
        try:
            Trajectory.from_bytes(_packed(msg))
        except SchemaError:
            pass


def test_random_bytes_only_ever_raise_schema_or_codec_errors():
    rng = random.Random(1)
    payload = _trajectory().to_bytes()
    for _ in range(2000):
        data = bytearray(payload)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            Trajectory.from_bytes(bytes(data[:rng.randint(0, len(data))]))
        except (SchemaError, CodecError):
            pass
