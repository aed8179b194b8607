"""How alike two renders are, computed offline with no learned weights: VAGEN's structural term
(the IoU of the two images' Canny edge maps, thresholds 100 and 200, on greyscale) and SSIM
(Wang et al. 2004: 11-tap Gaussian window, sigma 1.5, K1 0.01, K2 0.03, on greyscale 0-255).

``similarity(a, b, weights)`` -> (the weighted mean of the terms, each in [0, 1]; the terms).
Both terms are symmetric and 1 for identical images; SSIM's negative values count as 0. Two
images with no edges at all have an edge IoU of 1 (nothing to disagree on). A third term,
``perceptual`` (VAGEN's DINO features: envs/svg/perceptual.py), is computed only where it has a
weight, by the model passed in; by default it has none.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

TERMS = ("edges", "ssim", "perceptual")
DEFAULT_WEIGHTS = {"edges": 1.0, "ssim": 1.0}


def grey(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601 luma of an RGB uint8 image, as float64 in [0, 255]."""
    return rgb[..., :3].astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def edge_iou(a: np.ndarray, b: np.ndarray) -> float:
    import cv2

    ea, eb = (cv2.Canny(np.round(grey(x)).astype(np.uint8), 100, 200) > 0 for x in (a, b))
    union = np.count_nonzero(ea | eb)
    return 1.0 if union == 0 else np.count_nonzero(ea & eb) / union


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.ndimage import gaussian_filter

    x, y = grey(a), grey(b)
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2

    def blur(z: np.ndarray) -> np.ndarray:
        return gaussian_filter(z, sigma=1.5, truncate=3.5 / 1.5, mode="reflect")

    mx, my = blur(x), blur(y)
    vx, vy, cov = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
    index = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(index.mean())


def check_weights(weights: Mapping[str, float] | None) -> dict[str, float]:
    """``weights`` as a dict (None: ``DEFAULT_WEIGHTS``); ValueError unless they are
    non-negative, not all 0, and over ``TERMS``."""
    weights = dict(weights or DEFAULT_WEIGHTS)
    if set(weights) - set(TERMS) or sum(weights.values()) <= 0 or min(weights.values()) < 0:
        raise ValueError(f"weights are non-negative, not all 0, over {TERMS}; got {weights}")
    return weights


def similarity(a: np.ndarray, b: np.ndarray, weights: Mapping[str, float] | None = None,
               perceptual=None) -> tuple[float, dict[str, float]]:
    """(the weighted mean of ``weights``' terms, the terms computed); ``perceptual``: the model
    of the ``perceptual`` term (its ``similarity(a, b)``), needed when that term has a weight."""
    weights = check_weights(weights)
    if a.shape != b.shape:
        raise ValueError(f"the renders differ in shape: {a.shape} and {b.shape}")
    terms = {"edges": edge_iou(a, b), "ssim": max(0.0, ssim(a, b))}
    if weights.get("perceptual", 0.0) > 0:
        if perceptual is None:
            raise ValueError("the perceptual term has a weight but no model (perceptual_model)")
        terms["perceptual"] = perceptual.similarity(a, b)
    total = sum(weights.values())
    return sum(w * terms[k] for k, w in weights.items()) / total, terms
