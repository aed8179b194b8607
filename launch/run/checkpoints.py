"""A run's checkpoints on disk, and what resuming a run reads back and checks.

Called by launch/run/loop.py: ``check_shared`` once the processes have started, ``staging``,
``write_config`` and ``commit`` around every save, ``latest_or_fail``, ``check_config`` and
``read_extra`` when a run resumes, ``truncate_records`` after it, ``resume_hint`` when a run
stopped early. Layout: ``<run dir>/checkpoints/step-<N>/`` holds what the learner ranks write
(learner/trainer.py: sharded models and optimizers under ``dcp/``, ``extra.json``, each rank's
RNG states ``rng-<rank>.pt``), the run config the driver writes (``config.json``) and, written
last by ``commit``, ``MANIFEST.json``: the step and every other file's relative path, size and
sha256.

Invariants:
- complete or not a checkpoint: the ranks write into ``step-<N>.tmp/``; only once every rank has
  returned does ``commit`` write ``MANIFEST.json`` (atomically: a temporary file, then
  ``os.replace``) and rename the folder to ``step-<N>/``. A checkpoint without a manifest, or
  whose files do not match it (``verify``), is incomplete or damaged: ``latest`` (what resuming
  takes) is the newest checkpoint that verifies, and each newer one is skipped with a warning
  naming it and why; where none verifies, ``latest_or_fail`` lists each and why;
- a step never loses its checkpoint: committing a step that already has one (the final save at
  the step of a periodic one) renames the old folder aside (``step-<N>.old/``), the new one into
  place, then deletes the aside copy. A crash between the two renames leaves the old one aside,
  complete, and it counts as step N's checkpoint while ``step-<N>/`` is missing; the next commit
  renames it back (or deletes it where ``step-<N>/`` exists) and removes left-over ``.tmp``
  folders. ``all_steps`` lists neither ``.tmp`` folders nor an ``.old`` copy beside its step;
- the newest ``keep`` checkpoints that verify stay; checkpoints older than those are deleted
  after a commit (each renamed to a ``.tmp`` first, so that a crash mid-delete leaves no
  half-deleted checkpoint), never the one just committed; one that does not verify counts for
  nothing (and, newer than the kept ones, is left where it is, with a warning);
- a run resumes only with the config its checkpoint was written with (``config.json``): any
  other difference than those of ``RESUMABLE_CHANGES`` fails, listing each changed key, unless
  ``train.allow_config_change`` (then it warns with the same list);
- every learner rank sees the checkpoint directory the driver writes (``check_shared``, at the
  start of the run): a rank on a node without the shared filesystem fails the run before a step;
- resuming at step N keeps the metrics records of steps up to N and drops later ones (they
  belong to steps that will run again), so no step is counted twice in ``metrics.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST = "MANIFEST.json"
"""Written last into a checkpoint by ``commit``: its presence means the checkpoint is complete."""
CONFIG = "config.json"
"""The run config a checkpoint was written with (``write_config``), compared on resume."""

RESUMABLE_CHANGES: tuple[str, ...] = (
    # what resuming itself sets, and what it is for
    "train.resume",              # the run directory resumed: unset in the run that wrote it
    "train.steps",               # extending a run by more steps
    "train.allow_config_change",  # this check's own switch
    # where the output goes and how much of it is shown: not what is trained
    "logger", "train.eval_pages", "train.save_samples", "train.held_out_check", "train.baselines",
    "run_name", "storage",
    # when the loop saves, how many saves it keeps, how long it waits: not what is trained
    "train.checkpoint_every", "train.keep_checkpoints", "train.batch_timeout_s",
    "actors.step_timeout_s", "actors.reset_timeout_s", "actors.start_timeout_s",
    "actors.max_restarts", "learner.dist_timeout_s", "transport.weight_timeout_s",
    # where the processes run, how they find and trust each other, how the same weights are
    # cut for the broadcast: the same computation in other places
    "ray", "topology", "learner.cpus", "learner.threads", "actors.cpus", "actors.env_address",
    "actors.env_curve", "transport.stream_port", "transport.weight_port", "transport.curve",
    "transport.curve_keys", "transport.weight_bucket_mb",
    # the warm start only makes the weights the checkpoint's replace (and is not run again
    # where <run dir>/warm-start exists)
    "warm_start",
)
"""Config keys (dotted; a group name covers its keys) that may differ between a checkpoint's
config and the run resuming from it; ``config_changes`` ignores them."""

_STEP = re.compile(r"^step-(\d+)(\.old)?$")
_CHUNK = 1 << 20
_ABSENT = "(absent)"


def root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _name(step: int) -> str:
    return f"step-{step:06d}"


def staging(run_dir: str | Path, step: int) -> Path:
    """Where the ranks write the checkpoint of ``step`` (created, emptied if left over)."""
    path = root(run_dir) / f"{_name(step)}.tmp"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def write_config(staged: str | Path, config: Mapping[str, Any]) -> Path:
    """The run config (``dataclasses.asdict`` of it) as JSON in the staging folder, before the
    commit, so that the manifest covers it."""
    path = Path(staged) / CONFIG
    path.write_text(json.dumps(config, indent=1, sort_keys=True, default=str), encoding="utf-8")
    return path


def commit(run_dir: str | Path, step: int, keep: int) -> Path:
    """Publish the staged checkpoint of ``step``: its manifest, written last, then the rename
    (the old checkpoint of the same step renamed aside first, deleted last); then tidy the
    left-overs of earlier crashes and delete all but the newest ``keep`` checkpoints that
    verify. Returns the checkpoint's folder."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    base = root(run_dir)
    staged, final, aside = base / f"{_name(step)}.tmp", base / _name(step), base / f"{_name(step)}.old"
    _restore_aside(base)
    write_manifest(staged, step)
    if final.exists():
        os.rename(final, aside)
        os.rename(staged, final)
        shutil.rmtree(aside)
    else:
        os.rename(staged, final)
    for left in base.glob("*.tmp"):
        shutil.rmtree(left, ignore_errors=True)
    _prune(run_dir, final, keep)
    return final


