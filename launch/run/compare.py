"""Whether two evaluations differ: ``python -m launch.run.compare A [B]``.

Each of A and B is a run directory, optionally with ``@<step>`` for one of its evaluations
(default: its last). With A alone, its first evaluation is compared with its last (before and
after RL). The two are paired on the held-out seeds they share (launch/run/evaluation.py's
``compare``: McNemar's exact test for greedy success, a sign-flip test on per-seed means for
sampled success) and each line says whether the difference is real (p < 0.05) or inside the
noise. Exit status 0 either way; 2 when there is nothing to compare.

    $ python -m launch.run.compare outputs/run@0 outputs/run@100
    greedy   256 seeds  0.211 -> 0.305  +0.094 [+0.05, +0.14]  p 0.0001  real
    sampled  256 seeds  0.198 -> 0.231  +0.033 [-0.01, +0.07]  p 0.1432  no difference (inside the noise)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launch.run import evaluation


def _evaluation(spec: str, default: str) -> tuple[str, list[dict]]:
    """``<run dir>[@<step>]`` -> its name and outcomes; ``default`` picks "first" or "last"."""
    path, _, step = spec.partition("@")
    steps = evaluation.eval_steps(Path(path))
    if not steps:
        raise SystemExit(f"{path}: no evaluation outcomes (evals/step_*.jsonl) there")
    chosen = int(step) if step else (steps[0] if default == "first" else steps[-1])
    return f"{path}@{chosen}", evaluation.read_outcomes(Path(path), chosen)


def lines(result: dict[str, dict]) -> list[str]:
    out = []
    for mode, r in result.items():
        verdict = "real" if r["real"] else "no difference (inside the noise)"
        out.append(f"{mode:<8} {r['seeds']:>4} seeds  {r['a']:.3f} -> {r['b']:.3f}  {r['diff']:+.3f} "
                   f"[{r['diff_lo']:+.2f}, {r['diff_hi']:+.2f}]  p {r['p']:.4f}  {verdict}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="<run dir>[@<step>]; alone: its first evaluation against its last")
    p.add_argument("b", nargs="?", help="<run dir>[@<step>] (default step: the last evaluation)")
    args = p.parse_args(argv)
    name_a, a = _evaluation(args.a, "first" if args.b is None else "last")
    name_b, b = _evaluation(args.b or args.a, "last")
    result = evaluation.compare(a, b)
    if not result:
        print(f"{name_a} and {name_b} share no seeds", file=sys.stderr)
        return 2
    print(f"A = {name_a}\nB = {name_b}")
    print("\n".join(lines(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
