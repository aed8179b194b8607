"""Navigation: VAGEN's first-person navigation task, in a MiniWorld room (envs/navigation/world.py).

Built by ``make_env`` (envs.registry's ``navigation``): ``Navigation`` is the game that
envs/grid_env.py's ``GridEnv`` plays, so the formats, the format reward, the turn limit and the
reasoning judge are the layer every env shares. VAGEN runs this task in AI2-THOR, which cannot
run here; the room, the objects and the rules follow its Navigation env.

- Each episode: a seeded room of 3 to 5 distinct objects, one of them the target the instruction
  names ("Navigate to the red ball and be as close as possible to it."), a start at least
  ``min_start_m`` from it, from which the expert reaches it within the turns' actions.
- Actions (VAGEN's): ``moveahead``, ``moveback``, ``moveleft``, ``moveright`` (``STEP_M`` along
  the facing or sideways; a move into a wall or an object leaves the agent where it was),
  ``rotateleft``, ``rotateright`` (90 degrees), ``lookup``, ``lookdown`` (the camera's pitch by
  30 degrees, within ``PITCH_LIMITS_DEG``). Up to 5 per turn.
- Reward: ``success_reward`` (+10) when the agent's centre comes within ``success_m`` (1.5 m)
  of the target's, which ends the episode; the layer adds the format reward. The episode also
  ends, failed, after ``max_steps`` actions (VAGEN's hidden cap of 30).
- Observation: ``render="image"``, the first-person picture; ``render="text"`` (for text models),
  what is in view: each visible object's offset ahead and to the side, in metres.
- ``state_text()`` is VAGEN's state for the judge: the target's distance and direction (ahead,
  left, right, back: 90-degree sectors), then the 5 nearest objects in view with theirs;
  ``judge_score`` scores a description's distances and directions against it.
- ``solve()`` is the expert: a shortest action sequence (breadth-first over the lattice of
  reachable poses) to a pose within ``success_m`` of the target and facing it; among shortest
  ones it turns first, so it looks where it goes.

Invariants: same seed, same episode; the agent's pose is the game's (x, z on a lattice of
``STEP_M`` from the start, heading in quarter turns, pitch), pushed to the world only to render.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from envs.grid_env import GridEnv, takes_layer

STEP_M = 0.5
"""VAGEN's move length (its code's; its paper's table says 0.25 m)."""
PITCH_STEP_DEG = 30
PITCH_LIMITS_DEG = (-60, 30)
"""The camera's pitch (up > 0) stays within these, AI2-THOR's: 60 degrees down, 30 up."""
CAMERA_M = 1.5
"""The camera's height (MiniWorld's)."""
SUCCESS_M = 1.5
MAX_STEPS = 30
VIEW_LIMIT = 5
ACTIONS = ("moveahead", "moveback", "moveleft", "moveright", "rotateleft", "rotateright",
           "lookup", "lookdown")
# Per action: (lattice steps ahead, to the right, quarter turns left, pitch steps up).
_EFFECT = {"moveahead": (1, 0, 0, 0), "moveback": (-1, 0, 0, 0), "moveleft": (0, -1, 0, 0),
           "moveright": (0, 1, 0, 0), "rotateleft": (0, 0, 1, 0), "rotateright": (0, 0, -1, 0),
           "lookup": (0, 0, 0, 1), "lookdown": (0, 0, 0, -1)}
_UNDO = {"moveahead": "moveback", "moveback": "moveahead", "moveleft": "moveright",
         "moveright": "moveleft", "rotateleft": "rotateright", "rotateright": "rotateleft",
         "lookup": "lookdown", "lookdown": "lookup"}
"""Each action's opposite: the ``"reverse"`` mistake of a demonstration."""
# The expert's order of trial: turns first, so that among shortest plans it faces where it goes.
_SOLVER_ORDER = ("rotateleft", "rotateright", "moveahead", "moveback", "moveleft", "moveright")
# Heading h (quarter turns left of +x): the facing and the right vector in (x, z). MiniWorld's
# facing is (cos, -sin) of its angle and its right vector (sin, cos).
_FACING = ((1, 0), (0, -1), (-1, 0), (0, 1))
_RIGHT = ((0, 1), (1, 0), (0, -1), (-1, 0))
SECTORS = ("ahead", "left", "back", "right")


@dataclass(frozen=True)
class Pose:
    """Where the agent is: (x, z) = the start + ``STEP_M`` x (i, j), so poses compare exactly."""

    i: int
    j: int
    heading: int
    """Quarter turns left of +x, 0-3."""
    pitch: int = 0
    """Camera pitch in degrees, up > 0."""
    origin: tuple[float, float] = (0.0, 0.0)

    @property
    def x(self) -> float:
        return self.origin[0] + STEP_M * self.i

    @property
    def z(self) -> float:
        return self.origin[1] + STEP_M * self.j


