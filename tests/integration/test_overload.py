"""Actors far faster than the learner: the real loop (Ray, two vLLM actors, the ZeroMQ stream,
an FSDP learner rank) with a learner slowed by its own work (``OVERLOAD_EPOCHS`` passes over
each batch in ``OVERLOAD_MINIBATCHES`` minibatches) and byte windows that hold about two
batches. What bounds the actors is the config, each bound checked every step:

- the learner's buffer holds at most the stream's byte windows (``transport.window_bytes`` per
  actor, plus one message each): the actors wait for credit (their ``time/send_s``) instead of
  growing the learner's memory;
- no trajectory is trained staler than ``learner.max_staleness``; what is staler is dropped and
  counted (``buffer/dropped_stale``);
- the actors start no more than their episode budgets allow;
- every episode is accounted for at the end: none in flight, lost or in transit.

The figures of a run are in docs/faults.md; ``OVERLOAD_STEPS`` sets the steps (12), and the
test writes its figures to ``<run dir>/overload.json``."""

from __future__ import annotations

import json
import os

import pytest

from launch.config.compose import compose
from launch.run.loop import train
from launch.run.metrics import read_records
from launch.run.supervisor import episode_budget

ACTORS, BATCH, GROUP, STALENESS, WINDOW = 2, 16, 4, 2, 12 << 10
OVERLOAD_EPOCHS, OVERLOAD_MINIBATCHES = 4, 8
MAX_MESSAGE = 4 << 10
"""More than any one ActionWords trajectory of this job on the wire (under 1 KB)."""


@pytest.mark.slow
def test_actors_far_faster_than_the_learner_stay_within_their_bounds(tmp_path):
    steps = int(os.environ.get("OVERLOAD_STEPS", "12"))
    cfg = compose([
        "env=action_words", "algorithm=grpo", "warm_start.enabled=false", f"train.steps={steps}",
        f"train.batch_size={BATCH}", "train.eval_every=0", "train.eval_seeds=8", "learner.ranks=1",
        f"learner.max_staleness={STALENESS}", f"actors.run_ahead={STALENESS}", "learner.lr=1e-3",
        f"learner.epochs={OVERLOAD_EPOCHS}", f"learner.num_minibatches={OVERLOAD_MINIBATCHES}",
        f"transport.window_bytes={WINDOW}", f"actors.num={ACTORS}", "actors.concurrency=16",
        f"actors.group_size={GROUP}", "actors.max_tokens=12", "actors.envs_per_worker=16",
        "logger.wandb=false", "ray.num_cpus=4"])
    summary = train(cfg, tmp_path)
    rows = [r for r in read_records(tmp_path) if r["kind"] == "train"]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for r in rows:
        assert r["buffer/bytes"] <= ACTORS * (WINDOW + MAX_MESSAGE), r["step"]
        assert r["policy/staleness_max"] <= STALENESS
        # the actors' budgets (what they may have started, failed ones replaced) hold
        budget = episode_budget(r["step"], batch_size=BATCH, run_ahead=STALENESS, max_staleness=STALENESS,
                                dropped=int(r["buffer/dropped"]), actors=ACTORS, group_size=GROUP)
        assert r["episodes/started"] - r["episodes/failed"] <= ACTORS * budget
    ep = summary["episodes"]
    assert ep["episodes/in_flight"] == ep["episodes/lost"] == ep["episodes/in_transit"] == 0
    assert ep["episodes/started"] == sum(ep[f"episodes/{k}"] for k in ("done", "failed", "cancelled"))
    received = sum(a["received"] for a in summary["accounting"].values())
    assert ep["episodes/sent"] == received == rows[-1]["buffer/taken"] + rows[-1]["buffer/dropped"] \
        + rows[-1]["buffer/size"]
    # the learner held the actors back: each spent most of the run waiting for its credit
    wall = rows[-1]["time_s"] - rows[0]["time_s"]
    send = [a["time/send_s"] for a in summary["actors"]]
    assert min(send) > 0.3 * wall, (send, wall)
    (tmp_path / "overload.json").write_text(json.dumps({
        "steps": steps, "wall_s": wall, "send_s": send,
        "buffer_bytes_max": max(r["buffer/bytes"] for r in rows),
        "buffer_size_max": max(r["buffer/size"] for r in rows),
        "staleness_max": max(r["policy/staleness_max"] for r in rows),
        "dropped": {k: rows[-1][k] for k in rows[-1] if k.startswith("buffer/dropped")},
        "episodes": ep}, indent=2))
