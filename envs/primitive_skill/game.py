"""PrimitiveSkill: VAGEN's manipulation env, a Panda arm on ManiSkill 3 driven by pick / place / push.

Built by ``make_env`` (envs.registry's ``primitive_skill``): ``PrimitiveSkill`` is the game that
envs/grid_env.py's ``GridEnv`` plays, so the answer formats, the format reward, the turn limit and
the reasoning judge are the same layer as every other env's. One simulator per game (one per env,
so one per env worker process as the pool runs it); ManiSkill needs a Vulkan device
(launch/tools/system.sh installs Mesa's lavapipe where there is none).

- Actions: ``pick(x,y,z)``, ``place(x,y,z)``, ``push(x1,y1,z1,x2,y2,z2)``, integer millimetres in
  the world frame the prompt states (x toward the viewer, y to the right, z up; the table top at
  z = 0). A coordinate outside the task's workspace by up to ``CLIP_MM`` is clipped onto it (a
  point stated on a cube's far face); further out, a wrong arity, a non-integer or any other text
  is an invalid action: it executes nothing and the turn loses its format reward.
- Observation: the objects' centres in mm, one per line (``red_cube: (-42, 57, 20)``); with
  ``render="image"`` the task camera's RGB picture instead. ``state_text()`` is the same lines, the
  truth the rule judge compares a stated or predicted position with (``judge_score``).
- Reward (VAGEN's): the layer's format reward per turn, and on the episode's last turn
  ``end_reward()`` = stage value now - stage value at reset - ``step_penalty`` x skills executed,
  where the stage value is 10 on success, else 2 x (highest completed stage + 1), 0 for none
  (envs/primitive_skill/tasks.py and drawer.py list each task's stages). The episode ends on
  success.
- ``solve()`` is the scripted expert: the skills that finish the task from the current state.

Invariants: same seed, same episode (layouts and the simulation); every action string the game
executes is canonical (``pick(-42,57,20)``: lowercase, no spaces, clipped).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from envs.grid_env import GridEnv, takes_layer

CLIP_MM = 50
"""How far outside the workspace a coordinate may be and still be clipped onto it (mm)."""
STEP_PENALTY = 0.1
SUCCESS_VALUE = 10.0
ARITY = {"pick": 3, "place": 3, "push": 6}
_ACTION_RE = re.compile(r"\s*([A-Za-z]+)\s*\(([^()]*)\)\s*")
_INT_RE = re.compile(r"[+-]?\d+")
HOLD_MM = (0, 0, 300)
"""Where a held cube is after a pick: the hand's home (envs/primitive_skill/skills.py)."""
REST_MM = 25
"""The expert's place height for a cube on the table: its centre (20 mm) plus a drop of 5 mm."""


def stage_value(success: bool, stages: list[bool]) -> float:
    """VAGEN's stage reward: 10 on success, else 2 x (highest completed stage + 1), 0 for none."""
    if success:
        return SUCCESS_VALUE
    done = [i for i, s in enumerate(stages) if s]
    return 2.0 * (done[-1] + 1) if done else 0.0


def parse_action(text: str, workspace: dict[str, tuple[int, int]]) -> tuple[str | None, str]:
    """(the canonical action, "") for a valid ``text``, else (None, why it is invalid)."""
    m = _ACTION_RE.fullmatch(text)
    if m is None:
        return None, "not of the form name(numbers)"
    name, args = m.group(1).lower(), [a.strip() for a in m.group(2).split(",")]
    if name not in ARITY:
        return None, f"{m.group(1)!r} is not one of {', '.join(ARITY)}"
    if len(args) != ARITY[name]:
        return None, f"{name} takes {ARITY[name]} integers, got {len(args)}"
    if not all(_INT_RE.fullmatch(a) for a in args):
        return None, f"{name} takes integer millimetres"
    values = [int(a) for a in args]
    clipped = []
    for axis, v in zip("xyz" * 2, values):
        low, high = workspace[axis]
        if not low - CLIP_MM <= v <= high + CLIP_MM:
            return None, f"{axis}={v} is outside the workspace [{low}, {high}]"
        clipped.append(min(max(v, low), high))
    return _act(name, clipped), ""


