"""`python -m launch.model.warm_start`: supervised fine-tuning on solver demonstrations before RL.

A model that starts from random weights (the tiny model) cannot find the answer format by
sampling, so RL would never see a reward. The warm start teaches the format, and a little of the
task, from demonstrations (actors/demonstrations.py) whose actions are partly random, and stops
early: the model should answer in the format most of the time yet still leave RL room to improve.

Called by the topologies' ``warm_start`` (launch/topology/ray_cluster.py: inside a Ray task;
launch/topology/local_cluster.py: in the driver) and from the command line.
``warm_start`` writes into ``out_dir`` the fine-tuned model (``save_pretrained``), the tokenizer
files (a vision-language model's processor files too) and ``warm_start.jsonl``: one JSON line
for the demonstrations, then the metrics of every logged SFT step (and of each evaluation, when
asked for one).

A model whose config has a ``vision_config`` (Qwen2-VL style; the tiny one is
``launch.model.tiny_model --vision``) loads as an image-text-to-text model, and an env that renders
images (``render: image``) is demonstrated, trained on and evaluated with the pictures, token in
/ token out as the actor records its episodes (actors.vision, learner.vision). A VLM on a text
env trains on text alone.

Seeds: demonstrations are played on ``[seed_offset, seed_offset + n_seeds)``, training seeds
(envs/splits.py), so they never play a map that an evaluation plays (the validation or test
seeds, on maps of their own split: envs/splits.py); a range that reaches a held-out split's
seeds is refused. The warm start is judged before and after by
``launch.model.playback.evaluate_hf``, greedy episodes with transformers (the RL run's evaluation
uses vLLM).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from actors.demonstrations import MISTAKES, REASONING, make_demonstrations
from actors.vision import VisionTokens
from envs import splits
from envs.grid_env import PROMPTS, RENDERS
from envs.registry import load_config
from launch.config.cli import add_fields
from launch.config.compose import compose
from launch.config.schema import WarmStartConfig
from launch.model.playback import evaluate_hf

PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json",
                   "processor_config.json")


def warm_start(model_path: str | Path, out_dir: str | Path, *, env_name: str,
               env_config: Mapping[str, Any], n_seeds: int, seed_offset: int = 0,
               action_noise: float, steps: int, batch_size: int, lr: float, seed: int,
               actions_per_turn: int | None = None, mistake: str = "random",
               reasoning: str = "relation", schedule: str = "constant", warmup: int = 0,
               micro_batch_size: int = 0, log_every: int = 10, eval_seeds: Sequence[int] = (),
               eval_every: int = 0, progress_s: float = 30.0,
               max_new_tokens: int = 256, workers: int = 1) -> Path:
    """Fine-tune ``model_path`` on demonstrations of ``env_name``; returns ``out_dir``.

    With ``eval_seeds``, ``evaluate_hf`` runs before training, every ``eval_every`` steps
    (0: only before and after) and after the last step; its results go to warm_start.jsonl.
    A progress line (step, loss, token accuracy, time left) is printed every ``progress_s``
    seconds and at the last step (0: never). ``workers`` > 1 builds the demonstrations in that
    many processes (``demonstrations``), for envs whose steps are slow (a simulator).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    from learner.sft import train_sft  # torch
    from learner.vision import ImageInputs

    if splits.meets_held_out(seed_offset, seed_offset + n_seeds):
        raise ValueError(f"demonstration seeds [{seed_offset}, {seed_offset + n_seeds}) reach "
                         f"the held-out seeds {dict(splits.SEEDS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    # A VLM: the actor's image tokens for the demonstrations and the evaluation, the learner's
    # image inputs for SFT (the same processor files, read by each side's own code).
    vision = VisionTokens.from_pretrained(str(model_path))  # None: a text-only model
    images = ImageInputs(str(model_path)) if vision is not None else None
    auto = AutoModelForCausalLM if vision is None else AutoModelForImageTextToText
    model = auto.from_pretrained(model_path, dtype=torch.float32).to(device)
    t0 = time.perf_counter()
    _say(f"warm start: building demonstrations of {n_seeds} {env_name} seeds")
    demos = demonstrations(str(model_path), env_name, env_config,
                           range(seed_offset, seed_offset + n_seeds), workers=workers,
                           tokenizer=tokenizer, vision=vision, action_noise=action_noise,
                           rng_seed=seed, actions_per_turn=actions_per_turn, mistake=mistake,
                           reasoning=reasoning)
    with open(out / "warm_start.jsonl", "w", encoding="utf-8") as log:

        def write(record: dict) -> None:
            log.write(json.dumps(record) + "\n")
            log.flush()

        def evaluate(step: int) -> None:
            result = evaluate_hf(model, tokenizer, env_name, env_config, eval_seeds, max_new_tokens,
                                 vision=vision)
            write({"step": step, **{f"eval/{k}": v for k, v in result.items()}})

        progress = _Progress(steps, progress_s)

        def on_step(metrics: dict) -> None:
            step = int(metrics["step"])
            progress(step, metrics)
            if step % log_every == 0 or step == steps:
                write(metrics)
            if eval_seeds and eval_every and step % eval_every == 0 and step != steps:
                evaluate(step)

        write(_demo_summary(demos, seconds=time.perf_counter() - t0))
        _say(f"warm start: {len(demos)} demonstrations in {time.perf_counter() - t0:.0f} s; "
             f"{steps} SFT steps of {batch_size}")
        if eval_seeds:
            evaluate(0)
        train_sft(model, demos, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                  schedule=schedule, warmup=warmup, pad_id=tokenizer.pad_token_id, log_every=1,
                  images=images, micro_batch_size=micro_batch_size, on_log=on_step)
        if eval_seeds:
            evaluate(steps)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if vision is not None:
        _copy_processor_files(Path(model_path), out)
    return out


def demonstrations(model_path: str, env_name: str, env_config: Mapping[str, Any],
                   seeds: Sequence[int], *, workers: int = 1, tokenizer=None,
                   vision: VisionTokens | None = None, **kwargs: Any) -> list:
    """``make_demonstrations`` of ``seeds`` with ``model_path``'s tokenizer (and image tokens),
    built in ``workers`` processes when > 1 (each on a contiguous share of the seeds, with its
    own envs, loading the tokenizer itself): the same demonstrations, in the same order, as in
    this process, which uses ``tokenizer`` and ``vision`` where given (else loads them)."""
    seeds = list(seeds)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(seeds) < 2:
        if tokenizer is None:
            return _demonstrate(model_path, env_name, dict(env_config), seeds, 0, kwargs)
        return make_demonstrations(env_name, env_config, tokenizer, seeds, vision=vision, **kwargs)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    bounds = np.linspace(0, len(seeds), min(workers, len(seeds)) + 1).astype(int)
    with ProcessPoolExecutor(len(bounds) - 1, mp_context=mp.get_context("spawn")) as pool:
        shares = [pool.submit(_demonstrate, model_path, env_name, dict(env_config),
                              seeds[a:b], int(a), kwargs) for a, b in zip(bounds, bounds[1:])]
        return [demo for share in shares for demo in share.result()]


def _demonstrate(model_path: str, env_name: str, env_config: dict, seeds: list[int],
                 first_index: int, kwargs: dict) -> list:
    from transformers import AutoTokenizer

    return make_demonstrations(env_name, env_config, AutoTokenizer.from_pretrained(model_path),
                               seeds, vision=VisionTokens.from_pretrained(model_path),
                               first_index=first_index, **kwargs)


def _say(line: str) -> None:
    print(line, flush=True)


class _Progress:
    """Prints "warm start: step k/n, loss .., token accuracy .., t s, ~m min left" every
    ``every_s`` seconds of SFT and at the last step."""

    def __init__(self, steps: int, every_s: float) -> None:
        self.steps, self.every_s = steps, every_s
        self.start = self.last = time.perf_counter()

    def __call__(self, step: int, metrics: dict) -> None:
        now = time.perf_counter()
        if not self.every_s or (now - self.last < self.every_s and step != self.steps):
            return
        self.last = now
        left = (now - self.start) / step * (self.steps - step)
        _say(f"warm start: step {step}/{self.steps}, loss {metrics['sft/loss']:.3f}, token accuracy "
             f"{metrics['sft/token_accuracy']:.3f}, {now - self.start:.0f} s, ~{left / 60:.1f} min left")


def _copy_processor_files(src: Path, out: Path) -> None:
    """A VLM's image / video processor configs, as they are (transformers and vLLM read them)."""
    import shutil

    for name in PROCESSOR_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, out / name)


