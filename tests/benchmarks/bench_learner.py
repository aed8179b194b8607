"""Benchmark: one learner step of the default job's shape, whole mini-batch vs length-sorted
micro-batches.

Run with `make bench` (or `python -m tests.benchmarks.bench_learner`). One process, a gloo group
of one, the tiny model and the default algorithm (configs/algorithm/vagen_full.yaml: policy,
critic and reference model); the batch is 32 FrozenLake episodes as the warm start's
demonstrations write them (real token sequences, 1 to 3 turns, so lengths vary as in RL). The
baseline is ``micro_batch_size`` 0: every forward as wide as the longest episode. Prints a
Markdown table; `--json PATH` saves it.
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from tests.benchmarks.report import report

REPO = Path(__file__).resolve().parents[2]


def _batch(model_dir: Path, n: int):
    from transformers import AutoTokenizer

    from actors.demonstrations import make_demonstrations
    from envs.registry import load_config

    tok = AutoTokenizer.from_pretrained(model_dir)
    env = load_config("frozenlake") | {"prompt": "brief"}
    return make_demonstrations("frozenlake", env, tok, range(n), action_noise=0.4, rng_seed=0)


def run(micro_sizes: list[int], repeats: int, threads: int) -> list[dict]:
    from launch.tiny_model import build_tiny_model
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
            batch = _batch(model, 32)
            algo = yaml.safe_load((REPO / "configs/algorithm/vagen_full.yaml").read_text())
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
    p.add_argument("--threads", type=int, default=2, help="torch threads (the CPU learner's default)")
    p.add_argument("--json")
    args = p.parse_args()
    report(run(args.micro, args.repeats, args.threads), args.json)


if __name__ == "__main__":
    main()
