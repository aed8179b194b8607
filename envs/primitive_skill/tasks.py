"""VAGEN's PrimitiveSkill table-top tasks as ManiSkill 3 environments (built-in assets only).

Imported by envs/primitive_skill/game.py when a PrimitiveSkill env is made (importing it imports
ManiSkill and registers ``TASKS`` with ManiSkill and gymnasium). Each task is a Panda arm (base at
x = -0.615 m) on ManiSkill's table scene (table top at z = 0) with 4 cm cubes, built as
``gym.make(TASKS[name], num_envs=1, obs_mode="state", control_mode="pd_ee_delta_pose",
sim_backend="cpu", render_mode="rgb_array")``. The layouts, goals and success rules are VAGEN's:

- PlaceTwoCube: red and green cubes drawn in x [-0.10, 0], y [-0.10, 0.10]; the red cube goes on
  the left target disc at (0.08, -0.10), the green on the right one at (0.08, 0.10): success when
  each cube's centre is within 0.05 m of its target in xy and neither is held.
- StackThreeCube: red, green and purple cubes drawn over the whole workspace; success when red is
  on green and purple on red (centres within 0.02 m in xy, the upper more than 0.02 m higher) and
  neither upper cube is held.
- AlignTwoCube: red drawn in x [0.10, 0.15], y [-0.20, 0.10], green in x [0.10, 0.15],
  y [0.10, 0.20]; success when both have |x| <= 0.01 m and z <= 0.05 m (on the line x = 0).

Every task also reports its stages, for VAGEN's stage reward (envs/primitive_skill/game.py):
``evaluate()["stages"]`` holds a boolean per stage (Shape: (1, n stages)), stage n completed now
(PlaceTwoCube: red held; red on its target and let go; green held with red on target. StackThreeCube: red held; red on
green and let go; purple held with red on green. AlignTwoCube: red on the line; green on the
line). VAGEN names the first two tasks' stage keys so that its reward parser never finds them
(only success counts there); here every task's stages count.

Invariants:
- Same seed, same episode: the layout comes from the episode generator ManiSkill seeds with
  ``reset(seed=...)``; every cube is drawn at least ``MIN_GAP`` m from the others (centres), with
  a random yaw, resting on the table.
- ``positions()`` maps each named object (cubes, targets) to its centre in metres, world frame.
"""

from __future__ import annotations

import numpy as np
import sapien
import torch
from mani_skill.envs.sapien_env import BaseEnv
from mani_skill.sensors.camera import CameraConfig
from mani_skill.utils import sapien_utils
from mani_skill.utils.building import actors
from mani_skill.utils.registration import register_env
from mani_skill.utils.scene_builder.table import TableSceneBuilder
from mani_skill.utils.structs.pose import Pose


def _let_introspection_pass() -> None:
    """trimesh (ManiSkill's) puts a placeholder in place of each missing optional dependency that
    raises that ImportError on ANY attribute, so ``hasattr(placeholder, "__dict__")`` raises
    instead of answering: code that walks every module's globals breaks on it (vLLM does so when an
    engine starts in the same process: the single-process topology, tests). Asking a placeholder
    for its ``__dict__`` now raises AttributeError (hasattr: False); every real use still raises
    the ImportError."""
    from trimesh import exceptions

    wrapper = exceptions.ExceptionWrapper
    if getattr(wrapper, "_introspectable", False):
        return
    original = wrapper.__getattribute__

    def __getattribute__(self, name):
        if name == "__dict__":
            raise AttributeError(name)
        return original(self, name)

    wrapper.__getattribute__ = __getattribute__
    wrapper._introspectable = True


_let_introspection_pass()

HALF = 0.02
"""A cube's half size (m)."""
MIN_GAP = 2 * float(np.hypot(HALF, HALF)) + 0.01
"""Least distance between two cubes' centres at reset (m): their diagonals plus 1 cm."""
WORKSPACE_MM = {"x": (-100, 150), "y": (-200, 200), "z": (10, 200)}
"""Where the arm is told to act (mm, world frame): the prompt states it; actions outside it are
invalid."""
COLORS = {"red": (1, 0, 0, 1), "green": (0, 1, 0, 1), "purple": (1, 0, 1, 1)}
CAMERA_EYE, CAMERA_TARGET = (1.0, 0.0, 0.6), (-0.2, 0.0, 0.2)
"""The image's camera (VAGEN's): in front of the table, facing the robot (toward -x)."""


