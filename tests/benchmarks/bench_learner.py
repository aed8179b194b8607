"""Benchmark: one learner step of the default job's shape, whole mini-batch vs length-sorted
micro-batches.

Run with `make bench` (or `python -m tests.benchmarks.bench_learner`). One process, a gloo group
of one, the tiny model and the default job's algorithm group (``launch.train.compose``: vagen_full,
policy, critic and reference model); the batch is one mini-batch of the default job, 32 FrozenLake
episodes as its warm start's demonstrations write them (configs/train.yaml: its prompt, moves per
turn, mistakes; real token sequences, 1 to 3 turns, so lengths vary as in RL). The baseline is
``micro_batch_size`` 0: every forward as wide as the longest episode. One thread by default, as
the default job's learner has (a core of its own). Prints a Markdown table; `--json PATH` saves
it.
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tests.benchmarks.report import report

def _batch(cfg, model_dir: Path, n: int):
    from transformers import AutoTokenizer

    from actors.demonstrations import make_demonstrations
    from launch.builders import env_config

    tok = AutoTokenizer.from_pretrained(model_dir)
    ws = cfg.warm_start
    return make_demonstrations(cfg.env_name, env_config(cfg), tok,
                               range(n), action_noise=ws.action_noise, rng_seed=0,
                               actions_per_turn=ws.actions_per_turn, mistake=ws.mistake,
                               reasoning=ws.reasoning)


def run(micro_sizes: list[int], repeats: int, threads: int, prompt: str | None) -> list[dict]:
    import dataclasses

    from launch.tiny_model import build_tiny_model
    from launch.train import compose
    from learner.config import TrainerConfig
    from learner.trainer import Trainer

    torch.set_num_threads(threads)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = build_tiny_model(Path(tmp) / "tiny")
            cfg = compose([f"env.prompt={prompt}"] if prompt else [])
            batch = _batch(cfg, model, 32)
            algo = dataclasses.asdict(cfg.algorithm)
            del algo["reasoning_reward"]  # an env setting
            base = None
            for micro in micro_sizes:
                trainer = Trainer(TrainerConfig.from_dict(
                    {"model_path": str(model), **algo, "micro_batch_size": micro}))
                trainer.train_step(batch, version=0)  # warm-up
                times, padding = [], 0.0
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    padding = trainer.train_step(batch, version=0)["learner/padding"]
                    times.append(time.perf_counter() - t0)
                best = min(times)
                base = base or best
                rows.append({"micro_batch_size": micro or "whole", "step_s": round(best, 2),
                             "padding": round(padding, 3), "speed_vs_whole": f"{base / best:.2f}x"})
    finally:
        dist.destroy_process_group()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--micro", type=int, nargs="+", default=[0, 16, 8, 4])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (the default job's learner: one, on a core of its own)")
    p.add_argument("--prompt", help="the env's prompt (default: the job's)")
    p.add_argument("--json")
    args = p.parse_args()
    report(run(args.micro, args.repeats, args.threads, args.prompt), args.json)


if __name__ == "__main__":
    main()
