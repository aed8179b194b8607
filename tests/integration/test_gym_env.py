"""A gymnasium env nobody here wrote (CliffWalking, the slippery one) trains through VAGEN's layer
(envs/gym_game.py): the same loop, in one process (topology=local), from the env's text rendering.
No learning signal is asked of it; that every part takes it is. Its moves have three outcomes, so
there is no solver to demonstrate with, and the run says it goes without a warm start."""

import pytest

from launch.config.compose import compose
from launch.run.loop import train
from launch.run.metrics import read_records


@pytest.mark.slow  # the adapter is tested in units; the loop by every other env's run
def test_cliff_walking_trains_through_the_adapter(tmp_path, capsys):
    summary = train(compose([
        "env=gym", "env.id=CliffWalkingSlippery-v1", "topology=local", "train.steps=3", "train.batch_size=8",
        "train.eval_every=0",
        "train.eval_seeds=4", "learner.critic_warmup=1", "actors.group_size=2",
        "actors.concurrency=8", "actors.envs_per_worker=8", "actors.max_tokens=24",
        "logger.wandb=false",
    ]), tmp_path)
    out = capsys.readouterr().out
    assert "warm start off: the gym env has no solver" in out
    # one map: nothing held out, and the run says so; the floors are played all the same
    assert summary["held_out"]["held_out"] is False and "evaluations may play training maps" in out
    assert "floors: random" in out and {"random"} < set(summary["baselines"])
    rows = [r for r in read_records(tmp_path) if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["rollout/tokens"] > 0 and r["rollout/reward"] == r["rollout/reward"]
        assert r["rollout/turns"] >= 1
    (actor,) = summary["actors"]
    assert actor["version"] == 3 and actor["episodes_failed"] == 0
    ((_, acc),) = summary["accounting"].items()
    assert acc["taken"] == 3 * 8 and acc["received"] == actor["episodes_sent"]
    assert not (tmp_path / "warm-start").exists()
