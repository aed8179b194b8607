"""Environments nobody here wrote, through the real env worker pool and a short training run
(topology=local): TextArena's games (one against a fixed opponent), reasoning-gym's tasks, and
OpenEnv's template environment (what ``openenv init`` writes) in the workers and behind its own
server."""

from __future__ import annotations

import pytest

from envs.pool import EnvPool
from envs.protocol import Observation, StepResult
from envs.wire import EpisodeFailure
from launch.config.compose import compose
from launch.run.loop import train
from launch.run.metrics import read_records
from tests.envs_api import env_reset, env_step
from tests.openenv_template import ENTRY_POINT, serve, write_template
from tests.unit.envs.fake_envs import assert_same
from tests.unit.envs.test_pool import _check_against_in_process
from tests.unit.envs.test_service import service_process


def reply(answer: str) -> str:
    return f"<think>I think.</think><answer>{answer}</answer>"


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return write_template(tmp_path_factory.mktemp("openenv"))


def _config(name: str, overrides: dict) -> tuple[str, dict]:
    from envs.registry import resolve_config

    return name, resolve_config(name, overrides)


POOLED = {
    "hanoi": ("textarena", {}, ["[A C]", "[A B]", "[C B]", "[B B]", "[A C]", "x"]),
    "mastermind": ("textarena", {"id": "Mastermind-v0", "held_out": True}, ["[1 2 3 4]", "[4 3 2 1]", "[1 1]"]),
    "minesweeper": ("textarena", {"id": "Minesweeper-v0"}, ["[3 3]", "[0 0]", "[7 7]", "[4 4]"]),
    "tictactoe": ("textarena", {"id": "TicTacToe-v0", "num_players": 2, "opponent": "random_available",
                                "max_turns": 5}, ["[0]", "[4]", "[8]", "[2]", "[6]"]),
    "arithmetic": ("reasoning_gym", {"max_turns": 2}, ["12", "-6", "7"]),
    "chain_sum": ("reasoning_gym", {"task": "chain_sum", "max_turns": 2}, ["1", "0"]),
    "openenv": ("openenv", {"entry_point": ENTRY_POINT, "success_reward": 1.0}, ["hi", "hello world", "{"]),
}


@pytest.mark.parametrize("case", list(POOLED))
def test_the_pool_plays_them_as_this_process_does(case, template):
    # Four episodes on two workers of two envs each equal four envs here, turn by turn: the seeds
    # replay across processes, and envs sharing a process keep their own randomness.
    name, overrides, answers = POOLED[case]
    if name == "openenv":
        overrides = {**overrides, "import_path": str(template)}
    turns = [[reply(answers[(i + t) % len(answers)]) if (i + t) % 4 else "malformed" for i in range(4)]
             for t in range(4)]
    _check_against_in_process(_config(name, overrides), [0, 1, 2_000_000, 2_000_001], turns,
                              num_workers=2, envs_per_worker=2)


def test_a_pool_larger_than_the_servers_sessions_waits_then_fails_the_start_with_the_reason(template):
    with serve(template) as url:
        factory = _config("openenv", {"url": url, "max_turns": 2, "session_wait_s": 2.0})
        with EnvPool(factory, num_workers=2, envs_per_worker=1, step_timeout_s=10.0,
                     reset_timeout_s=10.0) as pool:
            first, second = pool.reset([0, 1], [0, 1])  # the template serves one session at a time
            started = [r for r in (first, second) if isinstance(r, Observation)]
            (refused,) = [r for r in (first, second) if isinstance(r, EpisodeFailure)]
            assert len(started) == 1 and "no free session" in refused.reason
            assert "max_concurrent_envs" in refused.reason
            slot = 0 if started[0] is first else 1
            for answer in ("hi", "there"):
                (result,) = pool.step([slot], [reply(answer)])
                assert isinstance(result, StepResult)
            assert result.done  # the episode ended and gave its session back: the other starts
            assert isinstance(pool.reset([1 - slot], [1])[0], Observation)
            assert pool.stats()["worker_crashes"] == 0