def describe(positions: dict[str, tuple[int, int, int]], structured: bool = False) -> str:
    """One line per object, ``red_cube: (-42, 57, 20)``; ``structured``: one dict,
    ``{'red_cube': (-42, 57, 20), ...}`` (the structured formats' <observation>)."""
    if structured:
        return "{" + ", ".join(f"'{name}': ({x}, {y}, {z})"
                               for name, (x, y, z) in positions.items()) + "}"
    return "\n".join(f"{name}: ({x}, {y}, {z})" for name, (x, y, z) in positions.items())


_POSITION_RE = re.compile(r"([A-Za-z_]+)['\"]?\s*[:=]\s*['\"]?\(\s*([+-]?\d+(?:\.\d+)?)\s*,\s*"
                          r"([+-]?\d+(?:\.\d+)?)\s*,\s*([+-]?\d+(?:\.\d+)?)\s*\)")
JUDGE_SCALE_MM = 50.0
"""A stated position scores 1 - distance / this (at least 0): 1 when exact, 0 from 5 cm off."""


def judge_score(description: str, truth: str) -> float:
    """The rule judge for positions: the mean over the true objects of 1 - d / 50 mm (at least 0),
    d the distance between the object's true centre and the first position the description states
    for it (``name: (x, y, z)`` or a dict's ``'name': (x, y, z)``); an object not stated scores 0,
    and objects the truth does not have are ignored."""
    true = {m[0]: np.array(m[1:], dtype=float) for m in _POSITION_RE.findall(truth)}
    if not true:
        return 0.0
    stated: dict[str, np.ndarray] = {}
    for m in _POSITION_RE.findall(description):
        stated.setdefault(m[0], np.array(m[1:], dtype=float))
    scores = [max(0.0, 1.0 - np.linalg.norm(stated[name] - p) / JUDGE_SCALE_MM)
              if name in stated else 0.0 for name, p in true.items()]
    return float(np.mean(scores))