def _restore_aside(base: Path) -> None:
    """An ``.old`` copy beside its step's folder is deleted (the crash came after the new one
    was in place); one without is renamed back (it is that step's checkpoint)."""
    if not base.exists():
        return
    for aside in base.glob("step-*.old"):
        final = aside.with_suffix("")
        if final.exists():
            shutil.rmtree(aside)
        else:
            os.rename(aside, final)


def _prune(run_dir: str | Path, committed: Path, keep: int) -> None:
    """Delete the checkpoints older than the newest ``keep`` that verify (``committed`` counts
    as verified: its manifest was just made from its files, and it is never deleted). Verifying
    reads each file of up to ``keep - 1`` older checkpoints."""
    kept = 0
    for path in reversed(all_steps(run_dir)):
        if path == committed:
            kept += 1
        elif kept >= keep:  # renamed first: a crash mid-delete leaves a .tmp, not a checkpoint
            trash = path.parent / f"{path.name}.tmp"
            os.rename(path, trash)
            shutil.rmtree(trash)
        elif (reason := verify(path)) is None:
            kept += 1
        else:
            warnings.warn(f"checkpoint {path} does not verify ({reason}): not counted among the "
                          f"{keep} kept", stacklevel=3)


def sha256(path: str | Path) -> str:
    """The file's sha256, hex, read in chunks of 1 MiB."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest(folder: str | Path, step: int) -> dict[str, Any]:
    """``{"step": step, "files": [{"path", "size", "sha256"}, ...]}``: every file under
    ``folder`` (its path relative to it, with ``/``), sorted by path, the manifest itself left out."""
    folder = Path(folder)
    own = {MANIFEST, f"{MANIFEST}.tmp"}
    files = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel not in own:
            files.append({"path": rel, "size": path.stat().st_size, "sha256": sha256(path)})
    return {"step": step, "files": files}


def write_manifest(folder: str | Path, step: int) -> Path:
    """``manifest`` as ``folder/MANIFEST.json``, atomically (written, flushed to disk, renamed)."""
    folder = Path(folder)
    data = manifest(folder, step)
    tmp, path = folder / f"{MANIFEST}.tmp", folder / MANIFEST
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def verify(path: str | Path) -> str | None:
    """None when ``path/MANIFEST.json`` exists and every file it lists is there with its size and
    sha256 (and the step it names is the folder's); else why not, in one line ("no MANIFEST.json
    (incomplete write)", "missing rng-0.pt", "dcp/__0_0.distcp: sha256 mismatch", ...). Files
    the manifest does not list are not looked at.

    The checksums show that each file is the one the run wrote, whole. They say nothing of what
    a file holds: DCP's ``dcp/.metadata`` is in torch's pickle format, and loading it unpickles;
    its checksum at least guarantees it is the file this run wrote."""
    folder = Path(path)
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"no {MANIFEST} (incomplete write)"
    except (OSError, ValueError) as e:
        return f"{MANIFEST} unreadable: {e}"
    entries = data.get("files") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and {"path", "size", "sha256"} <= e.keys() for e in entries):
        return f"{MANIFEST} malformed: no list of files with path, size and sha256"
    named = _STEP.match(folder.name)
    if named and data.get("step") != int(named.group(1)):
        return f"{MANIFEST} is of step {data.get('step')}, the folder of step {int(named.group(1))}"
    for entry in entries:  # what is missing or cut short first: it costs no reading
        rel = PurePosixPath(entry["path"])
        if rel.is_absolute() or ".." in rel.parts:
            return f"{MANIFEST} lists {entry['path']}, outside the checkpoint"
        file = folder / rel
        if not file.is_file():
            return f"missing {entry['path']}"
        size = file.stat().st_size
        if size != entry["size"]:
            return f"{entry['path']}: {size} bytes, {entry['size']} when written (truncated or changed)"
    for entry in entries:
        if sha256(folder / entry["path"]) != entry["sha256"]:
            return f"{entry['path']}: sha256 mismatch"
    return None


def all_steps(run_dir: str | Path) -> list[Path]:
    """Committed checkpoints, oldest first, verified or not: each ``step-<N>/``, and a
    ``step-<N>.old/`` where ``step-<N>/`` is missing (a crash between a re-commit's renames).
    Staging folders (``.tmp``) are not checkpoints."""
    base = root(run_dir)
    if not base.exists():
        return []
    committed: dict[int, Path] = {}
    aside: dict[int, Path] = {}
    for p in base.iterdir():
        if (m := _STEP.match(p.name)) and p.is_dir():
            (aside if m.group(2) else committed)[int(m.group(1))] = p
    found = {**aside, **committed}
    return [found[step] for step in sorted(found)]


def _newest_good(run_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that verifies, and each newer one with why it does not, each
    warned about."""
    failed: list[tuple[Path, str]] = []
    for path in reversed(all_steps(run_dir)):
        reason = verify(path)
        if reason is None:
            return path, failed
        failed.append((path, reason))
        warnings.warn(f"checkpoint {path} skipped: {reason}", stacklevel=3)
    return None, failed


def latest(run_dir: str | Path) -> Path | None:
    """The newest checkpoint that verifies (each newer one is skipped with a warning naming it
    and why), or None."""
    return _newest_good(run_dir)[0]


def latest_or_fail(run_dir: str | Path) -> Path:
    """``latest``, for resuming: FileNotFoundError where there is no checkpoint, RuntimeError
    listing each checkpoint and why where none verifies."""
    path, failed = _newest_good(run_dir)
    if path is not None:
        return path
    if not failed:
        raise FileNotFoundError(f"no checkpoint in {root(run_dir)} to resume from")
    raise RuntimeError(f"no checkpoint in {root(run_dir)} verifies, none to resume from:\n"
                       + "\n".join(f"  {p.name}: {reason}" for p, reason in failed))


def resume_hint(run_dir: str | Path) -> str | None:
    """What to run to continue a run that stopped early (an error, a stop request) from its newest
    checkpoint, or None where it has none that verifies."""
    newest = latest(run_dir)
    if newest is None:
        return None
    step = int(newest.name.removeprefix("step-").split(".")[0])
    return (f"checkpoint of step {step} in {newest}; to continue the run: "
            f'make train ARGS="train.resume={Path(run_dir).resolve()}" '
            f"(or python -m launch.train train.resume={Path(run_dir).resolve()})")


def read_extra(checkpoint: str | Path) -> dict[str, Any]:
    """What the driver saved with a checkpoint (step, version, the actors' seed streams): JSON,
    so reading it executes nothing."""
    path = Path(checkpoint) / "extra.json"
    if not path.exists() and (path.parent / "extra.pt").exists():
        raise ValueError(f"{path.parent} was written by an older version, whose checkpoints held "
                         "pickles (extra.pt), which are no longer loaded")
    extra = json.loads(path.read_text(encoding="utf-8"))
    extra.pop("_trainer", None)
    return extra


# --- the config a checkpoint was written with --------------------------------------------------
def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict of dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``); an empty
    dict and any other value (a list included) stay whole."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(saved: Mapping[str, Any], now: Mapping[str, Any],
                   ignore: Sequence[str] = RESUMABLE_CHANGES) -> list[str]:
    """Each key (dotted) whose value differs between the two configs, as ``key: saved -> now``
    (values as JSON; ``(absent)`` where a config lacks the key), sorted by key; keys under
    ``ignore`` (a key or a group) are left out. Both are compared as JSON reads them back (an
    enum as its word, a tuple as a list)."""
    old, new = (flatten(json.loads(json.dumps(c, default=str))) for c in (saved, now))
    changes = []
    for key in sorted(old.keys() | new.keys()):
        if any(key == k or key.startswith(f"{k}.") for k in ignore):
            continue
        if key not in old or key not in new or old[key] != new[key]:
            before = json.dumps(old[key]) if key in old else _ABSENT
            after = json.dumps(new[key]) if key in new else _ABSENT
            changes.append(f"{key}: {before} -> {after}")
    return changes


