"""transport/wire.py: the compiled kernels (transport/_wire.c) equal their references (numpy,
msgspec) on hand-computed cases and on random, unaligned, unusual and invalid inputs."""

import numpy as np
import pytest

from transport import wire

_wire = pytest.importorskip("transport._wire", reason="the install builds transport/_wire.c")


def test_the_install_builds_the_compiled_kernels():
    assert wire.COMPILED and wire._wire is _wire


def _columns_both(flag_bytes, logprobs, rewards, ids=None):
    """``columns`` compiled and in numpy on a message of these flags, log-probs and rewards (its
    token ids and versions zeros unless given)."""
    zeros = b"\x00" * (4 * len(flag_bytes))
    fields = (flag_bytes, zeros if ids is None else ids, logprobs, zeros, rewards)
    return _wire.columns(*fields), wire.columns_numpy(*fields)


def test_a_hand_computed_trajectory():
    loss = np.array([0, 1, 1, 0, 1, 1], bool)
    turn = np.array([0, 0, 1, 0, 0, 1], bool)
    assert _wire.pack(loss, turn) == wire.pack_numpy(loss, turn) == b"\x00\x01\x02\x00\x01\x02"
    logprobs = np.array([0, -1, -2, 0, -0.5, -3], "<f4")
    ids = np.arange(6, dtype="<i4").tobytes()
    for arrays in _columns_both(b"\x00\x01\x02\x00\x01\x02", logprobs.tobytes(),
                                np.array([1.5, -2], "<f4").tobytes(), ids):
        token_ids, loss_mask, turn_end, lp, versions, rewards = arrays
        assert loss_mask.tolist() == loss.tolist() and turn_end.tolist() == turn.tolist()
        assert token_ids.tolist() == list(range(6)) and lp.tolist() == logprobs.tolist()
        assert versions.tolist() == [0] * 6 and rewards.tolist() == [1.5, -2]


def test_pack_refuses_a_turn_end_outside_the_loss_mask_and_unequal_lengths():
    for loss, turn in [([1, 0], [0, 1]), ([1, 1, 1], [0, 1]), ([0], [1])]:
        loss, turn = np.array(loss, bool), np.array(turn, bool)
        assert _wire.pack(loss, turn) is None and wire.pack_numpy(loss, turn) is None
        assert wire.pack(loss, turn) is None


def test_columns_report_a_bad_flag_then_a_non_finite_value_then_a_reward_count():
    ok, nan = np.zeros(3, "<f4").tobytes(), np.array([0, np.nan, 0], "<f4").tobytes()
    none, one = b"", np.array([1.0], "<f4").tobytes()
    cases = [(b"\x00\x03\x01", ok, none, wire.BAD_FLAG),
             (b"\xff\x00\x00", nan, none, wire.BAD_FLAG),
             (b"\x00\x01\x02", nan, one, wire.NON_FINITE),
             (b"\x00\x01\x02", ok, np.array([np.inf], "<f4").tobytes(), wire.NON_FINITE),
             (b"\x00\x01\x02", ok, none, 1), (b"\x00\x01\x01", ok, one, 0)]
    for flag_bytes, logprobs, rewards, expected in cases:
        compiled, reference = _columns_both(flag_bytes, logprobs, rewards)
        assert compiled == reference == expected
    compiled, reference = _columns_both(b"\x00\x01\x02", ok, one)
    assert isinstance(compiled, tuple) and isinstance(reference, tuple)


def test_columns_refuse_fields_of_the_wrong_size_instead_of_reading_past_them():
    twelve = b"\x00" * 12
    for ids, logprobs, rewards in [(twelve, b"\x00" * 8, b""), (twelve, twelve, b"\x00" * 3),
                                   (b"\x00" * 11, twelve, b"")]:
        with pytest.raises(ValueError, match="columns: 3 flags"):
            _wire.columns(b"\x00\x01\x02", ids, logprobs, b"\x00" * 12, rewards)


