"""The training loop of one run: warm start, start the processes, train, evaluate, checkpoint.

Called by ``python -m launch.train`` (the Hydra entry) with the run config and the run directory.
The processes (placement, start, weight push, evaluation, shutdown) are the topology's
(launch/topology/: Ray's, or all in this process); the actors have one owner, the supervisor
(launch/run/supervisor.py: start and stop, budgets, restarts, pushes, evaluations), and the loop
calls the learner half of the cluster (``Learners``) itself. No Ray here.

The loop. ``async``: actors play episodes without pause, each within an episode budget that keeps
them ``actors.run_ahead`` batches ahead of the learner; each learner step takes the next batch
within the staleness bound, and every ``publish_every`` steps the weights go to every actor in
flight. ``sync``: the same components with no overlap: generate a batch, train, push, repeat
(the baseline the async mode is measured against). Evaluation (greedy, and sampled) on maps
held out of training (``train.eval_split``'s seeds: envs/splits.py, checked at the start) runs
before RL, every ``eval_every`` steps and at the end; each writes a page of its first
``eval_pages`` episodes, turn by turn (launch/run/pages.py). launch/run/supervisor.py keeps the
actors going: it sets their budgets, and replaces one that crashed (between the learner's waits
for a batch, or when a weight push fails) without stopping the run.

Invariants: everything started here is stopped here, on success, on error and on SIGTERM or
Ctrl-C (which checkpoint first, at the next step boundary or, while the learner waits for its
batch, within a wait slice; an evaluation, a sync-mode rollout or the warm start in progress is
abandoned at once; a second Ctrl-C leaves at once);
``<run dir>/summary.json`` is written in every case. Checkpoints (launch/run/checkpoints.py) are
written every ``train.checkpoint_every`` steps and at the end, each with the run config, into
a directory every learner rank sees (checked once the processes have started). Resuming
(``train.resume=<run dir>``) continues that run in its directory from its newest checkpoint that
verifies, with the config it was written with (what may differ is listed in
launch/run/checkpoints.py): the step, the policy version, the optimizers, the value-norm
statistics, the entropy coefficient and the learner ranks' RNG states come back, each actor's
seed stream continues where it was, the episode budgets follow from the step, the warm start is
not run again, and ``metrics.jsonl`` continues without the records of steps after the checkpoint
(they run again).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from envs import splits
from envs.registry import make as make_env
from launch.config import schema
from launch.config.builders import env_config
from launch.config.schema import RunConfig
from launch.model.hub import hub_access
from launch.model.prepare import prepare_model
from launch.run import baselines, checkpoints, evaluation
from launch.run.memory import MemoryMonitor
from launch.run.metrics import RunLogger, baseline_figures
from launch.run.pages import write_eval_page
from launch.run.supervisor import Supervisor, origin
from launch.topology.factory import make_cluster

WAIT_SLICE_S = 5.0
"""The learner waits for a batch this long per call; the supervisor checks the actors between."""


class Interrupted(Exception):
    """A stop request arrived during a wait the loop cuts short (``Stop.interruptible``)."""


class Stop:
    """Set by SIGTERM or Ctrl-C (SIGINT): the loop checkpoints and leaves at the next step
    boundary; inside ``interruptible`` (an evaluation, a sync-mode rollout, the warm start) the
    request raises ``Interrupted`` at once. A second Ctrl-C raises KeyboardInterrupt: leave now
    (processes are still shut down)."""

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}
        self._interruptible: str | None = None

    @contextmanager
    def interruptible(self, what: str) -> Iterator[None]:
        """A wait that a stop request ends with ``Interrupted`` (raised here if one came before)."""
        if self.requested:
            raise Interrupted(what)
        self._interruptible = what
        try:
            yield
        finally:
            self._interruptible = None

    def __enter__(self) -> "Stop":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt
        self.requested = True
        what = self._interruptible
        print(f"{signal.Signals(signum).name}: checkpointing and stopping "
              + (f"now ({what} abandoned)" if what else "after this step") + " (Ctrl-C again to stop now)",
              flush=True)
        if what:
            self._interruptible = None
            raise Interrupted(what)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def train(cfg: RunConfig, run_dir: Path) -> dict[str, Any]:
    """One whole run; returns the summary (also written to ``<run dir>/summary.json``)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir = _log_dir(cfg, run_dir)
    cfg = hub_access(cfg)  # before any process starts: they inherit HF_HUB_OFFLINE
    resume = _resume_point(cfg, run_dir)
    if resume is not None:
        dropped = checkpoints.truncate_records(run_dir, resume["step"])
        print(f"resuming {run_dir} from step {resume['step']} (version {resume['version']}); "
              f"{dropped} records of later steps dropped", flush=True)
    logger = RunLogger(run_dir, dataclasses.asdict(cfg), wandb_mode=cfg.logger.mode,
                       use_wandb=cfg.logger.wandb, project=cfg.logger.project, name=cfg.run_name)
    supervisor = Supervisor(cfg, make_cluster(cfg))
    learners = supervisor.learners
    monitor = None
    if learners.connect():  # a local cluster: every process of the run is a descendant of this one
        monitor = MemoryMonitor(os.getpid())
    summary: dict[str, Any] = {"run_dir": str(run_dir), "mode": cfg.train.mode}
    try:
        with Stop() as stop:
            learners.check_room()  # a run the cluster cannot hold fails before its warm start
            if cfg.train.held_out_check:  # and one whose env cannot hold maps out
                summary["held_out"] = _check_held_out(cfg)
            t0 = time.perf_counter()
            try:
                with stop.interruptible("the warm start"):
                    model_path = prepare_model(cfg, run_dir, learners.warm_start)
            except Interrupted:
                summary.update(interrupted=True, steps=0)
                return summary
            summary["warm_start_s"] = round(time.perf_counter() - t0, 1)
            supervisor.start(model_path, log_dir=log_dir,
                             streams=resume["actor_streams"] if resume else None)
            checkpoints.check_shared(run_dir, learners.read_probe, learners.nodes)
            summary["nodes"], summary["stream_curve"] = learners.nodes, learners.stream_secured
            summary.update(_run(cfg, run_dir, supervisor, logger, monitor, stop, resume))
    except BaseException as e:
        summary["error"] = f"{type(e).__name__}: {e}"
        if supervisor.readings:  # a failed run's ledger too, as far as the actors still answer
            try:
                try:
                    summary["episodes"] = _ledger(supervisor)
                except Exception:  # noqa: BLE001 - no learner to ask: every incarnation's sent as read
                    summary["episodes"] = supervisor.ledger(
                        _sent_as_read([*supervisor.readings, *supervisor.retired]))
            except Exception as ledger_error:  # noqa: BLE001 - the run's own error is the one raised
                summary["episodes"] = {"unreadable": f"{type(ledger_error).__name__}: {ledger_error}"}
        raise
    finally:
        if monitor is not None:
            summary["memory"] = monitor.report()
            monitor.close()
        supervisor.shutdown()
        logger.plot()
        logger.close()
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        if "error" in summary or summary.get("interrupted"):
            hint = checkpoints.resume_hint(run_dir)
            if hint:
                print(hint, flush=True)
    return summary


