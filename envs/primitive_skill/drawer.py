"""PutAppleInDrawer, VAGEN's fourth PrimitiveSkill task: put the apple in the open drawer, then
push the drawer in.

Imported by envs/primitive_skill/game.py with the other tasks (envs/primitive_skill/tasks.py,
whose ``TableTask`` it extends): the same Panda arm at x = -0.615 m on ManiSkill's table (top at
z = 0), with a cabinet standing on the table and an apple beside it. Where the two come from is
``assets``:

- ``"builtin"`` (the default, offline): a cabinet built here from boxes (a body open at the front
  and a drawer, a tray on a prismatic joint) and a red ball of 3 cm radius as the apple.
- ``"maniskill"``: VAGEN's, the YCB apple (``ycb:013_apple``) and PartNet-Mobility cabinet 1016,
  which ManiSkill downloads (``DOWNLOADS``) into ``~/.maniskill/data``. Without them the task
  refuses to build, naming the commands.

Either way the drawer is read from the articulation (``_read_drawer``: its link's collision box,
and the way the link moves when the joint opens), and the cabinet is turned and placed so that the
closed drawer's front stands at y = ``FRONT_Y`` and the drawer opens toward +y: the same code
serves both pairs.

VAGEN's task, as its stages: the apple held (stage 0); the apple in the drawer and let go
(stage 1); success, the apple in the drawer, let go, and the drawer in (open by at most
``CLOSED`` m). The drawer starts open by ``OPEN`` of its travel; the apple is drawn on the table
in ``APPLE_REGION``, right of the open drawer.

Invariants: same seed, same episode; ``positions()`` names the apple's centre, the middle of the
drawer floor out of the cabinet (``drawer``: where the apple goes) and the middle of the drawer's
front (``drawer_handle``: where a push starts); pushing the handle toward -y by ``open_by()``
closes the drawer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sapien
import torch
from mani_skill.utils.building import actors
from mani_skill.utils.registration import register_env
from mani_skill.utils.structs.pose import Pose

from envs.primitive_skill.tasks import TableTask

APPLE_RADIUS = 0.03
"""The built-in apple: a ball of this radius (m)."""
APPLE_REGION = ((-0.08, 0.08), (0.11, 0.19))
"""Where the apple's centre is drawn at reset: (x low, x high), (y low, y high) (m), to the right
of the open drawer."""
FRONT_Y = -0.07
"""Where the closed drawer's front stands (m): the cabinet is to the left of it, and the drawer
opens to the right (+y), across the table in front of the arm (VAGEN's cabinet stands at the arm's
side and opens across too); the camera sees it from the side."""
OPEN = 0.6
"""The drawer's opening at reset, a share of its travel (VAGEN's)."""
CLOSED = 0.02
"""The drawer counts as closed when open by at most this (m)."""
FLOOR = 0.01
"""How far above the underside of the drawer its floor is taken to be (m)."""
ASSETS = ("builtin", "maniskill")
DOWNLOADS = ("python -m mani_skill.utils.download_asset ycb",
             "python -m mani_skill.utils.download_asset partnet_mobility_cabinet")
YCB_APPLE, PARTNET_CABINET = "013_apple", "1016"


@dataclass(frozen=True)
class Cabinet:
    """The built-in cabinet's sizes (m), in its own frame (x from its front inward, y across, z up
    from the table): a body open at the front and a tray that slides out of it by up to
    ``travel``."""

    depth: float = 0.20
    width: float = 0.20
    height: float = 0.12
    wall: float = 0.01
    tray_height: float = 0.06
    travel: float = 0.18
    clearance: float = 0.004
    """Between the tray and the body, so that they never touch."""


@dataclass(frozen=True)
class DrawerShape:
    """What the task knows of a drawer, read from its articulation (``_read_drawer``): the corners
    of the drawer link's collision box in the link's own frame (8 x 3), and its joint's travel
    (``closed`` to ``fully_open``, in the joint's units: m)."""

    corners: np.ndarray
    closed: float
    fully_open: float


class PutAppleInDrawer(TableTask):
    INSTRUCTION = ("Put the apple in the drawer, then close the drawer by pushing its handle "
                   f"until the drawer is in (its handle at y = {round(FRONT_Y * 1000)}).")

    def __init__(self, *args, assets: str = "builtin", **kwargs):
        if assets not in ASSETS:
            raise ValueError(f"assets must be one of {ASSETS}, got {assets!r}")
        if assets == "maniskill":
            _check_downloaded()
        self.assets = assets
        self.shape: DrawerShape | None = None
        super().__init__(*args, **kwargs)

    # -- the scene ------------------------------------------------------------------------------
    def _load_scene(self, options: dict):
        super()._load_scene(options)
        away = sapien.Pose(p=[0, 0.6, 0])  # until the first reset places it
        if self.assets == "builtin":
            self.apple = actors.build_sphere(self.scene, radius=APPLE_RADIUS,
                                             color=[0.8, 0.1, 0.1, 1], name="apple",
                                             initial_pose=away)
            builder = _cabinet_builder(self.scene, Cabinet())
        else:
            from mani_skill.utils.building import articulations

            apple = actors.get_actor_builder(self.scene, id=f"ycb:{YCB_APPLE}")
            apple.initial_pose = away
            self.apple = apple.build_dynamic(name="apple")
            builder = articulations.get_articulation_builder(
                self.scene, f"partnet-mobility:{PARTNET_CABINET}")
        builder.initial_pose = sapien.Pose(p=[0, -0.6, 0])
        self.cabinet = builder.build(name="cabinet", fix_root_link=True)
        prismatic = [j for j in self.cabinet.active_joints if j.type[0] == "prismatic"]
        if not prismatic:
            raise ValueError("the cabinet has no drawer: no prismatic joint")
        self.joint = prismatic[0]

    def _initialize_episode(self, env_idx: torch.Tensor, options: dict):
        super()._initialize_episode(env_idx, options)
        if self.shape is None:
            self.shape, root = _read_drawer(self.cabinet, self.joint)
            self.cabinet.set_root_pose(root)
            bounds = self.apple.get_first_collision_mesh(to_world_frame=False).bounds
            self.apple_half_height = float(-bounds[0, 2])
            """How far the apple's centre is above its lowest point (m)."""
        rng = self._episode_rng
        xy = [rng.uniform(*APPLE_REGION[0]), rng.uniform(*APPLE_REGION[1])]
        self.apple.set_pose(Pose.create_from_pq(p=torch.tensor([[*xy, self.apple_half_height]])))
        self.apple.set_linear_velocity(torch.zeros(1, 3))
        self.apple.set_angular_velocity(torch.zeros(1, 3))
        s = self.shape
        self._set_open(s.closed + OPEN * (s.fully_open - s.closed))

    def _set_open(self, q: float) -> None:
        qpos = self.cabinet.get_qpos().clone()
        qpos[0, int(self.joint.active_index[0])] = q
        self.cabinet.set_qpos(qpos)
        self.cabinet.set_qvel(torch.zeros_like(qpos))

    # -- what the skill layer reads -------------------------------------------------------------
    def open_by(self) -> float:
        """How far the drawer is out (m)."""
        return float(self.cabinet.get_qpos()[0, int(self.joint.active_index[0])]) - self.shape.closed

    def _box(self) -> tuple[np.ndarray, np.ndarray]:
        """The drawer's box now, world frame (low corner, high corner): its front is the high y."""
        m = self.joint.child_link.pose.to_transformation_matrix()[0].numpy()
        corners = self.shape.corners @ m[:3, :3].T + m[:3, 3]
        return corners.min(axis=0), corners.max(axis=0)

    def positions(self) -> dict[str, tuple[float, float, float]]:
        """The apple's centre; the middle of the drawer floor's stretch that is out of the
        cabinet (``drawer``); the middle of the drawer's front (``drawer_handle``)."""
        low, high = self._box()
        x, front = (low[0] + high[0]) / 2, high[1]
        out = max(self.open_by(), 2 * APPLE_RADIUS)
        return {"apple": tuple(float(v) for v in self.apple.pose.p[0]),
                "drawer": (float(x), float(front - out / 2), float(low[2] + FLOOR)),
                "drawer_handle": (float(x), float(front), float((low[2] + high[2]) / 2))}

    def grasp_yaw(self, p: np.ndarray) -> float:
        """Every skill's yaw: the fingers close along x, so the hand's width runs along x, clear
        of the cabinet's top when the hand goes down into the drawer or pushes it in."""
        return np.pi / 2

    def push_yaw(self, p1: np.ndarray, p2: np.ndarray) -> float:
        return self.grasp_yaw(p1)

    def expert(self, pos: dict[str, tuple[int, int, int]]) -> list[tuple[str, tuple]] | None:
        """VAGEN's strategy from now, as (skill, its points in mm): the apple into the open
        drawer (dropped from 5 mm above its resting height), then the handle pushed from 25 mm
        outside it to 10 mm short of closed. None once the drawer is too far in to take the
        apple (a push only moves it in)."""
        plan: list[tuple[str, tuple]] = []
        opened = round(self.open_by() * 1000)
        if not bool(self._in_drawer()[0]) or bool(self.held()[0]):
            if opened < 2000 * APPLE_RADIUS:
                return None
            if not bool(self.held()[0]):
                plan.append(("pick", pos["apple"]))
            x, y, z = pos["drawer"]
            plan.append(("place", (x, y, z + round(self.apple_half_height * 1000) + 5)))
        if opened > CLOSED * 1000:
            x, y, z = pos["drawer_handle"]
            plan.append(("push", (x, y + 25, z, x, y - opened + 10, z)))
        return plan

    def held(self, name: str = "apple") -> torch.Tensor:
        if self._contacts_stale:
            return torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        return self.agent.is_grasping(self.apple)

    def _in_drawer(self) -> torch.Tensor:
        """The apple's centre is within the drawer's box, 15 mm short of its sides, and above
        its underside, below its top by less than an apple."""
        low, high = self._box()
        p = self.apple.pose.p[0].numpy()
        inside = bool(np.all(p[:2] > low[:2] + 0.015) and np.all(p[:2] < high[:2] - 0.015)
                      and low[2] < p[2] < high[2] + APPLE_RADIUS)
        return torch.tensor([inside])

    def evaluate(self):
        held = self.held()
        inside = self._in_drawer() & ~held
        closed = torch.tensor([self.open_by() <= CLOSED])
        return {"success": inside & closed, "stages": torch.stack([held, inside], dim=1)}


def _cabinet_builder(scene, c: Cabinet):
    """The built-in cabinet: a fixed body (top, sides, back) and a tray, its drawer link, on a
    prismatic joint whose q is how far the tray is out."""
    builder = scene.create_articulation_builder()
    body = builder.create_link_builder()
    body.set_name("cabinet")
    w, d, h, t = c.width / 2, c.depth, c.height, c.wall
    for pose, half in (  # in the body's frame: its front at x = 0, the table at z = 0
        ((d / 2, 0, h - t / 2), (d / 2, w, t / 2)),                 # top
        ((d / 2, -w + t / 2, h / 2), (d / 2, t / 2, h / 2)),        # sides
        ((d / 2, w - t / 2, h / 2), (d / 2, t / 2, h / 2)),
        ((d - t / 2, 0, h / 2), (t / 2, w, h / 2)),                 # back
    ):
        body.add_box_collision(sapien.Pose(p=pose), half_size=half)
        body.add_box_visual(sapien.Pose(p=pose), half_size=half, material=[0.55, 0.4, 0.25])
    tray = builder.create_link_builder(body)
    tray.set_name("drawer")
    tray.set_joint_name("drawer_slide")  # ManiSkill finds a joint's index by its name
    tw, tl, th, z0 = w - t - c.clearance, d - t - c.clearance, c.tray_height, c.clearance
    for pose, half in (  # in the tray's frame: its front at x = 0
        ((tl / 2, 0, z0 + t / 2), (tl / 2, tw, t / 2)),                 # floor
        ((t / 2, 0, z0 + th / 2), (t / 2, tw, th / 2)),                 # front
        ((tl - t / 2, 0, z0 + th / 2), (t / 2, tw, th / 2)),            # back
        ((tl / 2, -tw + t / 2, z0 + th / 2), (tl / 2, t / 2, th / 2)),  # sides
        ((tl / 2, tw - t / 2, z0 + th / 2), (tl / 2, t / 2, th / 2)),
    ):
        tray.add_box_collision(sapien.Pose(p=pose), half_size=half, density=200)
        tray.add_box_visual(sapien.Pose(p=pose), half_size=half, material=[0.7, 0.55, 0.35])
    turn = [0, 0, 0, 1]  # the joint's x axis is the body's -x: q > 0 slides the tray out
    tray.set_joint_properties("prismatic", limits=[[0, c.travel]], pose_in_parent=sapien.Pose(q=turn),
                              pose_in_child=sapien.Pose(q=turn), friction=0.2, damping=5.0)
    return builder


def _read_drawer(cabinet, joint) -> tuple[DrawerShape, sapien.Pose]:
    """(the drawer's shape, the cabinet's root pose that stands it on the table with the closed
    drawer's front at y = ``FRONT_Y``, opening toward +y, its middle on x = 0), for any cabinet
    whose drawer link's frame is square to the world's (the built-in one, PartNet-Mobility's): the
    drawer link's move from closed to half open is the way it opens."""
    from mani_skill.utils.geometry.trimesh_utils import get_component_meshes, merge_meshes

    i = int(joint.active_index[0])
    closed, fully_open = (float(v) for v in cabinet.get_qlimits()[0, i])
    link = joint.child_link
    cabinet.set_root_pose(sapien.Pose())

    def link_pose(q: float) -> np.ndarray:
        qpos = cabinet.get_qpos().clone()
        qpos[0, i] = q
        cabinet.set_qpos(qpos)
        return link.pose.to_transformation_matrix()[0].numpy()

    shut = link_pose(closed)
    move = link_pose(closed + 0.5 * (fully_open - closed))[:3, 3] - shut[:3, 3]
    link_pose(closed)
    box = merge_meshes(get_component_meshes(link._objs[0])).bounding_box
    corners = np.asarray(box.vertices, dtype=float)
    # Turn about z so that the drawer opens along +y, then shift: the front to y = FRONT_Y, the
    # drawer's middle to x = 0, the cabinet's lowest point onto the table.
    yaw = np.pi / 2 - np.arctan2(move[1], move[0])
    turn = np.array([[np.cos(yaw), -np.sin(yaw), 0], [np.sin(yaw), np.cos(yaw), 0], [0, 0, 1]])
    drawer = (corners @ shut[:3, :3].T + shut[:3, 3]) @ turn.T
    lowest = (cabinet.get_first_collision_mesh(to_world_frame=True).vertices @ turn.T)[:, 2].min()
    shift = [-(drawer[:, 0].min() + drawer[:, 0].max()) / 2, FRONT_Y - drawer[:, 1].max(), -lowest]
    return (DrawerShape(corners, closed, fully_open),
            sapien.Pose(p=shift, q=[np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)]))


def _check_downloaded() -> None:
    """Refuse, naming the downloads, where VAGEN's assets are not on this machine."""
    from mani_skill import ASSET_DIR

    wanted = (f"assets/mani_skill2_ycb/models/{YCB_APPLE}", f"partnet_mobility/dataset/{PARTNET_CABINET}")
    missing = [p for p in wanted if not (ASSET_DIR / p).exists()]
    if missing:
        raise FileNotFoundError(
            f"PutAppleInDrawer with assets=maniskill needs ManiSkill's YCB apple and PartNet-Mobility "
            f"cabinet {PARTNET_CABINET}, missing under {ASSET_DIR}: {', '.join(missing)}. Download them "
            f"with `{DOWNLOADS[0]}` and `{DOWNLOADS[1]}`, or use the built-in stand-ins "
            f"(env.assets=builtin).")


TASKS = {"PutAppleInDrawer": "PutAppleInDrawer-v0"}
register_env(TASKS["PutAppleInDrawer"], max_episode_steps=100_000)(PutAppleInDrawer)
