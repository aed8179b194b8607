"""Reasoning formats of the agent's answers: the strict parser, the format reward, prompt sections.

Called by every env (envs.frozenlake, envs.sokoban, envs.navigation, envs.primitive_skill, envs.svg): ``parse``
and ``format_reward`` from ``Env.step``, ``format_prompt`` from ``Env.system_prompt``. Stdlib only.

A format is a fixed sequence of tags (the five ``FORMATS``, e.g. ``grounding`` is
``<think><observation>…</observation><reasoning>…</reasoning></think><answer>…</answer>``, and
the ``STRUCTURED`` variants of the three with an <observation> or <prediction>).
Invariants of ``parse``:
- Strict: after stripping surrounding whitespace and at most one trailing ``<|im_end|>`` or
  ``<|endoftext|>``, the text is exactly the format's tag sequence, with only whitespace between
  tags and non-whitespace text inside every innermost section (an empty ``<observation>`` would
  earn the format reward without the work). The answer must give at least one action.
- Tags are the five names in lowercase; the same names in any other case (``<Answer>``) are
  errors, never text. Any other angle-bracket text (``<svg>`` markup in an answer) is plain text.
- ``format_correct`` False implies ``actions == []`` and all text fields empty.
- More than ``max_actions`` actions is not an error: the first ``max_actions`` are kept and
  ``truncated`` is set, so the env can report it.
- Never raises for a ``str``; linear time: one bounded-regex scan for tags, then one comparison.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# format -> the sections inside <think> (None: no <think> at all; (): free text inside <think>).
_THINK_SECTIONS: dict[str, tuple[str, ...] | None] = {
    "no_think": None,
    "free_think": (),
    "grounding": ("observation", "reasoning"),
    "worldmodeling": ("reasoning", "prediction"),
    "grounding_worldmodeling": ("observation", "reasoning", "prediction"),
}
FORMATS: tuple[str, ...] = tuple(_THINK_SECTIONS)
STRUCTURED: tuple[str, ...] = tuple(f"{name}_structured" for name in FORMATS[2:])
"""VAGEN's structured variants of the grounding formats: the same tags, but <observation> and
<prediction> state the state as a dict (``{'red_cube': (x, y, z), ...}``), which VAGEN found best
for manipulation. The env says which keys (envs/grid_env.py); the parser checks the tags only."""
_THINK_SECTIONS.update({name: _THINK_SECTIONS[name.removesuffix("_structured")]
                        for name in STRUCTURED})
ALL_FORMATS: tuple[str, ...] = FORMATS + STRUCTURED


def base_format(format: str) -> str:
    """The five-format name whose tags ``format`` uses (itself, or without ``_structured``)."""
    _check_format(format)
    return format.removesuffix("_structured")

_TAG_NAMES = frozenset({"think", "observation", "reasoning", "prediction", "answer"})
# Names are at most 11 letters ("observation"), so each match attempt is bounded: linear scan.
_TAG_RE = re.compile(r"<(/?)([A-Za-z]{1,11})>")
_END_TOKENS = ("<|im_end|>", "<|endoftext|>")


@dataclass(frozen=True)
class Parsed:
    """The result of parsing one model answer; text fields are stripped of whitespace."""

    format_correct: bool
    actions: list[str]
    """The actions as written, at most ``max_actions``; [] whenever ``format_correct`` is False."""
    think: str = ""
    """Inner text of <think>; for structured formats the whole inner text, sub-tags included."""
    observation: str = ""
    reasoning: str = ""
    prediction: str = ""
    answer: str = ""
    """Raw inner text of <answer>, before splitting into actions."""
    error: str = ""
    """A short reason when ``format_correct`` is False, e.g. "missing <answer>"."""
    truncated: bool = False
    """The answer gave more than ``max_actions`` actions; only the first ones were kept."""


def _check_format(format: str) -> tuple[str, ...] | None:
    if format not in _THINK_SECTIONS:
        raise ValueError(f"unknown format {format!r}; expected one of {ALL_FORMATS}")
    return _THINK_SECTIONS[format]


def _expected_tags(format: str) -> list[str]:
    sections = _check_format(format)
    tags = []
    if sections is not None:
        tags.append("<think>")
        for name in sections:
            tags += [f"<{name}>", f"</{name}>"]
        tags.append("</think>")
    return tags + ["<answer>", "</answer>"]


def _fail(error: str) -> Parsed:
    return Parsed(format_correct=False, actions=[], error=error)


def _mismatch(got: str, want: str, format: str) -> str:
    if got.strip("</>") not in {t.strip("</>") for t in _expected_tags(format)}:
        return f"unexpected {got} for format {format}"
    return f"expected {want}, got {got}"


def _stray_text(tags: list[str], i: int) -> str:
    if i == 0:
        return f"text before {tags[0]}"
    if i == len(tags):
        return f"text after {tags[-1]}"
    return f"text between {tags[i - 1]} and {tags[i]}"


def parse(
    text: str,
    format: str,
    *,
    action_sep: str = ",",
    max_actions: int = 3,
    max_chars: int = 20_000,
) -> Parsed:
    """Parse a model answer strictly against ``format``; see the module docstring for the rules.

    Raises ValueError for an unknown ``format`` or bad settings, TypeError for a non-str ``text``;
    any str, however malformed, gives a ``Parsed`` (``format_correct=False`` with an ``error``).
    """
    expected = _expected_tags(format)
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if not action_sep or max_actions < 1:
        raise ValueError(f"bad action_sep {action_sep!r} or max_actions {max_actions}")
    if len(text) > max_chars:
        return _fail("too long")
    text = text.strip()
    for end in _END_TOKENS:
        if text.endswith(end):
            text = text[: -len(end)].rstrip()
            break
    if not text:
        return _fail("empty")

    # Tokenize: tags of our names, and the gaps of text around them (len(gaps) == len(tags) + 1).
    tags: list[str] = []
    spans: list[tuple[int, int]] = []
    gaps: list[str] = []
    pos = 0
    for m in _TAG_RE.finditer(text):
        name = m.group(2)
        if name.lower() not in _TAG_NAMES:
            continue  # not one of ours: plain text
        if name not in _TAG_NAMES:
            return _fail(f"malformed tag {m.group(0)}")
        tag, i = m.group(0), len(tags)
        if i == len(expected):
            return _fail(f"unexpected {tag} after </answer>")
        if tag != expected[i]:
            return _fail(_mismatch(tag, expected[i], format))
        gaps.append(text[pos : m.start()])
        tags.append(tag)
        spans.append(m.span())
        pos = m.end()
    gaps.append(text[pos:])
    if len(tags) < len(expected):
        return _fail(f"missing {expected[len(tags)]}")

    fields: dict[str, str] = {}
    for i, gap in enumerate(gaps):
        # An innermost section: an opening tag directly followed by its own closing tag.
        if 0 < i < len(tags) and tags[i] == "</" + tags[i - 1][1:]:
            name = tags[i][2:-1]
            if not gap.strip():
                return _fail(f"empty <{name}>")
            fields[name] = gap.strip()
        elif gap.strip():
            return _fail(_stray_text(tags, i))

    if format not in ("no_think", "free_think"):
        # Raw inner text of <think>: from the end of <think> (tag 0) to the start of </think>.
        fields["think"] = text[spans[0][1] : spans[len(expected) - 3][0]].strip()
    actions = [a.strip() for a in fields["answer"].split(action_sep)]
    actions = [a for a in actions if a]
    if not actions:
        return _fail("no actions in <answer>")
    return Parsed(
        format_correct=True,
        actions=actions[:max_actions],
        truncated=len(actions) > max_actions,
        **fields,
    )


def format_reward(parsed: Parsed, actions_valid: bool, *, reward: float = 0.5) -> float:
    """``reward`` when the format is correct and every (>= 1) action was valid, else 0.0."""
    return reward if parsed.format_correct and actions_valid and parsed.actions else 0.0


_EXAMPLE_TEXT = {
    "think": "The target is below and to the right of me, so I move toward it.",
    "observation": "The player is at the top left; the target is below and to the right of it.",
    "reasoning": "I should move toward the target without stepping onto an obstacle.",
    "prediction": "The player will be closer to the target, still below and to the right of it.",
}
_SECTION_HELP = {
    "observation": "describe the current state you observe",
    "reasoning": "reason about what to do",
    "prediction": "predict the state after your actions",
}


def _fill(format: str, contents: dict[str, str]) -> str:
    sections = _check_format(format)
    answer = f"<answer>{contents['answer']}</answer>"
    if sections is None:
        return answer
    if not sections:
        return f"<think>{contents['think']}</think>{answer}"
    inner = "".join(f"<{name}>{contents[name]}</{name}>" for name in sections)
    return f"<think>{inner}</think>{answer}"


def format_example(format: str, *, action_example: str) -> str:
    """A correct answer in ``format`` (it parses as correct) whose answer is ``action_example``."""
    return _fill(format, {**_EXAMPLE_TEXT, "answer": action_example})


def format_prompt(
    format: str, *, action_example: str, action_sep: str = ",", max_actions: int = 3
) -> str:
    """The system-prompt section describing ``format``, with the example of ``format_example``."""
    return (
        f"{_how(format, 'your actions')}"
        f'In <answer>, give 1 to {max_actions} actions separated by "{action_sep}"; '
        f"actions after the first {max_actions} are ignored.\n"
        f"Example:\n{format_example(format, action_example=action_example)}"
    )


def answer_prompt(format: str, *, answer_is: str, example: str) -> str:
    """The system-prompt section describing ``format`` for an env whose answer is free text, one
    answer a turn (envs/text_env.py): ``answer_is`` says what goes inside <answer> ("your move,
    written as the game asks"), ``example`` is an answer's text for the example reply."""
    return f"{_how(format, answer_is)}Example:\n{format_example(format, action_example=example)}"


def _how(format: str, what: str) -> str:
    """The format's instructions and its template, ``what`` going inside <answer>."""
    sections = _check_format(format)
    if sections is None:
        how = f"Give only {what} inside <answer></answer>, with no other text."
    elif not sections:
        how = f"First think step by step inside <think></think>, then give {what}"
        how += " inside <answer></answer>."
    else:
        steps = "; then ".join(f"{_SECTION_HELP[n]} in <{n}></{n}>" for n in sections)
        how = f"Inside <think></think>, first {steps}."
        how += f" Then give {what} inside <answer></answer>."
    template = _fill(format, {**{name: "..." for name in _EXAMPLE_TEXT}, "answer": "..."})
    return (
        f"Answer format: {how}\n"
        f"Your whole reply must be exactly:\n{template}\n"
        f"with nothing before, between or after the tags, and no section left empty. "
    )