def _resume_point(cfg: RunConfig, run_dir: Path) -> dict[str, Any] | None:
    """The extra (with its ``path``) of the newest checkpoint that verifies when resuming, else
    None; it fails where none verifies, or where the config differs from the checkpoint's beyond
    what may change on resume (unless ``train.allow_config_change``)."""
    if not cfg.train.resume:
        return None
    latest = checkpoints.latest_or_fail(run_dir)
    checkpoints.check_config(latest, dataclasses.asdict(cfg), allow_change=cfg.train.allow_config_change,
                             defaults=schema.defaults())
    return {**checkpoints.read_extra(latest), "path": latest}


def _check_held_out(cfg: RunConfig) -> dict[str, Any]:
    """envs/splits.py's ``report`` of the evaluation seeds against the first
    ``train.held_out_check`` training seeds, in this process; printed and returned."""
    t0 = time.perf_counter()
    figures = splits.report(functools.partial(make_env, cfg.env_name), env_config(cfg),
                            _eval_seeds(cfg), cfg.train.held_out_check)
    print(f"{splits.report_text(cfg.train.eval_split, figures)} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return figures


def _eval_seeds(cfg: RunConfig) -> list[int]:
    return splits.seeds_of(cfg.train.eval_split, cfg.train.eval_seeds)


def _log_dir(cfg: RunConfig, run_dir: Path) -> Path | None:
    """Where the processes' output goes (``logger.console=run``), or None: the console (``all``)."""
    return run_dir / "logs" if cfg.logger.console == "run" else None


def _eval_text(record: dict[str, Any]) -> str:
    """"greedy 0.438 [0.38, 0.50] | sampled 0.402 [0.36, 0.44] | failed 2 | observation 0.71":
    success with its 95% interval, the failed episodes where any, the judge's scores where the
    env has one (launch/run/evaluation.py)."""
    parts = [f"greedy {record['success']:.3f} [{record['success_lo']:.2f}, {record['success_hi']:.2f}]"]
    if "sampled/success" in record:
        parts.append(f"sampled {record['sampled/success']:.3f} "
                     f"[{record['sampled/success_lo']:.2f}, {record['sampled/success_hi']:.2f}]")
    failed = record.get("n_failed", 0) + record.get("sampled/n_failed", 0)
    if failed:
        parts.append(f"failed {failed:.0f}")
    parts += [f"{k.removesuffix('_score')} {v:.2f}" for k, v in record.items()
              if k.endswith("_score") and "/" not in k]
    return " | ".join(parts)


def _run(cfg: RunConfig, run_dir: Path, supervisor: Supervisor, logger: RunLogger,
         monitor: MemoryMonitor | None, stop: Stop, resume: dict[str, Any] | None) -> dict[str, Any]:
    """From started processes to the final checkpoint; returns the summary's results."""
    learners = supervisor.learners
    t = cfg.train
    step = 0
    seeds = _eval_seeds(cfg)
    evals = [r for r in logger.records if r["kind"] == "eval"]
    resumed, dropped = None, 0
    if resume is not None:
        loaded = learners.load_checkpoint(resume["path"])
        step = int(loaded["step"])
        # the episode ledger and fault counts go on
        supervisor.carry(loaded.get("ledger", {}), loaded.get("buffer", {}).get("received_by_origin", {}))
        dropped = sum(loaded.get("buffer", {}).get("dropped", {}).values())
        if loaded["optimizer_fingerprint_loaded"] != loaded["optimizer_fingerprint"]:
            raise RuntimeError(f"{resume['path']}: the optimizers did not come back as saved")
        supervisor.push(step)  # the actors' engines start from the model path, not the checkpoint
        resumed = {"step": step, "version": int(loaded["version"]),
                   "optimizer_fingerprint": loaded["optimizer_fingerprint_loaded"]}
    if not evals and (record := _evaluate(cfg, run_dir, supervisor, logger, seeds, step, stop)):
        evals.append(record)
        print(f"eval before RL: {_eval_text(record)} on {len(seeds)} seeds "
              f"(+{cfg.train.eval_samples} sampled each)", flush=True)
        if t.baselines and (floors := _baselines(cfg, run_dir, supervisor, logger, seeds, stop)):
            print(baselines.baselines_text(floors), flush=True)
    if t.mode == "async":
        supervisor.start_runs(step, dropped=dropped)
    while step < t.steps and not stop.requested:
        t_step = time.perf_counter()
        metrics = _train_step(cfg, supervisor, step, stop)
        if metrics is None:  # stopped while the learner waited for its batch
            break
        step += 1
        if step % t.publish_every == 0:
            metrics.update(supervisor.push(step))
        if supervisor.running:
            supervisor.set_budgets(step, dropped=int(metrics.get("buffer/dropped", 0)))
        wall = time.perf_counter() - t_step
        metrics.update({"timing/step_wall_s": wall, "throughput/trajectories_per_s": t.batch_size / wall,
                        "throughput/tokens_per_s": metrics.get("rollout/tokens", 0.0) / wall,
                        "actors/restarts": supervisor.restarts})
        metrics.update(_ledger(supervisor))
        if monitor is not None:  # memory as of the monitor thread's last sample (launch/run/memory.py)
            monitor.sample_cpu()
            if monitor.total:
                metrics["memory/total_gib"] = monitor.total / 2**30
                metrics.update({f"memory/{k}_gib": v / 2**30 for k, v in monitor.current.items()})
            metrics.update({f"cpu/{k}_s": v for k, v in monitor.cpu_seconds().items()})
        record = logger.log("train", step, metrics)
        if step % cfg.logger.print_every == 0:
            logger.progress(record)
        if (t.eval_every and step % t.eval_every == 0 and step < t.steps
                and (record := _evaluate(cfg, run_dir, supervisor, logger, seeds, step, stop))):
            evals.append(record)
            print(f"eval at step {step}: {_eval_text(record)}", flush=True)
        if t.checkpoint_every and step % t.checkpoint_every == 0:
            _checkpoint(cfg, supervisor, run_dir, step)
    supervisor.stop_runs()
    if ((not evals or evals[-1]["step"] != step)  # a stop request leaves without it
            and (record := _evaluate(cfg, run_dir, supervisor, logger, seeds, step, stop))):
        evals.append(record)
    if evals and evals[-1]["step"] == step:
        print(f"eval after RL: {_eval_text(evals[-1])}", flush=True)
    elif evals:  # stopped before it: the last one is of an earlier step, and says so
        print(f"no eval after RL (stopped at step {step}); the last, at step {evals[-1]['step']}: "
              f"{_eval_text(evals[-1])}", flush=True)
    _checkpoint(cfg, supervisor, run_dir, step)
    learners.save_final(run_dir, t.save_samples)
    accounting = learners.accounting()
    ledger = _ledger(supervisor)
    last = [e["success"] for e in evals[-3:]]
    return {"steps": step, "eval_before": evals[0]["success"] if evals else None,
            "eval_after": evals[-1]["success"] if evals else None,
            "eval_after_interval": [evals[-1]["success_lo"], evals[-1]["success_hi"]] if evals else None,
            "eval_before_sampled": evals[0].get("sampled/success") if evals else None,
            "eval_after_sampled": evals[-1].get("sampled/success") if evals else None,
            "eval_last3_mean": sum(last) / len(last) if last else None, "interrupted": stop.requested,
            "baselines": baseline_figures(logger.records),
            "actor_restarts": supervisor.incarnations, "actors": supervisor.actor_stats(),
            "accounting": accounting, "episodes": ledger, "resumed_from": resumed}


def _ledger(supervisor: Supervisor) -> dict[str, float]:
    """The supervisor's ledger (launch/run/supervisor.py) with the learner's side, read first:
    every episode the actors sent was received (then taken, dropped or buffered, see
    learner/buffer.py) or is ``episodes/in_transit``."""
    return supervisor.ledger(supervisor.learners.received_by_origin())


def _sent_as_read(readings: list[dict[str, Any]]) -> dict[str, int]:
    """What the learner would say it received from each incarnation, when it cannot answer:
    what each said it sent (so ``episodes/in_transit`` is 0 and nothing sent counts as lost)."""
    return {origin(r): int(r.get("episodes_sent", 0)) for r in readings}


def _evaluate(cfg: RunConfig, run_dir: Path, supervisor: Supervisor, logger: RunLogger,
              seeds: list[int], step: int, stop: Stop) -> dict[str, Any] | None:
    """One evaluation: its figures logged (the returned record: launch/run/evaluation.py's
    ``summarize``), every episode's outcome written to ``<run dir>/evals/step_<step>.jsonl``,
    its recorded episodes as ``<run dir>/episodes/eval_step_<step>.html``; None if a stop
    request came first or during it."""
    try:
        with stop.interruptible("the evaluation"):
            result = supervisor.evaluate(seeds, cfg.train.eval_pages, cfg.train.eval_samples)
    except Interrupted:
        return None
    evaluation.write_outcomes(run_dir, step, result["outcomes"])
    means = evaluation.summarize(result["outcomes"])
    episodes = result.get("episodes", [])
    record = logger.log("eval", step, means)
    if cfg.train.eval_pages:
        write_eval_page(run_dir, step, means, episodes, cfg.env_name)
    return record


def _baselines(cfg: RunConfig, run_dir: Path, supervisor: Supervisor, logger: RunLogger,
               seeds: list[int], stop: Stop) -> dict[str, dict[str, float]]:
    """The floors beside the first evaluation (launch/run/baselines.py): the scripted players
    here, and for an env observed through pictures the model blind (greedy, every picture white)
    by the actors; each one's outcomes written to ``<run dir>/evals/baseline_<name>.jsonl``, its
    figures logged (a ``baseline`` record) and returned by name; {} if a stop request came."""
    config = env_config(cfg)
    try:
        with stop.interruptible("the baselines"):
            results = baselines.run_scripted(functools.partial(make_env, cfg.env_name), config, seeds)
            if config.get("render", "text") != "text":
                results["blind"] = supervisor.evaluate(seeds, blind=True)["outcomes"]
    except Interrupted:
        return {}
    if not results:  # no floor fits the env (ActionWords)
        return {}
    for name, outcomes in results.items():
        baselines.write_outcomes(run_dir, name, outcomes)
    figures = baselines.summarize(results)
    logger.log("baseline", 0, {f"baseline/{name}/{k}": v for name, f in figures.items() for k, v in f.items()})
    return figures


def _train_step(cfg: RunConfig, supervisor: Supervisor, version: int,
                stop: Stop) -> dict[str, float] | None:
    """One learner step (after a sync-mode rollout, which a stop request cuts short). The learner
    waits for its batch in slices of WAIT_SLICE_S, between which failed actors are replaced and a
    stop request is honoured (None: no step was taken); no batch within ``train.batch_timeout_s``
    ends the run."""
    if cfg.train.mode == "sync":
        try:
            with stop.interruptible("the rollout"):
                supervisor.rollout(version)
        except Interrupted:
            return None
    t0 = time.perf_counter()
    while True:
        supervisor.check(version)
        t_slice = time.perf_counter()
        metrics = supervisor.learners.train_step(cfg.train.batch_size, WAIT_SLICE_S)
        if metrics:
            metrics["timing/wait_batch_s"] += t_slice - t0  # the slices before this one
            return metrics
        if stop.requested:
            return None
        if time.perf_counter() - t0 > cfg.train.batch_timeout_s:
            raise RuntimeError(f"no full batch in {cfg.train.batch_timeout_s} s: are the actors producing?")


def _checkpoint(cfg: RunConfig, supervisor: Supervisor, run_dir: Path, step: int) -> Path:
    """Every learner rank writes its part into the staging folder, with the step, each actor's
    seed stream and the episode ledger, and the driver the run config; then it is committed, its
    manifest written last (launch/run/checkpoints.py)."""
    path = checkpoints.staging(run_dir, step)
    supervisor.learners.save_checkpoint(path, {"step": step, "actor_streams": supervisor.actor_streams(),
                                               "ledger": supervisor.ledger_state()})
    checkpoints.write_config(path, dataclasses.asdict(cfg))
    return checkpoints.commit(run_dir, step, cfg.train.keep_checkpoints)
