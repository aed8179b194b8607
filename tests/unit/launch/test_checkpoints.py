"""launch/run/checkpoints.py: atomic commits, the newest k kept, and metrics cut back to a step."""

import json

import pytest

from launch.run import checkpoints


def _write(run_dir, step):
    path = checkpoints.staging(run_dir, step)
    (path / "extra.json").write_text(json.dumps({"step": step}))
    return path


def test_commit_is_atomic_and_keeps_the_newest(tmp_path):
    assert checkpoints.latest(tmp_path) is None
    for step in (2, 4, 6):
        _write(tmp_path, step)
        checkpoints.commit(tmp_path, step, keep=2)
    assert [p.name for p in checkpoints.all_steps(tmp_path)] == ["step-000004", "step-000006"]
    _write(tmp_path, 8)  # a crash before the commit: the staged folder is not a checkpoint
    assert checkpoints.latest(tmp_path).name == "step-000006"
    _write(tmp_path, 10)  # step 8's left-over is removed by the next commit
    checkpoints.commit(tmp_path, 10, keep=2)
    assert sorted(p.name for p in checkpoints.root(tmp_path).iterdir()) == ["step-000006", "step-000010"]
    _write(tmp_path, 10)  # the same step again (the final save after a periodic one)
    assert checkpoints.commit(tmp_path, 10, keep=2).name == "step-000010"
    assert checkpoints.read_extra(checkpoints.latest(tmp_path)) == {"step": 10}
    assert len(checkpoints.all_steps(tmp_path)) == 2
    with pytest.raises(ValueError, match="keep"):
        checkpoints.commit(tmp_path, 12, keep=0)


def test_truncate_keeps_the_records_up_to_the_step(tmp_path):
    records = [{"kind": "eval", "step": 0}] + [{"kind": "train", "step": s} for s in range(1, 7)]
    records.insert(5, {"kind": "eval", "step": 4})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert checkpoints.truncate_records(tmp_path, 4) == 2
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in kept] == [("eval", 0), ("train", 1), ("train", 2),
                                                       ("train", 3), ("train", 4), ("eval", 4)]
    assert checkpoints.truncate_records(tmp_path / "none", 4) == 0


def test_what_the_driver_reads_back_is_json_and_an_old_pickle_is_refused(tmp_path):
    path = _write(tmp_path, 3)
    (path / "extra.json").write_text(json.dumps({"step": 3, "version": 3, "_trainer": {"x": 1}}))
    assert checkpoints.read_extra(path) == {"step": 3, "version": 3}  # the learner's own part stays
    old = tmp_path / "old"
    old.mkdir()
    (old / "extra.pt").write_bytes(b"\x80\x04a pickle")  # never unpickled
    with pytest.raises(ValueError, match="older version"):
        checkpoints.read_extra(old)


def test_a_run_that_stopped_early_is_told_how_to_continue(tmp_path):
    assert checkpoints.resume_hint(tmp_path) is None  # nothing to continue from
    for step in (10, 20):
        _write(tmp_path, step)
        checkpoints.commit(tmp_path, step, keep=2)
    hint = checkpoints.resume_hint(tmp_path)
    assert "step 20" in hint and f'make train ARGS="train.resume={tmp_path.resolve()}"' in hint
