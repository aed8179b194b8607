"""Where a run's components live: what the loop and the supervisor need of them, and the two
topologies that provide it.

``topology=ray`` (the default): launch/cluster.py's ``RayCluster``, every learner rank and
inference actor a Ray actor of its own, trajectories over ZeroMQ, weights by torch.distributed
broadcast. ``topology=local``: launch/local.py's ``LocalCluster``, the same learner, actor and
vLLM code in this one process, both channels in-process (transport/inprocess.py): no Ray, no
sockets of ours, one console and one debugger. launch/loop.py and launch/supervisor.py drive
either through ``Cluster``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

from launch.config import RunConfig


class PushError(RuntimeError):
    """A weight push failed: ``errors`` by actor index, the learners' errors, and which of the
    failed actors are ``dead`` (their process is gone: replace them, not just re-join them)."""

    def __init__(self, version: int, errors: dict[int, Exception], learner_errors: list[Exception],
                 dead: set[int] = frozenset()):
        super().__init__(f"push of version {version} failed: actors {sorted(errors)}, "
                         f"learner {[str(e) for e in learner_errors]}")
        self.errors, self.learner_errors = errors, learner_errors
        self.dead_actors = {i: e for i, e in errors.items() if i in dead}


class Cluster(Protocol):
    """A run's learner and actors, started and stopped as a whole (see RayCluster's docstrings
    for what each operation means)."""

    incarnations: list[int]
    """Per actor: times it was restarted."""
    nodes: dict[str, str]
    """Where each learner rank and actor runs (after ``start``)."""
    stream_secured: bool
    """The trajectory stream requires CurveZMQ keys (after ``start``)."""

    @property
    def actors(self) -> list: ...
    @property
    def running(self) -> bool: ...

    def connect(self) -> bool: ...
    def warm_start(self, model_path: str, out: Path) -> str: ...
    def start(self, model_path: str, log_dir: Path | None = None,
              streams: list[dict[str, int]] | None = None) -> None: ...
    def shutdown(self) -> None: ...
    def train_step(self, batch_size: int, timeout_s: float) -> dict[str, float]: ...
    def save_checkpoint(self, path: Path, extra: dict[str, Any]) -> None: ...
    def load_checkpoint(self, path: Path) -> dict[str, Any]: ...
    def save_final(self, run_dir: Path, samples: int) -> None: ...
    def accounting(self) -> dict[str, dict[str, int]]: ...
    def actor_stats(self) -> list[dict[str, Any]]: ...
    def set_budgets(self, budgets: list[int]) -> None: ...
    def start_runs(self, indices: list[int] | None = None) -> None: ...
    def ended_runs(self) -> dict[int, BaseException]: ...
    def stop_runs(self) -> None: ...
    def rollout(self, counts: dict[int, int]) -> dict[int, BaseException]: ...
    def restart_actor(self, index: int, error: BaseException) -> None: ...
    def evaluate(self, seeds: list[int], pages: int = 0) -> dict[str, Any]: ...
    def push_weights(self, version: int) -> dict[str, float]: ...
    def reform_weights(self, version: int) -> dict[str, float]: ...


def make_cluster(cfg: RunConfig) -> Cluster:
    """The ``cfg.topology`` cluster (nothing started yet)."""
    if cfg.topology == "local":
        from launch.local import LocalCluster

        return LocalCluster(cfg)
    from launch.cluster import RayCluster

    return RayCluster(cfg)


def weighted_means(parts: list[dict[str, float]]) -> dict[str, float]:
    """The actors' evaluations (each with its episode count ``n``) as one: means weighted by
    episodes; an actor that finished no episode has no scores; values that are not numbers (the
    recorded ``episodes``) are left out."""
    total = sum(p["n"] for p in parts)
    counted = [p for p in parts if p["n"]] or parts
    keys = sorted({k for p in counted for k, v in p.items() if k != "n" and isinstance(v, (int, float))})
    out = {k: sum(p.get(k, 0.0) * p["n"] for p in parts) / max(total, 1) for k in keys}
    out["n"] = float(total)
    return out


def eval_shares(seeds: list[int], actors: int, pages: int) -> list[tuple[list[int], int]]:
    """Per actor: its share of ``seeds`` (round robin) and how many of the share's first episodes
    it records, so that the recorded episodes are those of the first ``pages`` seeds."""
    return [(seeds[i::actors], len(range(i, min(pages, len(seeds)), actors))) for i in range(actors)]


def combine_evaluations(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The actors' ``evaluate`` results as one: ``weighted_means``, and the recorded episodes
    of all (plain data, not metrics) under ``episodes``, ordered by seed, where there are any."""
    out: dict[str, Any] = weighted_means(parts)
    episodes = sorted((e for p in parts for e in p.get("episodes", ())), key=lambda e: e["seed"])
    if episodes:
        out["episodes"] = episodes
    return out


def push_timings(published: dict[str, float], updates: list[dict[str, float]],
                 elapsed: Callable[[], float]) -> dict[str, float]:
    """A push's metrics: the learner's, the push's wall time, the slowest actor's phases."""
    out = {**published, "weights/push_s": elapsed()}
    for key in ("pause_s", "receive_s", "total_s"):
        vals = [u.get(key, 0.0) for u in updates]
        if vals:
            out[f"weights/actor_{key}"] = max(vals)
    return out
