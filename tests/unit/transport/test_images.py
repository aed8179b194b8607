"""transport.images: PNG round trip and the pad-run bookkeeping of VLM token ids."""

import numpy as np
import pytest

from transport.images import collapse_pads, decode_image, encode_image, expand_pads
from transport.schema import EncodedImage

PAD = 9


def test_png_round_trip_is_exact():
    rng = np.random.default_rng(0)
    for shape in [(1, 1, 3), (7, 13, 3), (96, 96, 3)]:
        rgb = rng.integers(0, 256, shape, dtype=np.uint8)
        image = encode_image(rgb)
        assert (image.height, image.width) == shape[:2]
        decoded = decode_image(image)
        np.testing.assert_array_equal(decoded, rgb)
        assert decoded.flags.writeable  # torch.from_numpy warns on read-only arrays


def test_bad_images_raise_value_error():
    with pytest.raises(ValueError, match="uint8"):
        encode_image(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="not a readable PNG"):
        decode_image(EncodedImage(b"\x89PNG garbage", 4, 4))
    good = encode_image(np.zeros((4, 5, 3), np.uint8))
    with pytest.raises(ValueError, match="the message says"):
        decode_image(EncodedImage(good.png, 5, 4))


def test_expand_by_hand():
    assert expand_pads([1, PAD, 2, PAD], PAD, [3, 1]) == [1, PAD, PAD, PAD, 2, PAD]
    assert collapse_pads([1, PAD, PAD, PAD, 2, PAD], PAD) == ([1, PAD, 2, PAD], [3, 1])
    with pytest.raises(ValueError, match="1 image pads for 2 images"):
        expand_pads([1, PAD], PAD, [2, 2])
    with pytest.raises(ValueError, match="more image pads"):
        expand_pads([PAD, 1, PAD], PAD, [2])


def test_collapse_inverts_expand_on_random_sequences():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(0, 30))
        ids = [int(t) for t in rng.integers(0, 8, n)]  # no pad among them
        for _ in range(int(rng.integers(0, 4))):  # pads, never two adjacent (vision tokens around)
            ids.insert(int(rng.integers(0, len(ids) + 1)), PAD)
        ids = [t for i, t in enumerate(ids) if not (t == PAD and i and ids[i - 1] == PAD)]
        counts = [int(c) for c in rng.integers(1, 50, ids.count(PAD))]
        expanded = expand_pads(ids, PAD, counts)
        assert len(expanded) == len(ids) + sum(counts) - len(counts)
        assert collapse_pads(expanded, PAD) == (ids, counts)