def _demo_summary(demos: list, seconds: float) -> dict[str, float]:
    means = {f"demo/{k}": sum(d.metrics[k] for d in demos) / len(demos)
             for k in ("success", "turns", "random_action_share")}
    return {"demo/episodes": len(demos), "demo/seconds": seconds, **means,
            "demo/tokens": sum(len(d.token_ids) for d in demos),
            "demo/policy_tokens": sum(int(d.loss_mask.sum()) for d in demos)}


def config_defaults():
    """The composed run config's ``warm_start`` group: what ``make train`` warm-starts with."""
    return compose([]).warm_start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m launch.model.warm_start",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="Hugging Face model directory to start from")
    p.add_argument("--out", required=True, type=Path, help="where the fine-tuned model goes")
    p.add_argument("--env", default="frozenlake", help="env name (configs/env/<name>.yaml)")
    p.add_argument("--format", help="answer format (default: the env config's)")
    p.add_argument("--prompt", choices=PROMPTS, help="prompt (default: the env config's)")
    p.add_argument("--render", choices=RENDERS,
                   help="observations (default: the env config's); image and both need a VLM")
    p.add_argument("--image-size", type=int, help="pixels per side of an image observation")
    # The run's warm_start group, same names (--action-noise is warm_start.action_noise).
    add_fields(p, WarmStartConfig, config_defaults(), skip={"enabled"})
    p.add_argument("--seed-offset", type=int, default=0, help="first demonstration seed")
    p.add_argument("--seed", type=int, default=0, help="demonstration noise and batch order")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-seeds", type=int, default=0,
                   help="greedy evaluation episodes on the first validation seeds (0: none)")
    p.add_argument("--eval-every", type=int, default=0, help="also evaluate every k steps")
    p.add_argument("--max-new-tokens", type=int, default=256, help="per answer, in evaluation")
    args = p.parse_args(argv)
    if args.mistake not in MISTAKES or args.reasoning not in REASONING:
        p.error(f"--mistake must be one of {MISTAKES}, --reasoning one of {REASONING}")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    overrides = {"format": args.format, "prompt": args.prompt, "render": args.render,
                 "image_size": args.image_size}
    env_config = load_config(args.env) | {k: v for k, v in overrides.items() if v}
    eval_seeds = splits.seeds_of("validation", args.eval_seeds)
    out = warm_start(args.model, args.out, env_name=args.env, env_config=env_config,
                     n_seeds=args.seeds, seed_offset=args.seed_offset, action_noise=args.action_noise,
                     actions_per_turn=args.actions_per_turn, mistake=args.mistake,
                     reasoning=args.reasoning,
                     steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                     schedule=args.schedule, warmup=args.warmup,
                     micro_batch_size=args.micro_batch_size, log_every=args.log_every,
                     eval_seeds=eval_seeds, eval_every=args.eval_every,
                     max_new_tokens=args.max_new_tokens, workers=args.workers)
    for line in (out / "warm_start.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "demo/episodes" in record or any(k.startswith("eval/") for k in record):
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                              for k, v in record.items()}))
    return out


if __name__ == "__main__":
    main()
