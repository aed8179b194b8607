"""SVG reconstruction, VAGEN's SVG env: the agent sees a rendered target and answers with SVG code;
the next observation shows its own SVG drawn beside the target, so it can refine it.

Built by ``make_env`` (envs.registry's ``svg``, configs/env/svg.yaml). Targets (``targets``):
- ``icons``: the Tabler outline icons inside the ``pytablericons`` wheel (MIT; 24 x 24 stroke
  icons, drawn black on white here), read as files: the wheel's own code is not used;
- ``shapes``: 1 to 3 random circles, rectangles and lines in a 24 x 24 view box, an unbounded
  curriculum simpler than icons;
- ``mixed``: either, half and half.
The seed picks the target, among its split's (envs/splits.py); the same seed, the same target.

A turn: the answer is parsed strictly in ``format`` (envs/formats.py); the inner text of
``<answer>`` is the SVG. It is checked and drawn within limits by envs/svg/render.py. Reward:
``format_reward`` for a well-formed answer whose SVG draws, plus ``similarity_reward`` x the
similarity of the two renders (envs/svg/score.py: the edge IoU and SSIM, ``weights``; with
``perceptual_model``, a local DINO checkpoint, also VAGEN's learned term). An answer
whose SVG does not draw (refused as hostile, malformed, too slow) earns nothing and ends the
episode, as VAGEN's; its reason is counted (``svg_refused/<reason>`` in the turn's metrics). The
episode ends with success once the similarity reaches ``success_threshold``, else after
``max_turns`` (VAGEN's 2).

Invariants: the observation holds the target, and after the first turn the last drawing, as
``<image>``s in the text (envs/protocol.py); renders are ``image_size`` pixels a side.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from envs import splits
from envs.formats import format_reward, parse
from envs.protocol import IMAGE_PLACEHOLDER, TEXT, Observation, blanked, observation_space
from envs.svg.render import MAX_BYTES, Renderer
from envs.svg.score import check_weights, similarity

TARGETS = ("icons", "shapes", "mixed")
PROMPTS = ("none", "brief", "full")
TASK = ("Reproduce the target picture as SVG code: a 24 x 24 view box (viewBox=\"0 0 24 24\"), "
        "shapes and paths only; your SVG is drawn and compared with the target, which you see "
        "again beside your drawing.")
EXAMPLE = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><circle cx="12" cy="12" '
           'r="9" fill="none" stroke="black" stroke-width="2"/></svg>')


@functools.cache
def tabler_icons() -> tuple[Path, ...]:
    """The Tabler outline icons' files in the installed ``pytablericons`` wheel, sorted."""
    import importlib.util

    spec = importlib.util.find_spec("pytablericons")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the icons come from the pytablericons wheel: pip install pytablericons")
    folder = Path(next(iter(spec.submodule_search_locations))) / "icons" / "outline"
    return tuple(sorted(folder.glob("*.svg")))


def icon_svg(path: Path) -> str:
    """An icon's SVG, its stroke black (Tabler draws in ``currentColor``), its comment dropped."""
    text = path.read_text()
    return text[text.index("<svg"):].replace("currentColor", "#000000")


COLOURS = {"#000000": "black", "#e6194b": "red", "#3cb44b": "green", "#4363d8": "blue",
           "#f58231": "orange", "#911eb4": "purple"}
_NUMBER_RE = re.compile(r"(?<![0-9a-fA-F.])\d+(?:\.\d+)?")
_GEOMETRY_RE = re.compile(r'(\s(?:cx|cy|rx|ry|r|x|y|x1|y1|x2|y2|width|height|d|points)=")([^"]*)(")')
"""The attributes that place and size a shape (path data included): the numbers a miss moves."""


def shapes_svg(rng: np.random.Generator) -> str:
    """1 to 3 random shapes (circle, rectangle, line) of random colours in a 24 x 24 view box."""
    colours = tuple(COLOURS)
    parts = []
    for _ in range(int(rng.integers(1, 4))):
        colour = colours[int(rng.integers(len(colours)))]
        kind = int(rng.integers(3))
        if kind == 0:
            r = int(rng.integers(3, 8))
            cx, cy = (int(rng.integers(r, 24 - r + 1)) for _ in range(2))
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="{r}" fill="{colour}"/>')
        elif kind == 1:
            w, h = int(rng.integers(4, 15)), int(rng.integers(4, 15))
            x, y = int(rng.integers(0, 25 - w)), int(rng.integers(0, 25 - h))
            parts.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{colour}"/>')
        else:
            x1, y1, x2, y2 = (int(v) for v in rng.integers(2, 23, size=4))
            parts.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{colour}" '
                         'stroke-width="2" stroke-linecap="round"/>')
    return ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24">'
            + "".join(parts) + "</svg>")


