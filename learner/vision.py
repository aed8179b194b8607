"""A vision-language policy's image inputs: from a trajectory's PNG images to the pixel values,
patch grids and modality ids its forward pass takes (Qwen2-VL style models).

Called by learner/trainer.py once per train step (``encode``) and for every forward of a
micro-batch (``model_inputs``). Invariants:
- a trajectory's images are processed by the model's own image processor, the one the actor's
  engine used, so a run of image-pad tokens in its ids has exactly as many tokens as its image
  has merged patches; a trajectory whose runs disagree with its images is rejected (ValueError);
- ``model_inputs`` concatenates the rows' images in row order, the order in which the model
  fills the image-pad positions of the (B, L) ids, and marks those positions in
  ``mm_token_type_ids`` (1: image, 0: text), which the model needs for its 3-D rotary positions;
  rows without images add nothing, and a micro-batch without images gets no image inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from transport.images import collapse_pads, decode_image
from transport.schema import Trajectory

Encoded = tuple[torch.Tensor, torch.Tensor] | None
"""One row's (pixel_values (patches, D), image_grid_thw (images, 3)), None without images."""


def is_vision_config(hf_config) -> bool:
    return hasattr(hf_config, "vision_config")


class ImageInputs:
    """The image processor of a vision-language model and its image-pad token."""

    def __init__(self, model_path: str) -> None:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(model_path)
        self.image_processor = processor.image_processor
        self.pad_id = int(processor.tokenizer.convert_tokens_to_ids(processor.image_token))
        self.merge = int(self.image_processor.merge_size)

    def encode(self, trajectories: Sequence[Trajectory]) -> list[Encoded]:
        """Each trajectory's processed images (None for one without images)."""
        out: list[Encoded] = []
        for t in trajectories:
            if not t.images:
                out.append(None)
                continue
            px = self.image_processor(images=[decode_image(im) for im in t.images], return_tensors="pt")
            grid = px["image_grid_thw"]
            _, runs = collapse_pads(t.token_ids.tolist(), self.pad_id)
            expected = (grid.prod(-1) // self.merge ** 2).tolist()
            if runs != expected:
                raise ValueError(f"trajectory {t.run_id}/{t.actor_id}/{t.episode_id}: image-pad runs "
                                 f"{runs} do not match its {len(t.images)} images ({expected} tokens)")
            out.append((px["pixel_values"], grid))
        return out

    def model_inputs(self, rows: Sequence[Encoded], ids: torch.Tensor) -> dict[str, Any]:
        """Keyword arguments of the model's forward for the rows ``rows`` of ids ``ids``."""
        present = [r for r in rows if r is not None]
        if not present:
            return {}
        return {"pixel_values": torch.cat([p for p, _ in present]).to(ids.device),
                "image_grid_thw": torch.cat([g for _, g in present]).to(ids.device),
                "mm_token_type_ids": (ids == self.pad_id).long()}
