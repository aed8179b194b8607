"""Images in a vision-language episode's context (Qwen2-VL style processors).

Called by actors/episode.py (``ChatContext`` puts an observation's images into the token ids)
and actors/actor.py (the vLLM request). An env writes ``<image>`` (envs.protocol) where each
image goes; the context replaces it by the model's vision placeholder (``<|vision_start|>
<|image_pad|><|vision_end|>``), tokenizes, and repeats the pad as many times as the model's
image processor makes tokens of that image, so the trajectory's ids are exactly the model's
input. vLLM expands placeholders itself: its request gets each run collapsed to one pad
(transport.images) and the images, and the actor checks that vLLM's expanded prompt equals
the context's ids.

Weight updates: vLLM cannot encode an image again for a request preempted in flight (it no
longer holds the image data, and its engine dies: "Expected number of multimodal embeddings to
match number of input items"), so for a VLM the actor's pause lets the answers in flight finish
(vLLM's "wait" mode: new requests wait, no running request is preempted), then resets the prefix
cache and the encoder cache, so no KV or image embedding of the old weights is used again.
Without images the actor pauses in "keep" mode and preempts (nothing waits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.protocol import IMAGE_PLACEHOLDER
from transport.images import collapse_pads


@dataclass(frozen=True)
class VisionTokens:
    """How one model writes images into its token ids."""

    placeholder: str
    """The text that stands for one image in a prompt (one pad token inside it)."""
    pad_id: int
    special_ids: frozenset[int]
    """The vision tokens (start, end, image and video pads): never the policy's to write."""
    image_processor: Any
    """A Qwen2-VL style image processor: ``get_number_of_image_patches`` and ``merge_size``."""

    @classmethod
    def from_pretrained(cls, path: str) -> "VisionTokens | None":
        """The model's vision tokens, or None when ``path`` has no image processor (a text model)."""
        from transformers import AutoConfig, AutoProcessor

        if not hasattr(AutoConfig.from_pretrained(path), "vision_config"):
            return None
        processor = AutoProcessor.from_pretrained(path)
        tok, pad = processor.tokenizer, processor.image_token
        start, end = (getattr(tok, name, None) for name in ("vision_start_token", "vision_end_token"))
        start = start or "<|vision_start|>"
        end = end or "<|vision_end|>"
        video = getattr(processor, "video_token", None) or "<|video_pad|>"
        special = frozenset(tok.convert_tokens_to_ids([start, end, pad, video])) - {tok.unk_token_id}
        return cls(start + pad + end, tok.convert_tokens_to_ids(pad), special,
                   processor.image_processor)

    def count(self, image: np.ndarray) -> int:
        """How many pad tokens ``image`` (RGB uint8, (H, W, 3)) becomes: its patches after the
        processor's resize, merged; from the size alone (no pixel is processed here)."""
        patches = self.image_processor.get_number_of_image_patches(image.shape[0], image.shape[1], {})
        return int(patches) // self.image_processor.merge_size ** 2

    def render(self, text: str, n_images: int) -> str:
        """``text`` with each ``<image>`` replaced by the placeholder; one per image."""
        if text.count(IMAGE_PLACEHOLDER) != n_images:
            raise ValueError(f"{text.count(IMAGE_PLACEHOLDER)} {IMAGE_PLACEHOLDER} placeholders "
                             f"for {n_images} images")
        return text.replace(IMAGE_PLACEHOLDER, self.placeholder)


def vllm_prompt(ids: Sequence[int], images: Sequence[np.ndarray],
                vision: VisionTokens | None) -> dict[str, Any]:
    """The vLLM request for a context: token ids, with the images when there are any."""
    if not images:
        return {"prompt_token_ids": list(ids)}
    if vision is None:
        raise ValueError("the observation has images but the model has no image processor")
    collapsed, counts = collapse_pads(ids, vision.pad_id)
    if len(counts) != len(images):
        raise ValueError(f"{len(counts)} image pad runs in the context for {len(images)} images")
    return {"prompt_token_ids": collapsed, "multi_modal_data": {"image": list(images)}}


def engine_image_args(max_images: int) -> dict[str, Any]:
    """vLLM engine arguments for a VLM whose prompts hold up to ``max_images`` images. No
    processor cache: with it, vLLM sends an image it has seen before without its data, and a
    request that must encode it again (after the encoder cache reset) kills the engine."""
    return {"limit_mm_per_prompt": {"image": max_images, "video": 0}, "mm_processor_cache_gb": 0}
