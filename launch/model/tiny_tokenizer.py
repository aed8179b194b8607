"""Tiny byte-level BPE tokenizer trained offline, with a Qwen-style (ChatML) chat template.

Called by `launch.model.tiny_model` (which saves it next to the weights); nothing here touches the
network. Invariants:
- byte-level BPE, so every string (any unicode) encodes. The pipeline is exactly the one
  transformers 5 rebuilds for `model_type` qwen2 (it forces `Qwen2Tokenizer`, whose normaliser is
  NFC, whatever tokenizer.json says), so every loader gives the same ids: text round-trips
  exactly when it is NFC-normalised, else `decode(encode(s)) == unicodedata.normalize("NFC", s)`;
- ids are laid out Qwen-style: the learned BPE vocabulary first, then the added tokens in
  `ADDED_TOKENS` order, so `len(tokenizer) == vocab_size` exactly;
- `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` and the vision tokens are special (dropped by
  `skip_special_tokens=True`); the reasoning tags are atomic added tokens that are NOT special, so
  they survive vLLM's default detokenisation (Qwen3 does the same with `<think>`); so is each
  relation of the state text (" is directly above the player"): a relation sentence is 4 tokens
  ("The", " hole", the relation, "."), not 12, which halves the model's part of an episode;
- every cell of a symbol grid is its own token: no learned token holds two grid symbols
  (`GRID_SYMBOLS`) or a grid symbol and a line break, so "PO__" is P, O, _, _ and a model reads
  positions cell by cell, as a word-level vocabulary would (merged pairs like "PO" or "__" hide
  where the player is);
- the same seed and sizes give a byte-identical `tokenizer.json`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

from envs.relations import PHRASES

if TYPE_CHECKING:
    import tokenizers
    from transformers import PreTrainedTokenizerBase

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
REASONING_TAGS = tuple(
    f"<{slash}{name}>"
    for name in ("think", "answer", "observation", "reasoning", "prediction")
    for slash in ("", "/")
)
# Every relation the grid envs' state text states ("The hole is below and to the right of the
# player."), as one token: a relation is one choice of the model, not a run of words to spell.
RELATION_TOKENS = tuple(f" is {phrase} the player" for phrase in PHRASES.values())
ADDED_TOKENS = SPECIAL_TOKENS + VISION_TOKENS + REASONING_TAGS + RELATION_TOKENS
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Qwen2's pre-tokeniser split: single digits, words with one leading non-letter, punctuation runs.
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML. String content renders as is; list content (VL style) renders text items and turns each
# {"type": "image"} / {"type": "video"} item into its vision placeholder. No default system prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'video' -%}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)

_WORDS = """
player box target wall hole goal start frozen lake ice floor empty grid map row column cell
Up Down Left Right up down left right above below left of right of next to on at in the a an is
are you your must push pull reach avoid fall falling into onto all boxes targets holes walls
step steps move moves action actions reward observation state position current previous after
before then now turn episode game puzzle level solve solved success failed done valid invalid
answer think reasoning prediction output format only one each every should can will may not
and or if when where which what there this that with from by for as it its be been has have
Sokoban FrozenLake symbol symbols means represents legend coordinate coordinates distance
nearest blocked free path route north south east west please choose select final Please You
Your The A If When After Before Then Now Answer Think Observation Reward Action Valid
directly same place toward keep off so I executed Executed Turn turns give order edge leaves
walking Reach without Moving safe fallen top per player assistant user system
""".split()
GRID_SYMBOLS = ("P", "_", "#", "O", "G", "X", "√", "S", "F", "H", ".", "@", "$", "*", "+")
"""The cell symbols of the grid envs' text observations (and common others): never merged."""
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "bo", "da", "fu", "gi", "he",
              "ju", "pa", "qi", "ro", "su", "ty", "wo", "xe", "yu", "cha", "sh", "th", "st", "er")


