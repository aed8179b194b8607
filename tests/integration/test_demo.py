"""`make train`'s synchronous demo loop: real vLLM sampling, real weight hot-swap, learning.

Runs `python -m launch.demo` in a child process (its vLLM engine dies with it) on the tiny model.
"""

import subprocess
import sys
from pathlib import Path

from launch.metrics import read_records

ROOT = Path(__file__).resolve().parents[2]


def test_demo_loop_learns_and_keeps_vllm_in_sync(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "launch.demo", "--steps", "20", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_records(out)
    assert [r["step"] for r in rows] == list(range(20))
    # Every update reached the engine: vLLM's behaviour log-probs match the trained HF policy.
    assert max(r["policy/vllm_logp_gap"] for r in rows) < 1e-4
    rewards = [r["rollout/reward"] for r in rows]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert first < 0.1, rewards
    assert last > first + 0.3, rewards
