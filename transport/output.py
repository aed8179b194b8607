"""Send this process's output, and its future children's, to a log file.

The learner ranks and the inference actors call ``redirect_output`` first thing when the run keeps
the console to its own lines (``logger.console=run``): vLLM's engine core and worker, started
later by the actor, inherit the descriptors, so the engine's logs (model loading, every weight
reload) land in ``<run dir>/logs/<process>.log`` instead of the driver's console. Errors still
reach the driver: Ray re-raises a failed call's exception there.

Descriptor-level (``dup2``), not ``sys.stdout``: C extensions and child processes write to the
descriptors, not to Python's objects.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def redirect_output(path: str | Path | None) -> Path | None:
    """Point descriptors 1 and 2 at ``path`` (appended to; its folder made); None: leave them.
    Returns the path redirected to."""
    if path is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    return path
