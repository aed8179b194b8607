"""The SVG env (envs/svg/) in the whole loop, in one process (topology=local): the tiny Qwen2-VL
sees the target icons as images, answers, the learner trains on those image episodes. No learning
signal is asked of it; that every part takes the env's images and rewards is, and that each
evaluation writes its page of episodes with the images the model saw, and that the floors (the
empty drawing, one shape, the model blind) are played beside the first evaluation."""

from launch.config.compose import compose
from launch.run.loop import train
from launch.run.metrics import read_records


def test_the_svg_env_trains_through_the_loop_with_a_vision_language_model(tmp_path):
    summary = train(compose([
        "env=svg", "env.image_size=56", "env.targets=shapes", "model.vision=true",
        "topology=local", "warm_start.enabled=false", "train.steps=2", "train.batch_size=8",
        "train.eval_every=0", "train.eval_seeds=4", "learner.critic_warmup=1",
        "actors.group_size=2", "actors.concurrency=8", "actors.envs_per_worker=8",
        "actors.max_tokens=48", "logger.wandb=false",
    ]), tmp_path)
    rows = [r for r in read_records(tmp_path) if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/tokens"] > 0 and r["rollout/turns"] >= 1 for r in rows)
    (actor,) = summary["actors"]
    assert actor["version"] == 2 and actor["weight_updates"] == 2
    failed = {k: v for k, v in actor.items() if k.startswith("failed/")}
    assert set(failed) <= {"failed/vision_token_generated"}, failed  # an untrained VLM may write one
    ((_, acc),) = summary["accounting"].items()
    assert acc["taken"] == 2 * 8 and acc["received"] == actor["episodes_sent"]
    evals = [r for r in read_records(tmp_path) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2] and not any("episodes" in r for r in evals)
    pages = sorted(p.name for p in (tmp_path / "episodes").iterdir())
    assert pages == ["eval_step_0.html", "eval_step_2.html", "index.html"]
    for name in pages[:2]:
        page = (tmp_path / "episodes" / name).read_text()
        assert page.count('<section class="episode') == 4  # train.eval_pages (4) of the 4 seeds
        turns = page.count('<div class="turn">')
        assert page.count('<img src="data:image/png;base64,') >= turns > 0  # the target, each turn
    # the floors, on the same seeds; the blind one by the actors, the model seeing white pictures
    assert set(summary["baselines"]) == {"empty", "one_shape", "blind"}
    for name in summary["baselines"]:
        outcomes = (tmp_path / "evals" / f"baseline_{name}.jsonl").read_text().splitlines()
        assert len(outcomes) == 4
    assert summary["baselines"]["empty"]["n"] == 4 and summary["baselines"]["blind"]["n"] == 4
    assert summary["held_out"]["shared"] == 0 and summary["held_out"]["eval_seeds"] == 4