def test_the_env_service_serves_a_reasoning_gym_task_from_another_process():
    import asyncio

    from envs.registry import make, resolve_config
    from envs.service import RemoteEnvClient

    with service_process("--env-workers", "1", "--envs-per-worker", "2", "--set", "task=chain_sum",
                         "--set", "max_turns=2", env="reasoning_gym") as (_, line):
        local = make("reasoning_gym", **resolve_config("reasoning_gym", {"task": "chain_sum", "max_turns": 2}))

        async def run() -> None:
            client = RemoteEnvClient(line.split()[-1], timeout_s=30)
            try:
                assert_same((await client.reset([1], [2_000_005]))[0], env_reset(local, 2_000_005))
                for answer in ("12", local.source._entry["answer"]):
                    assert_same((await client.step([1], [reply(answer)]))[0], env_step(local, reply(answer)))
            finally:
                await client.close()

        asyncio.run(run())


def _trains(tmp_path, capsys, env: list[str], warm_start: str, shown: str) -> None:
    """A short run; ``shown``: text of the env's first observation, which its episode page holds."""
    summary = train(compose([
        *env, "topology=local", "train.steps=2", "train.batch_size=4", "train.eval_every=0",
        "train.eval_seeds=2", "train.held_out_check=64", "learner.critic_warmup=1",
        "actors.group_size=2", "actors.concurrency=4", "actors.envs_per_worker=4",
        "actors.max_tokens=24", "logger.wandb=false", *warm_start.split(),
    ]), tmp_path)
    capsys.readouterr()
    rows = [r for r in read_records(tmp_path) if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/tokens"] > 0 and r["rollout/turns"] >= 1 for r in rows)
    (actor,) = summary["actors"]
    assert actor["version"] == 2 and actor["episodes_failed"] == 0
    assert shown in (tmp_path / "episodes" / "eval_step_0.html").read_text()  # the episode pages


RUNS = {
    "hanoi": (["env=textarena", "env.max_turns=3"], "warm_start.enabled=false", "Tower of Hanoi"),
    "arithmetic": (["env=reasoning_gym", "env.format=no_think"],
                   "warm_start.seeds=16 warm_start.steps=2 warm_start.batch_size=4 "
                   "warm_start.mistake=random warm_start.action_noise=0.2", "Calculate"),
    "mastermind": (["env=textarena", "env.id=Mastermind-v0", "env.held_out=true", "env.max_turns=2"],
                   "warm_start.enabled=false", "You are playing Mastermind"),
    "minesweeper": (["env=textarena", "env.id=Minesweeper-v0", "env.max_turns=2"], "warm_start.enabled=false",
                    "Minesweeper"),
    "chain_sum": (["env=reasoning_gym", "env.task=chain_sum", "env.max_turns=2"], "warm_start.enabled=false",
                  "State the final answer"),
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c not in ("hanoi", "arithmetic")
                                  else c for c in RUNS])
def test_a_short_run_trains_on_it(case, tmp_path, capsys):
    env, warm_start, shown = RUNS[case]
    _trains(tmp_path, capsys, env, warm_start, shown)
    if "warm_start.enabled=false" not in warm_start:  # reasoning-gym's answers were demonstrated
        assert (tmp_path / "warm-start").exists()


@pytest.mark.slow  # the server through the pool: test_a_pool_larger_than_the_servers_sessions...
@pytest.mark.parametrize("served", [True, False])
def test_a_short_run_trains_on_the_openenv_template(served, template, tmp_path, capsys):
    if served:
        with serve(template) as url:
            # one session at a time: one env slot, one episode at a time
            _trains(tmp_path, capsys, ["env=openenv", f"env.url={url}", "env.max_turns=2",
                                       "env.success_reward=1.0", "actors.env_workers=1"],
                    "warm_start.enabled=false actors.envs_per_worker=1 actors.concurrency=1",
                    "Echo Env environment ready!")
    else:
        _trains(tmp_path, capsys, ["env=openenv", f"env.import_path={template}",
                                   f"env.entry_point={ENTRY_POINT}", "env.max_turns=2"],
                "warm_start.enabled=false", "Echo Env environment ready!")
