"""`python -m launch.warm_start`: supervised fine-tuning on solver demonstrations before RL.

A model that starts from random weights (the tiny model) cannot find the answer format by
sampling, so RL would never see a reward. The warm start teaches the format, and a little of the
task, from demonstrations (actors/demonstrations.py) whose actions are partly random, and stops
early: the model should answer in the format most of the time yet still leave RL room to improve.

Called by launch/controller.py (``prepare_model``, inside a Ray task) and from the command line.
``warm_start`` writes into ``out_dir`` the fine-tuned model (``save_pretrained``), the tokenizer
files and ``warm_start.jsonl``: one JSON line for the demonstrations, then the metrics of every
logged SFT step (and of each evaluation, when asked for one).

Seeds: demonstrations are played on ``[seed_offset, seed_offset + n_seeds)``; the RL run
evaluates on ``[train.eval_seed_offset, ...)`` = ``[1_000_000, ...)`` (configs/train.yaml), so
keep ``seed_offset + n_seeds`` below that. ``evaluate_hf`` here is the greedy transformers
evaluation used to judge a warm start before and after (the RL run's evaluation uses vLLM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

EVAL_SEED_OFFSET = 1_000_000
"""The first held-out seed (configs/train.yaml ``train.eval_seed_offset``)."""


def warm_start(model_path: str | Path, out_dir: str | Path, *, env_name: str,
               env_config: Mapping[str, Any], n_seeds: int, seed_offset: int = 0,
               action_noise: float, steps: int, batch_size: int, lr: float, seed: int,
               schedule: str = "constant", warmup: int = 0, log_every: int = 10,
               eval_seeds: Sequence[int] = (), eval_every: int = 0,
               max_new_tokens: int = 256) -> Path:
    """Fine-tune ``model_path`` on demonstrations of ``env_name``; returns ``out_dir``.

    With ``eval_seeds``, ``evaluate_hf`` runs before training, every ``eval_every`` steps
    (0: only before and after) and after the last step; its results go to warm_start.jsonl.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actors.demonstrations import make_demonstrations
    from learner.sft import train_sft

    if seed_offset + n_seeds > EVAL_SEED_OFFSET:
        raise ValueError(f"demonstration seeds reach {seed_offset + n_seeds}, into the "
                         f"evaluation seeds from {EVAL_SEED_OFFSET}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
    t0 = time.perf_counter()
    demos = make_demonstrations(env_name, env_config, tokenizer,
                                range(seed_offset, seed_offset + n_seeds),
                                action_noise=action_noise, rng_seed=seed)
    with open(out / "warm_start.jsonl", "w", encoding="utf-8") as log:

        def write(record: dict) -> None:
            log.write(json.dumps(record) + "\n")
            log.flush()

        def evaluate(step: int) -> None:
            result = evaluate_hf(model, tokenizer, env_name, env_config, eval_seeds, max_new_tokens)
            write({"step": step, **{f"eval/{k}": v for k, v in result.items()}})

        def on_step(metrics: dict) -> None:
            step = int(metrics["step"])
            if step % log_every == 0 or step == steps:
                write(metrics)
            if eval_seeds and eval_every and step % eval_every == 0 and step != steps:
                evaluate(step)

        write(_demo_summary(demos, seconds=time.perf_counter() - t0))
        if eval_seeds:
            evaluate(0)
        train_sft(model, demos, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                  schedule=schedule, warmup=warmup, pad_id=tokenizer.pad_token_id, log_every=1,
                  on_log=on_step)
        if eval_seeds:
            evaluate(steps)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _demo_summary(demos: list, seconds: float) -> dict[str, float]:
    means = {f"demo/{k}": sum(d.metrics[k] for d in demos) / len(demos)
             for k in ("success", "turns", "random_action_share")}
    return {"demo/episodes": len(demos), "demo/seconds": seconds, **means,
            "demo/tokens": sum(len(d.token_ids) for d in demos),
            "demo/policy_tokens": sum(int(d.loss_mask.sum()) for d in demos)}


def evaluate_hf(model, tokenizer, env_name: str, env_config: Mapping[str, Any],
                seeds: Sequence[int], max_new_tokens: int = 256, *,
                batch_size: int = 16) -> dict[str, float]:
    """Greedy episodes of ``env_name`` on ``seeds`` with transformers' ``generate``.

    The episodes run through actors.episode.run_episode (the actor's turn loop) concurrently;
    each round of answers is generated in batches of ``batch_size`` left-padded rows. Returns
    the means of the episode metrics (``success``, ``format_correct``: share of turns, ``reward``,
    ``turns``, ``generated_tokens``), the per-turn means of the reasoning judge's scores
    (``observation_score``, ``prediction_score``, where the env's format and config have them),
    ``episodes`` and ``seconds``.
    """
    from envs.registry import make

    t0 = time.perf_counter()
    envs = [make(env_name, **env_config) for _ in seeds]
    batcher = _GreedyBatcher(model, tokenizer, max_new_tokens, batch_size, live=len(envs))
    max_turns = getattr(envs[0], "max_turns", 100)  # the env ends its episodes itself
    max_context = model.config.max_position_embeddings - max_new_tokens
    envs = _InProcessEnvs(envs)
    results = asyncio.run(_play_all(batcher, envs, list(seeds), tokenizer,
                                    max_turns=max_turns, max_context=max_context))
    keys = ("success", "format_correct", "reward", "turns", "generated_tokens")
    played = [r.metrics for r in results if r.trajectory is not None]
    summary = {k: sum(m[k] for m in played) / max(len(played), 1) for k in keys}
    for name, scores in envs.scores.items():
        summary[name] = sum(scores) / len(scores)
    return {**summary, "episodes": float(len(played)), "seconds": time.perf_counter() - t0}


async def _play_all(batcher, envs, seeds, tokenizer, **kwargs):
    from actors.episode import run_episode

    async def play(slot: int, seed: int):
        try:
            return await run_episode(batcher.generate, envs, slot, seed, tokenizer, **kwargs)
        finally:
            batcher.finished()

    return await asyncio.gather(*(play(slot, seed) for slot, seed in enumerate(seeds)))


class _InProcessEnvs:
    """The EnvClient calls run_episode makes, over one in-process env per slot; it keeps every
    turn's reasoning scores (``observation_score``, ``prediction_score``: the judge's score of
    the <observation> and <prediction> sections, 0 for a turn out of format)."""

    def __init__(self, envs: list) -> None:
        self.envs = envs
        self.scores: dict[str, list[float]] = {}

    async def system_prompt(self, slot):
        return self.envs[slot].system_prompt()

    async def reset(self, slots, seeds):
        return [self.envs[s].reset(seed) for s, seed in zip(slots, seeds)]

    async def step(self, slots, texts):
        results = [self.envs[s].step(text) for s, text in zip(slots, texts)]
        for result in results:
            for key, value in result.info["metrics"].items():
                if key.startswith("reasoning/") and key.endswith("_score"):
                    self.scores.setdefault(key.removeprefix("reasoning/"), []).append(value)
        return results


class _GreedyBatcher:
    """A ``Generate`` for concurrent episodes: once every live episode waits for an answer, all
    of them are answered together by greedy ``model.generate`` (log-probs 0, version 0)."""

    def __init__(self, model, tokenizer, max_new_tokens: int, batch_size: int, live: int) -> None:
        self.model, self.max_new_tokens, self.batch_size, self.live = (
            model, max_new_tokens, batch_size, live)
        self.eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        self.pending: list = []

    async def generate(self, ids: list[int]):
        future = asyncio.get_running_loop().create_future()
        self.pending.append((ids, future))
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
            for (_, future), gen in zip(chunk, self._generate([ids for ids, _ in chunk])):
                future.set_result(gen)

    def _generate(self, rows: list[list[int]]):
        import torch

        from actors.episode import Generation

        device = next(self.model.parameters()).device
        length = max(len(r) for r in rows)
        ids = torch.full((len(rows), length), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, length - len(row):] = torch.tensor(row)
            mask[b, length - len(row):] = 1
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                max_new_tokens=self.max_new_tokens, eos_token_id=self.eos, pad_token_id=self.pad)
        gens = []
        for new in out[:, length:].tolist():
            stopped = self.eos in new
            new = new[:new.index(self.eos) + 1] if stopped else new
            gens.append(Generation(new, [0.0] * len(new), [0] * len(new), stopped=stopped))
        return gens


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m launch.warm_start",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="Hugging Face model directory to start from")
    p.add_argument("--out", required=True, type=Path, help="where the fine-tuned model goes")
    p.add_argument("--env", default="frozenlake", help="env name (configs/env/<name>.yaml)")
    p.add_argument("--format", help="answer format (default: the env config's)")
    p.add_argument("--prompt", choices=("full", "brief"), help="prompt (default: the env config's)")
    p.add_argument("--seeds", type=int, default=2000, help="demonstration episodes")
    p.add_argument("--seed-offset", type=int, default=0, help="first demonstration seed")
    p.add_argument("--noise", type=float, default=0.4, help="share of random actions")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--schedule", choices=("constant", "cosine"), default="constant",
                   help="learning rate: constant, or warm-up then cosine decay to 0")
    p.add_argument("--warmup", type=int, default=0, help="warm-up steps (cosine)")
    p.add_argument("--seed", type=int, default=0, help="demonstration noise and batch order")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-seeds", type=int, default=0,
                   help=f"greedy evaluation episodes on seeds from {EVAL_SEED_OFFSET} (0: none)")
    p.add_argument("--eval-every", type=int, default=0, help="also evaluate every k steps")
    p.add_argument("--max-new-tokens", type=int, default=256, help="per answer, in evaluation")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    from envs.registry import load_config

    overrides = {"format": args.format, "prompt": args.prompt}
    env_config = load_config(args.env) | {k: v for k, v in overrides.items() if v}
    eval_seeds = range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + args.eval_seeds)
    out = warm_start(args.model, args.out, env_name=args.env, env_config=env_config,
                     n_seeds=args.seeds, seed_offset=args.seed_offset, action_noise=args.noise,
                     steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                     schedule=args.schedule, warmup=args.warmup,
                     log_every=args.log_every, eval_seeds=eval_seeds, eval_every=args.eval_every,
                     max_new_tokens=args.max_new_tokens)
    for line in (out / "warm_start.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "demo/episodes" in record or any(k.startswith("eval/") for k in record):
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                              for k, v in record.items()}))
    return out


if __name__ == "__main__":
    main()
