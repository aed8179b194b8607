"""launch/run/checkpoints.py: atomic commits with a manifest of checksums, verification and the
fall-back to the newest good checkpoint, re-commits that keep a complete checkpoint at every
moment, the newest k good ones kept, the config compared on resume, the shared-directory probe,
and metrics cut back to a step."""

import dataclasses
import enum
import hashlib
import json
import os
import shutil
import typing
from pathlib import Path

import pytest

from launch.config.schema import RunConfig
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


# --- the manifest: complete, and each file the one written -------------------------------------
def _hand_made(run_dir, step=4):
    """A staged checkpoint with the learner's layout: dcp shards, extra.json, an RNG file."""
    path = checkpoints.staging(run_dir, step)
    (path / "dcp").mkdir()
    (path / "dcp" / "__0_0.distcp").write_bytes(b"shard zero")
    (path / "dcp" / ".metadata").write_bytes(b"meta")
    (path / "extra.json").write_text('{"step": 4}')
    (path / "rng-0.pt").write_bytes(b"rng")
    return path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_manifest_lists_every_file_with_its_size_and_sha256(tmp_path):
    _hand_made(tmp_path)
    final = checkpoints.commit(tmp_path, 4, keep=2)
    assert final.name == "step-000004" and not (tmp_path / "checkpoints" / "step-000004.tmp").exists()
    assert json.loads((final / "MANIFEST.json").read_text()) == {"step": 4, "files": [
        {"path": "dcp/.metadata", "size": 4, "sha256": _sha(b"meta")},
        {"path": "dcp/__0_0.distcp", "size": 10, "sha256": _sha(b"shard zero")},
        {"path": "extra.json", "size": 11, "sha256": _sha(b'{"step": 4}')},
        {"path": "rng-0.pt", "size": 3, "sha256": _sha(b"rng")},
    ]}
    assert not (final / "MANIFEST.json.tmp").exists()
    assert checkpoints.verify(final) is None
    assert checkpoints.sha256(final / "dcp" / "__0_0.distcp") == _sha(b"shard zero")


def test_a_crash_while_the_manifest_is_written_leaves_no_checkpoint(tmp_path, monkeypatch):
    """The manifest goes in by os.replace of a whole file, and before the folder's rename: a
    crash up to that moment leaves a staged folder without a manifest, not a checkpoint."""
    staged = _hand_made(tmp_path)

    def crash(src, dst):
        assert Path(src).read_text().startswith("{")  # written whole under another name
        raise OSError("killed before the manifest was in place")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="manifest"):
        checkpoints.commit(tmp_path, 4, keep=2)
    assert not (staged / "MANIFEST.json").exists()
    assert checkpoints.all_steps(tmp_path) == [] and checkpoints.latest(tmp_path) is None


def test_a_file_streamed_in_chunks_hashes_as_a_whole(tmp_path):
    data = bytes(range(256)) * 9000  # 2.2 MiB: three chunks
    (tmp_path / "big").write_bytes(data)
    assert checkpoints.sha256(tmp_path / "big") == _sha(data)


def test_one_changed_byte_is_detected(tmp_path):
    _hand_made(tmp_path)
    final = checkpoints.commit(tmp_path, 4, keep=2)
    shard = final / "dcp" / "__0_0.distcp"
    shard.write_bytes(b"shard zerO")  # same size
    assert checkpoints.verify(final) == "dcp/__0_0.distcp: sha256 mismatch"


def test_a_truncated_file_is_detected(tmp_path):
    _hand_made(tmp_path)
    final = checkpoints.commit(tmp_path, 4, keep=2)
    (final / "dcp" / "__0_0.distcp").write_bytes(b"shard")
    assert checkpoints.verify(final) == "dcp/__0_0.distcp: 5 bytes, 10 when written (truncated or changed)"


def test_a_missing_file_or_manifest_is_detected(tmp_path):
    _hand_made(tmp_path)
    final = checkpoints.commit(tmp_path, 4, keep=2)
    (final / "rng-0.pt").unlink()
    assert checkpoints.verify(final) == "missing rng-0.pt"
    (final / "MANIFEST.json").unlink()
    assert checkpoints.verify(final) == "no MANIFEST.json (incomplete write)"
    staged = _hand_made(tmp_path, 6)  # the ranks wrote, the driver did not commit
    assert checkpoints.verify(staged) == "no MANIFEST.json (incomplete write)"
    (final / "MANIFEST.json").write_text("{not json")
    assert checkpoints.verify(final).startswith("MANIFEST.json unreadable: ")
    (final / "MANIFEST.json").write_text('{"step": 4}')
    assert checkpoints.verify(final) == "MANIFEST.json malformed: no list of files with path, size and sha256"
    (final / "MANIFEST.json").write_text('{"step": 2, "files": []}')
    assert checkpoints.verify(final) == "MANIFEST.json is of step 2, the folder of step 4"
    (final / "MANIFEST.json").write_text('{"step": 4, "files": [{"path": "../x", "size": 1, "sha256": ""}]}')
    assert checkpoints.verify(final) == "MANIFEST.json lists ../x, outside the checkpoint"


