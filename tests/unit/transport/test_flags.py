"""transport/flags.py: the compiled flags kernels (transport/_flags.c) equal their numpy
reference on hand-computed cases and on random, unaligned and invalid inputs."""

import numpy as np
import pytest

from transport import flags

_flags = pytest.importorskip("transport._flags", reason="the install builds transport/_flags.c")


def test_the_install_builds_the_compiled_kernels():
    assert flags.COMPILED and flags._flags is _flags


def _unpack_both(flag_bytes, logprobs, rewards):
    masks = np.empty(2 * len(flag_bytes), np.bool_)
    turns = _flags.unpack(flag_bytes, logprobs, rewards, masks)
    n = len(flag_bytes)
    return (masks[:n], masks[n:], turns), flags.unpack_numpy(flag_bytes, logprobs, rewards)


def test_a_hand_computed_trajectory():
    loss = np.array([0, 1, 1, 0, 1, 1], bool)
    turn = np.array([0, 0, 1, 0, 0, 1], bool)
    assert _flags.pack(loss, turn) == flags.pack_numpy(loss, turn) == b"\x00\x01\x02\x00\x01\x02"
    logprobs = np.array([0, -1, -2, 0, -0.5, -3], "<f4").tobytes()
    for loss_mask, turn_end, turns in _unpack_both(b"\x00\x01\x02\x00\x01\x02", logprobs,
                                                   np.array([1.5, -2], "<f4").tobytes()):
        assert loss_mask.tolist() == loss.tolist() and turn_end.tolist() == turn.tolist()
        assert turns == 2


def test_pack_refuses_a_turn_end_outside_the_loss_mask_and_unequal_lengths():
    for loss, turn in [([1, 0], [0, 1]), ([1, 1, 1], [0, 1]), ([0], [1])]:
        loss, turn = np.array(loss, bool), np.array(turn, bool)
        assert _flags.pack(loss, turn) is None and flags.pack_numpy(loss, turn) is None
        assert flags.pack(loss, turn) is None


def test_unpack_reports_a_bad_flag_before_a_non_finite_value():
    ok, nan = np.zeros(3, "<f4").tobytes(), np.array([0, np.nan, 0], "<f4").tobytes()
    none = b""
    cases = [(b"\x00\x03\x01", ok, none, flags.BAD_FLAG), (b"\xff\x00\x00", nan, none, flags.BAD_FLAG),
             (b"\x00\x01\x02", nan, none, flags.NON_FINITE),
             (b"\x00\x01\x02", ok, np.array([np.inf], "<f4").tobytes(), flags.NON_FINITE),
             (b"\x00\x01\x02", ok, np.array([1.0], "<f4").tobytes(), 1)]
    for flag_bytes, logprobs, rewards, expected in cases:
        compiled, reference = _unpack_both(flag_bytes, logprobs, rewards)
        assert compiled[2] == reference[2] == expected


def test_unpack_refuses_buffers_of_the_wrong_size_instead_of_reading_past_them():
    masks = np.empty(6, np.bool_)
    for logprobs, rewards, out in [(b"\x00" * 8, b"", masks), (b"\x00" * 12, b"\x00" * 3, masks),
                                   (b"\x00" * 12, b"", np.empty(5, np.bool_))]:
        with pytest.raises(ValueError, match="unpack: 3 flags"):
            _flags.unpack(b"\x00\x01\x02", logprobs, rewards, out)
    with pytest.raises(TypeError):
        _flags.unpack(b"\x00\x01\x02", b"\x00" * 12, b"", b"\x00" * 6)  # read-only output


def test_random_unaligned_and_invalid_inputs_give_the_numpy_results():
    rng = np.random.default_rng(0)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.4e38, -3.4e38], np.float32)
    # lengths around the compiler's vector widths and the 240-flag chunks of the turn count
    for length in [0, 1, 15, 16, 17, 239, 240, 241, 479, 480, 1000, 4099]:
        for trial in range(12):
            p_bad = [0.0, 0.001, 0.3][trial % 3]
            values = rng.choice(4, length, p=[0.3 - p_bad / 2, 0.4 - p_bad / 2, 0.3, p_bad])
            values[values == 3] = rng.integers(3, 256, int((values == 3).sum()))
            flag_bytes = values.astype(np.uint8).tobytes()
            logprobs = -rng.random(length).astype(np.float32)
            rewards = rng.standard_normal(rng.integers(0, 9)).astype(np.float32)
            if trial % 4 == 1 and length:
                logprobs[rng.integers(length)] = rng.choice(specials)
            if trial % 4 == 2 and rewards.size:
                rewards[rng.integers(rewards.size)] = rng.choice(specials)
            # a msgpack payload places the floats at any offset
            offset = trial % 4
            lp = memoryview(b"\x00" * offset + logprobs.tobytes())[offset:]
            compiled, reference = _unpack_both(flag_bytes, lp, rewards.tobytes())
            assert compiled[2] == reference[2], (length, trial)
            if compiled[2] >= 0:
                assert np.array_equal(compiled[0], reference[0])
                assert np.array_equal(compiled[1], reference[1])
            loss = rng.random(length) < 0.5
            turn = loss & (rng.random(length) < 0.2)
            if trial % 5 == 4 and length:
                turn[rng.integers(length)] = True  # maybe outside the loss mask
            assert _flags.pack(loss, turn) == flags.pack_numpy(loss, turn)


def test_a_turn_count_past_a_byte_is_exact():
    all_ends = b"\x02" * 100_003
    compiled, reference = _unpack_both(all_ends, b"\x00" * 4 * 100_003, b"")
    assert compiled[2] == reference[2] == 100_003


def test_pack_takes_any_layout_and_bool_bytes_other_than_one():
    loss = np.ones(20, bool)[::2]  # not contiguous: the numpy path
    turn = np.zeros(20, bool)[::2]
    turn[-1] = True
    assert flags.pack(loss, turn) == b"\x01" * 9 + b"\x02"
    odd = np.frombuffer(b"\x05\x00\x05", np.bool_)  # a bool array viewed from other bytes
    assert _flags.pack(odd, np.array([1, 0, 0], bool)) == flags.pack_numpy(
        odd, np.array([1, 0, 0], bool)) == b"\x02\x00\x01"
