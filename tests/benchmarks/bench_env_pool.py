"""Benchmark: env steps per second through the env pool and the env service, against in-process.

Run with `python -m tests.benchmarks.bench_env_pool` (`--seconds`, `--json PATH`). Every row runs
the same loop on the same envs and seeds: step every live slot with a fixed cycle of answers,
reset the finished ones with the next seeds. In-process calls the envs one after another; the
pool rows go through ``EnvPool`` directly, through ``LocalEnvClient`` (the asyncio interface
actors use: one thread hop per call), and through ``RemoteEnvClient`` to `python -m envs.main` on
loopback. "per call" is the number of slots in each call: all of them, or one (an actor stepping
each episode as its generation finishes). Each figure is the best of 3 runs (the machine is
shared). Prints a Markdown table; the ratio is against in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

from envs.formats import format_example
from envs.pool import EnvPool
from envs.registry import make_env, resolve_config
from envs.service import LocalEnvClient, RemoteEnvClient
from envs.wire import EpisodeFailure
from tests.envs_api import env_reset, env_step

ROOT = Path(__file__).resolve().parents[2]
WORKERS, ENVS_PER_WORKER = 2, 4
RUNS = 3
ENVS = {  # label -> (name, overrides)
    "frozenlake (text)": ("frozenlake", {}),
    "frozenlake (image 96px)": ("frozenlake", {"render": "image"}),
    "counter (no work)": ("tests.unit.envs.fake_envs:CounterEnv", {}),
}
ANSWERS = [format_example("grounding_worldmodeling", action_example=a)
           for a in ("Left,Down", "Right", "Down,Down,Right", "Up")] + ["no answer"]


async def best_of(runs: int, reset, step, num_slots: int, per_call: int, seconds: float) -> float:
    """The best of ``runs`` drives of ``seconds / runs`` each (the box is shared: take the best)."""
    return max([await drive(reset, step, num_slots, per_call, seconds / runs) for _ in range(runs)])


async def drive(reset, step, num_slots: int, per_call: int, seconds: float) -> float:
    """Env steps per second of the step/reset loop (both async callables over slot batches)."""
    seeds = itertools.count()
    slots = list(range(num_slots))
    await reset(slots, [next(seeds) for _ in slots])
    steps, turn, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        done = []
        for i in range(0, num_slots, per_call):
            batch = slots[i:i + per_call]
            results = await step(batch, [ANSWERS[(s + turn) % len(ANSWERS)] for s in batch])
            for slot, r in zip(batch, results):
                if isinstance(r, EpisodeFailure):
                    raise RuntimeError(f"slot {slot}: {r.reason}")
                if r.done:
                    done.append(slot)
        steps += num_slots
        turn += 1
        if done:
            await reset(done, [next(seeds) for _ in done])
    return steps / (time.perf_counter() - start)


def _as_async(fn):
    async def call(*args):
        return fn(*args)
    return call


def start_service(name: str, config: dict) -> tuple[subprocess.Popen, str]:
    sets = [x for k, v in config.items() for x in ("--set", f"{k}={json.dumps(v)}")]
    cmd = [sys.executable, "-m", "envs.main", "--bind", "tcp://127.0.0.1:*", "--env", name,
           "--env-workers", str(WORKERS), "--envs-per-worker", str(ENVS_PER_WORKER), *sets]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("env service on "):
        proc.kill()
        raise RuntimeError(f"the env service did not start: {line!r}")
    return proc, line.split()[-1]


async def bench_env(label: str, name: str, overrides: dict, seconds: float) -> list[dict]:
    config = resolve_config(name, overrides)
    n = WORKERS * ENVS_PER_WORKER
    envs = [make_env((name, config)) for _ in range(n)]
    reset = _as_async(lambda slots, seeds: [env_reset(envs[i], x) for i, x in zip(slots, seeds)])
    step = _as_async(lambda slots, texts: [env_step(envs[i], t) for i, t in zip(slots, texts)])
    base = await best_of(RUNS, reset, step, n, n, seconds)
    rows = [{"env": label, "path": "in-process", "per call": n, "steps/s": base}]
    with EnvPool((name, config), num_workers=WORKERS, envs_per_worker=ENVS_PER_WORKER) as pool:
        client = LocalEnvClient(pool)
        for per_call in (n, 1):
            rate = await best_of(RUNS, _as_async(pool.reset), _as_async(pool.step), n, per_call, seconds)
            rows.append({"env": label, "path": "EnvPool", "per call": per_call, "steps/s": rate})
            rate = await best_of(RUNS, client.reset, client.step, n, per_call, seconds)
            rows.append({"env": label, "path": "LocalEnvClient", "per call": per_call, "steps/s": rate})
        await client.close()
    proc, address = start_service(name, overrides)
    try:
        remote = RemoteEnvClient(address, timeout_s=30)
        for per_call in (n, 1):
            rate = await best_of(RUNS, remote.reset, remote.step, n, per_call, seconds)
            rows.append({"env": label, "path": "RemoteEnvClient", "per call": per_call, "steps/s": rate})
        await remote.close()
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
    for row in rows:
        row["vs in-process"] = row["steps/s"] / base
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="time per row (all its runs)")
    parser.add_argument("--json", help="also save the rows here")
    args = parser.parse_args()
    rows = []
    for label, (name, overrides) in ENVS.items():
        rows += asyncio.run(bench_env(label, name, overrides, args.seconds))
    print(f"Env steps per second, {WORKERS} workers x {ENVS_PER_WORKER} envs = "
          f"{WORKERS * ENVS_PER_WORKER} slots (in-process: the same 8 envs, one after another).\n")
    print("| env | path | slots per call | steps/s | vs in-process |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['env']} | {r['path']} | {r['per call']} | {r['steps/s']:,.0f} "
              f"| {r['vs in-process']:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
