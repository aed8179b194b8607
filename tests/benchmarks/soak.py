"""Memory soak: the default job, asynchronous, for an hour; does total memory grow after warm-up?

    python -m tests.benchmarks.soak [--minutes 60] [--warmup-minutes 10] [--json out.json]

A real ``launch.run.loop.train`` (Ray, vLLM actor, env pool, ZeroMQ stream, gloo broadcast,
FSDP learner) with the default config, except: no warm start (memory does not depend on what the
weights know), no periodic eval, and steps without end; SIGTERM stops it after ``--minutes``,
as it would stop a job (checkpoint, then shut down). Memory is the training loop's monitor: the
proportional set size summed over every process of the local Ray cluster, once per step.

Growth = median of the last 5 minutes / median of the 5 minutes after warm-up - 1; the target is
at most 5%. Exit status 1 when it is above.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import threading
from pathlib import Path

from launch.config.compose import compose
from launch.run.metrics import read_records
from tests.benchmarks.report import report

WINDOW_S = 300.0


def growth(samples: list[tuple[float, float]], warmup_s: float) -> dict[str, float]:
    """``samples`` = (seconds, bytes); the medians after warm-up and at the end, and their ratio."""
    end = samples[-1][0]
    early = [m for t, m in samples if warmup_s <= t < warmup_s + WINDOW_S]
    late = [m for t, m in samples if t >= end - WINDOW_S]
    if not early or not late or end - WINDOW_S < warmup_s + WINDOW_S:
        raise ValueError(f"too short: {end:.0f} s of samples, need warm-up + 2 x {WINDOW_S:.0f} s")
    a, b = statistics.median(early), statistics.median(late)
    return {"after_warmup_gib": a / 2**30, "end_gib": b / 2**30, "growth": b / a - 1}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--warmup-minutes", type=float, default=10.0)
    p.add_argument("--json")
    a = p.parse_args(argv)
    from launch.run.loop import train

    cfg = compose(["train.steps=1000000", "train.eval_every=0", "train.eval_seeds=4",
                          "warm_start.enabled=false", "logger.wandb=false"])
    timer = threading.Timer(a.minutes * 60, os.kill, (os.getpid(), signal.SIGTERM))
    timer.daemon = True
    with tempfile.TemporaryDirectory() as d:
        timer.start()
        try:
            summary = train(cfg, Path(d))
        finally:
            timer.cancel()
        rows = read_records(Path(d))
    samples = [(r["time_s"], r["memory/total_gib"] * 2**30) for r in rows
               if r["kind"] == "train" and "memory/total_gib" in r]
    result = growth(samples, a.warmup_minutes * 60) | {
        "minutes": samples[-1][0] / 60, "steps": len(samples), **summary.get("memory", {})}
    kinds = sorted({k for r in rows for k in r if k.startswith("memory/") and k != "memory/total_gib"})
    per_kind = []
    for key in kinds:
        series = [(r["time_s"], r[key] * 2**30) for r in rows if r["kind"] == "train" and key in r]
        try:
            g = growth(series, a.warmup_minutes * 60)
        except ValueError:  # a process that came or went
            continue
        per_kind.append({"process": key[len("memory/"):-len("_gib")],
                         "after warm-up GiB": f"{g['after_warmup_gib']:.3f}",
                         "end GiB": f"{g['end_gib']:.3f}", "growth": f"{100 * g['growth']:+.1f}%"})
    result["per_process"] = per_kind
    report([{"after warm-up GiB": f"{result['after_warmup_gib']:.3f}",
             "end GiB": f"{result['end_gib']:.3f}", "growth": f"{100 * result['growth']:+.1f}%",
             "minutes": f"{result['minutes']:.0f}", "steps": result["steps"],
             "peak total GiB": f"{result.get('memory/peak_total_gib', float('nan')):.2f}"}])
    if per_kind:
        print()
        report(per_kind)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0 if result["growth"] <= 0.05 else 1


if __name__ == "__main__":
    raise SystemExit(main())
