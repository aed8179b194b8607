"""Whether ManiSkill can simulate here: ``requires_maniskill()`` skips a test, saying why, on a
machine without a Vulkan device (launch/tools/system.sh sets up Mesa's lavapipe where it can)."""

import functools
import subprocess
import sys

import pytest

_PROBE = ("from envs.primitive_skill.game import PrimitiveSkill; "
          "PrimitiveSkill('PlaceTwoCube', image_size=32).close()")


@functools.cache
def problem() -> str | None:
    """None when a PrimitiveSkill simulator starts, else the reason it does not (in a child
    process: a missing Vulkan device can abort the process that asks)."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                              timeout=300)
    except subprocess.TimeoutExpired:
        return "a ManiSkill simulator did not start within 300 s"
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return f"ManiSkill cannot simulate here (no Vulkan device? run `make system`): {last}"


def requires_maniskill() -> pytest.MarkDecorator:
    """A skip mark carrying ``problem()`` where there is one (probed once per test run)."""
    reason = problem()
    return pytest.mark.skipif(reason is not None, reason=reason or "")