def test_random_unaligned_and_invalid_inputs_give_the_numpy_results():
    rng = np.random.default_rng(0)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.4e38, -3.4e38], np.float32)
    # lengths around the 8-flag words, the vector widths and the 2040-flag chunks of the count
    for length in [0, 1, 7, 8, 9, 15, 16, 17, 1000, 2039, 2040, 2041, 2048, 4080, 4099]:
        for trial in range(12):
            p_bad = [0.0, 0.001, 0.3][trial % 3]
            values = rng.choice(4, length, p=[0.3 - p_bad / 2, 0.4 - p_bad / 2, 0.3, p_bad])
            values[values == 3] = rng.integers(3, 256, int((values == 3).sum()))
            flag_bytes = values.astype(np.uint8).tobytes()
            logprobs = -rng.random(length).astype(np.float32)
            turns = int((values == 2).sum())
            rewards = rng.standard_normal(turns + (trial % 6 == 5)).astype(np.float32)
            if trial % 4 == 1 and length:
                logprobs[rng.integers(length)] = rng.choice(specials)
            if trial % 4 == 2 and rewards.size:
                rewards[rng.integers(rewards.size)] = rng.choice(specials)
            # a msgpack payload places the floats at any offset
            offset = trial % 4
            lp = memoryview(b"\x00" * offset + logprobs.tobytes())[offset:]
            compiled, reference = _columns_both(flag_bytes, lp, rewards.tobytes())
            if isinstance(reference, int):
                assert compiled == reference, (length, trial)
            else:
                for got, want in zip(compiled, reference):
                    assert np.array_equal(got, want, equal_nan=True), (length, trial)
            loss = rng.random(length) < 0.5
            turn = loss & (rng.random(length) < 0.2)
            if trial % 5 == 4 and length:
                turn[rng.integers(length)] = True  # maybe outside the loss mask
            assert _wire.pack(loss, turn) == wire.pack_numpy(loss, turn)


def test_a_turn_count_past_a_byte_is_exact():
    n = 100_003
    compiled, reference = _columns_both(b"\x02" * n, b"\x00" * 4 * n, b"\x00" * 4 * n)
    assert int(compiled[2].sum()) == int(reference[2].sum()) == n
    compiled, reference = _columns_both(b"\x02" * n, b"\x00" * 4 * n, b"\x00" * 4 * (n - 1))
    assert compiled == reference == n


def test_pack_takes_any_layout_and_bool_bytes_other_than_one():
    loss = np.ones(20, bool)[::2]  # not contiguous: the numpy path
    turn = np.zeros(20, bool)[::2]
    turn[-1] = True
    assert wire.pack(loss, turn) == b"\x01" * 9 + b"\x02"
    odd = np.frombuffer(b"\x05\x00\x05", np.bool_)  # a bool array viewed from other bytes
    assert _wire.pack(odd, np.array([1, 0, 0], bool)) == wire.pack_numpy(
        odd, np.array([1, 0, 0], bool)) == b"\x02\x00\x01"


def _unusual_trajectory(rng, i):
    """A valid trajectory with values at the edges of msgpack's encodings: ints at every size
    boundary, strs and maps and arrays of every header size, bools, images."""
    from tests.unit.transport.trajectories import make_trajectory
    from transport.schema import EncodedImage

    edges = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, -1, -32, -33,
             -128, -129, -32768, -32769, -2**31, -2**31 - 1, -2**63]
    t = make_trajectory(int(rng.integers(3)), 0, length=int(rng.choice([2, 3, 8, 9, 300, 2048])),
                        turns=1, seed=i)
    t.actor_id, t.episode_id, t.seed = (int(rng.choice(edges)) for _ in range(3))
    t.run_id = str(rng.choice(["", "r" * 31, "r" * 32, "r" * 255, "r" * 256, "é" * 40000]))
    t.metrics = {f"m{k}": [True, False, 7, -300, 2.5, float("inf")][int(rng.integers(6))]
                 for k in range(int(rng.choice([0, 1, 15, 16, 40])))}
    t.images = [EncodedImage(png=bytes(int(rng.integers(300))), height=3, width=2)
                for _ in range(int(rng.choice([0, 1, 15, 16])))]
    t.final_reward, t.created_at = float(rng.standard_normal()), 1.7e9
    return t


