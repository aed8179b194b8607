import json

from launch.run.sweep import collect


def test_the_table_has_a_row_per_run_in_job_order_and_marks_failed_ones(tmp_path):
    floors = {"random": {"success": 0.16}, "constant:Right": {"success": 0.11}}
    for name, summary in [("10-seed=2", {"steps": 3, "eval_after": 0.5, "eval_last3_mean": 0.25,
                                         "baselines": floors}),
                          ("2-seed=1", None),
                          ("1-seed=0", {"steps": 3, "eval_after": 0.75, "eval_after_sampled": 0.5,
                                        "interrupted": True})]:
        run = tmp_path / name
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(f"- {name.split('-', 1)[1]}\n- env=sokoban\n")
        if summary is not None:
            (run / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "not-a-run").mkdir()
    rows = collect(tmp_path)
    assert [(r["run"], r["overrides"], r["status"]) for r in rows] == [
        ("1-seed=0", "seed=0 env=sokoban", "interrupted"),
        ("2-seed=1", "seed=1 env=sokoban", "no summary (failed)"),
        ("10-seed=2", "seed=2 env=sokoban", "done")]
    assert rows[2]["eval_last3_mean"] == 0.25 and rows[0]["eval_after"] == 0.75
    assert rows[2]["floor"] == 0.16 and rows[0]["floor"] is None  # the best floor; none played
    table = (tmp_path / "sweep.md").read_text().splitlines()
    assert table[2] == "| 1-seed=0 | seed=0 env=sokoban | 3 |  | 0.750 |  |  | 0.500 |  | True | interrupted |"
    assert (tmp_path / "sweep.csv").read_text().count("\n") == 4