# --- resuming takes the newest checkpoint that verifies ----------------------------------------
def test_resume_falls_back_to_the_previous_good_checkpoint_with_a_warning(tmp_path):
    for step in (2, 4, 6):
        _write(tmp_path, step)
        checkpoints.commit(tmp_path, step, keep=3)
    base = checkpoints.root(tmp_path)
    (base / "step-000006" / "extra.json").write_text('{"step": 7}')  # same size, other bytes
    (base / "step-000004" / "MANIFEST.json").unlink()
    with pytest.warns(UserWarning) as caught:
        assert checkpoints.latest(tmp_path) == base / "step-000002"
    assert [str(w.message) for w in caught] == [
        f"checkpoint {base / 'step-000006'} skipped: extra.json: sha256 mismatch",
        f"checkpoint {base / 'step-000004'} skipped: no MANIFEST.json (incomplete write)"]
    with pytest.warns(UserWarning):
        assert checkpoints.latest_or_fail(tmp_path) == base / "step-000002"
        assert "step 2 in" in checkpoints.resume_hint(tmp_path)


def test_resume_fails_listing_each_checkpoint_and_why_where_none_verifies(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint in .* to resume from"):
        checkpoints.latest_or_fail(tmp_path)
    for step in (2, 4):
        _write(tmp_path, step)
        checkpoints.commit(tmp_path, step, keep=2)
    base = checkpoints.root(tmp_path)
    (base / "step-000002" / "extra.json").unlink()
    (base / "step-000004" / "MANIFEST.json").unlink()
    with pytest.warns(UserWarning), pytest.raises(RuntimeError) as error:
        checkpoints.latest_or_fail(tmp_path)
    assert str(error.value) == (f"no checkpoint in {base} verifies, none to resume from:\n"
                                "  step-000004: no MANIFEST.json (incomplete write)\n"
                                "  step-000002: missing extra.json")
    with pytest.warns(UserWarning):
        assert checkpoints.latest(tmp_path) is None and checkpoints.resume_hint(tmp_path) is None


# --- committing a step again: a complete checkpoint of it at every moment ----------------------
def _names(run_dir):
    return sorted(p.name for p in checkpoints.root(run_dir).iterdir())


def test_recommitting_a_step_replaces_it_and_leaves_no_copy(tmp_path):
    _write(tmp_path, 4)
    checkpoints.commit(tmp_path, 4, keep=2)
    path = checkpoints.staging(tmp_path, 4)
    (path / "extra.json").write_text('{"step": 4, "final": true}')
    assert checkpoints.commit(tmp_path, 4, keep=2) == checkpoints.root(tmp_path) / "step-000004"
    assert _names(tmp_path) == ["step-000004"]
    assert checkpoints.read_extra(checkpoints.latest(tmp_path)) == {"step": 4, "final": True}


@pytest.mark.parametrize("deleted", [False, True])
def test_a_crash_at_the_first_delete_leaves_the_new_one(tmp_path, monkeypatch, deleted):
    """Killed at the first delete of a re-commit, before or after the folder went: step 4's
    checkpoint is the new one (deleting first, then renaming, would leave none)."""
    _write(tmp_path, 4)
    checkpoints.commit(tmp_path, 4, keep=2)
    (checkpoints.staging(tmp_path, 4) / "extra.json").write_text('{"step": 4, "final": true}')
    real_rmtree = shutil.rmtree

    def crash(path, *args, **kwargs):
        if deleted:
            real_rmtree(path)
        raise OSError("killed at the delete")

    monkeypatch.setattr(shutil, "rmtree", crash)
    with pytest.raises(OSError, match="killed at the delete"):
        checkpoints.commit(tmp_path, 4, keep=2)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert _names(tmp_path) == ["step-000004"] + ([] if deleted else ["step-000004.old"])
    assert checkpoints.all_steps(tmp_path) == [checkpoints.root(tmp_path) / "step-000004"]
    assert checkpoints.read_extra(checkpoints.latest(tmp_path)) == {"step": 4, "final": True}
    _write(tmp_path, 6)  # the next commit deletes the aside copy
    checkpoints.commit(tmp_path, 6, keep=2)
    assert _names(tmp_path) == ["step-000004", "step-000006"]


def test_a_crash_between_the_renames_leaves_the_old_one(tmp_path, monkeypatch):
    _write(tmp_path, 4)
    checkpoints.commit(tmp_path, 4, keep=2)
    (checkpoints.staging(tmp_path, 4) / "extra.json").write_text('{"step": 4, "final": true}')
    real_rename = os.rename
    renames = []

    def crash_on_the_second(src, dst):
        renames.append((Path(src).name, Path(dst).name))
        if len(renames) == 2:
            raise OSError("killed between the renames")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", crash_on_the_second)
    with pytest.raises(OSError, match="between the renames"):
        checkpoints.commit(tmp_path, 4, keep=2)
    monkeypatch.setattr(os, "rename", real_rename)
    assert renames == [("step-000004", "step-000004.old"), ("step-000004.tmp", "step-000004")]
    assert _names(tmp_path) == ["step-000004.old", "step-000004.tmp"]
    old = checkpoints.root(tmp_path) / "step-000004.old"
    assert checkpoints.all_steps(tmp_path) == [old]  # the old one is step 4's checkpoint
    assert checkpoints.latest(tmp_path) == old and checkpoints.read_extra(old) == {"step": 4}
    _write(tmp_path, 6)  # the next commit puts it back and removes the staged left-over
    checkpoints.commit(tmp_path, 6, keep=2)
    assert _names(tmp_path) == ["step-000004", "step-000006"]
    assert checkpoints.verify(checkpoints.root(tmp_path) / "step-000004") is None


def test_pruning_counts_only_checkpoints_that_verify(tmp_path):
    for step in (2, 4):
        _write(tmp_path, step)
        checkpoints.commit(tmp_path, step, keep=2)
    base = checkpoints.root(tmp_path)
    (base / "step-000004" / "extra.json").write_text('{"step": 5}')  # damaged
    _write(tmp_path, 6)
    with pytest.warns(UserWarning, match="step-000004 does not verify .*sha256 mismatch.*not counted"):
        checkpoints.commit(tmp_path, 6, keep=2)
    assert _names(tmp_path) == ["step-000002", "step-000004", "step-000006"]  # 2 is the second good one


def test_pruning_never_deletes_the_checkpoint_just_committed(tmp_path):
    for step in (4, 6, 8):
        _write(tmp_path, step)
        checkpoints.commit(tmp_path, step, keep=3)
    _write(tmp_path, 2)  # older than the kept ones (a resumed run's timeline, say)
    checkpoints.commit(tmp_path, 2, keep=1)
    assert _names(tmp_path) == ["step-000002", "step-000008"]


# --- the config a checkpoint was written with ------------------------------------------------
SAVED = {"seed": 0, "learner": {"lr": 1e-4, "ranks": 2}, "train": {"steps": 10, "resume": None},
         "logger": {"wandb": True}, "ray": {"address": None}, "env": {"size": 4}}


def test_flatten_makes_dotted_keys():
    assert checkpoints.flatten({"a": {"b": {"c": 1}, "d": [1, 2]}, "e": {}, "f": None}) == {
        "a.b.c": 1, "a.d": [1, 2], "e": {}, "f": None}


def test_what_may_change_on_resume_is_ignored():
    now = {"seed": 0, "learner": {"lr": 1e-4, "ranks": 2},
           "train": {"steps": 20, "resume": "/runs/a", "allow_config_change": False},
           "logger": {"wandb": False}, "ray": {"address": "10.0.0.1:6379"}, "env": {"size": 4}}
    assert checkpoints.config_changes(SAVED, now) == []


def test_every_other_change_is_listed_by_key_with_both_values():
    now = {"seed": 1, "learner": {"lr": 1e-3, "ranks": 2}, "train": {"steps": 10, "resume": None},
           "logger": {"wandb": True}, "ray": {"address": None}, "env": {"size": 6, "slippery": True}}
    assert checkpoints.config_changes(SAVED, now) == [
        "env.size: 4 -> 6", "env.slippery: (absent) -> true", "learner.lr: 0.0001 -> 0.001",
        "seed: 0 -> 1"]
    assert checkpoints.config_changes({"a": {"b": "x"}}, {"a": {}}) == [
        'a: (absent) -> {}', 'a.b: "x" -> (absent)']


def test_an_enum_compares_as_the_word_json_saved():
    class Mode(enum.StrEnum):
        sync = "sync"

    assert checkpoints.config_changes({"train": {"mode": "sync"}}, {"train": {"mode": Mode.sync}}) == []
    assert checkpoints.config_changes({"x": [1, 2]}, {"x": (1, 2)}) == []


def test_a_changed_config_fails_the_resume_unless_allowed(tmp_path):
    path = _write(tmp_path, 2)
    checkpoints.write_config(path, SAVED)
    final = checkpoints.commit(tmp_path, 2, keep=2)
    assert checkpoints.check_config(final, {**SAVED, "train": {"steps": 50, "resume": "x"}},
                                    allow_change=False) == []
    changed = {**SAVED, "seed": 3, "learner": {"lr": 1e-4, "ranks": 4}}
    with pytest.raises(ValueError) as error:
        checkpoints.check_config(final, changed, allow_change=False)
    assert str(error.value) == (f"resuming from {final} with a config that differs from the one it "
                                "was written with (train.allow_config_change=true to resume anyway):\n"
                                "  learner.ranks: 2 -> 4\n  seed: 0 -> 3")
    with pytest.warns(UserWarning, match="changed config") as caught:
        assert checkpoints.check_config(final, changed, allow_change=True) == [
            "learner.ranks: 2 -> 4", "seed: 0 -> 3"]
    assert str(caught[0].message).endswith(":\n  learner.ranks: 2 -> 4\n  seed: 0 -> 3")
    (final / "config.json").unlink()
    with pytest.raises(ValueError, match="config.json: not in the checkpoint"):
        checkpoints.check_config(final, SAVED, allow_change=False)


def _keys(cls, prefix=""):
    """The dotted keys of a config dataclass, its groups' keys included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def test_the_resumable_keys_are_keys_of_the_run_config():
    fields = set(_keys(RunConfig))
    assert {"train.allow_config_change", "learner.lr", "env"} <= fields
    for key in checkpoints.RESUMABLE_CHANGES:
        assert any(f == key or f.startswith(key + ".") for f in fields), key


# --- every learner rank sees the checkpoint directory ------------------------------------------
def test_a_probe_every_rank_reads_back_passes_and_is_removed(tmp_path):
    seen = []

    def read(path):
        seen.append(path)
        return [path.read_text(), path.read_text()]

    checkpoints.check_shared(tmp_path, read, {})
    assert len(seen) == 1 and seen[0].parent == checkpoints.root(tmp_path).resolve()
    assert seen[0].name.startswith(".probe-") and not seen[0].exists()
    assert list(checkpoints.root(tmp_path).iterdir()) == []


def test_a_rank_that_cannot_see_the_probe_fails_the_run_naming_its_node(tmp_path):
    paths = []

    def read(path):
        paths.append(path)
        return [path.read_text(), None, "another run's token"]

    nodes = {"learner-0": "n0", "learner-1": "n1", "learner-2": "n2", "actor-0": "n0"}
    with pytest.raises(RuntimeError) as error:
        checkpoints.check_shared(tmp_path, read, nodes, tries=2, wait_s=0)
    assert len(paths) == 2 and paths[0] == paths[1] and not paths[0].exists()
    assert str(error.value).endswith(f":\n  learner rank 1 on node n1 cannot read {paths[0]}\n"
                                     f"  learner rank 2 on node n2 reads another file at {paths[0]}")


def test_probe_errors_compare_each_ranks_reading_with_the_token(tmp_path):
    path, token = checkpoints.write_probe(tmp_path)
    assert path.read_text() == token and len(token) == 32 and path.is_absolute()
    assert checkpoints.probe_errors(path, token, [token, token], {}) == []
    assert checkpoints.probe_errors(path, token, [None], {}) == [
        f"learner rank 0 on node (unknown) cannot read {path}"]
    assert checkpoints.write_probe(tmp_path)[1] != token  # a new token each time


def test_the_learner_worker_reads_the_probe_as_its_node_sees_it(tmp_path):
    from learner.worker import LearnerWorker

    path, token = checkpoints.write_probe(tmp_path)
    worker = LearnerWorker.__new__(LearnerWorker)  # read_probe needs no process group
    assert worker.read_probe(str(path)) == token
    assert worker.read_probe(str(tmp_path / "elsewhere")) is None
