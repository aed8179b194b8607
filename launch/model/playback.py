"""Episodes played with transformers' ``generate`` in this process: greedy evaluation of a
model (the warm start's before/after check) and sampled episodes (``play`` with a temperature).
No vLLM, no Ray, no env workers.

The episodes run through actors.episode.run_episode (the actor's turn loop, token in, token out)
concurrently over one in-process env per episode. Once every live episode waits for an answer,
all of them are answered together in batches of left-padded rows. Image envs: given the model's
``vision`` (actors.vision.VisionTokens; the model an image-text-to-text one), each context holds
its images' pad runs as the actor's does, and ``generate`` gets the rows' pixel values, patch
grids and modality ids (M-RoPE positions, computed past the left padding).

Invariants:
- greedy (``temperature=0``): log-probs are 0 (nothing trains on them); sampled: each token's
log-prob is that of the distribution it was drawn from,
  log-softmax(logits / temperature) with top-p applied, as vLLM's ``processed_logprobs``;
  every generated token records the batcher's ``version``;
- an answer ends at the tokenizer's EOS (kept, as the model produced it) or after
  ``max_new_tokens``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from actors.episode import Generation, judge_scores, run_episode
from envs.protocol import to_observation, to_step_result
from envs.registry import make


def evaluate_hf(model, tokenizer, env_name: str, env_config: Mapping[str, Any],
                seeds: Sequence[int], max_new_tokens: int = 256, *,
                batch_size: int = 16, vision=None) -> dict[str, float]:
    """Greedy episodes of ``env_name`` on ``seeds`` (``vision``: as for ``play``).

    Returns the means of the episode metrics (``success``, ``format_correct``: share of turns,
    ``reward``, ``turns``, ``generated_tokens``), the per-turn means of the reasoning judge's
    scores (``observation_score``, ``prediction_score``, where the env's format and config have
    them), ``episodes`` and ``seconds``.
    """
    t0 = time.perf_counter()
    results, envs = play(model, tokenizer, env_name, env_config, seeds,
                         max_new_tokens=max_new_tokens, batch_size=batch_size, vision=vision)
    keys = ("success", "format_correct", "reward", "turns", "generated_tokens")
    played = [r.metrics for r in results if r.trajectory is not None]
    summary = {k: sum(m[k] for m in played) / max(len(played), 1) for k in keys}
    for name, scores in envs.scores.items():
        summary[name] = sum(scores) / len(scores)
    return {**summary, "episodes": float(len(played)), "seconds": time.perf_counter() - t0}


def play(model, tokenizer, env_name: str, env_config: Mapping[str, Any], seeds: Sequence[int], *,
         max_new_tokens: int, batch_size: int, temperature: float = 0.0, top_p: float = 1.0,
         group_ids: Sequence[int] | None = None, version: int = 0, vision=None):
    """One episode per seed; returns (the ``EpisodeResult`` of each, in order, the envs).

    ``temperature`` 0 is greedy; ``group_ids`` label the trajectories (GRPO groups); ``version``
    is the policy version the generated tokens record; ``vision`` (actors.vision.VisionTokens):
    a vision-language model's image tokens, needed for envs that render images."""
    envs = InProcessEnvs([make(env_name, **env_config) for _ in seeds])
    batcher = Batcher(model, tokenizer, max_new_tokens, batch_size, live=len(seeds),
                      temperature=temperature, top_p=top_p, version=version, vision=vision)
    max_turns = getattr(envs.envs[0], "max_turns", 100) if seeds else 0  # the env ends them itself
    text_config = getattr(model.config, "text_config", model.config)  # a VLM's: its language model's
    max_context = text_config.max_position_embeddings - max_new_tokens
    groups = list(group_ids) if group_ids is not None else [0] * len(seeds)

    async def one(slot: int, seed: int):
        try:
            return await run_episode(batcher.generate, envs, slot, seed, tokenizer,
                                     max_turns=max_turns, max_context=max_context,
                                     episode_id=slot, group_id=groups[slot], env_name=env_name,
                                     vision=vision)
        finally:
            batcher.finished()

    async def everything():
        return await asyncio.gather(*(one(slot, seed) for slot, seed in enumerate(seeds)))

    return asyncio.run(everything()), envs


