"""launch.model.tiny_model / tiny_tokenizer: the offline tiny model loads with transformers, is
deterministic, and its tokenizer keeps the invariants the rollout code relies on."""

import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from envs.relations import HORIZONTAL, VERTICAL, describe, parse_relations
from launch.model.tiny_model import build_tiny_model
from launch.model.tiny_tokenizer import (
    GRID_SYMBOLS,
    REASONING_TAGS,
    RELATION_TOKENS,
    SPECIAL_TOKENS,
    VISION_TOKENS,
)


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("text"), seed=0)


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("vl"), vision=True, seed=0)


@pytest.fixture(scope="module")
def tokenizer(text_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(text_dir)


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_help_does_not_import_torch():
    code = "import sys, launch.model.tiny_model; assert not {'torch', 'transformers'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])


def test_transformers_loads_text_model(text_dir, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

    model = AutoModelForCausalLM.from_pretrained(text_dir)
    assert isinstance(model, Qwen2ForCausalLM)
    assert len(tokenizer) == model.config.vocab_size == 1024
    ids = tokenizer("The player is left of the box.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 1024) and logits.dtype == torch.float32


def test_same_seed_is_byte_identical_other_seed_differs(text_dir, tmp_path):
    from safetensors.numpy import load_file

    again = build_tiny_model(tmp_path / "again", seed=0)
    assert _files(again) == _files(text_dir)
    other = build_tiny_model(tmp_path / "other", seed=1)
    w0, w1 = load_file(text_dir / "model.safetensors"), load_file(other / "model.safetensors")
    assert w0.keys() == w1.keys()
    random_init = [k for k in w0 if np.unique(w0[k]).size > 1]  # not the zero biases, unit norms
    assert len(random_init) > len(w0) // 2
    assert not any(np.array_equal(w0[k], w1[k]) for k in random_init)


def test_reasoning_tags_are_atomic_and_survive_skip_special_tokens(tokenizer):
    for tag in REASONING_TAGS:
        ids = tokenizer.encode(tag, add_special_tokens=False)
        assert len(ids) == 1, tag
        assert tokenizer.decode(ids, skip_special_tokens=True) == tag
        assert tokenizer.convert_ids_to_tokens(ids, skip_special_tokens=True) == [tag]
    text = "<think>box is left</think><answer>Left</answer>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_a_state_sentence_is_four_tokens_with_the_relation_as_one(tokenizer):
    # Every (vertical, horizontal) relation of an object to the player, as envs.relations says it.
    player = (1, 1)
    objects = [("hole", (1 + dr, 1 + dc)) for dr in (-1, 0, 1) for dc in (-1, 0, 1)]
    text = describe(player, objects)
    assert len(parse_relations(text)) == len(VERTICAL) * len(HORIZONTAL)
    ids = tokenizer.encode(text, add_special_tokens=False)
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert len(ids) == 4 * len(objects)  # "The", " hole", the relation, "."
    assert sorted(tokens[2::4]) == sorted(RELATION_TOKENS)
    assert tokenizer.decode(ids) == text
    # Inside other text (the demonstrations' reasoning sentence) the relation is still one token.
    reasoning = "The goal is directly below the player, so I move toward it."
    ids = tokenizer.encode(reasoning, add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids(" is directly below the player") in ids
    assert tokenizer.decode(ids) == reasoning


def test_chat_tokens_are_special_and_im_end_is_eos(tokenizer, text_dir):
    from transformers import AutoConfig, GenerationConfig

    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == im_end
    assert AutoConfig.from_pretrained(text_dir).eos_token_id == im_end
    assert GenerationConfig.from_pretrained(text_dir).eos_token_id == im_end
    assert set(tokenizer.all_special_tokens) == set(SPECIAL_TOKENS + VISION_TOKENS)
    for tok in SPECIAL_TOKENS + VISION_TOKENS:
        ids = tokenizer.encode(f"a{tok}b", add_special_tokens=False)
        assert tokenizer.convert_tokens_to_ids(tok) in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == "ab"
        assert tokenizer.convert_ids_to_tokens(ids, skip_special_tokens=True) == ["a", "b"]


def test_chat_template_renders_chatml(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Move?"},
        {"role": "assistant", "content": "<answer>Up</answer>"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Now?"}]},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nMove?<|im_end|>\n"
        "<|im_start|>assistant\n<answer>Up</answer><|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Now?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False)
    assert no_prompt.endswith("Move?<|im_end|>\n")


UNICODE = [
    "", "P _ # O G X √\nP_#OGX√", "héllo wörld, naïve café", "世界 こんにちは 한국어",
    "emoji 🚀🤖👍🏽 family 👨‍👩‍👧", "مرحبا שלום", "tabs\tand\r\nCRLF  double  spaces ",
    "\x00\x01\x7f\ufeff\U0010ffff", "<think> spaced </ think> <|im_start|",
]


@pytest.mark.parametrize("text", UNICODE)
def test_any_unicode_round_trips(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_non_nfc_text_decodes_to_its_nfc_form(tokenizer):
    # transformers 5 loads qwen2 tokenizers as Qwen2Tokenizer, whose normaliser is NFC (see tiny_tokenizer).
    text = "e\u0301 combining acute, \u212b angstrom sign"
    assert tokenizer.decode(tokenizer.encode(text)) == unicodedata.normalize("NFC", text)


def test_every_loader_gives_the_same_ids(text_dir, vl_dir, tokenizer):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    vl_tokenizer = AutoTokenizer.from_pretrained(vl_dir)
    raw = Tokenizer.from_file(str(text_dir / "tokenizer.json"))
    for text in UNICODE + ["<|im_start|>user\n<think>a</think><|im_end|>", "e\u0301"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert vl_tokenizer.encode(text, add_special_tokens=False) == ids
        assert raw.encode(text, add_special_tokens=False).ids == ids


def test_vl_model_and_processor_load_and_expand_images(vl_dir):
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor, Qwen2VLForConditionalGeneration

    processor = AutoProcessor.from_pretrained(vl_dir)
    model = AutoModelForImageTextToText.from_pretrained(vl_dir)
    assert isinstance(model, Qwen2VLForConditionalGeneration)
    content = [{"type": "image"}, {"type": "text", "text": "Where is the box?"}]
    messages = [{"role": "user", "content": content}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.count("<|image_pad|>") == 1
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    rng = np.random.default_rng(0)
    # 56x84 is a multiple of 28 (patch 14 x merge 2): a (2 x 3) grid of merged patches = 6 tokens.
    # 480x640 exceeds max_image_pixels and is shrunk to at most 64 tokens.
    for (h, w), expected in (((56, 84), 6), ((480, 640), None)):
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        inputs = processor(text=[prompt], images=[image], return_tensors="pt")
        n_pad = int((inputs["input_ids"] == pad).sum())
        assert n_pad == int(inputs["image_grid_thw"].prod()) // 4
        assert n_pad == expected if expected else 0 < n_pad <= 64
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], model.config.text_config.vocab_size)


def test_every_grid_cell_is_its_own_token(tokenizer):
    """Envs' symbol grids tokenise cell by cell (what a tiny policy needs to see positions), while
    ordinary words still merge."""
    import envs

    rng = np.random.default_rng(0)
    grids = ["P_OG\nX√__\n", "#_S√\nPX__\n#O##"]
    for name in ("frozenlake", "sokoban"):
        env = envs.make(name, **envs.registry.load_config(name))
        grids += [env.reset(seed=int(s))[0]["text"] for s in rng.integers(0, 10**6, 3)]
    for text in grids:
        for line in text.splitlines():
            if line and set(line) <= set(GRID_SYMBOLS):
                pieces = [tokenizer.decode([i]) for i in tokenizer.encode(line + "\n")]
                assert pieces == [*line, "\n"], (line, pieces)
    assert len(tokenizer.encode(" the player is below the goal")) == 6


def test_command_line_takes_the_model_groups_names(tmp_path, capsys):
    """``--build-seed`` is ``model.build_seed``: the same weights as the run builds."""
    import torch
    from safetensors.torch import load_file

    from launch.model.tiny_model import build_tiny_model, main

    main(["--out", str(tmp_path / "cli"), "--build-seed", "3"])
    assert "parameters" in capsys.readouterr().out
    cli = load_file(tmp_path / "cli" / "model.safetensors")
    run = load_file(build_tiny_model(tmp_path / "run", seed=3) / "model.safetensors")
    other = load_file(build_tiny_model(tmp_path / "other", seed=4) / "model.safetensors")
    assert cli.keys() == run.keys() and all(torch.equal(cli[k], run[k]) for k in cli)
    assert any(not torch.equal(cli[k], other[k]) for k in cli)
