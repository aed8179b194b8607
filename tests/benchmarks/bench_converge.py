"""Time to success: the default job's RL phase, synchronous against asynchronous, from one warm
start, in one invocation.

    python -m tests.benchmarks.bench_converge [--model WARM_START] [--target 0.6] [--steps 40]
        [--eval-every 10] [--set K=V ...] [--json out.json]

Each mode is a real `launch.run.loop.train` (Ray, vLLM actor, ZeroMQ, gloo broadcast, FSDP learner)
of the default config from the same model, each at its best here (bench_loop: synchronous with
the learner's two threads over both cores, asynchronous with a core each), with greedy evals on the
default 256 held-out maps every ``--eval-every`` steps. Without ``--model`` the default warm start is built first
(launch.model.warm_start with configs/train.yaml's settings and seed: the same model `make train`
starts its RL from; about 9 minutes here); pass a `make train` run's ``warm-start`` directory to
skip that.

Time to success = the RL phase's wall time from the first eval (before RL) to the end of the
first eval whose greedy success reaches ``--target``, less the time spent in the evals between
(both modes evaluate the same maps at the same steps; the asynchronous actors keep generating
while an eval runs, at most ``actors.run_ahead`` batches ahead).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from launch.config.compose import compose
from launch.run.metrics import read_records
from tests.benchmarks.bench_loop import UNBOUND
from tests.benchmarks.report import report


def training_time(records: list[dict]) -> list[tuple[int, float, float]]:
    """(step, greedy success, RL wall time without evals) of each eval in ``records`` (the
    run's metrics.jsonl, in order)."""
    out, evaluating, start, previous = [], 0.0, None, None
    for r in records:
        if r["kind"] == "eval":
            if start is None:
                start = r["time_s"]
            else:
                evaluating += r["time_s"] - previous
            out.append((r["step"], r["success"], r["time_s"] - start - evaluating))
        previous = r["time_s"]
    return out


def time_to(evals: list[tuple[int, float, float]], target: float) -> tuple[int, float] | None:
    """(step, seconds) of the first eval at or above ``target``; None if none reaches it."""
    return next(((step, s) for step, success, s in evals if success >= target), None)


def run(overrides: list[str], run_dir: Path) -> dict:
    from launch.run.loop import train

    cfg = compose(overrides)
    train(cfg, run_dir)
    records = read_records(run_dir)
    steps = [r for r in records if r["kind"] == "train"]
    return {"evals": training_time(records),
            "s_per_step": sum(r["timing/step_wall_s"] for r in steps) / len(steps)}


def build_warm_start(out: Path, overrides: list[str]) -> Path:
    """The default job's warm start (what `make train` builds before RL) into ``out``."""
    from launch.config.builders import warm_start_config
    from launch.model.tiny_model import build_tiny_model
    from launch.model.warm_start import warm_start

    cfg = compose(overrides)
    tiny = build_tiny_model(out / "tiny-model", seed=cfg.model.build_seed)
    return warm_start(tiny, out / "warm-start", **warm_start_config(cfg))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="a warm-started model (default: build the default's)")
    p.add_argument("--target", type=float, default=0.6, help="greedy success to reach")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="more Hydra overrides for every run")
    p.add_argument("--json")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model or build_warm_start(Path(tmp), a.set)
        base = [f"model.path={model}", "warm_start.enabled=false", "logger.wandb=false",
                f"train.steps={a.steps}", f"train.eval_every={a.eval_every}", *a.set]
        # each mode at its best on this machine (bench_loop): sync unbound, async bound
        runs = {"sync": run([*base, "train.mode=sync", *UNBOUND], Path(tmp) / "sync"),
                "async": run([*base, "train.mode=async"], Path(tmp) / "async")}
    rows, reached = [], {}
    for mode, r in runs.items():
        reached[mode] = time_to(r["evals"], a.target)
        rows.append({"mode": mode, "s/step": f"{r['s_per_step']:.2f}",
                     "greedy success at the evals": " / ".join(f"{s:.3f}" for _, s, _ in r["evals"]),
                     f"reaches {a.target}": "never" if reached[mode] is None else
                     f"step {reached[mode][0]}, {reached[mode][1]:.0f} s"})
    for row, mode in zip(rows, runs):
        row["time to success vs sync"] = (f"{reached['sync'][1] / reached[mode][1]:.2f}x"
                                          if reached["sync"] and reached[mode] else "-")
    report(rows, a.json)


if __name__ == "__main__":
    main()
