"""What an evaluation's episodes say, and how sure that is.

An evaluation plays one greedy episode on each held-out seed and ``train.eval_samples`` more
sampled at the training temperature (actors/actor.py's ``evaluate``), and returns every
episode's outcome. Here they become the eval record (``summarize``) and comparisons
(``compare``, the ``python -m launch.run.compare`` command); every outcome is kept in
``<run dir>/evals/step_<step>.jsonl`` (``write_outcomes``, ``read_outcomes``). Pure functions
apart from those two.

Invariants:
- a failed episode (env crash or timeout, an image token generated, the context overflowed) is
  a failure: it counts in ``n`` with success 0, and in ``n_failed`` and ``failed/<reason>``;
  the other means (reward, format, turns, the judge's scores) are over the episodes that ended;
- success comes with its 95% Wilson score interval (``success_lo``, ``success_hi``). For the
  sampled episodes the interval treats the ``samples x seeds`` episodes as independent, which
  they are not within a seed: it is narrower than the truth by up to ``sqrt(samples)``;
  ``compare`` pairs by seed and does not rely on it;
- two evaluations are compared on the seeds (and samples) they share: greedy success by
  McNemar's exact test on the discordant seeds, sampled success by an exact or Monte Carlo
  sign-flip test on the per-seed differences. A difference is reported as real when p < 0.05.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Z95 = 1.959963984540054
ALPHA = 0.05
EXACT_MAX = 16
"""Up to this many non-zero per-seed differences the sign-flip test enumerates every flip."""
MEANS = ("reward", "reward_env", "reward_format", "reward_reasoning", "format_correct", "turns")


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a success rate: ``successes`` of ``n`` (0, 1 for n = 0)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # at 0 and n the bound is exactly 0 or 1 (rounding would leave it a hair off)
    return (0.0 if successes <= 0 else centre - half), (1.0 if successes >= n else centre + half)


def summarize(outcomes: list[dict[str, Any]]) -> dict[str, float]:
    """The eval record of ``outcomes``: greedy figures unprefixed (``success``,
    ``success_lo``, ``success_hi``, ``n``, ``n_failed``, ``failed/<reason>``, the means), the
    sampled ones under ``sampled/``."""
    out: dict[str, float] = {}
    for prefix, rows in (("", [o for o in outcomes if o["sample"] < 0]),
                         ("sampled/", [o for o in outcomes if o["sample"] >= 0])):
        if not rows and prefix:
            continue
        ended = [o for o in rows if o["failure"] is None]
        wins = sum(o["success"] for o in ended)
        lo, hi = wilson(wins, len(rows))
        out.update({f"{prefix}success": wins / len(rows) if rows else 0.0, f"{prefix}success_lo": lo,
                    f"{prefix}success_hi": hi, f"{prefix}n": float(len(rows)),
                    f"{prefix}n_failed": float(len(rows) - len(ended))})
        out.update({f"{prefix}failed/{k}": float(v) for k, v in
                    sorted(Counter(o["failure"] for o in rows if o["failure"] is not None).items())})
        scores = sorted({k for o in ended for k in o if k.endswith("_score")})
        for key in (*MEANS, *scores):
            out[f"{prefix}{key}"] = float(np.mean([o.get(key, 0.0) for o in ended])) if ended else 0.0
    return out


def mcnemar(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value: of the pairs that disagree, ``a_only`` went A's way and
    ``b_only`` B's; under no difference each way is a fair coin."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(a_only, b_only) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def sign_flip(diffs: list[float], rounds: int = 20000, seed: int = 0) -> float:
    """Two-sided p-value of a mean of paired differences under random signs: every sign pattern
    for up to ``EXACT_MAX`` non-zero differences, ``rounds`` random ones beyond."""
    d = np.asarray([x for x in diffs if x != 0], dtype=float)
    if not d.size:
        return 1.0
    observed = abs(d.sum()) - 1e-12
    if d.size <= EXACT_MAX:
        signs = np.array(list(itertools.product((-1.0, 1.0), repeat=d.size)))
    else:
        signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(rounds, d.size))
    return float(np.mean(np.abs(signs @ d) >= observed))


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]],
            score: Callable[[dict[str, Any]], float] | None = None) -> dict[str, dict[str, Any]]:
    """Evaluation ``b`` against ``a`` (their outcomes), paired on what they share: per mode
    (``greedy``, ``sampled``) the seeds paired, both rates, the difference (b - a) with a 95%
    interval (normal, over per-seed differences), the p-value, and whether it is real. The rate
    is of success, or of ``score`` (an outcome -> 0 or 1, e.g. whether every answer was
    well-formed) where given; a failed episode scores 0 either way."""
    out = {}
    for mode, greedy in (("greedy", True), ("sampled", False)):
        per_seed = [_per_seed(x, greedy, score) for x in (a, b)]
        seeds = sorted(set(per_seed[0]) & set(per_seed[1]))
        if not seeds:
            continue
        sa = [per_seed[0][s] for s in seeds]
        sb = [per_seed[1][s] for s in seeds]
        diffs = [y - x for x, y in zip(sa, sb)]
        if greedy:
            p = mcnemar(sum(x > y for x, y in zip(sa, sb)), sum(y > x for x, y in zip(sa, sb)))
        else:
            p = sign_flip(diffs)
        mean = float(np.mean(diffs))
        half = Z95 * float(np.std(diffs, ddof=1)) / math.sqrt(len(diffs)) if len(diffs) > 1 else 1.0
        out[mode] = {"seeds": len(seeds), "a": float(np.mean(sa)), "b": float(np.mean(sb)),
                     "diff": mean, "diff_lo": mean - half, "diff_hi": mean + half, "p": p,
                     "real": p < ALPHA}
    return out


def _per_seed(outcomes: list[dict[str, Any]], greedy: bool,
              score: Callable[[dict[str, Any]], float] | None = None) -> dict[int, float]:
    """Success (or ``score``) per seed, a failed episode counting 0: the greedy episode's, or
    the mean of the sampled ones."""
    by_seed: dict[int, list[float]] = defaultdict(list)
    for o in outcomes:
        if (o["sample"] < 0) == greedy:
            value = float(o["success"]) if score is None else float(score(o))
            by_seed[o["seed"]].append(0.0 if o["failure"] is not None else value)
    return {s: float(np.mean(v)) for s, v in by_seed.items()}


def outcomes_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "evals" / f"step_{step:06d}.jsonl"


def write_outcomes(run_dir: Path, step: int, outcomes: list[dict[str, Any]]) -> Path:
    """Every episode's outcome of the evaluation at ``step``, one JSON object a line."""
    return write_lines(outcomes_path(run_dir, step), outcomes)


def write_lines(path: Path, outcomes: list[dict[str, Any]]) -> Path:
    """``outcomes`` to ``path``, one JSON object a line (its directory made where missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(o) + "\n" for o in outcomes))
    return path


def eval_steps(run_dir: Path) -> list[int]:
    """The steps at which ``run_dir`` has evaluation outcomes, in order."""
    return sorted(int(p.stem.removeprefix("step_")) for p in (Path(run_dir) / "evals").glob("step_*.jsonl"))


def read_outcomes(run_dir: Path, step: int) -> list[dict[str, Any]]:
    path = outcomes_path(run_dir, step)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no evaluation at step {step} (there are: {eval_steps(run_dir)})")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
