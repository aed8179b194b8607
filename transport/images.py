"""Images of vision-language episodes: PNG on the wire, and the image-pad runs in token ids.

A Qwen2-VL style model sees an image as one run of ``n`` image-pad tokens in its input ids, ``n``
fixed by the image's size (its patch grid). A trajectory records the ids with every run at full
length (exactly what the model saw) and the images in order, PNG-encoded; an inference engine
that expands placeholders itself (vLLM) is asked with each run collapsed to one pad token.
Producers: the actor (encode, expand, collapse); consumer: the learner (decode).

Invariants: ``decode_image(encode_image(a))`` equals ``a`` exactly (PNG is lossless);
``expand_pads(collapse_pads(ids, pad)[0], pad, counts) == ids`` for the counts returned.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from transport.schema import EncodedImage


def encode_image(rgb: np.ndarray) -> EncodedImage:
    """An RGB uint8 array (H, W, 3) as PNG."""
    from PIL import Image

    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"an image must be uint8 (H, W, 3), got {rgb.dtype} {rgb.shape}")
    buf = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(buf, format="PNG")
    return EncodedImage(buf.getvalue(), int(rgb.shape[0]), int(rgb.shape[1]))


def decode_image(image: EncodedImage) -> np.ndarray:
    """The RGB uint8 array of a PNG image; ValueError when it is not a PNG of the stated size."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(image.png)) as im:
            rgb = np.array(im.convert("RGB"))  # writable: torch and transformers warn on read-only
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"not a readable PNG image: {e}") from None
    if rgb.shape[:2] != (image.height, image.width):
        raise ValueError(f"image is {rgb.shape[:2]}, the message says {(image.height, image.width)}")
    return rgb


def expand_pads(ids: Sequence[int], pad_id: int, counts: Sequence[int]) -> list[int]:
    """``ids`` with its k-th ``pad_id`` repeated ``counts[k]`` times."""
    out, k = [], 0
    for t in ids:
        if t == pad_id:
            if k == len(counts):
                raise ValueError(f"more image pads than the {len(counts)} image sizes given")
            out += [pad_id] * counts[k]
            k += 1
        else:
            out.append(t)
    if k != len(counts):
        raise ValueError(f"{k} image pads for {len(counts)} images")
    return out


def collapse_pads(ids: Sequence[int], pad_id: int) -> tuple[list[int], list[int]]:
    """(``ids`` with every run of ``pad_id`` cut to one token, the length of each run)."""
    out, counts = [], []
    for t in ids:
        if t == pad_id and out and out[-1] == pad_id:
            counts[-1] += 1
            continue
        out.append(t)
        if t == pad_id:
            counts.append(1)
    return out, counts
