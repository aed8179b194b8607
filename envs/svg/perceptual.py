"""A learned perceptual term for the SVG env's similarity: VAGEN scores drawings with DINO
features. Here any vision backbone saved as a Hugging Face directory on this machine (a DINO or
DINOv2 checkpoint: ``AutoModel`` and ``AutoImageProcessor`` load it) plugs in; nothing is
downloaded, so a path that is not a local directory is refused.

Used by envs/svg/env.py when ``weights`` gives the ``perceptual`` term a weight. The term is the
cosine of the two images' first-token (CLS) embeddings, counted 0 where negative: 1 for identical
images, symmetric. The model runs on the CPU, in the env worker, in eval mode without gradients.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class PerceptualSimilarity:
    """``similarity(a, b)``: the cosine of the CLS embeddings of two RGB uint8 images."""

    def __init__(self, path: str) -> None:
        if not Path(path).is_dir():
            raise ValueError(f"perceptual_model must be a local Hugging Face directory (a DINO "
                             f"checkpoint); {path!r} is not one: nothing is downloaded here")
        import torch
        from transformers import AutoImageProcessor, AutoModel

        self._torch = torch
        self.processor = AutoImageProcessor.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()

    def embed(self, image: np.ndarray) -> np.ndarray:
        with self._torch.inference_mode():
            inputs = self.processor(images=np.array(image), return_tensors="pt")  # a writable copy
            out = self.model(**inputs).last_hidden_state[0, 0]
        return out.float().numpy()

    def similarity(self, a: np.ndarray, b: np.ndarray) -> float:
        x, y = self.embed(a), self.embed(b)
        cosine = float(x @ y / max(np.linalg.norm(x) * np.linalg.norm(y), 1e-12))
        return max(0.0, min(1.0, cosine))
