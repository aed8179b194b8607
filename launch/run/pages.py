"""Pages of sample episodes: ``<run dir>/episodes/eval_step_<step>.html`` for each evaluation,
and ``episodes/index.html`` linking them.

Called by the training loop (launch/run/loop.py) after each evaluation, with the evaluation's means and
the episodes the actors recorded (actors/actor.py's ``evaluate(record=k)``: plain data, each turn
actors/episode.py's ``turn_record``). Each turn shows the images and text the model was given, its
answer split into its tagged sections, the reward's terms, the judge's scores and the actions.

Invariants:
- Self-contained: images are data: URIs and the CSS is inline; the page fetches nothing (its
  Content-Security-Policy allows data: images, inline styles and its own script only).
- Every string of an episode (model answers, env text, even the PNGs' base64) is untrusted and
  goes through ``html.escape``: an answer holding ``<script>`` is shown as text. The policy,
  which lets no script but ours run, is a second line of defence, not the first.
- The page's one script sets ``data-images-loaded`` on ``<body>`` to the number of images that
  decoded, so a headless browser can check them (tests/unit/launch/test_episode_pages.py).
"""

from __future__ import annotations

import base64
import hashlib
import re
from html import escape
from pathlib import Path
from typing import Any

TAGS = ("think", "observation", "reasoning", "prediction", "answer")
_SECTION = re.compile(r"<(think|observation|reasoning|prediction|answer)>(.*?)</\1>", re.DOTALL)
_PAGE = re.compile(r"eval_step_(\d+)\.html")

_SCRIPT = """addEventListener("load", function () {
  var loaded = 0;
  for (var img of document.images) if (img.complete && img.naturalWidth > 0) loaded++;
  document.body.dataset.imagesLoaded = loaded;
});"""
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
_POLICY = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
           f"script-src 'sha256-{_SCRIPT_HASH}'")

_CSS = """body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
table { border-collapse: collapse; margin: 0.3em 0; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
section.episode { border: 2px solid #bbb; border-radius: 6px; margin: 1.2em 0; padding: 0.5em 1em; }
section.success { border-color: #3a3; } section.failed { border-color: #c33; }
.turn { display: flex; gap: 1em; border-top: 1px dashed #ccc; padding: 0.6em 0; }
.shown { flex: 0 0 auto; max-width: 40%; }
.shown img { image-rendering: pixelated; width: 224px; border: 1px solid #999; display: block; }
.model { flex: 1 1 auto; min-width: 0; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0.2em 0; background: #f6f6f6;
      padding: 4px 6px; }
.part { margin: 0.2em 0; } .label { font-weight: bold; font-size: 12px; color: #555; }
.observation pre { background: #eef5ff; } .reasoning pre { background: #f3eeff; }
.prediction pre { background: #fff6e6; } .answer pre { background: #eaf8ea; }
.bad { color: #c33; } .good { color: #282; }"""


def answer_parts(text: str) -> list[tuple[str, str]]:
    """The tagged sections of an answer, in order: ``(tag, content)`` for <observation>,
    <reasoning>, <prediction>, <answer>, and <think> for text it holds outside those; [] when
    nothing is tagged. Lenient (shows what is there): the env's parser judges the format."""
    parts = []
    for m in _SECTION.finditer(text):
        tag, body = m.group(1), m.group(2)
        if tag != "think":
            parts.append((tag, body.strip()))
            continue
        rest = _SECTION.sub("", body).strip()
        if rest:
            parts.append(("think", rest))
        parts += [(inner.group(1), inner.group(2).strip()) for inner in _SECTION.finditer(body)]
    return parts


def write_eval_page(run_dir: str | Path, step: int, means: dict[str, Any],
                    episodes: list[dict[str, Any]], env_name: str = "") -> Path:
    """Write ``<run_dir>/episodes/eval_step_<step>.html`` (replacing one of the same step) and
    rebuild the index; returns the page's path."""
    folder = Path(run_dir) / "episodes"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"eval_step_{step}.html"
    path.write_text(render_page(step, means, episodes, env_name), encoding="utf-8")
    (folder / "index.html").write_text(render_index(folder, env_name), encoding="utf-8")
    return path


def render_page(step: int, means: dict[str, Any], episodes: list[dict[str, Any]],
                env_name: str = "") -> str:
    """One evaluation's page: a header with the step and the means, then each episode."""
    title = f"{env_name + ' — ' if env_name else ''}evaluation at step {step}"
    summary = "".join(f"<tr><th>{escape(k)}</th><td>{_number(v)}</td></tr>"
                      for k, v in means.items() if isinstance(v, (int, float)))
    body = "\n".join(_episode(e) for e in episodes) or "<p>No episode was recorded.</p>"
    header = f'<h1>{escape(title)}</h1>\n<p><a href="index.html">all evaluations</a></p>'
    return _document(title, f"{header}\n<table>{summary}</table>\n{body}")


