"""The table of a sweep: after ``python -m launch.train --multirun ...`` ends, one row per run
with its overrides and final metrics, written next to the runs as ``sweep.md`` and ``sweep.csv``.

Called by Hydra (configs/train.yaml registers ``SweepTable`` under ``hydra.callbacks``) at the
end of a multirun; ``collect(sweep_dir)`` also works on its own, on a sweep that was cut short.
A run without a ``summary.json`` (it failed before writing one) still gets its row, marked so.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

COLUMNS = ("run", "overrides", "steps", "eval_before", "eval_after", "eval_last3_mean",
           "eval_before_sampled", "eval_after_sampled", "floor", "interrupted", "status")
"""``floor``: the highest greedy success of the run's floors (launch/run/baselines.py)."""


def collect(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """A row per run directory under ``sweep_dir`` (Hydra's job subdirectories), in job order;
    written to ``sweep_dir/sweep.md`` and ``sweep_dir/sweep.csv``."""
    sweep_dir = Path(sweep_dir)
    rows = []
    for run in sorted((d for d in sweep_dir.iterdir() if (d / ".hydra").is_dir()),
                      key=lambda d: _job_number(d.name)):
        row: dict[str, Any] = {"run": run.name, "overrides": " ".join(_overrides(run))}
        summary = run / "summary.json"
        if summary.exists():
            data = json.loads(summary.read_text())
            row.update({k: data.get(k) for k in COLUMNS[2:-1]})
            row["floor"] = max((f.get("success", 0.0) for f in (data.get("baselines") or {}).values()), default=None)
            row["status"] = "interrupted" if data.get("interrupted") else "done"
        else:
            row["status"] = "no summary (failed)"
        rows.append(row)
    _write(sweep_dir, rows)
    return rows


class SweepTable(Callback):
    """Hydra callback: ``collect`` the sweep's directory when a multirun ends."""

    def on_multirun_end(self, config, **kwargs) -> None:
        rows = collect(config.hydra.sweep.dir)
        print(f"sweep of {len(rows)} runs: {Path(config.hydra.sweep.dir).resolve() / 'sweep.md'}",
              flush=True)


def _job_number(name: str) -> tuple[int, str]:
    head = name.split("-", 1)[0]
    return (int(head), name) if head.isdigit() else (1 << 30, name)


def _overrides(run: Path) -> list[str]:
    path = run / ".hydra" / "overrides.yaml"
    if not path.exists():
        return []
    import yaml

    return [str(o) for o in yaml.safe_load(path.read_text()) or []]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "" if value is None else str(value)


def _write(sweep_dir: Path, rows: list[dict[str, Any]]) -> None:
    with open(sweep_dir / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    (sweep_dir / "sweep.md").write_text("\n".join(lines) + "\n")
