"""OpenEnv's own template environment for tests: what ``python -m openenv.cli init echo_env``
writes (offline), and that template's own server, started and stopped by the test."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ENTRY_POINT = "echo_env.server.echo_env_environment:EchoEnvironment"


def write_template(folder: Path) -> Path:
    """``openenv init echo_env`` run in ``folder``; returns ``folder`` (its import path)."""
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_env"], cwd=folder, check=True,
                   capture_output=True, timeout=120)
    assert (folder / "echo_env" / "server" / "app.py").exists()
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(folder: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """The template's server (its ``server/app.py`` under uvicorn, as its README runs it) on a
    free local port; yields its URL; stopped, by its process id, on leaving."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "echo_env.server.app:app",
                             "--host", "127.0.0.1", "--port", str(port)], cwd=folder,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the template's server did not start: {proc.stderr.read()[-2000:]!r}") from None
                time.sleep(0.2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
