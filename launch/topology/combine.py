"""What both topologies make of their processes' answers: the actors' evaluations as one (their
episodes' outcomes: launch/run/evaluation.py makes the figures), each actor's share of the
evaluation seeds, a weight push's timings.

Called by launch/topology/ray_cluster.py and launch/topology/local_cluster.py. Pure functions.
"""

from __future__ import annotations

from typing import Any, Callable


def eval_shares(seeds: list[int], actors: int, pages: int) -> list[tuple[list[int], int]]:
    """Per actor: its share of ``seeds`` (round robin) and how many of the share's first episodes
    it records, so that the recorded episodes are those of the first ``pages`` seeds."""
    return [(seeds[i::actors], len(range(i, min(pages, len(seeds)), actors))) for i in range(actors)]


def combine_evaluations(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The actors' ``evaluate`` results as one: every episode's outcome under ``outcomes``
    (greedy ones first, each kind by seed, then sample), and the recorded episodes of all
    (plain data) under ``episodes``, ordered by seed, where there are any."""
    outcomes = sorted((o for p in parts for o in p["outcomes"]),
                      key=lambda o: (o["sample"] >= 0, o["seed"], o["sample"]))
    out: dict[str, Any] = {"outcomes": outcomes}
    episodes = sorted((e for p in parts for e in p.get("episodes", ())), key=lambda e: e["seed"])
    if episodes:
        out["episodes"] = episodes
    return out


def push_timings(published: dict[str, float], updates: list[dict[str, float]],
                 elapsed: Callable[[], float]) -> dict[str, float]:
    """A push's metrics: the learner's, the push's wall time, the slowest actor's phases, and
    for an adapter the largest probe gap (engine vs learner) among the actors."""
    out = {**published, "weights/push_s": elapsed()}
    for key in ("pause_s", "receive_s", "total_s"):
        vals = [u.get(key, 0.0) for u in updates]
        if vals:
            out[f"weights/actor_{key}"] = max(vals)
    gaps = [u["probe_gap"] for u in updates if "probe_gap" in u]  # adapter pushes: the worst engine's
    if gaps:
        out["weights/probe_gap"] = max(gaps)
    return out