def render_index(folder: Path, env_name: str = "") -> str:
    """Links to every evaluation page in ``folder``, by step."""
    steps = sorted(int(m.group(1)) for p in folder.iterdir() if (m := _PAGE.fullmatch(p.name)))
    links = "".join(f'<li><a href="eval_step_{s}.html">step {s}</a></li>' for s in steps)
    title = f"{env_name + ' — ' if env_name else ''}evaluations"
    return _document(title, f"<h1>{escape(title)}</h1>\n<ul>{links}</ul>")


def _document(title: str, body: str) -> str:
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{_POLICY}">\n'
            f"<title>{escape(title)}</title>\n<style>\n{_CSS}\n</style></head>\n"
            f"<body>\n{body}\n<script>{_SCRIPT}</script>\n</body></html>\n")


def _episode(episode: dict[str, Any]) -> str:
    metrics, turns = episode.get("metrics") or {}, episode.get("turns") or []
    success = bool(metrics.get("success", turns[-1]["success"] if turns else False))
    head = [f"seed {escape(str(episode['seed']))}", _flag(success, "success", "no success")]
    if episode.get("failure"):
        head.append(f'<span class="bad">failed: {escape(str(episode["failure"]))}</span>')
    plural = "" if len(turns) == 1 else "s"
    head.append(f"reward {_number(sum(t['reward'] for t in turns))}, {len(turns)} turn{plural}")
    scores = [f"{escape(k)} {_number(v)}" for k, v in metrics.items() if k.endswith("_score")]
    judge = f"<p>judge: {', '.join(scores)}</p>\n" if scores else ""
    rows = "\n".join(_turn(i + 1, t) for i, t in enumerate(turns))
    return (f'<section class="episode {"success" if success else "failed"}">\n'
            f"<h2>{' · '.join(head)}</h2>\n{judge}{rows}\n</section>")


def _turn(number: int, turn: dict[str, Any]) -> str:
    images = "".join(f'<img src="data:image/png;base64,{escape(b64)}" alt="turn {number} image {k + 1}">'
                     for k, b64 in enumerate(turn.get("images", ())))
    shown = (f'<div class="shown"><div class="label">turn {number}: shown to the model</div>'
             f"{images}<pre>{escape(turn['observation'])}</pre></div>")
    return (f'<div class="turn">{shown}<div class="model"><div class="label">the answer</div>'
            f"{_answer(turn['answer'])}{_outcome(turn)}</div></div>")


def _answer(text: str) -> str:
    """Its tagged sections, with the raw text folded away; the raw text alone when untagged."""
    raw = f"<pre>{escape(text)}</pre>"
    parts = answer_parts(text)
    if not parts:
        return raw
    sections = "".join(f'<div class="part {tag}"><span class="label">{tag}</span>'
                       f"<pre>{escape(body)}</pre></div>" for tag, body in parts)
    return f"{sections}<details><summary>raw answer</summary>{raw}</details>"


def _outcome(turn: dict[str, Any]) -> str:
    """The turn's reward, format, actions and ending; the judge's scores; the reward's terms."""
    actions = ", ".join(escape(a) for a in turn["actions"]) or "none"
    ended = _flag(turn["success"], "success", "no success") if turn["done"] else "not done"
    facts = [f"reward <b>{_number(turn['reward'])}</b>",
             _flag(turn["format_correct"], "format ok", "format wrong"),
             _flag(turn.get("actions_valid", True), "actions valid", "invalid action"),
             f"actions: {actions}", ended]
    scores = ", ".join(f"{escape(k)} {_number(v)}" for k, v in turn.get("scores", {}).items())
    terms = "".join(f"<tr><th>{escape(k)}</th><td>{_number(v)}</td></tr>"
                    for k, v in turn["metrics"].items())
    return (f"<p>{' · '.join(facts)}</p>" + (f"<p>judge: {scores}</p>" if scores else "")
            + f"<details open><summary>reward terms</summary><table>{terms}</table></details>")


def _flag(ok: bool, yes: str, no: str) -> str:
    return f'<span class="good">{yes}</span>' if ok else f'<span class="bad">{no}</span>'


def _number(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return escape(str(v))
    return f"{v:.3f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)