def check_config(checkpoint: str | Path, config: Mapping[str, Any], *, allow_change: bool,
                 defaults: Mapping[str, Any] | None = None) -> list[str]:
    """Compare the run config resuming (``dataclasses.asdict`` of it) with the checkpoint's
    ``config.json``: ValueError listing each change (``config_changes``), or, with
    ``allow_change``, a warning with the same list. Returns the changes. A setting the
    checkpoint lacks (added to the code since it was written) that is at its value in
    ``defaults`` (nested as the config) is no change: it is named in a warning."""
    path = Path(checkpoint) / CONFIG
    if not path.exists():
        changes = [f"{CONFIG}: not in the checkpoint, nothing to compare the run's config with"]
    else:
        saved = flatten(json.loads(path.read_text(encoding="utf-8")))
        known = flatten(json.loads(json.dumps(defaults or {}, default=str)))
        now = flatten(json.loads(json.dumps(config, default=str)))
        added = sorted(k for k in now.keys() - saved.keys() if k in known and known[k] == now[k])
        if added:
            warnings.warn(f"resuming from {checkpoint}: settings added since it was written, at their "
                          f"defaults: {', '.join(added)}", stacklevel=2)
        changes = config_changes(saved, {k: v for k, v in now.items() if k not in added})
    if not changes:
        return changes
    listed = "\n".join(f"  {c}" for c in changes)
    if allow_change:
        warnings.warn(f"resuming from {checkpoint} with a changed config "
                      f"(train.allow_config_change=true):\n{listed}", stacklevel=2)
        return changes
    raise ValueError(f"resuming from {checkpoint} with a config that differs from the one it was "
                     f"written with (train.allow_config_change=true to resume anyway):\n{listed}")


