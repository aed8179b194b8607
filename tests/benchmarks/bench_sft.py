"""Benchmark: warm-start SFT steps of the default job's shape: the system prompt's cost, and one
padded forward per batch vs length-sorted micro-batches.

Run with `make bench` (or `python -m tests.benchmarks.bench_sft`). One process, the tiny model,
batches of 16 drawn from 2000 FrozenLake demonstrations as the default warm start writes them
(habit mistakes at 0.55, two moves per turn, 1 to 3 turns), once per env prompt: ``none`` (the
default job's: the turn and the state only), ``brief`` (rules, legend and answer template in a
system prompt). Every setting trains a fresh copy of the same model on the same episodes
(learner.sft.train_sft, same seed); the answers are the same tokens under every prompt. The
baseline is the first row (the brief prompt, ``micro_batch_size`` 0: every forward as wide as
the batch's longest episode). Prints a Markdown table; `--json PATH` saves it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from tests.benchmarks.report import report


def run(prompts: list[str], micro_sizes: list[int], steps: int, threads: int) -> list[dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actors.demonstrations import make_demonstrations
    from envs.registry import load_config
    from launch.model.tiny_model import build_tiny_model
    from learner.sft import train_sft

    torch.set_num_threads(threads)
    rows, base = [], None
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "tiny")
        tok = AutoTokenizer.from_pretrained(path)
        for prompt in prompts:
            env = load_config("frozenlake") | {"prompt": prompt}
            demos = make_demonstrations("frozenlake", env, tok, range(2000), action_noise=0.55,
                                        rng_seed=0, mistake="habit", actions_per_turn=2)
            tokens = statistics.mean(len(d.token_ids) for d in demos)
            for micro in micro_sizes:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
                history = train_sft(model, demos, steps=steps, batch_size=16, lr=1e-3, seed=0,
                                    pad_id=tok.pad_token_id, micro_batch_size=micro)
                step_s = statistics.median(h["time/step_s"] for h in history[2:])  # after warm-up
                base = base or step_s
                rows.append({"prompt": prompt, "tokens_per_episode": round(tokens),
                             "micro_batch_size": micro or "whole", "step_s": round(step_s, 3),
                             "final_loss": round(history[-1]["sft/loss"], 4),
                             "speed": f"{base / step_s:.2f}x"})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", nargs="+", default=["brief", "none"])
    p.add_argument("--micro", type=int, nargs="+", default=[0, 8, 4])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=2, help="torch threads (the warm start's, both cores)")
    p.add_argument("--json")
    args = p.parse_args()
    report(run(args.prompts, args.micro, args.steps, args.threads), args.json)


if __name__ == "__main__":
    main()