class TableTask(BaseEnv):
    """A Panda arm, the table, and ``CUBES`` drawn in ``REGIONS``; subclasses say what success is."""

    SUPPORTED_ROBOTS = ["panda"]
    CUBES: tuple[str, ...] = ()
    REGIONS: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {}
    """cube -> ((x low, x high), (y low, y high)) of its centre at reset (m)."""
    INSTRUCTION = ""
    _contacts_stale = True

    def __init__(self, *args, robot_uids="panda", robot_init_qpos_noise=0.02, image_size=300,
                 **kwargs):
        self.robot_init_qpos_noise = robot_init_qpos_noise
        self.image_size = image_size
        super().__init__(*args, robot_uids=robot_uids, **kwargs)

    @property
    def _default_sensor_configs(self):
        return []  # observations are state: no sensor is rendered on a step

    @property
    def _default_human_render_camera_configs(self):
        pose = sapien_utils.look_at(eye=list(CAMERA_EYE), target=list(CAMERA_TARGET))
        return CameraConfig("render_camera", pose, self.image_size, self.image_size, 1.0,
                            0.01, 100)

    def _load_agent(self, options: dict):
        super()._load_agent(options, sapien.Pose(p=[-0.615, 0, 0]))

    def _load_scene(self, options: dict):
        self.table_scene = TableSceneBuilder(self, robot_init_qpos_noise=self.robot_init_qpos_noise)
        self.table_scene.build()
        self.cubes = {
            name: actors.build_cube(self.scene, half_size=HALF, color=list(COLORS[name]),
                                    name=f"{name}_cube",
                                    initial_pose=sapien.Pose(p=[0.5 + i, 0, HALF]))
            for i, name in enumerate(self.CUBES)
        }
        self._load_goals()

    def _load_goals(self) -> None:
        pass

    def _initialize_episode(self, env_idx: torch.Tensor, options: dict):
        self.table_scene.initialize(env_idx)
        # Contacts are those of the last physics step, the previous episode's, until this
        # episode's first step: a cube held then would count as held now (see ``held``).
        self._contacts_stale = True
        rng = self._episode_rng
        placed: list[np.ndarray] = []
        for name in self.CUBES:
            (x0, x1), (y0, y1) = self.REGIONS[name]
            for _ in range(1000):
                xy = np.array([rng.uniform(x0, x1), rng.uniform(y0, y1)])
                if all(np.linalg.norm(xy - other) >= MIN_GAP for other in placed):
                    break
            else:  # the regions are far larger than the cubes: this does not happen
                raise RuntimeError(f"no room for the {name} cube in {self.REGIONS[name]}")
            placed.append(xy)
            yaw = rng.uniform(0, 2 * np.pi)
            q = [np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)]
            p = torch.tensor([[xy[0], xy[1], HALF]], dtype=torch.float32)
            self.cubes[name].set_pose(Pose.create_from_pq(p=p, q=torch.tensor([q])))

    def positions(self) -> dict[str, tuple[float, float, float]]:
        """Each object's centre (m, world frame), cubes first, in ``CUBES`` order."""
        return {f"{name}_cube": tuple(float(v) for v in cube.pose.p[0])
                for name, cube in self.cubes.items()} | self._goal_positions()

    def _goal_positions(self) -> dict[str, tuple[float, float, float]]:
        return {}

    def step(self, action):
        self._contacts_stale = False
        return super().step(action)

    def held(self, name: str) -> torch.Tensor:
        """The gripper holds the ``name`` cube; never before an episode's first step (nothing is
        held at reset, and the contacts read then are the previous episode's)."""
        if self._contacts_stale:
            return torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        return self.agent.is_grasping(self.cubes[name])

    def _on(self, upper: str, lower: str) -> torch.Tensor:
        """``upper`` rests on ``lower``: centres within 2 cm in xy, ``upper`` over 2 cm higher."""
        a, b = self.cubes[upper].pose.p, self.cubes[lower].pose.p
        return (torch.linalg.norm(a[:, :2] - b[:, :2], dim=1) < 0.02) & (a[:, 2] > b[:, 2] + 0.02)

    def _get_obs_extra(self, info: dict):
        return {"tcp_pose": self.agent.tcp.pose.raw_pose}

    def compute_dense_reward(self, obs, action, info):
        return torch.zeros(self.num_envs)  # the skill layer rewards by stages

    def compute_normalized_dense_reward(self, obs, action, info):
        return self.compute_dense_reward(obs, action, info)


