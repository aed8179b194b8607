"""Shared by the benchmarks: print rows as a Markdown table and optionally save them as JSON."""

import json
from pathlib import Path


def report(rows: list[dict], json_path: str | None = None) -> None:
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
