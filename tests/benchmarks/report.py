"""Shared by the benchmarks: print rows as a Markdown table and optionally save them as JSON; run
one measurement in a fresh process."""

import json
import multiprocessing as mp
from pathlib import Path


def report(rows: list[dict], json_path: str | None = None) -> None:
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))


def in_fresh_process(target, *args, timeout_s: float = 900.0) -> dict:
    """``target(*args, out)`` in a fresh (spawned) process, so that its memory and imports are
    its own; returns what it put on ``out``. The process is joined, or killed, before returning."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, out))
    proc.start()
    try:
        return out.get(timeout=timeout_s)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
