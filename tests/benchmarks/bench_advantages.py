"""Benchmark: vectorised advantage estimators against the straightforward per-token loop.

Run with `make bench` (or `python -m tests.benchmarks.bench_advantages`). Both sides run in the
same process on the same multi-turn batches; the figure that matters is the ratio. The baseline
is tests/naive_advantages.py: per-row, per-token Python loops over floats (it converts tensors to
lists once, the fastest form such a loop takes). Prints a Markdown table; `--json PATH` saves it.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

from learner import advantages as fast
from tests import naive_advantages as naive
from tests.benchmarks.report import report

SHAPES = [(64, 1024), (256, 4096)]
KW = {
    "masked_gae": dict(gamma=1.0, lam=0.95),
    "bi_level_gae": dict(gamma_token=1.0, gamma_turn=0.95, lam_token=0.95, lam_turn=0.95),
    "turn_wise_gae": dict(gamma_turn=0.95, lam_turn=0.95),
}


def _best_of(fn, repeats: int, budget_s: float) -> float:
    """Best wall time of up to ``repeats`` calls (stops early once ``budget_s`` is spent)."""
    best, spent = float("inf"), 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
        if spent > budget_s:
            break
    return best


def run(repeats: int) -> list[dict]:
    rows = []
    for batch, length in SHAPES:
        g = torch.Generator().manual_seed(0)
        rewards, values, mask, turn_end, log_rho = naive.random_episode_batch(
            batch, length, generator=g, max_turns=5
        )
        for name, kw in KW.items():
            args = (rewards, values, mask) if name == "masked_gae" else (rewards, values, mask, turn_end)
            for corrected in (False, True):
                extra = {"log_rho": log_rho} if corrected else {}
                f_fast = functools.partial(getattr(fast, name), *args, **kw, **extra)
                f_slow = functools.partial(getattr(naive, name), *args, **kw, **extra)
                f_fast()  # warm-up
                t_fast = _best_of(f_fast, repeats * 5, budget_s=2.0)
                t_slow = _best_of(f_slow, repeats, budget_s=10.0)
                rows.append({
                    "estimator": name + (" +vtrace" if corrected else ""),
                    "shape": f"{batch}x{length}",
                    "policy_tokens": int(mask.sum()),
                    "vectorised_ms": round(t_fast * 1e3, 2),
                    "per_token_loop_ms": round(t_slow * 1e3, 1),
                    "speedup": round(t_slow / t_fast, 1),
                })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the per-token loop is single-threaded; compare like with like
    rows = run(args.repeats)
    report(rows, args.json)


if __name__ == "__main__":
    main()
