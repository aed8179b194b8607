"""What a run writes and shows: metrics.jsonl, a progress line, wandb, the learning-curve PNG
(success, and the reasoning judge's eval scores where the env has one).

Called by the training loop (launch/run/loop.py) once per learner step and per evaluation.
Invariants: every record is one JSON line in ``<run dir>/metrics.jsonl`` (``kind`` is ``train``
or ``eval``) written before anything else can fail; wandb is optional and offline unless the
config says online; the PNG is redrawn from the records, so it always matches the jsonl.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

PROGRESS_KEYS = (
    ("step", "step", "{:.0f}"),
    ("success", "rollout/success", "{:.2f}"),
    ("reward", "rollout/reward", "{:.2f}"),
    ("stale", "policy/staleness_mean", "{:.2f}"),
    ("traj/s", "throughput/trajectories_per_s", "{:.1f}"),
    ("tok/s", "throughput/tokens_per_s", "{:.0f}"),
)
FAULT_KEYS = (
    ("replaced", "faults/actors_replaced"), ("hung", "faults/actors_hung"),
    ("reformed", "faults/weight_group_reformed"), ("env down", "faults/env_services_down"),
    ("failed", "episodes/failed"), ("lost", "episodes/lost"), ("refused", "buffer/refused"),
)
"""Shown after ``faults:`` in the progress line where not zero (run totals so far)."""


class RunLogger:
    def __init__(self, run_dir: Path, config: dict[str, Any], *, wandb_mode: str = "offline",
                 use_wandb: bool = True, project: str = "vagen-async", name: str = "") -> None:
        self.run_dir = Path(run_dir)
        self.env_name = str(config.get("env_name") or "")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        exists = (self.run_dir / "metrics.jsonl").exists()
        self.records: list[dict[str, Any]] = read_records(self.run_dir) if exists else []  # a resumed run's
        self._file = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8")
        self._t0 = time.time() - (self.records[-1]["time_s"] if self.records else 0.0)
        self._wandb = None
        if use_wandb and wandb_mode != "disabled":
            import wandb

            self._wandb = wandb.init(project=project, name=name or None, dir=str(self.run_dir),
                                     mode=wandb_mode,  # type: ignore[arg-type]  # checked by LoggerConfig
                                     config=config, reinit="finish_previous")

    def log(self, kind: str, step: int, metrics: dict[str, float]) -> dict[str, Any]:
        """Record ``metrics`` (flat numbers; lists and dicts, such as an evaluation's recorded
        episodes, are not metrics and are left out) and return the record."""
        record = {"kind": kind, "step": step, "time_s": round(time.time() - self._t0, 2),
                  **{k: _plain(v) for k, v in metrics.items() if not isinstance(v, (list, dict))}}
        self.records.append(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log({f"{kind}/{k}" if kind == "eval" else k: v for k, v in record.items()
                             if isinstance(v, (int, float)) and k not in ("step", "kind")}, step=step)
        return record

    def progress(self, record: dict[str, Any]) -> str:
        parts = [f"{name} " + fmt.format(record[key]) for name, key, fmt in PROGRESS_KEYS
                 if isinstance(record.get(key), (int, float))]
        faults = [f"{name} {record[key]:.0f}" for name, key in FAULT_KEYS if record.get(key)]
        if faults:
            parts.append("faults: " + ", ".join(faults))
        line = f"[{record['time_s']:7.1f}s] " + " | ".join(parts)
        print(line, flush=True)
        return line

    def plot(self) -> Path | None:
        """learning_curve.png, titled with the env: training success per step, and greedy and
        sampled eval success with their 95% intervals; below, where the env has a reasoning
        judge, its eval scores (``eval_scores``)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        train = [r for r in self.records if r["kind"] == "train" and "rollout/success" in r]
        evals = [r for r in self.records if r["kind"] == "eval" and "success" in r]
        if not train and not evals:
            return None
        scores = eval_scores(self.records)
        fig, axes = plt.subplots(2 if scores else 1, 1, figsize=(7, 6.5 if scores else 4),
                                 sharex=True, squeeze=False)
        ax = axes[0, 0]
        if train:
            ax.plot([r["step"] for r in train], [r["rollout/success"] for r in train],
                    label="rollout success (sampled)", alpha=0.6)
        for name, (steps, values, lo, hi) in eval_successes(evals).items():
            ax.errorbar(steps, values, yerr=[[v - x for v, x in zip(values, lo)], [x - v for v, x in zip(values, hi)]],
                        fmt="o-" if name == "greedy" else "s--", capsize=3,
                        label=f"eval success ({name}, held-out maps, 95% interval)")
        for i, (name, figures) in enumerate(baseline_figures(self.records).items()):
            ax.axhline(figures["success"], ls=":", lw=1, color=f"C{3 + i}",
                       label=f"floor: {name} (step 0, greedy)")
        ax.set_ylabel("success rate")
        if self.env_name:
            ax.set_title(self.env_name)
        for name, (steps, values) in scores.items():
            axes[1, 0].plot(steps, values, "s-", label=f"eval {name}")
        if scores:
            axes[1, 0].set_ylabel("judge's score (eval mean)")
        for ax in axes[:, 0]:
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
            ax.legend(loc="best", fontsize="small")
        axes[-1, 0].set_xlabel("learner step")
        path = self.run_dir / "learning_curve.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def eval_successes(records: list[dict[str, Any]]) -> dict[str, tuple[list[Any], ...]]:
    """Greedy and sampled success over the eval records with their 95% intervals: mode ->
    (steps, values, lows, highs), in record order (a record without an interval: the value)."""
    out: dict[str, tuple[list[Any], ...]] = {}
    for prefix, name in (("", "greedy"), ("sampled/", "sampled")):
        points = [r for r in records if r["kind"] == "eval" and f"{prefix}success" in r]
        if points:
            values = [r[f"{prefix}success"] for r in points]
            out[name] = ([r["step"] for r in points], values,
                         [r.get(f"{prefix}success_lo", v) for r, v in zip(points, values)],
                         [r.get(f"{prefix}success_hi", v) for r, v in zip(points, values)])
    return out


def eval_scores(records: list[dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """The reasoning judge's scores over the eval records (every key ending in ``_score``, e.g.
    ``observation_score``, of the greedy episodes): name -> (steps, values), in record order;
    {} without a judge."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for r in records:
        if r["kind"] != "eval":
            continue
        for key, value in r.items():
            if key.endswith("_score") and "/" not in key and isinstance(value, (int, float)):
                steps, values = out.setdefault(key, ([], []))
                steps.append(r["step"])
                values.append(float(value))
    return out


def read_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of ``<run dir>/metrics.jsonl``, in the order they were logged."""
    text = (Path(run_dir) / "metrics.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def _plain(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if hasattr(v, "item"):
        return v.item()
    return v


def baseline_figures(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each baseline's figures (launch/run/baselines.py) from a run's ``baseline`` record, by
    name: ``{"random": {"success": ..., "success_lo": ..., "reward": ...}, ...}`` ({} without)."""
    out: dict[str, dict[str, float]] = {}
    for record in records:
        if record["kind"] == "baseline":
            for key, value in record.items():
                if key.startswith("baseline/"):
                    name, figure = key.removeprefix("baseline/").split("/", 1)
                    out.setdefault(name, {})[figure] = value
    return out
