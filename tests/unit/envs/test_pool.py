"""envs/pool.py: batched calls equal in-process envs; env errors, crashes and hangs end episodes
visibly, workers are replaced, counters add up, and no worker outlives the pool."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from envs.formats import format_example
from envs.pool import EnvPool, EnvPoolError
from envs.protocol import Observation, StepResult
from envs.registry import make_env
from envs.service import LocalEnvClient
from envs.wire import EpisodeFailure, from_wire, to_wire
from tests.envs_api import env_reset, env_step
from tests.unit.envs.fake_envs import CounterEnv, assert_same

FAKE = "tests.unit.envs.fake_envs:"


def _gone(pid: int) -> bool:
    """True once the process is dead and reaped (no zombie left behind)."""
    return not os.path.exists(f"/proc/{pid}")


def _pool(env: str, config: dict | None = None, **kw) -> EnvPool:
    kw = {"num_workers": 2, "envs_per_worker": 2, "step_timeout_s": 2.0, "reset_timeout_s": 2.0, **kw}
    return EnvPool((FAKE + env, config or {}), **kw)


def _check_against_in_process(factory, seeds, turns, **kw) -> None:
    local = [make_env(factory) for _ in seeds]
    slots = list(range(len(seeds)))
    with EnvPool(factory, step_timeout_s=10.0, reset_timeout_s=10.0, **kw) as pool:
        for got, env, seed in zip(pool.reset(slots, seeds), local, seeds):
            assert_same(got, env_reset(env, seed))
        live, steps = list(slots), 0  # slots whose episode is still running
        for texts in turns:
            results = pool.step(live, [texts[s] for s in live])
            for slot, got in zip(live, results):
                assert_same(got, env_step(local[slot], texts[slot]))
            steps += len(live)
            live = [s for s, r in zip(live, results) if not r.done]
        assert pool.state_text(1) == local[1].state_text()
        assert pool.system_prompt(0) == local[0].system_prompt()
        assert pool.stats()["steps"] == steps


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_batched_calls_equal_in_process(start_method):
    turns = [["a", "bb", "ccc", "", "e", "ff"], ["x"] * 6]
    _check_against_in_process((FAKE + "CounterEnv", {"image": True}), [3, 1, 4, 1, 5, 9], turns,
                              num_workers=2, envs_per_worker=3, start_method=start_method)


REAL_ENVS = [("frozenlake", {}), ("frozenlake", {"render": "image", "image_size": 32}),
             ("sokoban", {})]


@pytest.mark.parametrize("factory", REAL_ENVS, ids=lambda f: f"{f[0]}-{f[1].get('render', 'text')}")
def test_real_envs_equal_in_process(factory):
    answers = [format_example("grounding_worldmodeling", action_example=a)
               for a in ("Left,Down", "Right", "Down,Down,Right", "Up")] + ["nonsense"]
    turns = [[answers[(i + t) % len(answers)] for i in range(4)] for t in range(4)]
    _check_against_in_process(factory, [0, 1, 2, 3], turns, num_workers=2, envs_per_worker=2)


def test_env_error_fails_the_slot_and_the_worker_lives():
    with _pool("RaisingEnv") as pool:
        pids = pool.worker_pids()
        assert all(isinstance(r, Observation) for r in pool.reset([0, 1, 2], [0, 0, 0]))
        out = pool.step([0, 1, 2], ["a", "raise", "b"])
        assert out[1] == EpisodeFailure("env_error: RuntimeError: boom")
        assert isinstance(out[0], StepResult) and isinstance(out[2], StepResult)
        assert pool.step([1], ["a"]) == [EpisodeFailure("no_episode")]  # needs a reset now
        assert pool.reset([1, 3], [5, -1])[1] == EpisodeFailure("env_error: RuntimeError: bad seed")
        assert pool.step([1], ["abc"])[0].observation.text == "value=8"
        failure = pool.step([0, 1], ["unencodable", "b"])[0]
        assert failure.reason.startswith("env_error: CodecError: cannot encode object")
        assert pool.worker_pids() == pids
        assert pool.stats() == {"resets": 4, "steps": 4, "env_errors": 3, "timeouts": 0,
                                "worker_crashes": 0, "worker_restarts": 0,
                                "worker_start_failures": 0, "failed_episodes": 3}


def test_killed_worker_is_replaced_and_its_episodes_fail():
    with _pool("CounterEnv") as pool:
        pool.reset([0, 1, 2, 3], [0, 1, 2, 3])
        pool.step([0, 1, 2, 3], ["a"] * 4)
        dead = pool.worker_pids()[0]
        os.kill(dead, signal.SIGKILL)
        out = pool.step([0, 1, 2, 3], ["a"] * 4)
        assert out[:2] == [EpisodeFailure("worker_crashed")] * 2
        assert [r.observation.text for r in out[2:]] == ["value=4", "value=5"]
        assert _gone(dead) and pool.worker_pids()[0] != dead
        assert [r.text for r in pool.reset([0, 1], [7, 8])] == ["value=7", "value=8"]
        assert pool.step([0], ["bb"])[0].observation.text == "value=9"
        stats = pool.stats()
        assert (stats["worker_crashes"], stats["worker_restarts"], stats["failed_episodes"]) == (1, 1, 2)


def test_crash_mid_step_ends_the_other_episodes_of_that_worker():
    with _pool("CrashingEnv") as pool:
        pool.reset([0, 1, 2, 3], [0, 0, 0, 0])
        out = pool.step([0, 2], ["crash", "a"])
        assert out[0] == EpisodeFailure("worker_crashed") and isinstance(out[1], StepResult)
        # slot 1 lived in the same worker: its episode is over, and it says why, once
        assert pool.state_text(1) == EpisodeFailure("worker_crashed")
        assert pool.step([1, 3], ["a", "a"])[0] == EpisodeFailure("no_episode")
        assert pool.stats()["failed_episodes"] == 2
        assert pool.reset([0, 1], [1, 2])[1].text == "value=2"


def test_hung_step_times_out_and_the_worker_is_replaced():
    with _pool("HangingEnv", step_timeout_s=1.0) as pool:
        pool.reset([0, 1, 2, 3], [0, 0, 0, 0])
        hung = pool.worker_pids()[0]
        start = time.monotonic()
        out = pool.step([0, 2], ["hang", "a"])
        elapsed = time.monotonic() - start
        assert out[0] == EpisodeFailure("timeout") and isinstance(out[1], StepResult)
        assert 1.0 <= elapsed < 2.5
        assert _gone(hung) and pool.worker_pids()[0] != hung
        assert pool.step([1], ["a"]) == [EpisodeFailure("timeout")]
        assert pool.reset([0], [4])[0].text == "value=4"
        stats = pool.stats()
        assert (stats["timeouts"], stats["worker_restarts"], stats["failed_episodes"]) == (1, 1, 2)


def test_calls_on_different_workers_run_in_parallel():
    async def run(client: LocalEnvClient) -> float:
        await client.reset([0, 1, 2], [0, 0, 0])
        start = time.monotonic()
        out = await asyncio.gather(client.step([0], ["hang"]), client.step([2], ["hang"]))
        assert all(isinstance(r[0], StepResult) for r in out)
        return time.monotonic() - start

    with _pool("HangingEnv", {"hang_s": 0.4}) as pool:
        client = LocalEnvClient(pool)
        try:
            assert asyncio.run(run(client)) < 0.75  # 0.8 s one after the other
        finally:
            asyncio.run(client.close())


def test_close_leaves_no_process_behind():
    pool = _pool("CrashingEnv")
    pids = set(pool.worker_pids())
    pool.reset([0, 1, 2, 3], [0] * 4)
    pool.step([0], ["crash"])  # one replacement, so three workers were started in all
    pids |= set(pool.worker_pids())
    pool.close()
    assert len(pids) == 3 and all(_gone(pid) for pid in pids)
    with pytest.raises(EnvPoolError):
        pool.step([0], ["a"])
    pool.close()  # idempotent


def test_a_replacement_that_cannot_start_leaves_the_worker_down_until_one_can(tmp_path):
    """The replacement of a killed worker fails to build its envs: its slots fail with
    worker_down and nothing raises; once start_timeout_s has passed and the envs can be built
    again, the next call brings the worker back, and the call's own timeout (shorter than the
    1.4 s start of two envs) counts from then. The other worker serves all along (a 1 s timeout
    leaves it room on a loaded machine: 0.5 s timed out beside three busy processes)."""
    block = tmp_path / "block"
    with _pool("flaky_factory", {"block": str(block), "start_s": 0.7}, start_timeout_s=3.0,
               step_timeout_s=1.0, reset_timeout_s=1.0) as pool:
        pool.reset([0, 1, 2, 3], [0, 1, 2, 3])
        block.touch()
        dead = pool.worker_pids()[0]
        os.kill(dead, signal.SIGKILL)
        out = pool.step([0, 1, 2, 3], ["a"] * 4)
        assert out[:2] == [EpisodeFailure("worker_crashed")] * 2
        assert [r.observation.text for r in out[2:]] == ["value=3", "value=4"]
        assert pool.reset([0, 2], [7, 8])[0] == EpisodeFailure("worker_down")
        assert pool.system_prompt(1) == EpisodeFailure("worker_down")
        assert pool.stats()["worker_start_failures"] == 1  # no second try within start_timeout_s
        block.unlink()
        time.sleep(3.1)
        assert [r.text for r in pool.reset([0, 1], [7, 8])] == ["value=7", "value=8"]
        assert pool.step([1], ["bb"])[0].observation.text == "value=10"
        stats = pool.stats()
        assert (stats["worker_crashes"], stats["worker_restarts"], stats["worker_start_failures"],
                stats["failed_episodes"]) == (1, 2, 1, 3)
    assert _gone(dead)


def test_factory_error_raises_at_start():
    with pytest.raises(EnvPoolError, match="no such env"):
        _pool("failing_factory")


def test_bad_calls_raise():
    with _pool("CounterEnv", num_workers=1) as pool:
        with pytest.raises(ValueError):
            pool.step([2], ["a"])
        with pytest.raises(ValueError):
            pool.reset([0, 0], [1, 2])
        with pytest.raises(ValueError):
            pool.reset([0], [1, 2])


def test_wire_round_trip():
    env = CounterEnv(image=True)
    for result in [env_reset(env, 3), env_step(env, "ab"), EpisodeFailure("timeout"), "some text"]:
        back = from_wire(to_wire(result))
        if isinstance(result, (Observation, StepResult)):
            assert_same(back, result)
        else:
            assert back == result
