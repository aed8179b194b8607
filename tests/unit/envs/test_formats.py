"""Tests of envs/formats.py: the strict parser, the format reward and the prompt sections."""

from __future__ import annotations

import random
import re

import pytest

from envs.formats import FORMATS, STRUCTURED, Parsed, base_format, format_example, format_prompt, format_reward, parse

OBS, REASON, PRED, THINK = "The box is left of me.", "Push it right.", "The box moves right.", "Go on."
TEXT_FIELDS = ("think", "observation", "reasoning", "prediction", "answer")
SECTIONS = {
    "no_think": None,
    "free_think": (),
    "grounding": ("observation", "reasoning"),
    "worldmodeling": ("reasoning", "prediction"),
    "grounding_worldmodeling": ("observation", "reasoning", "prediction"),
}


def build(fmt: str, fields: dict[str, str], sep: str = "") -> str:
    """The text of an answer in ``fmt`` from its fields, with ``sep`` between tags."""
    answer = f"<answer>{fields['answer']}</answer>"
    sections = SECTIONS[fmt]
    if sections is None:
        return answer
    if not sections:
        inner = fields["think"]
    else:
        inner = sep.join(f"<{n}>{sep}{fields[n]}{sep}</{n}>" for n in sections)
    return f"<think>{sep}{inner}{sep}</think>{sep}{answer}"


def example(fmt: str, answer: str = "Up, Left", sep: str = "") -> str:
    fields = {"think": THINK, "observation": OBS, "reasoning": REASON, "prediction": PRED}
    return build(fmt, {**fields, "answer": answer}, sep)


def assert_rejected(p: Parsed) -> None:
    assert isinstance(p, Parsed)
    assert p.format_correct is False
    assert p.actions == []
    assert p.error


# ---------------------------------------------------------------- correct answers


@pytest.mark.parametrize("fmt", FORMATS)
def test_correct_example_gives_exact_fields(fmt):
    p = parse(example(fmt), fmt)
    assert p.format_correct and p.error == "" and not p.truncated
    assert p.actions == ["Up", "Left"]
    assert p.answer == "Up, Left"
    sections = SECTIONS[fmt] or ()
    assert p.observation == (OBS if "observation" in sections else "")
    assert p.reasoning == (REASON if "reasoning" in sections else "")
    assert p.prediction == (PRED if "prediction" in sections else "")
    if fmt == "no_think":
        assert p.think == ""
    elif fmt == "free_think":
        assert p.think == THINK
    else:  # the whole inner text of <think>, sub-tags included
        assert p.think == "".join(f"<{n}>{getattr(p, n)}</{n}>" for n in sections)


def test_grounding_worldmodeling_fields_spelled_out():
    text = (
        "<think><observation>A</observation><reasoning>B</reasoning>"
        "<prediction>C</prediction></think><answer>Right</answer>"
    )
    assert parse(text, "grounding_worldmodeling") == Parsed(
        format_correct=True,
        actions=["Right"],
        think="<observation>A</observation><reasoning>B</reasoning><prediction>C</prediction>",
        observation="A",
        reasoning="B",
        prediction="C",
        answer="Right",
    )


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("other", FORMATS)
def test_each_format_rejects_the_others(fmt, other):
    p = parse(example(other), fmt)
    if fmt == other:
        assert p.format_correct
    else:
        assert_rejected(p)


@pytest.mark.parametrize(
    ("answer", "sep", "actions"),
    [
        ("Up", ",", ["Up"]),
        ("Up,Down", ",", ["Up", "Down"]),
        (" up ,  DOWN ", ",", ["up", "DOWN"]),  # case preserved, whitespace stripped
        ("Up,,Down,", ",", ["Up", "Down"]),  # empty pieces dropped
        ("Up|Left", "|", ["Up", "Left"]),
        ("pick(1,2)|place(3,4)", "|", ["pick(1,2)", "place(3,4)"]),
        ("<svg><rect/></svg>~~x", "~~", ["<svg><rect/></svg>", "x"]),  # other markup is text
        ("Up, Left", "|", ["Up, Left"]),
    ],
)
def test_action_separators(answer, sep, actions):
    p = parse(f"<answer>{answer}</answer>", "no_think", action_sep=sep, max_actions=5)
    assert p.format_correct and p.actions == actions and p.answer == answer.strip()