def test_encode_into_writes_msgspecs_bytes_on_random_and_unusual_trajectories():
    from transport.schema import _ENCODER

    rng = np.random.default_rng(1)
    buffer = bytearray(b"old content, longer than some messages" * 1000)
    for i in range(200):
        t = _unusual_trajectory(rng, i)
        assert _wire.encode_into(t, buffer) is True
        assert bytes(buffer) == _ENCODER.encode(t._wire_fields()), i


def test_encode_into_leaves_what_is_off_its_path_to_msgspec():
    from tests.unit.transport.trajectories import make_trajectory

    buffer = bytearray()
    changes = [
        ("token_ids", lambda t: t.token_ids.astype(np.int64)),  # not the wire's dtype
        ("behaviour_logprobs", lambda t: np.repeat(t.behaviour_logprobs, 2)[::2]),  # strided
        ("metrics", lambda t: {"success": np.float32(1.0)}),  # a numpy scalar
        ("metrics", lambda t: {1: 2.0}),  # not a str key
        ("seed", lambda t: 2**64),  # beyond 64 bits
        ("final_reward", lambda t: 1),  # an int where a float belongs
        ("images", lambda t: [{"png": b"", "height": 1, "width": 1}]),  # not an EncodedImage
        ("turn_end", lambda t: ~t.loss_mask),  # a turn end outside loss_mask
        ("loss_mask", lambda t: t.loss_mask[:-1]),  # lengths disagree
    ]
    for name, change in changes:
        t = make_trajectory(0, 0, length=64)
        setattr(t, name, change(t))
        assert _wire.encode_into(t, buffer) is False, name


def test_columns_equal_numpys_on_random_unaligned_and_invalid_messages():
    rng = np.random.default_rng(2)
    for length in [0, 1, 7, 8, 9, 2040, 2041, 4099]:
        for trial in range(12):
            values = rng.choice(3, length).astype(np.uint8)
            if trial % 4 == 3 and length:
                values[rng.integers(length)] = rng.integers(3, 256)
            turns = int((values == 2).sum())
            rewards = rng.standard_normal(turns + (trial % 6 == 5)).astype(np.float32)
            logprobs = -rng.random(length).astype(np.float32)
            if trial % 4 == 1 and length:
                logprobs[rng.integers(length)] = np.nan
            offset = trial % 4  # the fields lie at any offset of a message
            message = b"\x00" * offset + b"".join(
                [values.tobytes(), rng.integers(-5, 9, length, dtype=np.int32).tobytes(),
                 logprobs.tobytes(), rng.integers(-1, 9, length, dtype=np.int32).tobytes(),
                 rewards.tobytes()])
            view, bounds = memoryview(message), np.cumsum([offset, length] + [4 * length] * 3)
            fields = [view[a:b] for a, b in zip(bounds[:-1], bounds[1:])] + [view[bounds[-1]:]]
            compiled, reference = _wire.columns(*fields), wire.columns_numpy(*fields)
            if isinstance(reference, int):
                assert compiled == reference, (length, trial)
                continue
            dtypes = ["<i4", "?", "?", "<f4", "<i4", "<f4"]
            for got, want, dtype in zip(compiled, reference, dtypes):
                assert got.dtype == np.dtype(dtype) and got.shape == want.shape
                assert np.array_equal(got, want, equal_nan=True)
            assert not compiled[0].flags.writeable and compiled[1].flags.writeable


def test_columns_keep_the_message_alive_and_refuse_wrong_lengths():
    message = bytearray(np.arange(4, dtype=np.int32).tobytes())
    token_ids = _wire.columns(b"\x01\x02\x00\x00", message, b"\x00" * 16, b"\x00" * 16,
                              b"\x00" * 4)[0]
    with pytest.raises(BufferError):
        message.clear()  # the array's memoryview holds the bytearray's buffer
    del message
    assert token_ids.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="columns: 4 flags"):
        _wire.columns(b"\x01\x02\x00\x00", b"\x00" * 15, b"\x00" * 16, b"\x00" * 16, b"")
