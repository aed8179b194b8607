"""launch/run/pages.py: an evaluation's page of recorded episodes splits each answer into its
sections, escapes every string of the episode, and, opened in a real headless browser with no
network, shows every image and runs no script but its own."""

import os
import re
import shutil
import signal
import subprocess

import numpy as np
import pytest

from actors.episode import turn_record
from envs.protocol import Observation, StepResult
from launch.run.pages import answer_parts, render_page, write_eval_page

HOSTILE = ('<script>document.body.dataset.pwned = "1"</script>'
           '<img src=x onerror="document.body.dataset.pwned=2">')
GOOD = ("<think><observation>P at (1, 2)</observation><reasoning>go up</reasoning>"
        "<prediction>P at (0, 2)</prediction></think><answer>Up</answer>")
MEANS = {"success": 0.5, "reward": 1.25, "observation_score": 0.75, "n": 2.0}


def _image(colour: tuple[int, int, int]) -> np.ndarray:
    """8 x 8: the left half ``colour``, the right half a gradient."""
    im = np.zeros((8, 8, 3), dtype=np.uint8)
    im[:, :4] = colour
    im[:, 4:] = np.arange(8, dtype=np.uint8)[:, None, None] * 30
    return im


def _turn(text: str, images: list[np.ndarray], answer: str, done: bool, success: bool = False) -> dict:
    info = {"success": success, "format_correct": answer == GOOD, "actions_valid": answer == GOOD,
            "actions": ["Up"] if answer == GOOD else [],
            "metrics": {"env_reward": float(success), "format_reward": 0.5 * (answer == GOOD),
                        "reasoning/observation_score": 1.0}}
    result = StepResult(Observation("next"), 0.25, done, info)
    return turn_record(Observation(text, images), answer, result)


def _episodes() -> list[dict]:
    """Two episodes, five images: seed 7 solved in two turns, seed 8 failed after a hostile answer."""
    red, blue = _image((255, 0, 0)), _image((0, 0, 255))
    solved = [_turn("Turn 1 <image>", [red], GOOD, False),
              _turn("Turn 2 <image>", [blue], GOOD, True, success=True)]
    failed = [_turn(f"Turn 1 {HOSTILE} <image><image>", [blue, red], HOSTILE, False),
              _turn("Turn 2 <image>", [red], "<answer>Up", False)]
    return [{"seed": 7, "failure": None, "turns": solved,
             "metrics": {"success": 1.0, "turns": 2.0, "observation_score": 1.0}},
            {"seed": 8, "failure": f"env_error: {HOSTILE}", "turns": failed, "metrics": {}}]


def test_answers_split_into_their_tagged_sections():
    assert answer_parts(GOOD) == [("observation", "P at (1, 2)"), ("reasoning", "go up"),
                                  ("prediction", "P at (0, 2)"), ("answer", "Up")]
    assert answer_parts("<think> free\n</think> <answer>Left, Up</answer>") == [("think", "free"),
                                                                              ("answer", "Left, Up")]
    assert answer_parts("<think>a <reasoning>r</reasoning> b</think><answer><svg/></answer>") == [
        ("think", "a  b"), ("reasoning", "r"), ("answer", "<svg/>")]
    assert answer_parts("no tags <answer>unclosed") == []


def test_every_string_of_an_episode_is_escaped():
    page = render_page(3, MEANS, _episodes(), env_name="<b>lake</b>")
    assert page.count("<script>") == 1 and "<b>lake" not in page  # only the page's own script
    assert "pwned" in page and "<img src=x" not in page and "onerror=\"document" not in page
    assert "&lt;script&gt;document.body.dataset.pwned = &quot;1&quot;&lt;/script&gt;" in page
    assert page.count("<img ") == 5 and page.count('src="data:image/png;base64,') == 5
    assert "&lt;b&gt;lake&lt;/b&gt; — evaluation at step 3" in page
    for text in ("P at (1, 2)", "go up", "P at (0, 2)", "env_reward", "observation_score", "seed 8",
                 "failed: env_error", "format wrong", "invalid action"):
        assert text in page


def test_pages_are_written_per_step_and_indexed(tmp_path):
    write_eval_page(tmp_path, 10, MEANS, _episodes())
    path = write_eval_page(tmp_path, 0, MEANS, [])
    assert path == tmp_path / "episodes" / "eval_step_0.html"
    assert "No episode was recorded" in path.read_text()
    index = (tmp_path / "episodes" / "index.html").read_text()
    links = re.findall(r'href="(eval_step_\d+\.html)"', index)
    assert links == ["eval_step_0.html", "eval_step_10.html"]


def _browser() -> str | None:
    return shutil.which("chromium-headless-shell") or next(
        (p for p in ("/usr/lib/chromium/chromium-headless-shell",) if os.path.exists(p)), None)


def _run_browser(binary: str, profile, *args: str, timeout_s: float = 60.0) -> str:
    """Run the headless browser with no network; on timeout its whole process group is killed."""
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=5000", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, f"{binary} exited with {proc.returncode}"
    return out


def test_a_headless_browser_shows_every_image_and_runs_no_model_script(tmp_path):
    binary = _browser()
    if binary is None:
        pytest.skip("no chromium-headless-shell (launch/tools/system.sh installs it: apt-get install "
                    "chromium-headless-shell, as root)")
    page = write_eval_page(tmp_path / "run", 4, MEANS, _episodes(), env_name="frozenlake")
    url = page.resolve().as_uri()
    dom = _run_browser(binary, tmp_path / "profile", "--dump-dom", url)
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-images-loaded="5"' in body, body  # every <img> decoded, by the page's own script
    assert dom.count("<img ") == 5
    assert "data-pwned" not in dom  # the model's script and onerror handler never ran...
    assert "&lt;script&gt;document.body.dataset.pwned" in dom  # ...they are text on the page

    shot = tmp_path / "shot.png"
    _run_browser(binary, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1000,1400", url)
    from PIL import Image

    with Image.open(shot) as im:
        pixels = np.asarray(im.convert("RGB")).reshape(-1, 3).astype(int)
    assert len(np.unique(pixels, axis=0)) > 50  # not blank: text, tables and images
    red = (pixels[:, 0] > 230) & (pixels[:, 1] < 30) & (pixels[:, 2] < 30)
    assert red.sum() > 2000  # the first image's red half, drawn at 224 px wide
