"""Placement: which process runs where, with which ranks and ports. A pure function, no Ray.

Called by the Ray cluster (launch/topology/ray_cluster.py: each ``Slot`` becomes a Ray actor pinned to its
node) and tested on its own. Invariants:
- no node is given more CPUs or GPUs than it has; an infeasible request raises PlacementError
  saying what was asked for and what exists;
- learner ranks are packed onto as few nodes as possible (FSDP traffic stays local), rank 0 first;
  its node hosts the weight-broadcast store and the trajectory stream;
- actors are spread across nodes round-robin (inference load and failures are spread);
- env workers fill the CPUs left, spread the same way;
- the weight group has rank 0 = learner rank 0 and ranks 1..E for the E inference engines, in
  actor order; every port is distinct;
- with ``bind_cores``, each CPU-only learner rank and actor on a node gets cores of its own
  (as many as the CPUs it reserves, rounded up): learner ranks from the node's last core down,
  actors from core 0 up, never one core twice; on a node whose cores do not go round, nobody
  is bound there and the operating system shares them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace


class PlacementError(ValueError):
    """The cluster cannot hold the requested processes."""


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    cpus: float
    gpus: int = 0


@dataclass(frozen=True)
class Roles:
    """How many of each process and what each needs (one engine = one inference worker)."""

    learner_ranks: int = 1
    learner_cpus: float = 1.0
    learner_gpus: int = 0
    actors: int = 1
    actor_cpus: float = 1.0
    engine_gpus: int = 0
    """GPUs of an actor's engine."""
    engine_workers: int = 1
    """Worker processes of an actor's engine (its tensor-parallel size): weight-group ranks."""
    env_workers: int = 1
    env_worker_cpus: float = 0.5

    def __post_init__(self) -> None:
        if min(self.learner_ranks, self.actors, self.engine_workers) < 1 or self.env_workers < 0:
            raise ValueError("learner_ranks, actors and engine_workers must be >= 1; env_workers >= 0")


@dataclass(frozen=True)
class Slot:
    role: str
    """"learner", "actor" or "env_worker"."""
    index: int
    node: str
    cpus: float
    gpus: int
    weight_ranks: tuple[int, ...] = ()
    """Actors: the weight-group rank of each worker of their engine (consecutive)."""
    cores: tuple[int, ...] = ()
    """CPU cores of its own on its node (``place(bind_cores=True)``); () leaves it unbound."""


@dataclass
class Placement:
    slots: list[Slot]
    learner_address: str
    """Node address of learner rank 0: FSDP master, weight store, trajectory stream."""
    ports: dict[str, int]
    """``fsdp``, ``weights``, ``trajectories``."""
    weight_world_size: int
    free: dict[str, tuple[float, int]] = field(default_factory=dict)
    """CPUs and GPUs left per node."""

    def of(self, role: str) -> list[Slot]:
        return [s for s in self.slots if s.role == role]


def place(nodes: list[Node], roles: Roles, *, base_port: int = 29500,
          bind_cores: bool = False) -> Placement:
    if not nodes:
        raise PlacementError("no nodes")
    _check_totals(nodes, roles)
    free = {n.name: [n.cpus, n.gpus] for n in nodes}
    slots: list[Slot] = []

    # Learner: fill the node with the most GPUs (then CPUs) first, then the next.
    order = sorted(nodes, key=lambda n: (-n.gpus, -n.cpus, n.name))
    for rank in range(roles.learner_ranks):
        node = _first_fit(order, free, roles.learner_cpus, roles.learner_gpus, f"learner rank {rank}")
        slots.append(Slot("learner", rank, node, roles.learner_cpus, roles.learner_gpus))

    # Actors and env workers: round-robin over the nodes, skipping full ones.
    next_rank = 1
    for i in range(roles.actors):
        node = _round_robin(nodes, free, i, roles.actor_cpus, roles.engine_gpus, f"actor {i}")
        ranks = tuple(range(next_rank, next_rank + roles.engine_workers))
        next_rank += roles.engine_workers
        slots.append(Slot("actor", i, node, roles.actor_cpus, roles.engine_gpus, ranks))
    for i in range(roles.env_workers):
        node = _round_robin(nodes, free, i, roles.env_worker_cpus, 0, f"env worker {i}")
        slots.append(Slot("env_worker", i, node, roles.env_worker_cpus, 0))

    if bind_cores:
        slots = _bind_cores(nodes, slots)
    head = next(n for n in nodes if n.name == slots[0].node)
    return Placement(
        slots=slots,
        learner_address=head.address,
        ports={"fsdp": base_port, "weights": base_port + 1, "trajectories": base_port + 2},
        weight_world_size=next_rank,
        free={name: (cpus, int(gpus)) for name, (cpus, gpus) in free.items()},
    )