@pytest.mark.parametrize(
    ("answer", "max_actions", "actions", "truncated"),
    [
        ("A,B,C", 3, ["A", "B", "C"], False),
        ("A,B,C,D,E", 3, ["A", "B", "C"], True),
        ("A,B", 1, ["A"], True),
        ("A,,,B,C,", 3, ["A", "B", "C"], False),  # dropped empties do not count
    ],
)
def test_max_actions_truncates_without_format_error(answer, max_actions, actions, truncated):
    p = parse(f"<answer>{answer}</answer>", "no_think", max_actions=max_actions)
    assert p.format_correct and p.actions == actions and p.truncated is truncated
    assert format_reward(p, actions_valid=True) == 0.5


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("sep", [" ", "\n", "\n\n  \t", "\r\n"])
def test_whitespace_between_tags_and_around_text(fmt, sep):
    p = parse(f"{sep}{example(fmt, 'Up', sep)}{sep}", fmt)
    assert p.format_correct and p.actions == ["Up"]
    assert p.observation in ("", OBS) and p.reasoning in ("", REASON) and p.prediction in ("", PRED)


@pytest.mark.parametrize("end", ["<|im_end|>", "<|endoftext|>", "\n<|im_end|>\n", "  <|endoftext|>"])
def test_trailing_end_token_is_ignored(end):
    p = parse(example("free_think") + end, "free_think")
    assert p.format_correct and p.actions == ["Up", "Left"]


# ---------------------------------------------------------------- malformed answers

MALFORMED = [
    ("no_think", ""),
    ("no_think", "   \n\t "),
    ("no_think", "<|im_end|>"),
    ("no_think", "Up, Left"),
    ("free_think", "<think>x</think>"),  # missing <answer>
    ("free_think", "<answer>Up</answer>"),  # missing <think>
    ("grounding", "<think><observation>a</observation></think><answer>Up</answer>"),  # missing <reasoning>
    ("no_think", "<answer>Up"),  # unclosed
    ("no_think", "Up</answer>"),
    ("free_think", "<think>x</think><answer>Up"),
    ("no_think", "</think><answer>Up</answer>"),  # stray closing tag
    ("free_think", "<think>x</think></think><answer>Up</answer>"),
    ("no_think", "<answer>Up</answer><answer>Down</answer>"),  # repeated
    ("free_think", "<think>a</think><think>b</think><answer>Up</answer>"),
    ("free_think", "<think><think>x</think></think><answer>Up</answer>"),  # nested
    ("no_think", "<answer>Up<answer></answer>"),  # tag inside the answer
    ("no_think", "<answer>Up<think>x</think></answer>"),
    ("grounding", "<think><observation>a<reasoning>b</reasoning></observation></think><answer>Up</answer>"),
    ("free_think", "<think>a<answer>Up</answer></think><answer>Up</answer>"),
    ("no_think", "Sure! <answer>Up</answer>"),  # text before / after / between
    ("no_think", "<answer>Up</answer> done"),
    ("free_think", "<think>x</think> so <answer>Up</answer>"),
    ("grounding", "<think>hm<observation>a</observation><reasoning>b</reasoning></think><answer>Up</answer>"),
    ("grounding", "<think><observation>a</observation>x<reasoning>b</reasoning></think><answer>Up</answer>"),
    ("free_think", "<answer>Up</answer><think>x</think>"),  # wrong order
    ("grounding", "<think><reasoning>b</reasoning><observation>a</observation></think><answer>Up</answer>"),
    ("no_think", "<answer></answer>"),  # empty answer
    ("no_think", "<answer>  \n </answer>"),
    ("no_think", "<answer>, ,,</answer>"),  # no actions
    ("free_think", "<think> </think><answer>Up</answer>"),  # empty sections
    ("grounding", "<think><observation></observation><reasoning>b</reasoning></think><answer>Up</answer>"),
    ("worldmodeling", "<think><reasoning>b</reasoning><prediction>\n</prediction></think><answer>Up</answer>"),
    ("no_think", "<ANSWER>Up</ANSWER>"),  # uppercase tags
    ("no_think", "<Answer>Up</Answer>"),
    ("no_think", "<answer>Up</Answer>"),
    ("free_think", "<THINK>x</THINK><answer>Up</answer>"),
    ("no_think", "<answer>Up</answer><|im_end|><|im_end|>"),  # only one end token tolerated
    ("no_think", "<|im_end|><answer>Up</answer>"),
    ("grounding", example("grounding_worldmodeling")),
    ("no_think", "<answer>" + "Up," * 40_000 + "</answer>"),  # 120 kB
    ("no_think", "<answer>" * 50_000),
]


