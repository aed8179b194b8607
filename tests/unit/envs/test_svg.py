"""envs/svg: untrusted SVG rendered within limits (every kind of hostile input the policy may
write is refused or bounded, counted, and the renderer keeps serving), and the similarity of two
renders (exact values on constant images, identity, symmetry, order)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from envs.svg.render import MAX_BYTES, Renderer, check, render_png
from envs.svg.score import similarity, ssim

NS = 'xmlns="http://www.w3.org/2000/svg"'


def circle(cx: float = 50, r: float = 30, colour: str = "#ff0000") -> str:
    return f'<svg {NS} viewBox="0 0 100 100"><circle cx="{cx}" cy="50" r="{r}" fill="{colour}"/></svg>'


@pytest.fixture(scope="module")
def renderer():
    with Renderer(timeout_s=10) as r:
        yield r


def test_a_circle_is_drawn_at_the_asked_size_on_white_the_same_each_time(renderer):
    image, why = renderer.render(circle(), 64)
    again, _ = renderer.render(circle(), 64)
    assert why == "ok" and image.shape == (64, 64, 3) and image.dtype == np.uint8
    assert image[32, 32].tolist() == [255, 0, 0] and image[0, 0].tolist() == [255, 255, 255]
    assert np.array_equal(image, again)


HOSTILE = {
    "script": f"<svg {NS}><script>fetch('http://x')</script></svg>",
    "script (event)": f'<svg {NS} onload="steal()"><rect width="5" height="5"/></svg>',
    "script (foreignObject)": f"<svg {NS}><foreignObject><p>hi</p></foreignObject></svg>",
    "external_reference (file)": f'<svg {NS}><image href="file:///etc/passwd" width="9" height="9"/></svg>',
    "external_reference (network)": f'<svg {NS} xmlns:xlink="http://www.w3.org/1999/xlink">'
                                    f'<use xlink:href="http://example.com/a.svg#x"/></svg>',
    "external_reference (style)": f'<svg {NS}><rect style="fill:url(http://x/p)" width="5" height="5"/></svg>',
    "external_reference (import)": f"<svg {NS}><style>@import 'http://x/s.css';</style></svg>",
    "dtd": '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;">]>'
           f"<svg {NS}><text>&lol2;</text></svg>",
    "too_deep": f"<svg {NS}>" + "<g>" * 5000 + "</g>" * 5000 + "</svg>",
    "too_many": f"<svg {NS}>" + "<g/>" * 5000 + "</svg>",
    "too_large": f"<svg {NS}><text>{'x' * (3 << 20)}</text></svg>",  # megabytes of text
    "malformed": f"<svg {NS}><rect></svg>",
    "malformed (not svg)": "<html><body>hello</body></html>",
    "malformed (prose)": "I think the icon is a circle.",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_input_is_refused_before_the_renderer_and_counted(renderer, name):
    reason = name.split(" ")[0]
    before = renderer.counts[reason]
    assert check(HOSTILE[name]) == reason
    assert renderer.render(HOSTILE[name], 32) == (None, reason)
    assert renderer.counts[reason] == before + 1


def test_a_fragment_reference_and_inline_data_are_allowed():
    gradient = (f'<svg {NS}><defs><linearGradient id="g"><stop offset="0" stop-color="red"/>'
                f'</linearGradient></defs><rect fill="url(#g)" width="9" height="9"/>'
                f'<use href="#g"/><image href="data:image/png;base64,iVBOR" width="1" height="1"/></svg>')
    assert check(gradient) is None and len(HOSTILE["too_large"].encode()) > MAX_BYTES


def test_huge_declared_sizes_render_at_the_asked_size_in_time(renderer):
    huge = (f'<svg {NS} width="100000000" height="100000000" viewBox="0 0 100 100">'
            f'<circle cx="50" cy="50" r="40" fill="#0000ff" stroke="#000" stroke-width="1e9"/></svg>')
    t0 = time.perf_counter()
    image, why = renderer.render(huge, 48)
    assert why == "ok" and image.shape == (48, 48, 3) and time.perf_counter() - t0 < 10


def slow_render(text: str, size: int) -> bytes:
    time.sleep(30)
    return render_png(text, size)


def dying_render(text: str, size: int) -> bytes:
    if "die" in text:
        os._exit(3)
    return render_png(text, size)


def test_a_render_that_overruns_or_kills_its_worker_is_counted_and_the_next_one_served():
    with Renderer(timeout_s=1.0, render=f"{__name__}:slow_render") as slow:
        t0 = time.perf_counter()
        assert slow.render(circle(), 16) == (None, "timeout")
        assert time.perf_counter() - t0 < 20 and slow.counts["timeout"] == 1
    with Renderer(timeout_s=20, render=f"{__name__}:dying_render") as dying:
        assert dying.render(f'<svg {NS}><desc>die</desc></svg>', 16) == (None, "crashed")
        image, why = dying.render(circle(), 16)  # a fresh worker
        assert why == "ok" and image[8, 8].tolist() == [255, 0, 0]
        assert dict(dying.counts) == {"crashed": 1, "ok": 1}


def test_what_resvg_refuses_is_a_render_error_and_the_worker_serves_on(renderer):
    before = renderer.counts["render_error"]
    for size in ('width="0" height="0"', 'width="-5" height="10"'):  # "SVG has an invalid size"
        assert renderer.render(f"<svg {NS} {size}></svg>", 16) == (None, "render_error")
    assert renderer.counts["render_error"] == before + 2
    assert renderer.render(circle(), 16)[1] == "ok"


def test_ssim_of_constant_images_is_its_closed_form():
    a, b = np.full((16, 16, 3), 100, np.uint8), np.full((16, 16, 3), 150, np.uint8)
    c1 = (0.01 * 255) ** 2
    assert ssim(a, b) == pytest.approx((2 * 100 * 150 + c1) / (100 ** 2 + 150 ** 2 + c1), rel=1e-9)
    assert ssim(a, a) == pytest.approx(1.0)


def test_similarity_is_one_for_the_same_render_symmetric_and_falls_with_the_difference(renderer):
    target = renderer.render(circle(), 64)[0]
    near = renderer.render(circle(cx=54), 64)[0]
    far = renderer.render(circle(cx=70, r=15), 64)[0]
    blank = np.full_like(target, 255)
    same, terms = similarity(target, target)
    assert same == pytest.approx(1.0) and terms == pytest.approx({"edges": 1.0, "ssim": 1.0})
    scores = [similarity(target, x)[0] for x in (near, far, blank)]
    assert 1.0 > scores[0] > scores[1] > scores[2] >= 0.0
    assert similarity(near, target)[0] == pytest.approx(scores[0])
    assert similarity(target, blank, {"edges": 1.0})[0] == 0.0  # a blank has no edge in common
    with pytest.raises(ValueError, match="non-negative"):
        similarity(target, near, {"edges": -1.0, "ssim": 1.0})


@pytest.fixture(scope="module")
def dino_path(tmp_path_factory):
    """A tiny DINOv2 built here from random weights, saved as a Hugging Face directory."""
    import torch
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("dino")
    config = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, image_size=56, patch_size=14)
    Dinov2Model(config).save_pretrained(path)
    BitImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}).save_pretrained(path)
    return str(path)


def test_the_perceptual_term_is_the_cosine_of_the_models_embeddings(renderer, dino_path):
    from envs.svg.perceptual import PerceptualSimilarity

    model = PerceptualSimilarity(dino_path)
    a, _ = renderer.render(circle(), 56)
    b, _ = renderer.render(circle(cx=30, colour="#0000ff"), 56)
    x, y = model.embed(a), model.embed(b)
    naive = float(np.dot(x, y) / np.sqrt(np.dot(x, x) * np.dot(y, y)))
    assert model.similarity(a, a) == pytest.approx(1.0)
    assert model.similarity(a, b) == pytest.approx(max(0.0, naive)) == pytest.approx(model.similarity(b, a))
    weights = {"edges": 1.0, "ssim": 1.0, "perceptual": 2.0}
    total, terms = similarity(a, b, weights, model)
    assert total == pytest.approx((terms["edges"] + terms["ssim"] + 2 * terms["perceptual"]) / 4)
    assert "perceptual" not in similarity(a, b)[1]  # no weight, not computed


def test_the_perceptual_term_needs_a_local_model(dino_path):
    from envs.registry import make, resolve_config

    with pytest.raises(ValueError, match="perceptual_model"):
        make("svg", **resolve_config("svg", {"weights": {"perceptual": 1.0}}))
    with pytest.raises(ValueError, match="local Hugging Face directory"):
        make("svg", **resolve_config("svg", {"weights": {"perceptual": 1.0},
                                             "perceptual_model": "facebook/dinov2-small"}))
    env = make("svg", **resolve_config("svg", {"image_size": 56, "targets": "shapes",
                                               "weights": {"ssim": 1.0, "perceptual": 1.0},
                                               "perceptual_model": dino_path}))
    try:
        env.reset(seed=1)
        _, reward, *_, info = env.step(f"<think>x</think><answer>{env.target_svg}</answer>")
        assert info["metrics"]["similarity/perceptual"] == pytest.approx(1.0) and reward == pytest.approx(5.5)
    finally:
        env.close()
