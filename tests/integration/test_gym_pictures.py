"""A gymnasium env that draws and renders no text (MiniGrid's Empty-5x5) trains through VAGEN's
layer (envs/gym_game.py) in one process (topology=local): the tiny Qwen2-VL sees its rgb_array
pictures with the mission beside them and answers with MiniGrid's action names, the learner
trains on those image episodes. No learning signal is asked of it; that every part takes the
env's pictures is. It has no solver, so no warm start; one map, so nothing held out; the floors
play it in its pictures, and the model blind beside them."""

import importlib.util

import pytest

from launch.config.compose import compose
from launch.run.loop import train
from launch.run.metrics import read_records


@pytest.mark.slow  # the adapter's pictures are tested in units; a picture loop by test_svg_loop
@pytest.mark.skipif(importlib.util.find_spec("minigrid") is None, reason="needs minigrid")
def test_a_minigrid_env_trains_through_the_adapter_in_pictures(tmp_path, capsys):
    summary = train(compose([
        "env=gym", "env.id=MiniGrid-Empty-5x5-v0", "env.render=image", "env.image_size=56",
        "env.success=positive_reward", "env.task=''", "model.vision=true", "topology=local",
        "train.steps=2", "train.batch_size=8", "train.eval_every=0", "train.eval_seeds=4",
        "learner.critic_warmup=1", "actors.group_size=2", "actors.concurrency=8",
        "actors.envs_per_worker=8", "actors.max_tokens=24", "logger.wandb=false",
    ]), tmp_path)
    out = capsys.readouterr().out
    assert "warm start off: the gym env has no solver" in out
    assert summary["held_out"]["held_out"] is False
    assert {"random", "blind"} < set(summary["baselines"])
    rows = [r for r in read_records(tmp_path) if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/tokens"] > 0 and r["rollout/turns"] >= 1 and r["rollout/reward"] == r["rollout/reward"]
    (actor,) = summary["actors"]
    assert actor["version"] == 2 and actor["weight_updates"] == 2
    # no episode failed in the env; the untrained VLM may write a vision token, which fails its episode
    assert actor["env/failed_episodes"] == 0 and actor["env/worker_start_failures"] == 0
    assert actor["episodes_failed"] == actor.get("failed/vision_token_generated", 0)
    ((_, acc),) = summary["accounting"].items()
    assert acc["taken"] == 2 * 8 and acc["received"] == actor["episodes_sent"]
    # the learner's last batch held the pictures: their tokens, with the mission, as it trained on them
    samples = (tmp_path / "samples.txt").read_text()
    assert "<|vision_start|><|image_pad|>" in samples and "Mission: get to the green goal square" in samples
    page = (tmp_path / "episodes" / "eval_step_0.html").read_text()
    assert page.count('<img src="data:image/png;base64,') >= page.count('<div class="turn">') > 0