# --- every learner rank sees the checkpoint directory ------------------------------------------
def write_probe(run_dir: str | Path) -> tuple[Path, str]:
    """A file ``<run dir>/checkpoints/.probe-<token>`` holding a random token: (its absolute path,
    the token)."""
    token = secrets.token_hex(16)
    path = root(run_dir).resolve() / f".probe-{token}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token, encoding="utf-8")
    return path, token


def probe_errors(path: Path, token: str, seen: Sequence[str | None],
                 nodes: Mapping[str, str]) -> list[str]:
    """One line per learner rank that did not read ``token`` back from ``path`` (``seen``: what
    each rank read, by rank; None: no such file there), naming its node (``nodes``:
    ``learner-<rank>`` -> node, as the topology's ``nodes``)."""
    errors = []
    for rank, got in enumerate(seen):
        where = f"learner rank {rank} on node {nodes.get(f'learner-{rank}', '(unknown)')}"
        if got is None:
            errors.append(f"{where} cannot read {path}")
        elif got != token:
            errors.append(f"{where} reads another file at {path}")
    return errors


def check_shared(run_dir: str | Path, read_probe: Callable[[Path], Sequence[str | None]],
                 nodes: Mapping[str, str], *, tries: int = 3, wait_s: float = 1.0) -> None:
    """RuntimeError, naming each rank's node and the path, unless every learner rank reads back
    the probe the driver writes into the checkpoint directory (``read_probe(path)``: what each
    rank reads there, by rank; ``tries`` reads ``wait_s`` apart, for a network filesystem slow
    to show a new file). The probe is deleted in every case."""
    path, token = write_probe(run_dir)
    errors: list[str] = []
    try:
        for attempt in range(max(1, tries)):
            errors = probe_errors(path, token, read_probe(path), nodes)
            if not errors:
                return
            if attempt + 1 < tries:
                time.sleep(wait_s)
    finally:
        path.unlink(missing_ok=True)
    raise RuntimeError("every learner rank must see the checkpoint directory the driver writes "
                       "(a filesystem every node mounts at the same path: storage=...):\n"
                       + "\n".join(f"  {e}" for e in errors))


def truncate_records(run_dir: str | Path, step: int) -> int:
    """Drop the metrics records of steps after ``step`` (rewritten atomically); returns how many
    were dropped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line)["step"] <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    tmp.replace(path)
    return len(lines) - len(kept)
