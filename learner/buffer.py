"""The learner's trajectory buffer: FIFO batches of whole groups under a staleness bound, with
every drop counted.

Called by the learner's worker loop: ``put`` what the stream received, ``take`` a batch for the
current policy version. Invariants:
- staleness of a trajectory = current version - the oldest version that generated any of its
  tokens; with ``on_stale="drop"`` a trajectory staler than ``max_staleness`` never reaches a
  batch (counted under ``dropped["stale"]``); with ``on_stale="keep"`` it is kept and counted
  (the loss down-weights it through its importance ratios);
- groups: a trajectory whose ``group_size`` k is 1 or more was sent with the k members of its
  GRPO group that finished (the actor holds a group until all its members ended). A batch takes whole
  groups, in the order their first member arrived, until it has at least ``n`` trajectories, so
  no group is split across batches. A group with fewer members than the run's ``group_size``
  (an episode failed) is trained with the members it has (``partial_groups="train"``, counted in
  ``partial_groups``) or dropped (``"drop"``, ``dropped["partial_group"]``). A group whose
  members never all arrive (its actor died while sending) is dropped once its oldest member is
  staler than the bound (``dropped["incomplete_group"]``), whatever ``on_stale`` says. A group is
  stale, and dropped or kept as one, when its oldest member is. Trajectories with k = 0 (sent
  alone, not grouped) are groups of one;
- every entry leaves exactly once, taken or dropped, and its bytes go back through ``release``
  (the stream's credit), so memory is bounded by the stream's byte windows;
- a trajectory the learner cannot train on (learner/door.py) is ``refuse``d: counted as received
  and dropped (``dropped["refused/<reason>"]``), its bytes released at once;
- per actor: received == taken + dropped + still buffered (``dropped_by_actor``);
- a resumed run continues the counters of its checkpoint (``counters`` / ``carry``), in which
  what was buffered when it was written counts as dropped (``dropped["resumed"]``): the
  buffer itself is not saved.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from transport.schema import Trajectory

STALE_POLICIES = ("drop", "keep")
PARTIAL_GROUP_POLICIES = ("train", "drop")


@dataclass
class _Group:
    size: int
    """Members the actor sent (the trajectories' ``group_size``); 1 for one sent alone."""
    grouped: bool
    entries: list[tuple[str, Trajectory, int]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.entries) >= self.size

    @property
    def oldest_version(self) -> int:
        return min(t.min_policy_version for _, t, _ in self.entries)


class TrajectoryBuffer:
    def __init__(self, *, max_staleness: int, on_stale: str = "drop",
                 release: Callable[[str, int], None] | None = None, group_size: int = 1,
                 partial_groups: str = "train"):
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if on_stale not in STALE_POLICIES:
            raise ValueError(f"on_stale must be one of {STALE_POLICIES}, got {on_stale!r}")
        if partial_groups not in PARTIAL_GROUP_POLICIES:
            raise ValueError(f"partial_groups must be one of {PARTIAL_GROUP_POLICIES}, "
                             f"got {partial_groups!r}")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.max_staleness = max_staleness
        self.on_stale = on_stale
        self.group_size = group_size
        self.partial_groups = partial_groups
        self._release = release or (lambda actor, nbytes: None)
        self._groups: dict[object, _Group] = {}
        """In the order of their first member's arrival (dicts keep insertion order)."""
        self._lone = 0
        self._size = 0
        self.bytes = 0
        """Wire bytes of the buffered trajectories (bounded by the stream's byte windows)."""
        self.received: Counter[str] = Counter()
        self.taken: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        """By reason: ``stale``, ``partial_group``, ``incomplete_group``, ``refused/<why>``."""
        self.dropped_by_actor: Counter[str] = Counter()
        self.stale_kept = 0
        self.partial_groups_taken = 0

    def __len__(self) -> int:
        return self._size

    def counters(self) -> dict[str, Any]:
        """The counters as plain data, for a checkpoint; what is buffered now counts as dropped
        under ``resumed`` (a resumed run starts with an empty buffer)."""
        buffered = Counter(actor for g in self._groups.values() for actor, _, _ in g.entries)
        return {"received": dict(self.received), "taken": dict(self.taken),
                "dropped": dict(self.dropped + Counter(resumed=self._size)),
                "dropped_by_actor": dict(self.dropped_by_actor + buffered),
                "stale_kept": self.stale_kept, "partial_groups_taken": self.partial_groups_taken}

    def carry(self, saved: dict[str, Any]) -> None:
        """Continue from ``counters()`` of a checkpoint (added to these)."""
        for name in ("received", "taken", "dropped", "dropped_by_actor"):
            getattr(self, name).update(saved[name])
        self.stale_kept += saved["stale_kept"]
        self.partial_groups_taken += saved["partial_groups_taken"]

    def put(self, actor: str, trajectory: Trajectory, nbytes: int) -> None:
        self.received[actor] += 1
        self._size += 1
        self.bytes += nbytes
        if trajectory.group_size == 0:
            key: object = ("alone", self._lone)
            self._lone += 1
        else:
            key = (actor, trajectory.group_id)
        group = self._groups.setdefault(key, _Group(max(trajectory.group_size, 1),
                                                    grouped=trajectory.group_size > 0))
        group.entries.append((actor, trajectory, nbytes))

    def refuse(self, actor: str, reason: str, nbytes: int) -> None:
        """A received trajectory that never enters the buffer (learner/door.py says why): counted
        as received and dropped under ``refused/<reason>``, its bytes released at once."""
        self.received[actor] += 1
        self.dropped[f"refused/{reason}"] += 1
        self.dropped_by_actor[actor] += 1
        self._release(actor, nbytes)

    def take(self, n: int, current_version: int) -> list[Trajectory] | None:
        """Whole groups, oldest first, adding up to at least ``n`` fresh-enough trajectories;
        None (keeping everything) if the complete groups hold fewer."""
        self._drop(current_version)
        chosen, count = [], 0
        for key, group in self._groups.items():
            if count >= n:
                break
            if group.complete:
                chosen.append(key)
                count += len(group.entries)
        if count < n:
            return None
        batch = []
        for key in chosen:
            group = self._groups.pop(key)
            if self._partial(group):
                self.partial_groups_taken += 1
            for actor, trajectory, nbytes in group.entries:
                if current_version - trajectory.min_policy_version > self.max_staleness:
                    self.stale_kept += 1
                self.taken[actor] += 1
                self._size -= 1
                self.bytes -= nbytes
                self._release(actor, nbytes)
                batch.append(trajectory)
        return batch

    def staleness(self, current_version: int) -> list[int]:
        """Staleness of every buffered trajectory (for metrics)."""
        return [current_version - t.min_policy_version
                for g in self._groups.values() for _, t, _ in g.entries]

    def _drop(self, current_version: int) -> None:
        for key in list(self._groups):
            group = self._groups[key]
            stale = current_version - group.oldest_version > self.max_staleness
            if not group.complete and stale:
                self._remove(key, "incomplete_group")
            elif group.complete and stale and self.on_stale == "drop":
                self._remove(key, "stale")
            elif group.complete and self._partial(group) and self.partial_groups == "drop":
                self._remove(key, "partial_group")

    def _partial(self, group: _Group) -> bool:
        return group.grouped and group.size < self.group_size

    def _remove(self, key: object, reason: str) -> None:
        for actor, _, nbytes in self._groups.pop(key).entries:
            self.dropped[reason] += 1
            self.dropped_by_actor[actor] += 1
            self._size -= 1
            self.bytes -= nbytes
            self._release(actor, nbytes)