class PrimitiveSkill:
    """One ManiSkill task as a game of envs/grid_env.py (see the module docstring)."""

    shape = (1, 1)
    action_space = ("pick(x,y,z)", "place(x,y,z)", "push(x1,y1,z1,x2,y2,z2)")
    image_legend = ("The picture shows the arm and the table from in front: x points toward you, "
                    "y to your right, z up.")

    def __init__(self, task: str, *, image_size: int = 300, step_penalty: float = STEP_PENALTY,
                 assets: str = "builtin", sim_config: dict[str, Any] | None = None) -> None:
        import gymnasium as gym
        import torch

        from envs.primitive_skill import drawer, tasks
        from envs.primitive_skill.skills import Skills

        ids = tasks.TASKS | drawer.TASKS
        if task not in ids:
            raise ValueError(f"unknown task {task!r}; expected one of {sorted(ids)}")
        if task in drawer.TASKS:
            sim_config = {"assets": assets, **(sim_config or {})}
        self.name, self.step_penalty = task, float(step_penalty)
        # The camera renders on the GPU where there is one, else on the CPU (lavapipe).
        render_backend = "gpu" if torch.cuda.is_available() else "cpu"
        self.env = gym.make(ids[task], num_envs=1, obs_mode="state",
                            control_mode="pd_ee_delta_pose", render_mode="rgb_array",
                            sim_backend="cpu", render_backend=render_backend,
                            image_size=image_size, **(sim_config or {}))
        self.sim = self.env.unwrapped
        self.skills = Skills(self.env, self._grasp_yaw,
                             push_yaw=getattr(self.sim, "push_yaw", lambda p1, p2: None))
        self.workspace = dict(tasks.WORKSPACE_MM)
        limits = ", ".join(f"{a} in [{lo}, {hi}]" for a, (lo, hi) in self.workspace.items())
        self.task = (f"You control a robot arm above a table. {self.sim.INSTRUCTION}\n"
                     f"Positions are object centres (x, y, z) in integer millimetres: x points "
                     f"toward you, y to your right, z up; the table top is at z = 0. The arm acts "
                     f"within {limits}.")
        self.text_legend = "The state lists each object's centre: name: (x, y, z)."
        self.executed = 0
        self._start_value = 0.0

    # -- the game interface of envs/grid_env.py ------------------------------------------------
    def reset(self, rng: np.random.Generator) -> None:
        self.env.reset(seed=int(rng.integers(2**31)))
        self.skills.reset()
        self.executed = 0
        self._start_value = self.value()

    def parse_action(self, text: str) -> tuple[str | None, str]:
        return parse_action(text, self.workspace)

    def random_action(self, rng: np.random.Generator) -> str:
        """A skill drawn uniformly, each coordinate uniformly in the workspace (the random
        baseline of launch/run/baselines.py)."""
        name = list(ARITY)[int(rng.integers(len(ARITY)))]
        values = [int(rng.integers(*self.workspace[axis], endpoint=True)) for axis in "xyz" * (ARITY[name] // 3)]
        return f"{name}({','.join(map(str, values))})"

    def move(self, action: str) -> tuple[float, bool, bool]:
        """Execute one canonical action (``parse_action``'s); the reward comes at the end."""
        name, values = _split(action)
        p = np.array(values, dtype=float) / 1000.0
        getattr(self.skills, name)(*p.reshape(-1, 3))
        self.executed += 1
        success = self.success()
        return 0.0, success, success

    def end_reward(self) -> float:
        return self.value() - self._start_value - self.step_penalty * self.executed

    def text(self) -> str:
        return describe(self.positions_mm())

    def state_text(self) -> str:
        return self.text()

    def state_dict(self) -> dict[str, tuple[int, int, int]]:
        return self.positions_mm()

    def image(self, size: int) -> np.ndarray:
        """The task camera's RGB picture (the camera is built ``image_size`` a side)."""
        return self.sim.render()[0].numpy().astype(np.uint8)

    def judge_score(self, description: str, truth: str) -> float:
        return judge_score(description, truth)

    def close(self) -> None:
        self.env.close()

    # -- the task's state ---------------------------------------------------------------------
    def positions_mm(self) -> dict[str, tuple[int, int, int]]:
        return {name: tuple(int(round(v * 1000)) for v in p)
                for name, p in self.sim.positions().items()}

    def success(self) -> bool:
        return bool(self.sim.evaluate()["success"][0])

    def value(self) -> float:
        info = self.sim.evaluate()
        return stage_value(bool(info["success"][0]), [bool(s) for s in info["stages"][0]])

    def _grasp_yaw(self, p: np.ndarray) -> float | None:
        """The yaw to grasp the cube at ``p`` with: across two faces (of the two such yaws, the one
        whose fingers pass farthest from the other cubes); None when no cube is within 3 cm. A
        task with no cubes says it itself (``grasp_yaw``)."""
        own = getattr(self.sim, "grasp_yaw", None)
        if own is not None:
            return own(p)
        centres = {n: c.pose.p[0].numpy() for n, c in self.sim.cubes.items()}
        near = [n for n, c in centres.items() if np.linalg.norm(c[:2] - p[:2]) < 0.03]
        if not near:
            return None
        name = min(near, key=lambda n: np.linalg.norm(centres[n][:2] - p[:2]))
        w, _, _, z = self.sim.cubes[name].pose.q[0].numpy()
        face = (2 * np.arctan2(z, w) + np.pi / 4) % (np.pi / 2) - np.pi / 4
        others = [c[:2] - centres[name][:2] for n, c in centres.items() if n != name]

        def clearance(yaw: float) -> float:
            """How far the hand passes from the nearest other cube: the hand is about 0.24 m long
            along the fingers' axis and 0.08 m across (with a cube's half diagonal)."""
            d = np.array([-np.sin(yaw), np.cos(yaw)])
            return min([max(abs(v[0] * d[1] - v[1] * d[0]) - 0.05, abs(v @ d) - 0.13)
                        for v in others], default=1.0)

        return max((face, face - np.pi / 2 if face > 0 else face + np.pi / 2), key=clearance)

    # -- the scripted expert ------------------------------------------------------------------
    def solve(self) -> list[str] | None:
        """The expert's skills from the current state to success ([] only once it is reached)."""
        if self.success():
            return []
        pos = self.positions_mm()
        own = getattr(self.sim, "expert", None)  # a task of other things than cubes plans itself
        if own is not None:
            plan = own(pos)
            return None if plan is None else [_act(name, p) for name, p in plan]
        held = [n for n in self.sim.cubes if bool(self.sim.held(n)[0])]
        plan: list[str] = []
        goals = self._goals(pos)
        for cube, goal in goals:
            if self._placed(cube, goal, pos):
                continue
            if cube not in held:
                plan.append(_act("pick", pos[f"{cube}_cube"]))
            plan.append(_act("place", goal))
            pos[f"{cube}_cube"] = goal  # where the plan leaves it, for the goals after it
        if not plan:  # each cube looks placed, yet no success (one still held): place it again
            cube, goal = next(((c, g) for c, g in goals if c in held), goals[-1])
            plan = [_act("pick", pos[f"{cube}_cube"]), _act("place", goal)]
        return plan

    def demonstrate_turn(self, rng: np.random.Generator, noise: float, k: int,
                         structured: bool = False, mistake: str = "random"
                         ) -> tuple[list[str], str, int]:
        """A demonstration turn (actors/demonstrations.py): (the expert's next ``k`` skills, some
        replaced by a mistake, the state text the player predicts after them (a dict when
        ``structured``), how many were mistakes). The mistake, with probability ``noise`` each:
        ``"habit"``, a place puts the cube back where this turn picked it (the same z; a place
        with no pick before it in the turn stays the expert's): one systematic error, which
        greedy decoding follows once it is the likelier choice and RL unlearns; any other
        ``mistake``, a miss: any skill's point moved 30 to 60 mm in x and in y, kept in the
        workspace."""
        actions, misses, picked = [], 0, None
        for action in (self.solve() or [])[:k]:
            name, values = _split(action)
            if name == "pick":
                picked = values[:2]
            if mistake == "habit":
                if name == "place" and picked is not None and rng.random() < noise:
                    action, misses = _act(name, picked + values[2:]), misses + 1
            elif rng.random() < noise:
                for i, axis in ((0, "x"), (1, "y")):  # a miss stays in the workspace
                    low, high = self.workspace[axis]
                    values[i] = min(max(values[i] + int(rng.choice([-1, 1]) *
                                                        rng.integers(30, 61)), low), high)
                action, misses = _act(name, values), misses + 1
            actions.append(action)
        return actions, describe(self._predict(actions), structured), misses

    def describe_state(self, structured: bool) -> str:
        """The state as the demonstrations' <observation> writes it."""
        return describe(self.positions_mm(), structured)

    def reasoning(self) -> str:
        """One sentence on the expert's next move (the demonstrations' <reasoning>)."""
        pos = self.positions_mm()
        if self.name == "PutAppleInDrawer":
            (dx, dy, _), (hx, hy, _) = pos["drawer"], pos["drawer_handle"]
            if not self.sim.evaluate()["stages"][0, 1]:
                return f"The apple should go into the open drawer at ({dx}, {dy}), so I put it there."
            return f"The apple is in the drawer, so I push the handle at ({hx}, {hy}) until it is in."
        for cube, goal in self._goals(pos):
            if not self._placed(cube, goal, pos):
                return f"The {cube} cube should go to ({goal[0]}, {goal[1]}), so I move it there."
        return "The task is done."

    def _predict(self, actions: list[str]) -> dict[str, tuple[int, int, int]]:
        """The positions after ``actions`` if each works: a pick lifts the cube (or apple) nearest
        its point (within 30 mm) to the hand's home, a place puts the held one at its point, a push
        from at or before the drawer's handle moves the drawer in, and what is in it, to the push's
        end (no further than closed)."""
        pos, held = self.positions_mm(), None
        for action in actions:
            name, p = _split(action)
            cubes = [n for n in pos if n.endswith("_cube") or n == "apple"]
            if name == "push" and "drawer_handle" in pos:
                self._predict_push(pos, p)
                continue
            if name == "pick":
                near = min(cubes, key=lambda n: np.hypot(pos[n][0] - p[0], pos[n][1] - p[1]))
                if np.hypot(pos[near][0] - p[0], pos[near][1] - p[1]) <= 30:
                    held, pos[near] = near, HOLD_MM
            elif name == "place" and held is not None:
                pos[held], held = (p[0], p[1], p[2] - (REST_MM - 20)), None
        return pos

    def _predict_push(self, pos: dict[str, tuple[int, int, int]], p: list[int]) -> None:
        """A push's effect on the drawer (see ``_predict``), in ``pos``."""
        hx, hy, hz = pos["drawer_handle"]
        closed_y = hy - round(self.sim.open_by() * 1000)
        if not (abs(p[0] - hx) <= 30 and abs(p[2] - hz) <= 30 and p[1] >= hy > p[4]):
            return
        front = max(p[4], closed_y)
        (dx, dy, dz), (ax, ay, az) = pos["drawer"], pos["apple"]
        if np.hypot(ax - dx, ay - dy) <= 50:  # the apple rides in the drawer
            pos["apple"] = (ax, ay + front - hy, az)
        # as the task states it: the middle of the floor out of the cabinet, at least an apple's
        pos["drawer"] = (dx, front - max(front - closed_y, 60) // 2, dz)
        pos["drawer_handle"] = (hx, front, hz)

    def _goals(self, pos: dict[str, tuple[int, int, int]]) -> list[tuple[str, tuple[int, int, int]]]:
        """(cube, where the expert places it), in order; a goal may depend on earlier cubes."""
        if self.name == "PlaceTwoCube":
            (lx, ly, _), (rx, ry, _) = pos["left_target"], pos["right_target"]
            return [("red", (lx, ly, REST_MM)), ("green", (rx, ry, REST_MM))]
        if self.name == "AlignTwoCube":
            return [(c, (0, pos[f"{c}_cube"][1], REST_MM)) for c in ("red", "green")]
        gx, gy, gz = pos["green_cube"]  # StackThreeCube: red on green, purple on red
        return [("red", (gx, gy, gz + 45)), ("purple", (gx, gy, gz + 85))]

    def _placed(self, cube: str, goal: tuple[int, int, int], pos) -> bool:
        """The cube meets its part of success with a margin (positions are rounded to mm): the
        expert redoes one that only just does."""
        x, y, z = pos[f"{cube}_cube"]
        if self.name == "AlignTwoCube":
            return abs(x) <= 7 and z <= 45
        if self.name == "PlaceTwoCube":
            return np.hypot(x - goal[0], y - goal[1]) <= 45 and z < 45
        return np.hypot(x - goal[0], y - goal[1]) < 15 and abs(z - (goal[2] - 5)) < 10


def _act(name: str, p) -> str:
    """The canonical action text: ``pick(-42,57,20)``."""
    return f"{name}({','.join(str(int(v)) for v in p)})"


def _split(action: str) -> tuple[str, list[int]]:
    """A canonical action (``_act``'s, ``parse_action``'s) as (name, its integers)."""
    name, args = action[:-1].split("(")
    return name, [int(v) for v in args.split(",")]


@takes_layer
def make_env(*, task: str = "PlaceTwoCube", image_size: int = 300,
             step_penalty: float = STEP_PENALTY, assets: str = "builtin",
             sim_config: dict[str, Any] | None = None, **layer: Any) -> GridEnv:
    """The PrimitiveSkill ``task`` in VAGEN's layer; ``layer`` is GridEnv's settings; ``assets``:
    where PutAppleInDrawer's apple and cabinet come from (envs/primitive_skill/drawer.py)."""
    layer.setdefault("max_actions_per_turn", 2)
    layer.setdefault("action_sep", "|")
    game = PrimitiveSkill(task, image_size=image_size, step_penalty=step_penalty, assets=assets,
                          sim_config=sim_config)
    try:
        return GridEnv(game, action_example=("pick(62,-55,20)", "place(75,33,50)"),
                       image_size=image_size, **layer)
    except Exception:
        game.close()
        raise
