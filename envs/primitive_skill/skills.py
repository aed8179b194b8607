"""The skill controller: pick, place and push as waypoint state machines on end-effector delta-pose
control (ManiSkill's ``pd_ee_delta_pose``: each control step moves the hand by up to 0.1 m and
0.1 rad, normalised to [-1, 1], and sets the gripper: +1 open, -1 closed).

Called by envs/primitive_skill/game.py, one ``Skills`` per simulator. No motion planner: a skill is
a fixed sequence of waypoints for the hand (``panda_hand_tcp``, fingers pointing down), each
reached by proportional steps:
- pick(p): open, move over p (``travel_height``), down to ``approach`` m above p, down to p,
  close, lift to ``approach`` above p, go home;
- place(p): the same with the gripper as it is, opening at p;
- push(p1, p2): close, move above p1, down to p1, along to p2, lift above p2, go home.
A move ends when every axis is within ``tolerance`` m of the waypoint and the hand is turned as it
should be (``turn_tolerance``); a skill that runs out of its
step budget (``budget`` for its moves, ``home_budget`` for the way home) stops there, goes home and
reports failure. The hand always points down (rotation errors are corrected each step); a pick
first turns it about the vertical to the faces of the object under ``p``, so the fingers close on
two faces (a grasp across a cube's edges tilts it in the hand, and a tilted cube does not stack).
Invariants: every skill ends at home (or out of budget); ``steps`` counts the control steps taken.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.spatial.transform import Rotation

OPEN, CLOSED = 1.0, -1.0
DOWN = Rotation.from_quat([0.0, 1.0, 0.0, 0.0], scalar_first=True)
"""The hand's orientation in every move: fingers down, opening along the world's y axis."""


@dataclass(frozen=True)
class SkillConfig:
    """The controller's constants (m, control steps)."""

    approach: float = 0.05
    """Height above a point at which a skill arrives before going down to it."""
    travel_height: float = 0.15
    """A pick or place first goes over its point at least this high (above a three-cube stack
    with the hand's body), turning there, then goes straight down."""
    home: tuple[float, float, float] = (0.0, 0.0, 0.3)
    """Where the hand waits between skills, above the table's centre."""
    tolerance: float = 0.005
    """A waypoint is reached when every axis is within this..."""
    turn_tolerance: float = 0.05
    """... and the hand's orientation within this (rad)."""
    max_step: float = 0.03
    """Largest move per control step (m): the speed limit, 0.6 m/s at 20 Hz."""
    gain: float = 1.0
    """Move per control step = gain x error, up to ``max_step``."""
    grip_steps: int = 10
    """Control steps to close or open the gripper."""
    budget: int = 150
    """Control steps a pick or place may take before home; push gets 200."""
    push_budget: int = 200
    home_budget: int = 150


class Skills:
    """Runs skills on one ManiSkill env (``gym.make(..., control_mode="pd_ee_delta_pose")``).

    ``grasp_yaw(p)``: the yaw (rad, about the world's z axis, within [-pi/2, pi/2]) at which to
    grasp the object at ``p``, or None where there is none (the hand keeps its yaw); a pick turns
    the hand to it above ``p`` and keeps it until the next pick. At yaw 0 the fingers open along
    the world's y axis; at yaw t along (-sin t, cos t). ``push_yaw(p1, p2)``: the yaw for a push
    from ``p1`` to ``p2``, or None to keep the hand's.
    """

    def __init__(self, env, grasp_yaw: Callable[[np.ndarray], float | None] = lambda p: None,
                 config: SkillConfig = SkillConfig(),
                 push_yaw: Callable[[np.ndarray, np.ndarray], float | None] = lambda a, b: None
                 ) -> None:
        self.env, self.config, self.grasp_yaw, self.push_yaw = env, config, grasp_yaw, push_yaw
        self.agent = env.unwrapped.agent
        self.steps = 0
        self.gripper = OPEN
        self._hand = DOWN

    def reset(self) -> None:
        """After the env's reset."""
        self.gripper, self.steps, self._hand = OPEN, 0, DOWN

    def pick(self, p: np.ndarray) -> bool:
        yaw = self.grasp_yaw(p)
        if yaw is not None:
            self._hand = Rotation.from_euler("z", yaw) * DOWN
        high, up = self._above(p)
        ok = self._run([("grip", OPEN), ("move", high), ("move", up), ("move", p), ("grip", CLOSED),
                        ("move", up)], self.config.budget)
        return self._home() and ok

    def place(self, p: np.ndarray) -> bool:
        high, up = self._above(p)
        ok = self._run([("move", high), ("move", up), ("move", p), ("grip", OPEN), ("move", up)],
                       self.config.budget)
        return self._home() and ok

    def push(self, p1: np.ndarray, p2: np.ndarray) -> bool:
        yaw = self.push_yaw(p1, p2)
        if yaw is not None:
            self._hand = Rotation.from_euler("z", yaw) * DOWN
        up1, up2 = p1 + [0, 0, self.config.approach], p2 + [0, 0, self.config.approach]
        ok = self._run([("grip", CLOSED), ("move", up1), ("move", p1), ("move", p2), ("move", up2)],
                       self.config.push_budget)
        return self._home() and ok

    def _above(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the travel point over ``p``, where the hand turns clear of any stack; the approach
        point ``approach`` above ``p``)."""
        up = p + [0, 0, self.config.approach]
        return np.array([p[0], p[1], max(up[2], self.config.travel_height)]), up

    def tcp(self) -> np.ndarray:
        """The hand's position (m, world frame)."""
        return self.agent.tcp.pose.p[0].numpy().astype(np.float64)

    def _home(self) -> bool:
        return self._run([("move", np.array(self.config.home))], self.config.home_budget)

    def _run(self, plan: list[tuple[str, object]], budget: int) -> bool:
        """Execute ``plan``'s moves and grips within ``budget`` control steps; False if it ran out."""
        left = budget
        for kind, arg in plan:
            if kind == "grip":
                self.gripper = float(arg)
                for _ in range(min(self.config.grip_steps, left)):
                    self._act(np.zeros(3))
                left -= self.config.grip_steps
            else:
                while left > 0:
                    error = np.asarray(arg, dtype=np.float64) - self.tcp()
                    if (np.all(np.abs(error) < self.config.tolerance)
                            and self._turn().magnitude() < self.config.turn_tolerance):
                        break
                    step = error * self.config.gain
                    norm = np.linalg.norm(step)
                    if norm > self.config.max_step:
                        step *= self.config.max_step / norm
                    self._act(step)
                    left -= 1
            if left <= 0:
                return False
        return True

    def _act(self, move: np.ndarray) -> None:
        """One control step: move the hand by ``move`` (m), turn it back to pointing down."""
        turn = self._turn().as_rotvec()  # in the world's axes, as the controller's are
        # ManiSkill 3.0.1 scales the rotation part by its lower bound (-0.1): the sign flips.
        action = np.concatenate([move / 0.1, -turn / 0.1, [self.gripper]])
        self.env.step(torch.as_tensor(np.clip(action, -1, 1)[None], dtype=torch.float32))
        self.steps += 1

    def _turn(self) -> Rotation:
        """The rotation from the hand's orientation now to the one it should have."""
        now = Rotation.from_quat(self.agent.tcp.pose.q[0].numpy().astype(np.float64),
                                 scalar_first=True)  # ManiSkill's quaternions are (w, x, y, z)
        return self._hand * now.inv()
