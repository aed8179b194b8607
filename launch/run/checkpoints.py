"""A run's checkpoints on disk, and what resuming a run reads back.

Called by launch/run/loop.py. Layout: ``<run dir>/checkpoints/step-<N>/`` holds what the learner ranks
write (``learner/trainer.py``: sharded models and optimizers, ``extra.json``, each rank's RNG
states). Invariants:
- atomic: the ranks write into ``step-<N>.tmp/``, which is renamed to ``step-<N>/`` only once
  every rank has returned, so a crash mid-write leaves no checkpoint that ``latest`` would take
  (a left-over ``.tmp`` is removed by the next commit);
- the newest ``keep`` checkpoints stay, older ones are deleted after a new one is committed;
- resuming at step N keeps the metrics records of steps up to N and drops later ones (they
  belong to steps that will run again), so no step is counted twice in ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

_STEP = re.compile(r"^step-(\d+)$")


def root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def staging(run_dir: str | Path, step: int) -> Path:
    """Where the ranks write the checkpoint of ``step`` (created, emptied if left over)."""
    path = root(run_dir) / f"step-{step:06d}.tmp"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def commit(run_dir: str | Path, step: int, keep: int) -> Path:
    """Publish the staged checkpoint of ``step``; delete all but the newest ``keep`` and any
    left-over staging folder. Returns the checkpoint's folder."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    base = root(run_dir)
    final = base / f"step-{step:06d}"
    shutil.rmtree(final, ignore_errors=True)  # the same step again (the final save): the newer
    (base / f"step-{step:06d}.tmp").rename(final)
    for old in all_steps(run_dir)[:-keep]:
        shutil.rmtree(old)
    for left in base.glob("*.tmp"):
        shutil.rmtree(left, ignore_errors=True)
    return final


def all_steps(run_dir: str | Path) -> list[Path]:
    """Committed checkpoints, oldest first."""
    base = root(run_dir)
    if not base.exists():
        return []
    found = [(int(m.group(1)), p) for p in base.iterdir() if (m := _STEP.match(p.name))]
    return [p for _, p in sorted(found)]


def latest(run_dir: str | Path) -> Path | None:
    steps = all_steps(run_dir)
    return steps[-1] if steps else None


def resume_hint(run_dir: str | Path) -> str | None:
    """What to run to continue a run that stopped early (an error, a stop request) from its newest
    checkpoint, or None where it has none."""
    newest = latest(run_dir)
    if newest is None:
        return None
    step = int(newest.name.split("-")[-1])
    return (f"checkpoint of step {step} in {newest}; to continue the run: "
            f'make train ARGS="train.resume={Path(run_dir).resolve()}" '
            f"(or python -m launch.train train.resume={Path(run_dir).resolve()})")


def read_extra(checkpoint: str | Path) -> dict[str, Any]:
    """What the driver saved with a checkpoint (step, version, the actors' seed streams): JSON,
    so reading it executes nothing."""
    path = Path(checkpoint) / "extra.json"
    if not path.exists() and (path.parent / "extra.pt").exists():
        raise ValueError(f"{path.parent} was written by an older version, whose checkpoints held "
                         "pickles (extra.pt), which are no longer loaded")
    extra = json.loads(path.read_text(encoding="utf-8"))
    extra.pop("_trainer", None)
    return extra


def truncate_records(run_dir: str | Path, step: int) -> int:
    """Drop the metrics records of steps after ``step`` (rewritten atomically); returns how many
    were dropped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line)["step"] <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    tmp.replace(path)
    return len(lines) - len(kept)