@register_env("PlaceTwoCube-v0", max_episode_steps=100_000)
class PlaceTwoCube(TableTask):
    CUBES = ("red", "green")
    REGIONS = {"red": ((-0.10, 0.0), (-0.10, 0.10)), "green": ((-0.10, 0.0), (-0.10, 0.10))}
    INSTRUCTION = "Place the red cube on the left target and the green cube on the right target."
    TARGETS = {"left_target": (0.08, -0.10, 0.0), "right_target": (0.08, 0.10, 0.0)}
    TARGET_RADIUS = 0.05

    def _load_goals(self) -> None:
        for name, p in self.TARGETS.items():
            actors.build_red_white_target(
                self.scene, radius=self.TARGET_RADIUS, thickness=1e-5, name=name,
                body_type="kinematic", add_collision=False,
                initial_pose=sapien.Pose(p=list(p), q=[0.7071068, 0, 0.7071068, 0]))

    def _goal_positions(self):
        return dict(self.TARGETS)

    def _in(self, cube: str, target: str) -> torch.Tensor:
        xy = torch.tensor(self.TARGETS[target][:2])
        return torch.linalg.norm(self.cubes[cube].pose.p[:, :2] - xy, dim=1) <= self.TARGET_RADIUS

    def evaluate(self):
        red_held, green_held = self.held("red"), self.held("green")
        red_in, green_in = self._in("red", "left_target"), self._in("green", "right_target")
        red_placed = red_in & ~red_held
        success = red_placed & green_in & ~green_held
        return {"success": success,
                "stages": torch.stack([red_held, red_placed, red_placed & green_held], dim=1)}


@register_env("StackThreeCube-v0", max_episode_steps=100_000)
class StackThreeCube(TableTask):
    CUBES = ("red", "green", "purple")
    REGIONS = dict.fromkeys(CUBES, ((-0.10, 0.15), (-0.20, 0.20)))
    INSTRUCTION = ("Stack the red cube on top of the green cube, then the purple cube on top of "
                   "the red cube.")

    def evaluate(self):
        red_held, purple_held = self.held("red"), self.held("purple")
        red_on = self._on("red", "green") & ~red_held
        success = red_on & self._on("purple", "red") & ~purple_held
        return {"success": success,
                "stages": torch.stack([red_held, red_on, red_on & purple_held], dim=1)}


@register_env("AlignTwoCube-v0", max_episode_steps=100_000)
class AlignTwoCube(TableTask):
    CUBES = ("red", "green")
    REGIONS = {"red": ((0.10, 0.15), (-0.20, 0.10)), "green": ((0.10, 0.15), (0.10, 0.20))}
    INSTRUCTION = "Align both cubes on the line x = 0: each cube's x within 10 mm of 0."

    def _aligned(self, name: str) -> torch.Tensor:
        p = self.cubes[name].pose.p
        return (p[:, 0].abs() <= 0.01) & (p[:, 2] <= 0.05)

    def evaluate(self):
        red, green = self._aligned("red"), self._aligned("green")
        return {"success": red & green, "stages": torch.stack([red, green], dim=1)}


TASKS = {"PlaceTwoCube": "PlaceTwoCube-v0", "StackThreeCube": "StackThreeCube-v0",
         "AlignTwoCube": "AlignTwoCube-v0"}
"""Task name -> its ManiSkill (and gymnasium) id."""
