"""launch/run/loop.py's part in checkpoints, with a fake learner: each checkpoint carries the run
config and a manifest, resuming takes the newest that verifies and refuses a changed config, and
a learner rank that cannot see the checkpoint directory fails the run once the processes start."""

import dataclasses
import json

import pytest

from launch.config.compose import compose
from launch.run import checkpoints, loop


@pytest.fixture(scope="module")
def cfg():
    return compose(["logger.wandb=false", "train.keep_checkpoints=2"])


class _Learners:
    """Writes what learner/trainer.py's save_checkpoint writes, in miniature."""

    def save_checkpoint(self, path, extra):
        (path / "extra.json").write_text(json.dumps({**extra, "version": extra["step"], "_trainer": {}}))
        (path / "rng-0.pt").write_bytes(b"rng")


class _Supervisor:
    learners = _Learners()

    def actor_streams(self):
        return [{"incarnation": 0, "groups_drawn": 3}]

    def ledger_state(self):
        return {"retired": [], "faults": {}}


def _resuming(cfg, run_dir, **train):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, resume=str(run_dir), **train))


def test_a_checkpoint_carries_the_run_config_under_its_manifest(cfg, tmp_path):
    path = loop._checkpoint(cfg, _Supervisor(), tmp_path, 2)
    assert path == checkpoints.root(tmp_path) / "step-000002" and checkpoints.verify(path) is None
    assert json.loads((path / "config.json").read_text()) == json.loads(
        json.dumps(dataclasses.asdict(cfg), default=str))
    listed = [f["path"] for f in json.loads((path / "MANIFEST.json").read_text())["files"]]
    assert listed == ["config.json", "extra.json", "rng-0.pt"]


def test_resume_takes_the_newest_good_checkpoint_with_the_same_config(cfg, tmp_path):
    assert loop._resume_point(cfg, tmp_path) is None  # not resuming
    for step in (2, 4):
        loop._checkpoint(cfg, _Supervisor(), tmp_path, step)
    (checkpoints.root(tmp_path) / "step-000004" / "rng-0.pt").write_bytes(b"RNG")
    with pytest.warns(UserWarning, match="step-000004 skipped: rng-0.pt: sha256 mismatch"):
        point = loop._resume_point(_resuming(cfg, tmp_path, steps=500), tmp_path)
    assert point == {"step": 2, "version": 2, "path": checkpoints.root(tmp_path) / "step-000002",
                     "actor_streams": [{"incarnation": 0, "groups_drawn": 3}],
                     "ledger": {"retired": [], "faults": {}}}


def test_resume_refuses_a_changed_config_unless_told(cfg, tmp_path):
    loop._checkpoint(cfg, _Supervisor(), tmp_path, 2)
    changed = _resuming(dataclasses.replace(cfg, seed=cfg.seed + 1), tmp_path)
    with pytest.raises(ValueError, match=f"seed: {cfg.seed} -> {cfg.seed + 1}"):
        loop._resume_point(changed, tmp_path)
    allowed = _resuming(dataclasses.replace(cfg, seed=cfg.seed + 1), tmp_path, allow_config_change=True)
    with pytest.warns(UserWarning, match=f"seed: {cfg.seed} -> {cfg.seed + 1}"):
        assert loop._resume_point(allowed, tmp_path)["step"] == 2


def test_a_setting_added_since_the_checkpoint_is_no_change_at_its_default(cfg, tmp_path):
    """A checkpoint written before a setting existed (here: train.eval_samples, removed from its
    config.json) resumes with a warning while the setting is at its default, and is refused
    when it is not."""
    path = loop._checkpoint(cfg, _Supervisor(), tmp_path, 2)
    saved = json.loads((path / "config.json").read_text())
    del saved["train"]["eval_samples"]
    (path / "config.json").write_text(json.dumps(saved))
    checkpoints.write_manifest(path, 2)  # as that older version wrote it
    with pytest.warns(UserWarning, match="settings added since it was written, at their defaults: train.eval_samples"):
        assert loop._resume_point(_resuming(cfg, tmp_path), tmp_path)["step"] == 2
    changed = _resuming(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, eval_samples=3)), tmp_path)
    with pytest.raises(ValueError, match=r"train.eval_samples: \(absent\) -> 3"):
        loop._resume_point(changed, tmp_path)


def test_resume_with_no_good_checkpoint_fails_naming_each(cfg, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        loop._resume_point(_resuming(cfg, tmp_path), tmp_path)
    path = loop._checkpoint(cfg, _Supervisor(), tmp_path, 2)
    (path / "MANIFEST.json").unlink()
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="step-000002: no MANIFEST.json"):
        loop._resume_point(_resuming(cfg, tmp_path), tmp_path)


class _Cluster:
    """The learner half and the lifecycle, recording the calls; ``sees`` decides what each rank
    reads of the probe. The run itself stops at its first evaluation."""

    nodes = {"learner-0": "node-a", "learner-1": "node-b"}
    stream_secured = False
    actors: list = []
    incarnations: list = []

    def __init__(self, sees):
        self.sees, self.calls = sees, []

    def connect(self):
        return False

    def check_room(self):
        self.calls.append("check_room")

    def warm_start(self, model_path, out):
        raise AssertionError("prepare_model is replaced: no warm start")

    def start(self, model_path, log_dir=None, streams=None):
        self.calls.append("start")

    def read_probe(self, path):
        self.calls.append("read_probe")
        return [path.read_text() if sees else None for sees in self.sees]

    def evaluate(self, seeds, pages=0, samples=0, blind=False):
        self.calls.append("evaluate")
        raise KeyError("the run went on")

    def shutdown(self):
        self.calls.append("shutdown")


@pytest.mark.parametrize("sees", [(True, True), (True, False)])
def test_every_learner_rank_must_see_the_checkpoint_directory(cfg, tmp_path, monkeypatch, sees):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cluster = _Cluster(sees)
    monkeypatch.setattr(loop, "make_cluster", lambda _: cluster)
    monkeypatch.setattr(loop, "prepare_model", lambda *_: "model")
    monkeypatch.setattr(checkpoints, "check_shared", _no_wait(checkpoints.check_shared))
    if all(sees):
        with pytest.raises(KeyError, match="the run went on"):
            loop.train(cfg, tmp_path)
        assert cluster.calls == ["check_room", "start", "read_probe", "evaluate", "shutdown"]
    else:
        with pytest.raises(RuntimeError) as error:
            loop.train(cfg, tmp_path)
        assert cluster.calls == ["check_room", "start", "read_probe", "shutdown"]
        assert "learner rank 1 on node node-b cannot read " in str(error.value)
        assert f"{checkpoints.root(tmp_path).resolve()}/.probe-" in str(error.value)
    assert list(checkpoints.root(tmp_path).iterdir()) == []  # the probe is gone


def _no_wait(check):
    return lambda *args, **kwargs: check(*args, **kwargs, tries=1)
