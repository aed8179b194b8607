"""Whole GRPO groups: an actor's finished episodes held until their group has ended.

Called by actors/actor.py when ``whole_groups`` is on (GRPO): the learner's buffer takes groups
whole (transport/buffer.py), so the actor sends a group's members together, once every member
has ended, each stamped with how many were sent (``Trajectory.group_size``). A failed member
makes the group partial: it is sent with the members it has and counted. Pure bookkeeping.
"""

from __future__ import annotations

from transport.schema import Trajectory


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
