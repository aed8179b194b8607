"""Processor files for the tiny Qwen2-VL model, written as plain JSON.

Called by `launch.model.tiny_model.build_tiny_model(vision=True)` after the tokenizer is saved. The
files are the ones `Qwen2VLProcessor.save_pretrained` writes, produced without instantiating the
torchvision-backed image/video processors. Loading them (`AutoProcessor`, vLLM) needs an
importable torchvision: transformers 5 has no Qwen2-VL video processor without it, and vLLM's
Qwen2-VL imports transformers' torchvision image processor module.
Invariants: the processor's chat template is the `chat_template.jinja` shared with the tokenizer;
images are resized to between 56*56 and `max_pixels` pixels; output is deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path

PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
MIN_PIXELS = 56 * 56
# Qwen2-VL's CLIP normalisation constants.
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]


def _common(max_pixels: int) -> dict:
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
        "merge_size": MERGE_SIZE,
        "patch_size": PATCH_SIZE,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": max_pixels, "shortest_edge": MIN_PIXELS},
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    }


def _write(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_processor_files(out_dir: str | Path, *, max_pixels: int) -> None:
    """Writes preprocessor_config.json, video_preprocessor_config.json and processor_config.json."""
    if max_pixels < MIN_PIXELS:
        raise ValueError(f"max_pixels must be >= {MIN_PIXELS}, got {max_pixels}")
    out = Path(out_dir)
    image = _common(max_pixels) | {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
    }
    video = _common(max_pixels) | {
        "video_processor_type": "Qwen2VLVideoProcessor",
        "processor_class": "Qwen2VLProcessor",
    }
    _write(out / "preprocessor_config.json", image)
    _write(out / "video_preprocessor_config.json", video)
    _write(out / "processor_config.json", {"processor_class": "Qwen2VLProcessor"})