def step(pose: Pose, action: str) -> Pose:
    """The pose after ``action`` if nothing is in the way (moves are checked by the caller)."""
    ahead, right, turn, look = _EFFECT[action]
    (fx, fz), (rx, rz) = _FACING[pose.heading], _RIGHT[pose.heading]
    pitch = pose.pitch + look * PITCH_STEP_DEG
    if not PITCH_LIMITS_DEG[0] <= pitch <= PITCH_LIMITS_DEG[1]:
        pitch = pose.pitch
    return replace(pose, i=pose.i + ahead * fx + right * rx, j=pose.j + ahead * fz + right * rz,
                   heading=(pose.heading + turn) % 4, pitch=pitch)


def offsets(pose: Pose, point: tuple[float, float]) -> tuple[float, float]:
    """(metres ahead, metres to the right) of ``point`` from ``pose``."""
    dx, dz = point[0] - pose.x, point[1] - pose.z
    (fx, fz), (rx, rz) = _FACING[pose.heading], _RIGHT[pose.heading]
    return dx * fx + dz * fz, dx * rx + dz * rz


def sector(pose: Pose, point: tuple[float, float]) -> str:
    """VAGEN's direction of ``point``: ahead, left, right or back, 90-degree sectors."""
    ahead, right = offsets(pose, point)
    bearing = math.degrees(math.atan2(-right, ahead))  # left > 0
    return SECTORS[int(((bearing + 45.0) % 360.0) // 90.0)]


def in_view(pose: Pose, thing, fov_deg: float) -> bool:
    """``thing`` (a world.Thing) is inside the camera's field of view (walls of one room hide
    nothing; objects are not taken to hide each other)."""
    ahead, right = offsets(pose, thing.pos)
    if ahead <= 0.05:
        return False
    distance = math.hypot(ahead, right)
    half = fov_deg / 2 + math.degrees(math.asin(min(1.0, thing.radius / max(distance, 1e-6))))
    if abs(math.degrees(math.atan2(right, ahead))) > half:
        return False
    low = math.degrees(math.atan2(-CAMERA_M, distance))
    high = math.degrees(math.atan2(thing.height - CAMERA_M, distance))
    return high >= pose.pitch - fov_deg / 2 and low <= pose.pitch + fov_deg / 2


_LINE_RE = re.compile(r"^\s*(?:target\s+)?([a-z ]+?)\s*:\s*([0-9.]+)\s*m\s+(ahead|left|right|back)\s*$",
                      re.IGNORECASE | re.MULTILINE)
_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")


def judge_score(description: str, truth: str) -> float:
    """The rule judge: the mean over the truth's objects (``state_text`` lines) of half a point
    for the right direction (the first direction word after the object's name in the
    description) and half for the distance (the first number there: 1 - error / 1 m, at least
    0). An object not named scores 0; objects the truth does not list are ignored."""
    true = [(name.lower(), float(d), where) for name, d, where in _LINE_RE.findall(truth)]
    if not true:
        return 0.0
    text = description.lower()
    names = [name for name, _, _ in true]
    scores = []
    for name, distance, where in true:
        start = text.find(name)
        if start < 0:
            scores.append(0.0)
            continue
        rest = text[start + len(name):]
        ends = [rest.find(other) for other in names if other != name and rest.find(other) >= 0]
        rest = rest[:min([*ends, rest.find("\n") if "\n" in rest else len(rest)])]
        said = re.search(r"\b(ahead|left|right|back)\b", rest)
        number = _NUMBER_RE.search(rest)
        score = 0.5 * (said is not None and said.group(1) == where)
        if number is not None:
            score += 0.5 * max(0.0, 1.0 - abs(float(number.group()) - distance))
        scores.append(score)
    return float(np.mean(scores))


class Navigation:
    """VAGEN's Navigation as a game of envs/grid_env.py (see the module docstring)."""

    shape = (1, 1)
    action_space = ACTIONS
    image_legend = ("The picture is your own view: a camera 1.5 m above the floor with a "
                    "90-degree field of view.")
    text_legend = ("The state lists each object in view, nearest first: name: metres ahead, "
                   "metres to the left or right.")

    def __init__(self, *, image_size: int = 224, success_m: float = SUCCESS_M,
                 max_steps: int = MAX_STEPS, min_start_m: float = 2.5,
                 success_reward: float = 10.0, plan_limit: int | None = None) -> None:
        from envs.navigation.world import FOV_DEG, NavWorld

        if not 0 < success_m < min_start_m:
            raise ValueError(f"need 0 < success_m < min_start_m, got {success_m} and {min_start_m}")
        self.success_m, self.max_steps = float(success_m), int(max_steps)
        self.min_start_m, self.success_reward = float(min_start_m), float(success_reward)
        self.plan_limit = int(plan_limit or self.max_steps)
        """Layouts whose expert plan is longer are drawn again: the turns must be able to win."""
        self.fov = FOV_DEG
        self.world = NavWorld(image_size)
        self.task = (f"You are a robot in a room with a few objects. Each turn you get an "
                     f"instruction naming a target object. Reach it: you succeed when you are "
                     f"within {self.success_m:g} m of it. moveahead, moveback, moveleft and "
                     f"moveright move you {STEP_M:g} m (unless something is in the way), "
                     f"rotateleft and rotateright turn you 90 degrees, lookup and lookdown tilt "
                     f"your view {PITCH_STEP_DEG} degrees. You have {self.max_steps} actions in all.")
        self.pose = Pose(0, 0, 0)
        self.steps = 0
        self.target = ""
        self.things: list = []
        self._free: dict[tuple[int, int], bool] = {}

    # -- the game interface of envs/grid_env.py ------------------------------------------------
    def reset(self, rng: np.random.Generator) -> None:
        for _ in range(100):  # a layout the expert can finish from a start far enough away
            self.world.generate(int(rng.integers(2**31)))
            x, z, heading = self.world.start_pose()
            self.pose, self.steps, self._free = Pose(0, 0, heading, origin=(x, z)), 0, {}
            self.things = self.world.things()
            self.target = self.things[0].name
            plan = self.solve()
            if self.distance() >= self.min_start_m and plan is not None and len(plan) <= self.plan_limit:
                return
        raise RuntimeError(f"no layout in 100 draws has its target {self.min_start_m:g} m away or "
                           f"more and reachable in {self.plan_limit} actions")

    def layout(self) -> str:
        """The map (envs/splits.py): the target, every object where it stands and the agent's
        start, to the centimetre."""
        things = "; ".join(f"{t.name} at {t.pos[0]:.2f},{t.pos[1]:.2f}" for t in self.things)
        x, z = self.pose.origin
        return f"go to {self.target}; {things}; start {x:.2f},{z:.2f} facing {self.pose.heading}"

    def instruction(self) -> str:
        return f"Navigate to the {self.target} and be as close as possible to it."

    def move(self, action: str) -> tuple[float, bool, bool]:
        self.pose = self._next(self.pose, action)
        self.steps += 1
        success = self.distance() <= self.success_m
        return (self.success_reward if success else 0.0), success or self.steps >= self.max_steps, success

    def text(self) -> str:
        return self.view_text(self.pose)

    def state_text(self) -> str:
        return self.state_text_at(self.pose)

    def image(self, size: int) -> np.ndarray:
        p = self.pose
        self.world.place(p.x, p.z, p.heading, p.pitch)
        return self.world.picture()

    def judge_score(self, description: str, truth: str) -> float:
        return judge_score(description, truth)

    def solve(self) -> list[str] | None:
        return self.solve_from(self.pose)

    def close(self) -> None:
        self.world.close()

    # -- the state in words ---------------------------------------------------------------------
    def distance(self, pose: Pose | None = None) -> float:
        pose = pose or self.pose
        tx, tz = self.things[0].pos
        return math.hypot(tx - pose.x, tz - pose.z)

    def visible(self, pose: Pose) -> list:
        """The objects in view from ``pose``, nearest first."""
        seen = [t for t in self.things if in_view(pose, t, self.fov)]
        return sorted(seen, key=lambda t: math.hypot(t.pos[0] - pose.x, t.pos[1] - pose.z))

    def view_text(self, pose: Pose) -> str:
        """The text observation: each object in view, its offsets ahead and sideways."""
        lines = []
        for t in self.visible(pose):
            ahead, right = offsets(pose, t.pos)
            side = f"{abs(right):.1f} m {'right' if right >= 0 else 'left'}"
            lines.append(f"{t.name}: {ahead:.1f} m ahead, {side}")
        if pose.pitch:
            lines.append(f"(you look {abs(pose.pitch)} degrees {'up' if pose.pitch > 0 else 'down'})")
        return "\n".join(lines) or "Only walls are in view."

    def state_text_at(self, pose: Pose) -> str:
        """VAGEN's state: the target's distance and direction, then the nearest objects in view."""
        def line(t) -> str:
            d = math.hypot(t.pos[0] - pose.x, t.pos[1] - pose.z)
            return f"{t.name}: {d:.2f} m {sector(pose, t.pos)}"

        others = [t for t in self.visible(pose) if t.name != self.target][:VIEW_LIMIT]
        return "\n".join([f"target {line(self.things[0])}", *map(line, others)])

    # -- moving and planning --------------------------------------------------------------------
    def _fits(self, i: int, j: int) -> bool:
        """The agent fits at lattice point (i, j) (asked of the world once per point)."""
        if (i, j) not in self._free:
            origin = self.pose.origin
            self._free[i, j] = self.world.free(origin[0] + STEP_M * i, origin[1] + STEP_M * j)
        return self._free[i, j]

    def _next(self, pose: Pose, action: str) -> Pose:
        after = step(pose, action)
        return after if (after.i, after.j) == (pose.i, pose.j) or self._fits(after.i, after.j) else pose

    def _goal(self, pose: Pose) -> bool:
        return self.distance(pose) <= self.success_m and sector(pose, self.things[0].pos) == "ahead"

    def solve_from(self, pose: Pose) -> list[str] | None:
        """The expert's plan from ``pose`` (see the module docstring); None if there is none."""
        fix = ["lookup" if pose.pitch < 0 else "lookdown"] * (abs(pose.pitch) // PITCH_STEP_DEG)
        start = (pose.i, pose.j, pose.heading)
        parents: dict[tuple[int, int, int], tuple[tuple[int, int, int], str] | None] = {start: None}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            if self._goal(Pose(*node, origin=pose.origin)):
                plan = []
                while parents[node] is not None:
                    node, action = parents[node]
                    plan.append(action)
                return fix + plan[::-1]
            i, j, h = node
            (fx, fz), (rx, rz) = _FACING[h], _RIGHT[h]
            for action in _SOLVER_ORDER:
                ahead, right, turn, _ = _EFFECT[action]
                q = (i + ahead * fx + right * rx, j + ahead * fz + right * rz, (h + turn) % 4)
                if q not in parents and (turn or self._fits(q[0], q[1])):
                    parents[q] = (node, action)
                    queue.append(q)
        return None

    # -- demonstrations (actors/demonstrations.py) ----------------------------------------------
    def demonstrate_turn(self, rng: np.random.Generator, noise: float, k: int,
                         structured: bool = False, mistake: str = "random"
                         ) -> tuple[list[str], str, int]:
        """(the expert's next ``k`` actions, each replaced with probability ``noise`` by a
        mistake, the state text after them, how many were mistakes), replanned after every
        action; stops where the episode would end. The mistake, as for the grid games
        (actors/demonstrations.py): a random action (``"random"``), the expert's move undone
        (``"reverse"``: ahead for back, left for right, ...), the turn's previous action again
        (``"repeat"``; the first is the expert's), or always the first action (``"habit"``:
        moveahead). With no plan (the target out of reach) every action is random."""
        pose, steps, actions, misses = self.pose, self.steps, [], 0
        plan = self.solve_from(pose)
        previous = None
        for _ in range(k):
            if plan and rng.random() >= noise:
                action, plan = plan[0], plan[1:]  # the rest of a shortest plan is one from here
            else:
                if plan and mistake == "reverse":
                    action = _UNDO[plan[0]]
                elif plan and mistake == "repeat":
                    action = previous or plan[0]
                elif plan and mistake == "habit":
                    action = ACTIONS[0]
                else:
                    action = ACTIONS[int(rng.integers(len(ACTIONS)))]
                misses += not (mistake == "repeat" and plan and previous is None)
                plan = None
            previous = action
            actions.append(action)
            pose, steps = self._next(pose, action), steps + 1
            plan = plan if plan is not None else self.solve_from(pose)
            if self.distance(pose) <= self.success_m or steps >= self.max_steps:
                break
        return actions, self.state_text_at(pose), misses

    def describe_state(self, structured: bool) -> str:
        return self.state_text()

    def reasoning(self) -> str:
        """One sentence on the expert's next move (the demonstrations' <reasoning>)."""
        where = sector(self.pose, self.things[0].pos)
        plan = {"ahead": "so I walk toward it", "left": "so I turn left to face it",
                "right": "so I turn right to face it", "back": "so I turn around"}[where]
        return f"The {self.target} is {where}, {plan}."


@takes_layer
def make_env(*, image_size: int = 224, success_m: float = SUCCESS_M, max_steps: int = MAX_STEPS,
             min_start_m: float = 2.5, success_reward: float = 10.0, **layer) -> GridEnv:
    """Navigation in VAGEN's layer; ``layer`` is GridEnv's settings (envs/grid_env.py)."""
    layer.setdefault("max_actions_per_turn", 5)
    layer.setdefault("max_turns", 4)
    game = Navigation(image_size=image_size, success_m=success_m, max_steps=max_steps,
                      min_start_m=min_start_m, success_reward=success_reward,
                      plan_limit=layer["max_turns"] * layer["max_actions_per_turn"])
    try:
        return GridEnv(game, action_example=("rotateleft", "moveahead", "moveahead"),
                       image_size=image_size, **layer)
    except Exception:
        game.close()
        raise