class InProcessEnvs:
    """The EnvClient calls run_episode makes, over one in-process env per slot; it keeps every
    turn's reasoning scores (``observation_score``, ``prediction_score``: the judge's score of
    the <observation> and <prediction> sections, 0 for a turn out of format)."""

    def __init__(self, envs: list) -> None:
        self.envs = envs
        self.scores: dict[str, list[float]] = {}

    async def ping(self) -> dict[str, int]:
        return {"num_slots": len(self.envs)}

    async def stats(self) -> dict[str, int]:
        return {}

    async def system_prompt(self, slot):
        return self.envs[slot].system_prompt()

    async def state_text(self, slot):
        return self.envs[slot].state_text()

    async def close(self) -> None:
        """Nothing of its own to release: the envs are the caller's."""

    async def reset(self, slots, seeds):
        return [to_observation(self.envs[s].reset(seed=seed)[0]) for s, seed in zip(slots, seeds)]

    async def step(self, slots, texts):
        results = [to_step_result(self.envs[s].step(text)) for s, text in zip(slots, texts)]
        for result in results:
            for name, value in judge_scores(result.info["metrics"]).items():
                self.scores.setdefault(name, []).append(value)
        return results


class Batcher:
    """A ``Generate`` for concurrent episodes: once every live episode waits for an answer, all
    of them are answered together by ``model.generate`` (see the module docstring)."""

    def __init__(self, model, tokenizer, max_new_tokens: int, batch_size: int, live: int, *,
                 temperature: float = 0.0, top_p: float = 1.0, version: int = 0,
                 vision=None) -> None:
        self.model, self.max_new_tokens, self.batch_size, self.live = (
            model, max_new_tokens, batch_size, live)
        self.temperature, self.top_p, self.version, self.vision = temperature, top_p, version, vision
        self.eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        self.pending: list = []

    async def generate(self, ids: list[int], images: Sequence = (), room: int | None = None):
        """The answer to ``ids`` (and its ``images``), at most ``room`` tokens (and max_new_tokens)."""
        future = asyncio.get_running_loop().create_future()
        self.pending.append((ids, list(images), room, future))
        self._flush()
        return await future

    def finished(self) -> None:
        self.live -= 1
        self._flush()

    def _flush(self) -> None:
        if not self.pending or len(self.pending) < self.live:
            return
        pending = sorted(self.pending, key=lambda p: len(p[0]))  # similar lengths pad less
        self.pending = []
        for i in range(0, len(pending), self.batch_size):
            chunk = pending[i:i + self.batch_size]
            gens = self._generate([ids for ids, *_ in chunk], [ims for _, ims, *_ in chunk],
                                  [room for *_, room, _ in chunk])
            for (*_, future), gen in zip(chunk, gens):
                future.set_result(gen)

    def _image_inputs(self, ids, images: list[list]) -> dict:
        """``generate``'s image inputs for the left-padded ``ids`` whose rows hold ``images``."""
        flat = [im for row in images for im in row]
        if not flat:
            return {}
        if self.vision is None:
            raise ValueError("the observation has images but the model has no image processor "
                             "(pass vision=actors.vision.VisionTokens.from_pretrained(<a VLM>))")
        px = self.vision.image_processor(images=flat, return_tensors="pt")
        return {"pixel_values": px["pixel_values"], "image_grid_thw": px["image_grid_thw"],
                "mm_token_type_ids": (ids == self.vision.pad_id).long()}

    def _generate(self, rows: list[list[int]], images: list[list], rooms: list[int | None]):
        import torch

        device = next(self.model.parameters()).device
        length = max(len(r) for r in rows)
        ids = torch.full((len(rows), length), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, length - len(row):] = torch.tensor(row)
            mask[b, length - len(row):] = 1
        sample = self.temperature > 0
        options = dict(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=0,
                       output_scores=True) if sample else dict(do_sample=False)
        inputs = {k: v.to(device) for k, v in self._image_inputs(ids, images).items()}
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device),
                max_new_tokens=self.max_new_tokens, eos_token_id=self.eos, pad_token_id=self.pad,
                return_dict_in_generate=True, **inputs, **options)
        new = out.sequences[:, length:]
        if sample:  # scores: the processed logits each token was drawn from, one (B, V) per step
            logp = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], dim=1)
            picked = logp.gather(-1, new[..., None].to(logp.device))[..., 0].tolist()
        gens = []
        for b, row in enumerate(new.tolist()):
            stopped = self.eos in row
            row = row[:row.index(self.eos) + 1] if stopped else row
            room = rooms[b]
            if room is not None and len(row) > room:  # cut at the context's room
                row, stopped = row[:room], False
            lps = picked[b][:len(row)] if sample else [0.0] * len(row)
            gens.append(Generation(row, lps, [self.version] * len(row), stopped=stopped))
        return gens
