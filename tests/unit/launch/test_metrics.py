"""launch.run.metrics.RunLogger: jsonl records, progress line, learning-curve PNG (with the judge's
eval scores)."""

from launch.run.metrics import RunLogger, eval_scores, eval_successes, read_records


def test_records_are_jsonl_and_the_curve_is_drawn(tmp_path, capsys):
    logger = RunLogger(tmp_path, {}, use_wandb=False)
    logger.log("eval", 0, {"success": 0.25, "n": 4.0})
    rec = logger.log("train", 1, {"rollout/success": 0.5, "rollout/reward": 3.0, "bad": float("nan")})
    logger.log("eval", 1, {"success": 0.75, "n": 4.0})
    line = logger.progress(rec)
    assert "success 0.50" in line and "reward 3.00" in line and line in capsys.readouterr().out
    assert "faults" not in line  # none happened
    hurt = logger.log("train", 2, {"rollout/success": 0.5, "faults/actors_replaced": 1.0,
                                   "faults/actors_hung": 0.0, "episodes/failed": 16.0})
    assert logger.progress(hurt).endswith(" | faults: replaced 1, failed 16")
    png = logger.plot()
    logger.close()
    rows = read_records(tmp_path)
    assert [r["kind"] for r in rows] == ["eval", "train", "eval", "train"]
    assert rows[1]["bad"] == "nan" and rows[2]["success"] == 0.75
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_wandb_offline_writes_a_run_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = RunLogger(tmp_path, {"a": 1}, wandb_mode="offline", project="t")
    logger.log("train", 1, {"rollout/success": 0.5})
    logger.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_the_curve_shows_the_judges_eval_scores_and_the_env(tmp_path):
    logger = RunLogger(tmp_path, {"env_name": "sokoban"}, use_wandb=False)
    logger.log("eval", 0, {"success": 0.25, "observation_score": 0.5, "prediction_score": 0.25,
                           "n": 4.0, "episodes": [{"seed": 1, "turns": []}]})
    logger.log("train", 1, {"rollout/success": 0.5, "rollout/observation_score": 0.9})
    logger.log("eval", 2, {"success": 0.75, "success_lo": 0.3, "success_hi": 0.95, "observation_score": 0.75,
                           "prediction_score": 0.5, "n": 4.0, "sampled/success": 0.5, "sampled/success_lo": 0.2,
                           "sampled/success_hi": 0.8, "sampled/observation_score": 0.6})
    assert eval_scores(logger.records) == {"observation_score": ([0, 2], [0.5, 0.75]),
                                           "prediction_score": ([0, 2], [0.25, 0.5])}  # the greedy ones
    assert eval_successes(logger.records) == {"greedy": ([0, 2], [0.25, 0.75], [0.25, 0.3], [0.25, 0.95]),
                                              "sampled": ([2], [0.5], [0.2], [0.8])}
    assert eval_scores([r for r in logger.records if r["kind"] == "train"]) == {}
    assert logger.env_name == "sokoban"
    png = logger.plot()
    logger.close()
    assert "episodes" not in read_records(tmp_path)[0]  # recorded episodes are not metrics
    from PIL import Image

    with Image.open(png) as im:  # two panels: taller than the one-panel curve
        assert im.size == (700, 650)