class SvgEnv(gym.Env):
    """See the module docstring."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    observed_as = "image"
    """As GridEnv's: what the observations are (here always pictures)."""

    def __init__(self, *, targets: str = "icons", image_size: int = 224, max_turns: int = 2,
                 format: str = "free_think", prompt: str = "brief", format_reward: float = 0.5,
                 similarity_reward: float = 5.0, weights: dict[str, float] | None = None,
                 success_threshold: float = 0.9, render_timeout_s: float = 5.0,
                 render: str = "image", reasoning_reward: Any = None,
                 blank_images: bool = False, perceptual_model: str | None = None,
                 held_out: bool = True) -> None:
        if targets not in TARGETS:
            raise ValueError(f"targets must be one of {TARGETS}, got {targets!r}")
        if prompt not in PROMPTS:
            raise ValueError(f"prompt must be one of {PROMPTS}, got {prompt!r}")
        if render != "image":
            raise ValueError("the SVG env is observed as images (env.render=image)")
        if reasoning_reward is not None:
            raise ValueError("the SVG env has no state text for a reasoning judge "
                             "(env.reasoning_reward=null)")
        if max_turns < 1 or image_size < 16:
            raise ValueError(f"max_turns >= 1 and image_size >= 16, got {max_turns}, {image_size}")
        if format not in ("no_think", "free_think"):
            raise ValueError(f"format must be no_think or free_think (the answer is SVG code), "
                             f"got {format!r}")
        self.targets, self.image_size, self.max_turns = targets, int(image_size), int(max_turns)
        self.format, self.prompt = format, prompt
        self.blank_images = bool(blank_images)
        """Every picture shown white (the scores still compare the real ones): the ablation that
        tells whether a model reads them."""
        self.format_reward, self.similarity_reward = float(format_reward), float(similarity_reward)
        self.weights = check_weights(weights)
        self.perceptual = None
        """The perceptual term's model (envs/svg/perceptual.py), where ``weights`` gives it one."""
        if self.weights.get("perceptual", 0.0) > 0:
            if not perceptual_model:
                raise ValueError("weights.perceptual needs perceptual_model: a local DINO checkpoint")
            from envs.svg.perceptual import PerceptualSimilarity

            self.perceptual = PerceptualSimilarity(perceptual_model)
        self.success_threshold = float(success_threshold)
        self.held_out = bool(held_out)
        """Each seed draws a target of its split only (envs/splits.py): no evaluation target is
        ever a training one (with icons: held-out icons)."""
        self.renderer = Renderer(timeout_s=render_timeout_s)
        self.action_space = TEXT
        self.observation_space = observation_space(self.image_size)
        self.target_svg = ""
        self.target_name = ""
        """The icon's name ("arrow left"), "" for shapes."""
        self._target: np.ndarray | None = None
        self._turn, self._done = 0, True

    # -- the gymnasium interface ----------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        split = splits.wanted(seed, self.held_out)
        if seed is None:
            seed = int(self.np_random.integers(2**31))
        rng = np.random.default_rng(seed)
        key = splits.draw(functools.partial(self._next_target, rng), split, f"SVG, seed {seed}")
        self._target, why = self.renderer.render(self.target_svg, self.image_size)
        if self._target is None:
            raise RuntimeError(f"the target of seed {seed} did not draw: {why}")
        self._turn, self._done = 0, False
        return self._observe("", None), {"map": key, "split": split}

    def _next_target(self, rng: np.random.Generator) -> str:
        """Draw the next target from ``rng``; returns its SVG code (the map of envs/splits.py)."""
        kind = self.targets if self.targets != "mixed" else ("icons", "shapes")[int(rng.integers(2))]
        if kind == "icons":
            icon = tabler_icons()[int(rng.integers(len(tabler_icons())))]
            self.target_svg, self.target_name = icon_svg(icon), icon.stem.replace("-", " ")
        else:
            self.target_svg, self.target_name = shapes_svg(rng), ""
        return self.target_svg

    def step(self, llm_text: str) -> tuple[dict, float, bool, bool, dict]:
        if self._done:
            raise RuntimeError("step() after the episode ended (or before reset()); call reset()")
        parsed = parse(llm_text, self.format, action_sep="\x00", max_actions=1,
                       max_chars=4 * MAX_BYTES)
        drawing, why, score, terms = None, "format", 0.0, {}
        if parsed.format_correct:
            drawing, why = self.renderer.render(parsed.answer, self.image_size)
            if drawing is not None:
                score, terms = similarity(self._target, drawing, self.weights, self.perceptual)
        drew = drawing is not None
        fmt = format_reward(parsed, drew, reward=self.format_reward)
        reward = fmt + self.similarity_reward * score
        self._turn += 1
        success = drew and score >= self.success_threshold
        self._done = success or not drew or self._turn >= self.max_turns
        metrics = {"env_reward": self.similarity_reward * score, "format_reward": fmt,
                   "similarity": score, "turn": float(self._turn),
                   **{f"similarity/{k}": v for k, v in terms.items()}}
        if parsed.format_correct and not drew:
            metrics[f"svg_refused/{why}"] = 1.0
        info = {"success": success, "format_correct": parsed.format_correct,
                "actions_valid": drew, "actions": ["svg"] if drew else [], "metrics": metrics}
        feedback = (f"Your answer was not in the required format ({parsed.error})."
                    if not parsed.format_correct else
                    f"Your SVG was not drawn ({why})." if not drew else
                    f"Your SVG is drawn below; similarity to the target {score:.2f}.")
        observation = self._observe(feedback, drawing)
        ended = success or not drew  # a terminal state: the drawing is done, or failed to draw
        return observation, reward, ended, self._done and not ended, info

    def render(self) -> str:
        return self.target_svg

    def close(self) -> None:
        self.renderer.close()

    # -- what the layer above asks ----------------------------------------------------------------
    def system_prompt(self) -> str:
        if self.prompt == "none":
            return ""
        if self.format == "free_think":
            how = ("First think step by step inside <think></think>, then give one SVG document "
                   "inside <answer></answer>.")
            example = f"<think>A black ring in the middle.</think><answer>{EXAMPLE}</answer>"
        else:
            how = "Give one SVG document inside <answer></answer>, with no other text."
            example = f"<answer>{EXAMPLE}</answer>"
        return (f"{TASK}\nAnswer format: {how} Nothing before, between or after the tags.\n"
                f"Example:\n{example}")

    def state_text(self) -> str:
        return ""

    @property
    def has_solver(self) -> bool:
        """The target's own SVG answers it: the warm start demonstrates with it (``demonstrate``)."""
        return True

    def describe_target(self) -> str:
        """A sentence on the target: its shapes and colours, or the icon's name."""
        if self.target_name:
            return f"The {self.target_name} icon, in black outline."
        shapes = re.findall(r'<(circle|rect|line)[^>]*?(?:fill|stroke)="(#[0-9a-f]{6})"', self.target_svg)
        names = {"circle": "circle", "rect": "rectangle", "line": "line"}
        said = [f"{COLOURS[c]} {names[k]}" for k, c in shapes]
        return ", ".join(f"{'an' if x[0] in 'aeiou' else 'a'} {x}" for x in said).capitalize() + "."

    def demonstrate(self, rng: np.random.Generator, noise: float) -> tuple[str, int, int]:
        """A demonstration turn (actors/demonstrations.py): (the answer, how many of its numbers
        were moved, how many numbers it has). The answer is the target's own SVG with each
        number, with probability ``noise``, moved by 1 to 3 (kept in 0-24): a near miss."""
        moved = numbers = 0

        def jitter(m: re.Match) -> str:
            nonlocal moved, numbers
            numbers += 1
            if rng.random() >= noise:
                return m.group()
            moved += 1
            shift = int(rng.integers(1, 4)) * (1 if rng.random() < 0.5 else -1)
            return str(min(24, max(0, round(float(m.group())) + shift)))

        head = self.target_svg.index(">") + 1  # the <svg> element's own size stays
        svg = self.target_svg[:head] + _GEOMETRY_RE.sub(
            lambda m: m[1] + _NUMBER_RE.sub(jitter, m[2]) + m[3], self.target_svg[head:])
        answer = f"<answer>{svg}</answer>"
        if self.format == "free_think":
            answer = f"<think>{self.describe_target()}</think>{answer}"
        return answer, moved, numbers

    def _observe(self, feedback: str, drawing: np.ndarray | None) -> dict:
        header = "The episode is over." if self._done else f"Turn {self._turn + 1} of {self.max_turns}."
        lines, images = [feedback, header, f"The target:\n{IMAGE_PLACEHOLDER}"], [self._target.copy()]
        if drawing is not None:
            lines.append(f"Your drawing:\n{IMAGE_PLACEHOLDER}")
            images.append(drawing)
        if self.blank_images:
            images = blanked(images)
        checked = Observation("\n".join(line for line in lines if line), images)
        return {"text": checked.text, "images": tuple(checked.images)}


make_env = SvgEnv
"""The registry's factory is the class: its signature is the keys a config may hold."""
