"""A chaos run: a training job while a monkey SIGKILLs one of its processes every few seconds.

    make chaos [ARGS="--minutes 15 --every 45 --seed 0 --baseline --json chaos.json"]

The job is the real command line (``python -m launch.train``, Ray, a vLLM actor, FSDP learner):
asynchronous GRPO on ActionWords, the job the end-to-end test learns with, at a learning rate
that makes its reward rise over minutes rather than seconds, with one actor and one learner
rank, its envs served by two env services (``python -m envs.main``) that the actor fails over
between (``actors.env_address`` lists both). Every ``--every`` seconds the monkey picks a kind
at random among ``--kinds`` and SIGKILLs one process of that kind:

- ``actor``: the inference actor's Ray process (the supervisor replaces it);
- ``engine``: the actor's vLLM engine core (the actor is found dead and replaced);
- ``env_worker``: a worker process of an env service's pool (the pool replaces it);
- ``env_service``: a whole env service (the actor fails over to the other); it is started again
  at its address ``--service-down-s`` later;
- ``learner``: learner rank 0 (the run stops with its checkpoints; the monkey starts the
  command again with ``train.resume=<run dir>``, as a user would).

The kinds come in rounds, each round every kind once in a random order, so a run of 15
minutes kills each kind about four times. The monkey rests for the last ``max(2 x --every, 90)``
seconds, so every kill has time to be recovered from; then the job gets SIGTERM (a checkpoint,
then a clean stop) and its summary is the run's. Time to recover: from
a kill to the first training step logged after it. The report: kills by kind, recoveries, time to
recover (median, max), the episodes failed by reason and lost, the episode ledger's identities
at the end (docs/faults.md), and the reward curve (mean of the first and the last 5 steps, and
of the last 5 steps logged every ``CURVE_MINUTES`` of wall-clock), against a job of the same
length without the monkey with ``--baseline``. Exit status 1 if an
identity fails, a kill was not recovered from, or the reward did not rise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tests.benchmarks.report import report
from tests.integration.test_resume import _stop_all

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("actor", "engine", "env_worker", "env_service", "learner")
CURVE_MINUTES = 3
"""The curve: the mean reward of the last 5 steps logged, every this many minutes of wall-clock."""
JOB = ["env=action_words", "algorithm=grpo", "warm_start.enabled=false", "train.steps=1000000",
       "train.batch_size=32", "train.eval_every=0", "train.eval_seeds=8", "train.checkpoint_every=5",
       "learner.ranks=1", "learner.max_staleness=1", "learner.lr=1e-4", "actors.num=1",
       "actors.concurrency=16", "actors.group_size=8", "actors.max_tokens=12", "actors.max_restarts=1000",
       "actors.env_workers=2", "actors.envs_per_worker=8", "actors.env_timeout_s=10",
       "actors.env_heartbeat_s=1", "actors.env_grace_s=300", "logger.wandb=false", "ray.num_cpus=4",
       "ray.call_timeout_s=60"]


class EnvService:
    """``python -m envs.main`` on a fixed loopback port, startable again at the same address."""

    def __init__(self, port: int, log_dir: Path) -> None:
        self.address = f"tcp://127.0.0.1:{port}"
        self.log = log_dir / f"env-service-{port}.log"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "envs.main", "--bind", self.address, "--env", "action_words",
                 "--env-workers", "2", "--envs-per-worker", "8"],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def workers(self) -> list[psutil.Process]:
        """The pool's worker processes: the children of its multiprocessing fork server."""
        servers = [p for p in _tree(self.proc) if "forkserver" in _cmdline(p)]
        found = []
        for server in servers:
            try:
                found += server.children()
            except psutil.Error:
                continue
        return found

    def stop(self) -> None:
        if self.proc is not None:
            _stop_all(self.proc, [])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree(proc: subprocess.Popen | None) -> list[psutil.Process]:
    if proc is None or proc.poll() is not None:
        return []
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        return []


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join([p.name(), *p.cmdline()])
    except psutil.Error:
        return ""


