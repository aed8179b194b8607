"""The whole loop: async vs sync on the same config, async with and without cores of their own
for the learner and the actor (``ray.bind_cores``), async vs sync as env latency grows, and async
throughput with 1, 2, 4 actors when env latency dominates. Every run is a real
`launch.run.loop.train` (Ray, vLLM actors, ZeroMQ, gloo broadcast, FSDP learner) on the tiny model;
ratios are against the sync run / the 1-actor run measured in the same invocation.

    python -m tests.benchmarks.bench_loop [--parts modes,latency,scaling] [--steps 12]
        [--batch 16] [--latencies 0,0.01,0.05,0.1,0.3] [--delay 0.1] [--set K=V ...] [--json out.json]

Env latency is ``actors.env_latency_s``: every env reset and step answers that much later, as a
remote simulator's would, without holding an env worker (envs/service.py's LatencyEnvClient).

Throughput = trajectories trained on per second over the steady state (from the first to the
last learner step, so start-up is excluded). Where the time goes comes from the actors' counters
(generation, env, weight updates, engine idle), the learner's (waiting for a batch, training,
pushing weights) and the CPU seconds each kind of process used per step over the same span
(launch/run/memory.py): the learner, vLLM (engine core and worker), the actor process, and the rest
(env workers, Ray, the driver); their sum over the seconds a step takes is how many of the
machine's cores were busy.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from launch.config.compose import compose
from launch.run.loop import train
from launch.run.metrics import read_records
from tests.benchmarks.report import report

# Without cores of their own (ray.bind_cores=false) the learner runs 2 threads on both cores,
# one of them shared with vLLM's: the best a sync learner can do, whose phase has both cores.
UNBOUND = ("ray.bind_cores=false", "learner.threads=2")
CPU_KINDS = {"learner": ("LearnerWorker",), "vllm": ("EngineCore", "VLLM::Worker"), "actor": ("InferenceActor",)}
"""Process kinds (launch/run/memory.py) of each CPU column; every other kind counts as "rest"."""


def cpu_per_step(first: dict, last: dict, steps: int) -> dict[str, float]:
    """CPU seconds per step of each CPU_KINDS column and the rest, between two train rows'
    cumulative ``cpu/<kind>_s`` metrics ``steps`` steps apart."""
    out = dict.fromkeys([*CPU_KINDS, "rest"], 0.0)
    for key, value in last.items():
        if key.startswith("cpu/"):
            kind = key[len("cpu/"):-len("_s")]
            column = next((c for c, kinds in CPU_KINDS.items() if kind in kinds), "rest")
            out[column] += (value - first.get(key, 0.0)) / steps
    return out


def run(overrides: list[str]) -> dict:
    cfg = compose(overrides)
    with tempfile.TemporaryDirectory() as d:
        summary = train(cfg, Path(d))
        rows = read_records(Path(d))
    steps = [r for r in rows if r["kind"] == "train"]
    span = steps[-1]["time_s"] - steps[0]["time_s"]
    batch = cfg.train.batch_size
    mean = lambda key: sum(r.get(key, 0.0) for r in steps[1:]) / max(len(steps) - 1, 1)  # noqa: E731
    actors = summary["actors"]
    cpu = cpu_per_step(steps[0], steps[-1], len(steps) - 1)
    return {
        "phases": step_phases(steps),
        "traj_per_s": (len(steps) - 1) * batch / span,
        "s_per_step": span / (len(steps) - 1),
        "learner_wait_s": mean("timing/wait_batch_s"),
        "learner_train_s": mean("timing/step_s"),
        "push_s": mean("weights/push_s"),
        "actor_generate_s": sum(a["time/generate_s"] for a in actors),
        "actor_env_s": sum(a["time/env_s"] for a in actors),
        "actor_idle_s": sum(a["time/idle_s"] for a in actors),
        "dropped_stale": sum(v["dropped"] for v in summary["accounting"].values()),
        "produced": sum(a["episodes_sent"] for a in actors),
        **{f"cpu_{k}_s": v for k, v in cpu.items()},
        "cores_busy": sum(cpu.values()) * (len(steps) - 1) / span,
    }


def step_phases(steps: list[dict]) -> list[tuple[float, float]]:
    """(rollout, train + push) seconds of each step after the first, from the train rows: the
    rollout is the rest of the time since the previous row (a sync step's rollout, with the
    driver's bookkeeping), the learner's waits left out."""
    out = []
    for prev, row in zip(steps, steps[1:]):
        train = row["timing/step_s"] + row.get("weights/push_s", 0.0)
        rollout = row["time_s"] - prev["time_s"] - train - row.get("timing/wait_batch_s", 0.0)
        out.append((rollout, train))
    return out


def overlap_bound(unbound: dict, bound: dict, asyn: dict) -> dict:
    """The best async/sync ratio two cores allow, from the sync runs' phase times, and how much
    of it the async run reached. A sync step is rollout + train + push; with both cores per phase
    ("sync, unbound") that is the best synchronous step. With a core each ("sync") step i's
    phases take R1_i and T1_i + P1_i; overlapped perfectly, an async step takes the longer of the
    two, step by step (the first steps train the critic alone, quicker than a rollout; later
    ones are longer than one)."""
    pairs2, pairs1 = unbound["phases"], bound["phases"]
    r2, t2 = (sum(p[k] for p in pairs2) / len(pairs2) for k in (0, 1))
    r1, t1 = (sum(p[k] for p in pairs1) / len(pairs1) for k in (0, 1))
    best_step = sum(max(r, t) for r, t in pairs1) / len(pairs1)
    best = (r2 + t2) / best_step
    reached = asyn["traj_per_s"] / unbound["traj_per_s"]
    return {"rollout s, 2 cores": f"{r2:.2f}", "train + push s, 2 cores": f"{t2:.2f}",
            "rollout s, 1 core": f"{r1:.2f}", "train + push s, 1 core": f"{t1:.2f}",
            "best async step s": f"{best_step:.2f}", "best async / sync": f"{best:.2f}x",
            "async / sync": f"{reached:.2f}x", "of the best": f"{reached / best:.2f}"}


def _row(name: str, r: dict, base: dict) -> dict:
    return {"run": name, "traj/s": f"{r['traj_per_s']:.2f}",
            "vs sync, unbound": f"{r['traj_per_s'] / base['traj_per_s']:.2f}x",
            "s/step": f"{r['s_per_step']:.2f}", "learner wait s": f"{r['learner_wait_s']:.2f}",
            "train s": f"{r['learner_train_s']:.2f}", "push s": f"{r['push_s']:.3f}",
            "dropped stale": r["dropped_stale"], "produced": r["produced"],
            **{f"cpu {k} s": f"{r[f'cpu_{k}_s']:.2f}" for k in (*CPU_KINDS, "rest")},
            "cores busy": f"{r['cores_busy']:.2f}"}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="modes,latency,scaling")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--latencies", default="0,0.01,0.05,0.1,0.3",
                   help="env latencies (s) of the async vs sync sweep")
    p.add_argument("--latency-concurrency", type=int, default=32,
                   help="episodes in flight (and env slots) per actor in the latency sweep")
    p.add_argument("--delay", type=float, default=0.1, help="env latency of the actor scaling runs")
    p.add_argument("--actors", default="1,2,4")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="more Hydra overrides for every run, e.g. env.prompt=none")
    p.add_argument("--json")
    a = p.parse_args(argv)
    parts = set(a.parts.split(","))
    base = [f"train.steps={a.steps}", f"train.batch_size={a.batch}", "train.eval_every=0",
            "train.eval_seeds=4", "warm_start.enabled=false", "logger.wandb=false",
            "actors.group_size=4", "actors.max_tokens=64", *a.set]
    out: dict[str, list] = {}
    if "modes" in parts:
        sync = run([*base, "train.mode=sync", *UNBOUND])
        runs = (("sync, unbound", sync), ("sync", run([*base, "train.mode=sync"])),
                ("async, unbound", run([*base, "train.mode=async", *UNBOUND])),
                ("async", run([*base, "train.mode=async"])))
        out["mode"] = [_row(name, r, sync) for name, r in runs]
        report(out["mode"])
        out["overlap"] = [overlap_bound(sync, runs[1][1], runs[3][1])]
        print()
        report(out["overlap"])
    if "latency" in parts:
        out["latency"] = []
        for latency in (float(x) for x in a.latencies.split(",")):
            c = a.latency_concurrency
            lat = [f"actors.env_latency_s={latency}", f"actors.concurrency={c}",
                   f"actors.envs_per_worker={c}"]
            sync, asyn = run([*base, "train.mode=sync", *lat]), run([*base, "train.mode=async", *lat])
            out["latency"].append({
                "env latency s": latency, "in flight": c, "sync traj/s": f"{sync['traj_per_s']:.2f}",
                "async traj/s": f"{asyn['traj_per_s']:.2f}",
                "async / sync": f"{asyn['traj_per_s'] / sync['traj_per_s']:.2f}x",
                "sync s/step": f"{sync['s_per_step']:.2f}", "async s/step": f"{asyn['s_per_step']:.2f}",
                "async learner wait s": f"{asyn['learner_wait_s']:.2f}",
                "async train s": f"{asyn['learner_train_s']:.2f}"})
        print()
        report(out["latency"])
    if "scaling" in parts:
        out["scaling"], first = [], None
        for n in (int(x) for x in a.actors.split(",")):
            r = run([*base, "train.mode=async", f"actors.num={n}", f"actors.env_latency_s={a.delay}",
                     f"ray.num_cpus={max(2, n + 1)}"])
            first = first or r
            out["scaling"].append({
                "actors": n, "env latency s": a.delay, "traj/s": f"{r['traj_per_s']:.2f}",
                "vs 1 actor": f"{r['traj_per_s'] / first['traj_per_s']:.2f}x",
                "learner wait s": f"{r['learner_wait_s']:.2f}", "actor env s": f"{r['actor_env_s']:.0f}",
                "actor generate s": f"{r['actor_generate_s']:.0f}"})
        print()
        report(out["scaling"])
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