@pytest.mark.parametrize(("fmt", "text"), MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_is_rejected(fmt, text):
    assert_rejected(parse(text, fmt))


@pytest.mark.parametrize(
    ("fmt", "text", "error"),
    [
        ("free_think", "<think>x</think>", "missing <answer>"),
        ("no_think", "<answer>Up", "missing </answer>"),
        ("grounding", example("grounding_worldmodeling"), "unexpected <prediction> for format grounding"),
        ("no_think", "<answer>Up</answer> done", "text after </answer>"),
        ("no_think", "<answer> </answer>", "empty <answer>"),
        ("no_think", "x" * 20_001, "too long"),
    ],
)
def test_error_messages(fmt, text, error):
    assert parse(text, fmt).error == error


def test_max_chars_is_configurable():
    text = example("no_think")
    assert parse(text, "no_think", max_chars=len(text)).format_correct
    assert parse(text, "no_think", max_chars=len(text) - 1).error == "too long"


def test_programming_errors_raise():
    with pytest.raises(ValueError):
        parse("<answer>Up</answer>", "free-think")
    with pytest.raises(ValueError):
        parse("<answer>Up</answer>", "no_think", action_sep="")
    with pytest.raises(ValueError):
        parse("<answer>Up</answer>", "no_think", max_actions=0)
    with pytest.raises(TypeError):
        parse(b"<answer>Up</answer>", "no_think")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        format_prompt("cot", action_example="Up")


# ---------------------------------------------------------------- fuzz and round trip

NAMES = ("think", "observation", "reasoning", "prediction", "answer")
TAGS = [f"<{n}>" for n in NAMES] + [f"</{n}>" for n in NAMES]
PIECES = TAGS * 3 + [
    "<ANSWER>", "</Think>", "<answer", "answer>", "</", "<", ">", "<>", "</>", "< answer>",
    "<|im_end|>", "<|endoftext|>", "<svg>", "<b>", "<observationx>",
    "Up", "down", "LEFT", "Right", "push(1,2)", ",", "|", "~~", ", ", " ", "\n", "\t", "\r\n",
    "é", "日本語", "🙂", "\u200b", "\x00", "\x1b[31m", "\ufeff", "\ud800", "\\", "'", '"',
]
TAG_RE = re.compile(r"</?([A-Za-z]+)>")
CONTENT = r"((?:(?!</?(?:think|observation|reasoning|prediction|answer)>).)*)"


def reference(text: str, fmt: str, sep: str) -> dict[str, str] | None:
    """A slow, independent oracle: the fields of a correct answer, or None."""
    text = text.strip()
    for end in ("<|im_end|>", "<|endoftext|>"):
        if text.endswith(end):
            text = text[: -len(end)].rstrip()
            break
    if any(m[1].lower() in NAMES and m[1] not in NAMES for m in TAG_RE.finditer(text)):
        return None
    sections = SECTIONS[fmt]
    leaf = lambda n: rf"<{n}>{CONTENT}</{n}>"  # noqa: E731
    parts = [leaf("answer")]
    if sections == ():
        parts.insert(0, leaf("think"))
    elif sections:
        parts.insert(0, r"<think>\s*" + r"\s*".join(leaf(n) for n in sections) + r"\s*</think>")
    m = re.fullmatch(r"\s*".join(parts), text, re.DOTALL)
    if m is None or any(not g.strip() for g in m.groups()):
        return None
    names = (["think"] if sections == () else list(sections or ())) + ["answer"]
    fields = {n: g.strip() for n, g in zip(names, m.groups())}
    if not [a for a in fields["answer"].split(sep) if a.strip()]:
        return None
    return fields


def check(text: str, fmt: str, sep: str, max_actions: int) -> Parsed:
    p = parse(text, fmt, action_sep=sep, max_actions=max_actions)
    assert isinstance(p, Parsed)
    if not p.format_correct:
        assert p.actions == [] and p.error and not p.truncated
        assert all(getattr(p, f) == "" for f in TEXT_FIELDS)
    else:
        assert 1 <= len(p.actions) <= max_actions and p.error == ""
        assert all(a and a == a.strip() and sep not in a for a in p.actions)
    ref = reference(text, fmt, sep)
    assert p.format_correct == (ref is not None), (text, fmt, p.error)
    if ref is not None:
        assert all(getattr(p, n) == v for n, v in ref.items())
    return p


def test_fuzz_random_pieces_never_raise():
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30)))
        check(text, rng.choice(FORMATS), rng.choice([",", "|", "~~"]), rng.randint(1, 4))


