"""envs/svg/env.py: SVG reconstruction through its turns: targets by seed (Tabler icons, random
shapes), VAGEN's reward on hand-built answers (the target's own SVG, a near miss, malformed text,
hostile SVG), the two-image observation, and the settings it refuses."""

from __future__ import annotations

import re

import numpy as np
import pytest

from envs.registry import make, resolve_config
from envs.svg.env import icon_svg, shapes_svg, tabler_icons
from tests.envs_api import env_reset, env_step


def _env(**overrides):
    return make("svg", **resolve_config("svg", {"image_size": 64, **overrides}))


def _answer(svg: str) -> str:
    return f"<think>I draw it.</think><answer>{svg}</answer>"


@pytest.fixture(scope="module")
def env():
    env = _env()
    yield env
    env.close()


def test_the_icons_are_tablers_outline_set_drawn_black():
    icons = tabler_icons()
    assert len(icons) > 4000 and all(p.suffix == ".svg" for p in icons[:10])
    svg = icon_svg(icons[0])
    assert svg.startswith("<svg") and "currentColor" not in svg and 'stroke="#000000"' in svg


def test_a_seed_picks_the_target_and_the_observation_shows_it(env):
    first = env_reset(env, 7)
    svg = env.target_svg
    again = env_reset(env, 7)
    assert env.target_svg == svg and first.text == again.text
    assert np.array_equal(first.images[0], again.images[0])
    assert first.text.count("<image>") == 1 and first.images[0].shape == (64, 64, 3)
    assert "Turn 1 of 2." in first.text and (first.images[0] < 128).any()  # black strokes
    assert len({(env_reset(env, s), env.target_svg)[1] for s in range(20)}) > 15


def test_the_prompt_asks_for_one_svg_document_and_shows_one():
    env = _env()
    prompt = env.system_prompt()
    assert prompt.startswith("Reproduce the target picture as SVG code")
    assert "give one SVG document inside <answer></answer>" in prompt and "action" not in prompt
    assert "Example:\n<think>" in prompt and '<answer><svg xmlns="http://www.w3.org/2000/svg"' in prompt
    example = prompt.split("Example:\n")[1]
    env.reset(seed=0)
    assert env_step(env, example).info["format_correct"]  # the example is a well-formed answer
    env.close()
    assert "Example:\n<answer><svg" in _env(format="no_think").system_prompt()
    assert _env(prompt="none").system_prompt() == ""


def test_the_targets_own_svg_scores_one_and_succeeds(env):
    env_reset(env, 3)
    result = env_step(env, _answer(env.target_svg))
    assert result.done and result.info["success"] and result.info["format_correct"]
    assert result.info["metrics"]["similarity"] == pytest.approx(1.0)
    assert result.reward == pytest.approx(0.5 + 5.0)


def test_a_near_miss_earns_its_similarity_and_sees_its_drawing_beside_the_target():
    env = _env(targets="shapes")
    try:
        env_reset(env, 11)
        near = env.target_svg.replace('viewBox="0 0 24 24">', 'viewBox="0 0 24 24"><g transform="translate(1 0)">'
                                      ).replace("</svg>", "</g></svg>")
        first = env_step(env, _answer(near))
        score = first.info["metrics"]["similarity"]
        assert not first.done and 0.0 < score < 0.9 and not first.info["success"]
        assert first.reward == pytest.approx(0.5 + 5.0 * score)
        assert first.observation.text.count("<image>") == 2 and "similarity to the target" in first.observation.text
        second = env_step(env, _answer(near))  # the turn limit: truncated, not terminated
        assert second.done and not second.info["success"] and second.reward == pytest.approx(first.reward)
    finally:
        env.close()


@pytest.mark.parametrize("answer, reason", [
    ("a circle, probably", None),  # malformed: no tags
    (_answer('<svg xmlns="http://www.w3.org/2000/svg"><script>x()</script></svg>'), "script"),
    (_answer('<svg xmlns="http://www.w3.org/2000/svg"><image href="file:///etc/passwd"/></svg>'),
     "external_reference"),
    (_answer("<svg><g>" + "<g>" * 100 + "</g>" * 101 + "</svg>"), "too_deep"),
    (_answer("not svg at all"), "malformed"),
])
def test_an_answer_that_does_not_draw_earns_nothing_ends_the_episode_and_is_counted(env, answer, reason):
    env_reset(env, 5)
    result = env_step(env, answer)
    assert result.done and result.reward == 0.0 and not result.info["success"]
    assert result.info["actions"] == [] and not result.info["actions_valid"]
    metrics = result.info["metrics"]
    if reason is None:
        assert not result.info["format_correct"] and not any(k.startswith("svg_refused") for k in metrics)
    else:
        assert result.info["format_correct"] and metrics[f"svg_refused/{reason}"] == 1.0
        assert f"not drawn ({reason})" in result.observation.text