def _bind_cores(nodes: list[Node], slots: list[Slot]) -> list[Slot]:
    bound = {}
    for node in nodes:
        here = [i for i, s in enumerate(slots)
                if s.node == node.name and s.role in ("learner", "actor") and not s.gpus]
        wants = {i: max(1, math.ceil(slots[i].cpus - 1e-9)) for i in here}
        if not here or sum(wants.values()) > int(node.cpus + 1e-9):
            continue
        low, high = 0, int(node.cpus + 1e-9)
        for i in here:
            if slots[i].role == "learner":
                high -= wants[i]
                bound[i] = tuple(range(high, high + wants[i]))
            else:
                bound[i] = tuple(range(low, low + wants[i]))
                low += wants[i]
    return [replace(s, cores=bound[i]) if i in bound else s for i, s in enumerate(slots)]


def _check_totals(nodes: list[Node], roles: Roles) -> None:
    """More GPUs or CPUs asked for than the cluster has at all: say what each role asks for."""
    gpus = roles.learner_ranks * roles.learner_gpus + roles.actors * roles.engine_gpus
    cpus = (roles.learner_ranks * roles.learner_cpus + roles.actors * roles.actor_cpus
            + roles.env_workers * roles.env_worker_cpus)
    have_gpus, have_cpus = sum(n.gpus for n in nodes), sum(n.cpus for n in nodes)
    if gpus > have_gpus or cpus > have_cpus + 1e-9:
        raise PlacementError(
            f"the run asks for {gpus} GPUs ({roles.learner_ranks} learner ranks x "
            f"{roles.learner_gpus} + {roles.actors} actors x {roles.engine_gpus}) and {cpus:g} "
            f"CPUs ({roles.learner_ranks} x {roles.learner_cpus:g} + {roles.actors} x "
            f"{roles.actor_cpus:g} + {roles.env_workers} env workers x {roles.env_worker_cpus:g}); "
            f"the cluster has {have_gpus} GPUs and {have_cpus:g} CPUs on {len(nodes)} node(s). "
            f"Lower learner.ranks / actors.num (or learner.gpus, actors.gpus_per_engine, the "
            f"CPUs each asks for), or add nodes")


def _fits(free, name, cpus, gpus) -> bool:
    return free[name][0] >= cpus - 1e-9 and free[name][1] >= gpus


def _take(free, name, cpus, gpus) -> str:
    free[name][0] -= cpus
    free[name][1] -= gpus
    return name


def _first_fit(order: list[Node], free, cpus, gpus, what: str) -> str:
    for node in order:
        if _fits(free, node.name, cpus, gpus):
            return _take(free, node.name, cpus, gpus)
    raise PlacementError(_no_room(what, cpus, gpus, free))


def _round_robin(nodes: list[Node], free, i: int, cpus, gpus, what: str) -> str:
    for k in range(len(nodes)):
        node = nodes[(i + k) % len(nodes)]
        if _fits(free, node.name, cpus, gpus):
            return _take(free, node.name, cpus, gpus)
    raise PlacementError(_no_room(what, cpus, gpus, free))


def _no_room(what: str, cpus, gpus, free) -> str:
    left = ", ".join(f"{name}: {c:g} CPUs {g} GPUs" for name, (c, g) in free.items())
    return f"no node has room for {what} ({cpus:g} CPUs, {gpus} GPUs); left: {left}"
