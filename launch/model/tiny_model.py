"""Builds a tiny, randomly initialised Hugging Face model directory that needs no network.

`python -m launch.model.tiny_model --out DIR [--vision] [--build-seed N]`, or `build_tiny_model(...)`
from tests and other code. The directory loads from its path with transformers (`AutoTokenizer`,
`AutoModelForCausalLM` / `AutoModelForImageTextToText`, `AutoProcessor`) and with `vllm.LLM`.

- text: `Qwen2ForCausalLM`; vision: `Qwen2VLForConditionalGeneration` with a tiny vision tower
  and the `Qwen2VLProcessor` files (`launch.model.tiny_processor`). Building needs no torchvision;
  loading the processor (transformers or vLLM) needs an importable one: on CPU machines the
  install step runs `launch.tools.patch_torchvision`;
- tokenizer from `launch.model.tiny_tokenizer` (byte-level BPE, ChatML template, `<|im_end|>` = EOS);
- weights in float32 (exact HF/vLLM comparisons), initialised from `seed` without touching the
  caller's torch RNG state;
- deterministic: the same seed and sizes give byte-identical files; another seed other weights.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from launch.model.tiny_processor import MERGE_SIZE, PATCH_SIZE, TEMPORAL_PATCH_SIZE, save_processor_files
from launch.model.tiny_tokenizer import save_tokenizer


@dataclass(frozen=True)
class TinySizes:
    """Model sizes. Defaults fit CPU tests; head_dim = hidden_size / num_heads must be a head size
    vLLM's CPU attention accepts (32, 64, 80, 96, 112, 128, ...)."""

    vocab_size: int = 1024
    """Tokenizer length and embedding rows (learned BPE + 17 added tokens)."""
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 4096
    vision_depth: int = 2
    """Vision tower blocks (VL only)."""
    vision_embed_dim: int = 64
    """Vision tower width; vision head_dim = vision_embed_dim / vision_num_heads (VL only)."""
    vision_num_heads: int = 2
    max_image_pixels: int = 28 * 28 * 64
    """Images are resized to at most this many pixels: at most 64 `<|image_pad|>` tokens."""
    tie_word_embeddings: bool = False
    """Untied by default: a random tied model mostly repeats its last input token."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("hidden_size % num_heads and num_heads % num_kv_heads must be 0")
        if (self.hidden_size // self.num_heads) % 8:
            raise ValueError("head_dim must be a multiple of 8 (M-RoPE sections)")
        if self.vision_embed_dim % self.vision_num_heads:
            raise ValueError("vision_embed_dim % vision_num_heads must be 0")


def _text_kwargs(sizes: TinySizes, ids: dict[str, int]) -> dict:
    return dict(
        vocab_size=sizes.vocab_size,
        hidden_size=sizes.hidden_size,
        intermediate_size=sizes.intermediate_size,
        num_hidden_layers=sizes.num_layers,
        num_attention_heads=sizes.num_heads,
        num_key_value_heads=sizes.num_kv_heads,
        max_position_embeddings=sizes.max_position_embeddings,
        rope_theta=10000.0,
        bos_token_id=None,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )


def _text_config(sizes: TinySizes, ids: dict[str, int]):
    from transformers import Qwen2Config

    tie = sizes.tie_word_embeddings
    return Qwen2Config(**_text_kwargs(sizes, ids), tie_word_embeddings=tie, dtype="float32")


def _vl_config(sizes: TinySizes, ids: dict[str, int]):
    from transformers import Qwen2VLConfig

    # M-RoPE splits the head_dim / 2 rotary frequencies over (t, h, w): 128 -> [16, 24, 24] as in Qwen2-VL.
    half = sizes.hidden_size // sizes.num_heads // 2
    mrope_section = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]
    text = _text_kwargs(sizes, ids) | dict(
        rope_scaling={"type": "mrope", "mrope_section": mrope_section, "rope_theta": 10000.0},
    )
    vision = dict(
        depth=sizes.vision_depth,
        embed_dim=sizes.vision_embed_dim,
        num_heads=sizes.vision_num_heads,
        hidden_size=sizes.hidden_size,
        mlp_ratio=2,
        patch_size=PATCH_SIZE,
        spatial_merge_size=MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
    )
    return Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=sizes.tie_word_embeddings,
        dtype="float32",
    )


def build_tiny_model(out_dir: str | Path, *, vision: bool = False, seed: int = 0, **sizes) -> Path:
    """Writes the model, tokenizer (and processor for `vision`) into `out_dir`; returns its path.

    `sizes` are `TinySizes` fields. Overwrites files of the same names already in `out_dir`.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, GenerationConfig


    spec = TinySizes(**sizes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(
        out, seed=seed, vocab_size=spec.vocab_size, model_max_length=spec.max_position_embeddings
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in tokenizer.get_added_vocab()}
    config = _vl_config(spec, ids) if vision else _text_config(spec, ids)
    auto_cls = AutoModelForImageTextToText if vision else AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto_cls.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]
    )
    model.save_pretrained(out)
    if vision:
        save_processor_files(out, max_pixels=spec.max_image_pixels)
    (out / "tiny_model.json").write_text(
        json.dumps({"seed": seed, "vision": vision, **asdict(spec)}, indent=2, sort_keys=True) + "\n"
    )
    return out


def count_parameters(model_dir: str | Path) -> int:
    """Number of stored parameters (tied embeddings counted once)."""
    from safetensors import safe_open

    with safe_open(str(Path(model_dir) / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m launch.model.tiny_model", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    # The run's model group, same names: --vision is model.vision, --build-seed model.build_seed.
    parser.add_argument("--vision", action="store_true", help="model.vision: a tiny Qwen2-VL instead of Qwen2")
    parser.add_argument("--build-seed", type=int, default=0,
                        help="model.build_seed: seeds the tokenizer corpus and the weights")
    for name, field in TinySizes.__dataclass_fields__.items():
        flag = f"--{name.replace('_', '-')}"
        if field.type == "bool":
            parser.add_argument(flag, action="store_true", dest=name)
        else:
            parser.add_argument(flag, type=int, default=field.default, dest=name, metavar="N",
                                help=f"default {field.default}")
    args = vars(parser.parse_args(argv))
    out, vision, seed = args.pop("out"), args.pop("vision"), args.pop("build_seed")
    path = build_tiny_model(out, vision=vision, seed=seed, **args)
    print(f"wrote {path} ({count_parameters(path):,} parameters)")


if __name__ == "__main__":
    main()
