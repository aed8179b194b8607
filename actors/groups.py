"""An actor's GRPO groups: the seeds and group ids it plays, and (whole groups) its finished
episodes held until their group has ended. Pure bookkeeping, called by actors/actor.py.

``GroupStream``: ``group_size`` consecutive episodes share a seed and a ``group_id`` unique
across actors and restarts (``actor_id * GROUP_STRIDE + incarnation * INCARNATION_STRIDE + k``);
seeds come from a stream fixed by (``seed``, ``actor_id``, ``incarnation``) within
``train_seeds``, and a resumed run skips the groups its checkpoint says were drawn.

``GroupHolder``, when ``whole_groups`` is on (GRPO): the learner's buffer takes groups whole
(learner/buffer.py), so the actor sends a group's members together, once every member has
ended, each stamped with how many were sent (``Trajectory.group_size``). A failed member makes
the group partial: it is sent with the members it has and counted.
"""

from __future__ import annotations

import numpy as np

from transport.schema import GROUP_STRIDE, INCARNATION_STRIDE, Trajectory


class GroupStream:
    def __init__(self, *, seed: int, actor_id: int, incarnation: int, group_size: int,
                 train_seeds: tuple[int, int], skip_groups: int = 0) -> None:
        # The first incarnation keeps the stream of (seed, actor_id).
        self._rng = np.random.default_rng([seed, actor_id] + ([incarnation] if incarnation else []))
        self.group_size, self.train_seeds = group_size, train_seeds
        for _ in range(skip_groups):  # a resumed run: where its checkpoint left the stream
            self._rng.integers(*train_seeds)
        self.drawn = skip_groups
        """Groups of this incarnation's stream drawn so far (a resumed run's skipped ones too)."""
        self._first_id = actor_id * GROUP_STRIDE + incarnation * INCARNATION_STRIDE
        self._seed, self._group_id, self._member = 0, 0, 0
        self.last_member = 0
        """The place in its group of the member ``next_member`` returned last."""

    def next_member(self) -> tuple[int, int]:
        """The next episode's (seed, group_id)."""
        if self._member == 0:
            self._seed = int(self._rng.integers(*self.train_seeds))
            self._group_id = self._first_id + self.drawn
            self.drawn += 1
        self.last_member = self._member
        self._member = (self._member + 1) % self.group_size
        return self._seed, self._group_id


class GroupHolder:
    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self.partial = 0
        """Groups sent with fewer members than ``group_size`` (a member failed)."""
        self._held: dict[int, tuple[int, list[Trajectory]]] = {}
        """group_id -> (members ended, finished trajectories held)."""

    def ended(self, group_id: int, trajectory: Trajectory | None) -> list[Trajectory]:
        """A member of ``group_id`` ended with ``trajectory`` (None: it failed); returns the
        group's finished members, stamped, once its last member has ended, else []."""
        ended, members = self._held.pop(group_id, (0, []))
        members += [trajectory] if trajectory is not None else []
        if ended + 1 < self.group_size:
            self._held[group_id] = (ended + 1, members)
            return []
        if len(members) < self.group_size:
            self.partial += 1
        for t in members:
            t.group_size = len(members)
        return members

    @property
    def held(self) -> int:
        """Finished trajectories waiting for the rest of their group."""
        return sum(len(members) for _, members in self._held.values())
