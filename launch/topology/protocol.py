"""Where a run's components live: what the loop and the supervisor need of them, and the two
topologies that provide it.

``topology=ray`` (the default): launch/topology/ray_cluster.py's ``RayCluster``, every learner rank and
inference actor a Ray actor of its own, trajectories over ZeroMQ, weights by torch.distributed
broadcast. ``topology=local``: launch/topology/local_cluster.py's ``LocalCluster``, the same learner, actor and
vLLM code in this one process, both channels in-process (transport/inprocess.py): no Ray, no
sockets of ours, one console and one debugger. launch/topology/factory.py makes the one a
config names.

``Cluster`` is the two halves the run uses: ``Learners``, which the training loop
(launch/run/loop.py) calls, and ``Actors``, which only the supervisor (launch/run/supervisor.py)
calls: one owner of the actors' lifecycle. tests/unit/launch/test_topology.py holds both
backends to the Protocol and the loop to its half; the type checker holds every caller to it.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Protocol


class PushError(RuntimeError):
    """A weight push (or the actors' joining the weight group before one: ``what``) failed:
    ``errors`` by actor index, the learners' errors, and which of the failed actors are
    ``dead`` (their process is gone: replace them, not just re-join them)."""

    def __init__(self, version: int, errors: dict[int, Exception], learner_errors: list[Exception],
                 dead: AbstractSet[int] = frozenset(), what: str = "push"):
        causes = [f"actor {i}: {_said(e)}" for i, e in sorted(errors.items())]
        causes += [f"learner: {_said(e)}" for e in learner_errors]
        super().__init__(f"{what} of version {version} failed: {'; '.join(causes) or 'no cause given'}")
        self.errors, self.learner_errors = errors, learner_errors
        self.dead_actors = {i: e for i, e in errors.items() if i in dead}


def _said(error: BaseException, most: int = 600) -> str:
    """An error's type and message, on one line and cut at ``most`` characters."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= most else text[:most] + "..."


class CallTimeout(TimeoutError):
    """A call on an actor gave no answer within its deadline (``ray.*_timeout_s``), or the actor
    is hung (its event loop does not answer, or its engine stalled): the actor is killed and
    replaced, as a dead one is."""


class LearnerHung(RuntimeError):
    """A call on the learner ranks gave no answer within its deadline; the message says what
    each rank was doing, for how long, and its threads' stacks. The run stops (its newest
    checkpoint stays)."""


class ActorsFailed(RuntimeError):
    """An operation on every actor (an evaluation) failed on some: ``errors`` by actor index,
    ``dead`` those to replace."""

    def __init__(self, what: str, errors: dict[int, BaseException]):
        super().__init__(f"{what} failed on actors {sorted(errors)}: "
                         + "; ".join(f"{i}: {type(e).__name__}: {e}" for i, e in sorted(errors.items())))
        self.errors = errors


class Learners(Protocol):
    """The operations on the run as a whole and on its learner ranks: what the training loop
    (launch/run/loop.py) calls directly."""

    nodes: dict[str, str]
    """Where each learner rank and actor runs (after ``start``)."""
    stream_secured: bool
    """The trajectory stream requires CurveZMQ keys (after ``start``)."""

    def connect(self) -> bool: ...
    def check_room(self) -> None: ...
    def warm_start(self, model_path: str, out: Path) -> str: ...
    def train_step(self, batch_size: int, timeout_s: float) -> dict[str, float]: ...
    def save_checkpoint(self, path: Path, extra: dict[str, Any]) -> None: ...
    def load_checkpoint(self, path: Path) -> dict[str, Any]: ...
    def read_probe(self, path: Path) -> list[str | None]: ...
    def save_final(self, run_dir: Path, samples: int) -> None: ...
    def accounting(self) -> dict[str, dict[str, int]]: ...
    def received_by_origin(self) -> dict[str, int]: ...


class Actors(Protocol):
    """The processes' lifecycle and every operation on the inference actors: the supervisor's
    alone (launch/run/supervisor.py); the loop reaches them through it."""

    incarnations: list[int]
    """Per actor: times it was restarted."""

    @property
    def actors(self) -> list: ...
    @property
    def running(self) -> bool: ...

    def start(self, model_path: str, log_dir: Path | None = None,
              streams: list[dict[str, int]] | None = None) -> None: ...
    def shutdown(self) -> None: ...
    def actor_stats(self) -> list[dict[str, Any]]: ...
    def set_budgets(self, budgets: list[int]) -> None: ...
    def start_runs(self, indices: list[int] | None = None) -> None: ...
    def ended_runs(self) -> dict[int, BaseException]: ...
    def hung_actors(self) -> dict[int, BaseException]: ...
    def stop_runs(self) -> None: ...
    def rollout(self, counts: dict[int, int]) -> dict[int, BaseException]: ...
    def restart_actor(self, index: int, error: BaseException) -> None: ...
    def evaluate(self, seeds: list[int], pages: int = 0, samples: int = 0,
                 blind: bool = False) -> dict[str, Any]: ...
    def push_weights(self, version: int) -> dict[str, float]: ...
    def reform_weights(self, version: int) -> dict[str, float]: ...


class Cluster(Learners, Actors, Protocol):
    """A run's learner and actors, started and stopped as a whole (see RayCluster's docstrings
    for what each operation means)."""