def _launch(run_dir: Path, extra: list[str]) -> subprocess.Popen:
    with open(run_dir.parent / f"driver-{time.strftime('%H%M%S')}.log", "w") as log:  # the child keeps its copy
        return subprocess.Popen([sys.executable, "-m", "launch.train", *JOB, *extra, f"hydra.run.dir={run_dir}"],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _train_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if row.get("kind") == "train":
            rows.append(row)
    return rows


def _victim(kind: str, driver: subprocess.Popen, services: list[EnvService],
            rng: random.Random) -> psutil.Process | EnvService | None:
    tree = _tree(driver)
    if kind == "actor":
        found = [p for p in tree if "InferenceActor" in _cmdline(p) and "EngineCore" not in _cmdline(p)]
    elif kind == "engine":
        found = [p for p in tree if "EngineCore" in _cmdline(p)]
    elif kind == "learner":
        ranks = [p for p in tree if "LearnerWorker" in _cmdline(p)]
        found = [min(ranks, key=lambda p: p.create_time())] if ranks else []
    elif kind == "env_worker":
        found = [w for s in services for w in s.workers()]
    else:  # env_service: never both at once (the actor would wait out the grace)
        live = [s for s in services if s.proc is not None and s.proc.poll() is None]
        return rng.choice(live) if len(live) == len(services) else None
    return rng.choice(found) if found else None


def chaos(minutes: float, every_s: float, kinds: list[str], seed: int, service_down_s: float,
          work: Path, monkey: bool = True) -> dict:
    """One job of ``minutes``, with the monkey unless ``monkey`` is False; its report as a dict."""
    rng = random.Random(seed)
    rounds: list[str] = []
    run_dir = work / "run"
    services = [EnvService(_free_port(), work) for _ in range(2)]
    extra = [f"actors.env_address=[{','.join(s.address for s in services)}]", f"seed={seed}"]
    kills: list[dict] = []
    curve: list[float] = []
    restarts, driver = 0, None
    try:
        driver = _launch(run_dir, extra)
        t_end = time.monotonic() + 60 * minutes
        t_rest = t_end - max(2 * every_s, 90.0)
        next_kill = time.monotonic() + every_s
        down: list[tuple[float, EnvService]] = []
        t_start = time.monotonic()
        while time.monotonic() < t_end:
            time.sleep(0.5)
            now = time.monotonic()
            rows = _train_records(run_dir)
            seen = {(r["step"], r["time_s"]) for r in rows}
            if rows and now - t_start >= 60 * (len(curve) + 1) * CURVE_MINUTES:
                curve.append(_mean_reward(rows[-5:]))
            for k in kills:
                if "recovered_s" not in k and seen - k["seen"]:
                    k["recovered_s"] = round(now - k["at"], 1)
            for at, service in list(down):
                if now >= at:
                    service.start()
                    down.remove((at, service))
            if driver.poll() is not None:  # the learner's death ended the run: resume it
                restarts += 1
                driver = _launch(run_dir, [*extra, f"train.resume={run_dir}"])
                continue
            if not monkey or now < next_kill or now > t_rest or not seen:
                continue
            if not rounds:
                rounds = rng.sample(kinds, len(kinds))
            kind = rounds[0]
            victim = _victim(kind, driver, services, rng)
            if victim is None:  # none of that kind now (a service down, an actor restarting): soon,
                if now > next_kill + every_s:  # or, after a whole interval, the next kind
                    print(f"[chaos] {time.strftime('%H:%M:%S')} found no {rounds.pop(0)} to kill", flush=True)
                continue
            rounds.pop(0)
            next_kill = now + every_s
            if isinstance(victim, EnvService):
                victim.stop()
                down.append((now + service_down_s, victim))
            else:
                try:
                    victim.kill()
                except psutil.Error:
                    continue
            kills.append({"kind": kind, "at": now, "seen": seen})
            print(f"[chaos] {time.strftime('%H:%M:%S')} killed {kind}", flush=True)
        if driver.poll() is not None:  # died in the rest: the summary must be a clean stop's
            restarts += 1
            driver = _launch(run_dir, [*extra, f"train.resume={run_dir}"])
            steps = len(_train_records(run_dir))
            deadline = time.monotonic() + 300
            while len(_train_records(run_dir)) <= steps and time.monotonic() < deadline:
                time.sleep(1)
        driver.send_signal(signal.SIGTERM)  # a checkpoint, then a clean stop
        driver.wait(timeout=600)
    finally:
        if driver is not None and driver.poll() is None:
            _stop_all(driver, [])
        for s in services:
            s.stop()
    return _result(run_dir, kills, restarts, curve)


def _mean_reward(rows: list[dict]) -> float:
    return round(statistics.mean(r["rollout/reward"] for r in rows), 3)


def _result(run_dir: Path, kills: list[dict], restarts: int, curve: list[float]) -> dict:
    rows = _train_records(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    ep = summary.get("episodes", {})
    received = sum(a["received"] for a in summary.get("accounting", {}).values())
    identities = {
        "in_flight == 0": ep.get("episodes/in_flight") == 0,
        "started == done + failed + cancelled + in_flight + lost": ep.get("episodes/started") == sum(
            ep.get(f"episodes/{k}", 0) for k in ("done", "failed", "cancelled", "in_flight", "lost")),
        "done == sent + unsent + held": ep.get("episodes/done") == sum(
            ep.get(f"episodes/{k}", 0) for k in ("sent", "unsent", "held")),
        "sent == received + in_transit": ep.get("episodes/sent") == received + ep.get("episodes/in_transit", 0),
        "in_transit == 0": ep.get("episodes/in_transit") == 0,
    }
    rewards = [r["rollout/reward"] for r in rows]
    times = [k["recovered_s"] for k in kills if "recovered_s" in k]
    by_kind = {kind: sum(k["kind"] == kind for k in kills) for kind in KINDS}
    return {
        "steps": len(rows), "minutes": round(rows[-1]["time_s"] / 60, 1) if rows else 0,
        "kills": by_kind, "recovered": len(times), "killed": len(kills), "driver_restarts": restarts,
        "recover_median_s": statistics.median(times) if times else None,
        "recover_max_s": max(times) if times else None,
        "reward_first5": statistics.mean(rewards[:5]) if rewards else None,
        "reward_last5": statistics.mean(rewards[-5:]) if rewards else None,
        "episodes": ep, "failed": {k: v for k, v in ep.items() if k.startswith("failed/")},
        "identities": identities, "error": summary.get("error"),
        f"reward_every_{CURVE_MINUTES}_min": curve,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=15.0)
    p.add_argument("--every", type=float, default=45.0, help="seconds between kills")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--service-down-s", type=float, default=20.0)
    p.add_argument("--baseline", action="store_true", help="also a job of the same length without kills")
    p.add_argument("--dir", help="keep the run directories here (default: a temporary one)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    if not set(kinds) <= set(KINDS):
        p.error(f"--kinds: choose among {KINDS}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks stop the job
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(a.dir or tmp)
        runs = {"chaos": True, **({"baseline": False} if a.baseline else {})}
        results = {}
        for name, monkey in runs.items():
            work = base / name
            work.mkdir(parents=True, exist_ok=True)
            results[name] = chaos(a.minutes, a.every, kinds, a.seed, a.service_down_s, work, monkey)
    report([{"run": name, "steps": r["steps"], "kills": r["killed"], "recovered": r["recovered"],
             "driver restarts": r["driver_restarts"],
             "recover median / max s": f"{r['recover_median_s']} / {r['recover_max_s']}",
             "reward first 5 -> last 5": f"{r['reward_first5']:.2f} -> {r['reward_last5']:.2f}",
             f"reward every {CURVE_MINUTES} min": " ".join(f"{v:.2f}" for v in r[f"reward_every_{CURVE_MINUTES}_min"]),
             "failed": int(r["episodes"].get("episodes/failed", 0)),
             "lost": int(r["episodes"].get("episodes/lost", 0))} for name, r in results.items()])
    chaotic = results["chaos"]
    print("\nkills by kind:", chaotic["kills"])
    print("failed by reason:", chaotic["failed"])
    print("identities:", chaotic["identities"])
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    ok = (all(chaotic["identities"].values()) and chaotic["recovered"] == chaotic["killed"]
          and chaotic["reward_last5"] > chaotic["reward_first5"] + 0.1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