def test_random_shapes_stay_in_the_view_box_and_a_seed_draws_the_same():
    svgs = [shapes_svg(np.random.default_rng(s)) for s in range(50)]
    assert svgs[:5] == [shapes_svg(np.random.default_rng(s)) for s in range(5)]
    coordinates = [int(v) for svg in svgs for v in __import__("re").findall(r'(?:cx|cy|x|y|x1|y1|x2|y2)="(\d+)"', svg)]
    assert min(coordinates) >= 0 and max(coordinates) <= 24
    mixed = _env(targets="mixed")
    try:
        kinds = {("24 24" in (env_reset(mixed, s), mixed.target_svg)[1] and "<path" in mixed.target_svg)
                 for s in range(12)}
        assert kinds == {True, False}  # icons (paths) and shapes both appear
    finally:
        mixed.close()


@pytest.mark.parametrize("settings, message", [
    ({"targets": "emoji"}, "targets must be one of"),
    ({"render": "text"}, "observed as images"),
    ({"reasoning_reward": {"judge": "rule"}}, "no state text"),
    ({"format": "grounding"}, "no_think or free_think"),
    ({"weights": {"dino": 1.0}}, "weights are non-negative"),
])
def test_settings_the_env_cannot_honour_fail_naming_why(settings, message):
    with pytest.raises(ValueError, match=message):
        _env(**settings)


def _render_workers() -> set[int]:
    """Pids of SVG render workers alive now (envs/svg/render.py's ``_serve`` subprocesses)."""
    import os

    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"from envs.svg.render import _serve" in cmdline:
            found.add(int(pid))
    return found


def test_the_env_plays_in_the_pools_daemonic_workers_and_leaves_no_renderer_behind():
    import asyncio
    import time

    from envs.pool import EnvPool
    from envs.service import LocalEnvClient

    before = _render_workers()
    circle = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24">'
              '<circle cx="12" cy="12" r="5"/></svg>')
    with EnvPool(("svg", resolve_config("svg", {"image_size": 32})), num_workers=1,
                 envs_per_worker=2, step_timeout_s=30, reset_timeout_s=30) as pool:
        async def play():
            client = LocalEnvClient(pool)
            try:
                first = await client.reset([0, 1], [1, 2])
                return first, await client.step([0, 1], [_answer(circle), "junk"])
            finally:
                await client.close()

        first, results = asyncio.run(play())
        assert [len(o.images) for o in first] == [1, 1]
        drawn, junk = results
        assert 0.5 < drawn.reward <= 5.5 and not drawn.done and (junk.reward, junk.done) == (0.0, True)
        assert _render_workers() - before  # the worker's renderer runs
    deadline = time.monotonic() + 10
    while _render_workers() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _render_workers() - before


def test_a_demonstration_is_the_targets_own_svg_and_noise_moves_only_its_geometry():
    env = _env(targets="mixed")
    try:
        for seed in range(6):
            env_reset(env, seed)
            answer, moved, numbers = env.demonstrate(np.random.default_rng(seed), 0.0)
            assert answer == f"<think>{env.describe_target()}</think><answer>{env.target_svg}</answer>"
            assert moved == 0 and numbers > 0
            result = env_step(env, answer)
            assert result.info["success"] and result.reward == pytest.approx(5.5)
            env_reset(env, seed)
            noisy, moved, numbers = env.demonstrate(np.random.default_rng(seed), 1.0)
            assert moved == numbers  # every coordinate and length moved, by 1 to 3
            svg = noisy[noisy.index("<answer>") + 8:-len("</answer>")]
            head = env.target_svg[:env.target_svg.index(">") + 1]
            assert svg.startswith(head) and svg != env.target_svg  # the view box and size stay
            colours = sorted(re.findall(r"#[0-9a-f]{6}", env.target_svg))
            assert sorted(re.findall(r"#[0-9a-f]{6}", svg)) == colours
            result = env_step(env, noisy)
            assert result.info["actions_valid"] and not result.info["success"]
    finally:
        env.close()


def test_the_demonstrations_think_names_the_shapes_or_the_icon(env):
    env.target_name = ""
    env.target_svg = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><circle cx="3" '
                      'cy="4" r="3" fill="#e6194b"/><line x1="2" y1="2" x2="9" y2="9" stroke="#f58231" '
                      'stroke-width="2"/></svg>')
    assert env.describe_target() == "A red circle, an orange line."
    env_reset(env, 0)
    assert env.describe_target() == f"The {env.target_name} icon, in black outline."


def test_blank_images_show_white_and_score_the_real_drawing():
    plain, blank = _env(targets="shapes"), _env(targets="shapes", blank_images=True)
    try:
        first, white = env_reset(plain, 3), env_reset(blank, 3)
        assert white.images[0].shape == first.images[0].shape and (white.images[0] == 255).all()
        assert not (first.images[0] == 255).all()
        answer = blank.demonstrate(np.random.default_rng(0), 0.0)[0]
        a, b = env_step(plain, answer), env_step(blank, answer)
        assert a.reward == b.reward == pytest.approx(5.5)  # the real target against the drawing
        assert all((im == 255).all() for im in b.observation.images) and len(b.observation.images) == 2
    finally:
        plain.close()
        blank.close()
