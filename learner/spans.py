"""Which policy tokens lie inside given tags of the model's answers, e.g. everything from
``<observation>`` to ``</observation>``: the tokens a KL term restricted to parts of the answer
(``kl_loss.tags``) acts on.

Called by learner/trainer.py. Works on token ids alone, through the text of each vocabulary entry
(``pieces``), so a tag may be one added token (the tiny tokenizer) or several BPE tokens (a hub
model's "<", "observation", ">"): each turn's policy tokens (a maximal run of ``loss_mask``) are
joined into text, the tagged spans found in it, and every token whose text overlaps a span is in
the mask.

Invariants: the mask is a subset of ``loss_mask``; a span never crosses from one turn into the
next; an opening tag that is never closed runs to the end of its turn (the model stopped inside
it); text outside every span (the answer, other sections, the end-of-turn token) is not masked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import torch


class TagSpans:
    """The token mask of the spans ``<tag> ... </tag>`` for tags in ``tags``."""

    def __init__(self, pieces: Sequence[str], tags: Sequence[str]) -> None:
        check_tags(tags)
        self.pieces = list(pieces)
        self.piece_lengths = np.array([len(p) for p in self.pieces], dtype=np.int64)
        names = "|".join(re.escape(t) for t in tags)
        # From an opening tag to its closing tag, or to the end of the turn's text.
        self._span = re.compile(rf"<({names})>.*?(?:</\1>|\Z)", re.DOTALL)

    @classmethod
    def from_tokenizer(cls, tokenizer, tags: Sequence[str]) -> "TagSpans":
        """Pieces decoded one id at a time (special tokens kept: a tag may be one)."""
        pieces = [tokenizer.decode([i], skip_special_tokens=False) for i in range(len(tokenizer))]
        return cls(pieces, tags)

    def mask(self, token_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
        """Policy tokens inside a tagged span. Shape: (B, L) -> (B, L) bool."""
        ids = token_ids.cpu().numpy()
        policy = loss_mask.bool().cpu().numpy()
        out = np.zeros_like(policy)
        for r in range(ids.shape[0]):
            for start, stop in _runs(policy[r]):
                out[r, start:stop] = self._turn_mask(ids[r, start:stop])
        return torch.from_numpy(out).to(loss_mask.device)

    def _turn_mask(self, ids: np.ndarray) -> np.ndarray:
        """One turn's policy tokens -> which of them overlap a tagged span of their text."""
        n = len(self.pieces)
        known = (ids >= 0) & (ids < n)  # an id beyond the tokenizer (padded embeddings) has no text
        text = "".join(self.pieces[i] for i in ids[known])
        lengths = np.where(known, self.piece_lengths[np.clip(ids, 0, n - 1)], 0)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        inside = np.zeros(len(ids), dtype=bool)
        for m in self._span.finditer(text):
            inside |= (starts < m.end()) & (ends > m.start())
        return inside


def check_tags(tags) -> None:
    """Raise ValueError unless ``tags`` is a non-empty list of tag names (letters, digits, _ or -)."""
    if isinstance(tags, str) or not tags or not all(
            isinstance(t, str) and re.fullmatch(r"[\w-]+", t) for t in tags):
        raise ValueError(f"tags must be a non-empty list of names such as 'observation', got {tags!r}")


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each maximal run of True in a 1-D bool array."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))