def test_fuzz_mutated_valid_answers():
    rng = random.Random(1)
    n_correct = 0
    for _ in range(3000):
        fmt = rng.choice(FORMATS)
        source = fmt if rng.random() < 0.8 else rng.choice(FORMATS)
        pieces = re.split(r"(<[^<>]*>)", example(source, rng.choice(["Up", "Up, Down", "a,b,c,d"])))
        for _ in range(rng.randint(0, 3)):
            i = rng.randrange(len(pieces) + 1)
            op = rng.randrange(3)
            if op == 0:
                pieces.insert(i, rng.choice(PIECES))
            elif op == 1 and i < len(pieces):
                del pieces[i]
            elif i < len(pieces):
                pieces.insert(i, pieces[i])
        n_correct += check("".join(pieces), fmt, ",", 3).format_correct
    assert n_correct > 500  # the oracle comparison covered accepted answers too


def random_content(rng: random.Random, alphabet: str) -> str:
    """Non-empty text without surrounding whitespace (the parser strips it)."""
    body = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
    return rng.choice([c for c in alphabet if not c.isspace()]) + body.strip()


def test_round_trip_random_fields():
    rng = random.Random(2)
    alphabet = "abcXYZ 019.,;:!?'\"/\\()[]{}=&é日本🙂\n\t-_|~"
    for _ in range(2000):
        fmt = rng.choice(FORMATS)
        actions = [random_content(rng, "ABCxyz01 ()") for _ in range(rng.randint(1, 3))]
        fields = {n: random_content(rng, alphabet) for n in ("think", "observation", "reasoning", "prediction")}
        fields["answer"] = " | ".join(actions)
        spacing = rng.choice(["", " ", "\n", "\n\n"])
        p = parse(build(fmt, fields, spacing) + rng.choice(["", "<|im_end|>"]), fmt, action_sep="|")
        assert p.format_correct, p.error
        assert p.actions == [a.strip() for a in actions]
        assert p.answer == fields["answer"]
        sections = SECTIONS[fmt]
        for n in ("observation", "reasoning", "prediction"):
            assert getattr(p, n) == (fields[n] if sections and n in sections else "")
        if sections == ():
            assert p.think == fields["think"]


# ---------------------------------------------------------------- reward and prompt


@pytest.mark.parametrize(
    ("text", "valid", "expected"),
    [
        ("<answer>Up</answer>", True, 0.5),
        ("<answer>Up</answer>", False, 0.0),
        ("<answer>Up", True, 0.0),
        ("<answer></answer>", True, 0.0),
    ],
)
def test_format_reward(text, valid, expected):
    assert format_reward(parse(text, "no_think"), actions_valid=valid) == expected


def test_format_reward_amount_and_no_actions():
    p = parse("<answer>Up</answer>", "no_think")
    assert format_reward(p, True, reward=1.25) == 1.25
    assert format_reward(Parsed(format_correct=True, actions=[]), True) == 0.0


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("action_example", "sep", "max_actions"),
    [("Up, Left", ",", 3), ("pick(1,2,3)|place(4,5,6)", "|", 2)],
)
def test_format_prompt(fmt, action_example, sep, max_actions):
    prompt = format_prompt(fmt, action_example=action_example, action_sep=sep, max_actions=max_actions)
    ex = format_example(fmt, action_example=action_example)
    assert ex in prompt and f'"{sep}"' in prompt and str(max_actions) in prompt
    p = parse(ex, fmt, action_sep=sep, max_actions=max_actions)
    assert p.format_correct and p.answer == action_example
    assert p.actions == [a.strip() for a in action_example.split(sep)]
    pos = -1
    for tag in re.findall(r"</?[a-z]+>", ex):  # every tag of the format, in order
        pos = prompt.find(tag, pos + 1)
        assert pos >= 0, tag
    for other in set(NAMES) - set(re.findall(r"<([a-z]+)>", ex)):
        assert f"<{other}>" not in prompt


@pytest.mark.parametrize("fmt", STRUCTURED)
def test_a_structured_format_has_its_base_formats_tags(fmt):
    base = base_format(fmt)
    assert base + "_structured" == fmt and base in FORMATS
    example = format_example(fmt, action_example="pick(1,2,3)")
    assert example == format_example(base, action_example="pick(1,2,3)")
    assert parse(example, fmt, action_sep="|") == parse(example, base, action_sep="|")
    assert format_prompt(fmt, action_example="a") == format_prompt(base, action_example="a")


def test_structured_variants_exist_only_for_formats_that_describe_the_state():
    assert STRUCTURED == ("grounding_structured", "worldmodeling_structured",
                          "grounding_worldmodeling_structured")
    with pytest.raises(ValueError, match="unknown format"):
        base_format("free_think_structured")