def synthetic_corpus(seed: int, n_lines: int = 3000) -> list[str]:
    """Grid-puzzle prompts, sentences, digits and seed-made pseudo-words. Deterministic in `seed`."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        kind = i % 5
        if kind == 0:  # a grid, with or without separators
            sep = rng.choice(("", " ", ", "))
            rows = [sep.join(rng.choice(GRID_SYMBOLS[:7]) for _ in range(rng.randint(3, 8)))
                    for _ in range(rng.randint(3, 8))]
            lines.append("\n".join(rows))
        elif kind == 1:  # a sentence about positions, as the grid envs' state text words them
            a = rng.choice(_WORDS[:12])
            lines.append(f"The {a} is {rng.choice(list(PHRASES.values()))} the player.")
        elif kind == 2:  # free word salad, sometimes under a chat role (as the template writes it)
            words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 20)))
            role = rng.choice(("", "system\n", "user\n", "assistant\n"))
            lines.append(role + words)
        elif kind == 3:  # action lists and rewards
            acts = ", ".join(rng.choice(("Up", "Down", "Left", "Right")) for _ in range(rng.randint(1, 5)))
            lines.append(f"Action: {acts}\nReward: {rng.uniform(-1, 10):.2f}\nStep {rng.randint(0, 99)}")
        else:  # pseudo-words: make the learned merges (and the ids) depend on the seed
            lines.append(" ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
                                  for _ in range(rng.randint(3, 10))))
    return lines


def train_tokenizer(seed: int = 0, vocab_size: int = 1024) -> tokenizers.Tokenizer:
    """Trains byte-level BPE on `synthetic_corpus(seed)`; returns a tokenizer of exactly `vocab_size`."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    n_bpe = vocab_size - len(ADDED_TOKENS)
    if n_bpe < 256:
        raise ValueError(f"vocab_size must be >= {256 + len(ADDED_TOKENS)}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    # Learn more merges than needed, drop those that join grid cells, keep the first n_bpe tokens.
    # The corpus grows with the vocabulary so that BPE finds enough merges (2 lines per token).
    learned = n_bpe + _MERGE_SLACK
    trainer = BpeTrainer(
        vocab_size=learned, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(synthetic_corpus(seed, n_lines=max(3000, 2 * learned)), trainer)
    tok = _without_grid_merges(tok, n_bpe)
    if tok.get_vocab_size() != n_bpe:
        raise RuntimeError(f"corpus too small: learned {tok.get_vocab_size()} of {n_bpe} BPE tokens")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in SPECIAL_TOKENS + VISION_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in REASONING_TAGS + RELATION_TOKENS])
    return tok


_MERGE_SLACK = 512


def _joins_cells(text: str) -> bool:
    """Whether a learned token's text holds two grid symbols, or one and a line break. Partial
    bytes of a multi-byte symbol ("√") decode as U+FFFD and count as a symbol, so "√" itself may
    form but never "_" + part of it."""
    cells = sum(c in GRID_SYMBOLS or c == "\ufffd" for c in text)
    return cells >= 2 or (cells == 1 and "\n" in text)


def _without_grid_merges(tok: tokenizers.Tokenizer, n_bpe: int) -> tokenizers.Tokenizer:
    """`tok` with every token that joins grid cells (and every merge that needs one) removed, cut
    to its first `n_bpe` tokens in learned order and re-numbered."""
    from tokenizers import Tokenizer

    state = json.loads(tok.to_str())
    vocab, merges = state["model"]["vocab"], state["model"]["merges"]
    kept = [t for t in sorted(vocab, key=vocab.get)
            if len(t) == 1 or not _joins_cells(tok.decoder.decode([t]))][:n_bpe]
    known = set(kept)
    state["model"]["vocab"] = {t: i for i, t in enumerate(kept)}
    state["model"]["merges"] = [m for m in merges if m[0] in known and m[1] in known
                                and m[0] + m[1] in known]
    return Tokenizer.from_str(json.dumps(state))


def build_tokenizer(
    seed: int = 0, vocab_size: int = 1024, model_max_length: int = 4096
) -> PreTrainedTokenizerBase:
    """The trained tokenizer wrapped for transformers, with EOS/PAD and the chat template set."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(seed, vocab_size),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        # So that `all_special_ids` (used by convert_ids_to_tokens(skip_special_tokens=True)) agrees
        # with the special flags in tokenizer.json.
        extra_special_tokens=[t for t in SPECIAL_TOKENS + VISION_TOKENS if t not in (EOS_TOKEN, PAD_TOKEN)],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(
    out_dir: str | Path, seed: int = 0, vocab_size: int = 1024, model_max_length: int = 4096
) -> PreTrainedTokenizerBase:
    """Builds the tokenizer and writes it (tokenizer.json, config, chat template) into `out_dir`."""
    tokenizer = build_tokenizer(seed, vocab_size, model_max_length)
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer
