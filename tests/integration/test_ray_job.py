"""The real client: a local Ray head on loopback with token authentication (as Ray 2.60 asks),
``ray job submit --working-dir`` of ``python -m launch.train`` for one step, as a user types it,
then ``ray job status`` and ``ray job logs``, and the run's summary where ``storage`` said, after
Ray has deleted its copy of the working directory. The head and everything it started are
stopped by their process ids, also on failure; the token is this test's own file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
SHORT = ["env=action_words", "algorithm=grpo", "warm_start.enabled=false", "train.steps=1",
         "train.batch_size=4", "train.eval_every=0", "train.eval_seeds=4", "train.save_samples=0",
         "learner.ranks=1", "actors.concurrency=4", "actors.group_size=4", "actors.max_tokens=8",
         "actors.envs_per_worker=4", "logger.wandb=false"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ours(marker: str) -> list[int]:
    """Pids of the processes whose command line names ``marker`` (this test's temp dir)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile
                pass
    return pids


@pytest.mark.timeout(1500)  # beyond the submit's own limit, so the head is always stopped here
def test_ray_job_submit_runs_the_trainer_and_the_run_outlives_the_job(tmp_path):
    scratch = Path(tempfile.mkdtemp(prefix="rayjob-", dir="/tmp"))  # short: Ray's socket paths
    token = scratch / "token"
    token.write_text(uuid.uuid4().hex)
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
               HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    dashboard = _free_port()
    address = f"http://127.0.0.1:{dashboard}"
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={_free_port()}",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
         # ports of its own, where Ray has defaults: another Ray on this machine must not matter
         *(f"--{name}={_free_port()}" for name in (
             "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
             "runtime-env-agent-port", "ray-client-server-port")),
         "--num-cpus=2", f"--temp-dir={scratch / 'ray'}", "--disable-usage-stats"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while subprocess.run([RAY, "job", "list", "--address", address], env=env,
                             capture_output=True).returncode != 0:
            assert time.monotonic() < deadline and head.poll() is None, "the head did not start"
            time.sleep(2)
        storage = tmp_path / "runs"
        for _ in range(30):  # the head's job agent comes up a little after its dashboard
            submit = subprocess.run(
                [RAY, "job", "submit", "--address", address, "--submission-id", "train-1",
                 "--working-dir", str(ROOT), "--", sys.executable, "-m", "launch.train", *SHORT,
                 f"storage={storage}"], env=env, capture_output=True, text=True, timeout=1200)
            if "No available agent" not in submit.stderr:
                break
            time.sleep(2)
        assert submit.returncode == 0, (submit.stdout + submit.stderr)[-4000:]
        status = subprocess.run([RAY, "job", "status", "--address", address, "train-1"],
                                env=env, capture_output=True, text=True).stdout
        assert "Job 'train-1' succeeded" in status, status
        logs = subprocess.run([RAY, "job", "logs", "--address", address, "train-1"],
                              env=env, capture_output=True, text=True).stdout
        (run_dir,) = storage.glob("*/*/summary.json")
        assert f"run directory: {run_dir.parent}" in logs  # printed at start and end
        summary = json.loads(run_dir.read_text())
        # a run that joins a cluster requires CurveZMQ keys on its stream (transport.curve=auto)
        assert summary["steps"] == 1 and summary["stream_curve"] is True
    finally:
        head.send_signal(signal.SIGTERM)  # --block: the CLI stops what it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        for pid in _ours(str(scratch)):  # anything of this head's that outlived it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(scratch, ignore_errors=True)
