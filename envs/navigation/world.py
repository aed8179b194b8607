"""The Navigation env's 3D world: one MiniWorld room of distinct objects, a first-person camera.

Used by envs/navigation/game.py only. MiniWorld renders through pyglet; on a machine with no
display pyglet must be told to go headless (EGL, Mesa's llvmpipe on a CPU) before MiniWorld is
imported, which this module does first. One ``NavWorld`` holds one OpenGL context.

Invariants:
- ``generate(seed)`` draws the whole layout from ``seed`` alone: the room's size and textures, 3
  to 5 objects of distinct names, the agent's start on a pose facing one of the four walls.
- The world holds no rules: the game (envs/navigation/game.py) moves the agent by exact steps
  and asks ``free`` whether it fits; ``place`` puts the camera where the game says.
- Geometry is in metres on the floor plane (x, z); a bearing is in degrees, positive to the
  agent's left (MiniWorld turns left by adding to ``dir``).
"""

from __future__ import annotations

import contextlib
import io
import math
from dataclasses import dataclass

import numpy as np
import pyglet
from PIL import Image

pyglet.options["headless"] = True  # before miniworld: otherwise pyglet asks for an X display

from miniworld.entity import COLOR_NAMES, Ball, Box, Key, MeshEnt  # noqa: E402
from miniworld.miniworld import MiniWorldEnv  # noqa: E402
from miniworld.opengl import Texture  # noqa: E402
from pyglet import gl  # noqa: E402

FOV_DEG = 90
"""The camera's field of view, both ways (square pictures): four turns see the whole room."""
ROOM_M = (5.0, 8.0)
OBJECTS = (3, 5)
WALLS = ("brick_wall", "concrete", "drywall", "stucco", "wood_planks", "cinder_blocks", "marble")
FLOORS = ("floor_tiles_bw", "concrete_tiles", "wood", "asphalt", "grass")
# name -> (MiniWorld mesh, height in metres); coloured balls, boxes and keys are added below.
MESHES = {"barrel": ("barrel", 1.0), "traffic cone": ("cone", 0.7), "rubber duck": ("duckie", 0.5),
          "medkit": ("medkit", 0.4), "office chair": ("office_chair", 1.0),
          "potion": ("potion", 0.5), "desk": ("office_desk", 0.9)}
COLOURED = ("ball", "box", "key")


@dataclass(frozen=True)
class Thing:
    """One object of the room as the game sees it."""

    name: str
    pos: tuple[float, float]
    """(x, z) of its centre on the floor."""
    radius: float
    height: float


def catalogue() -> tuple[str, ...]:
    """Every object name a room may hold: the meshes and the coloured balls, boxes and keys."""
    return tuple(MESHES) + tuple(f"{c} {kind}" for kind in COLOURED for c in COLOR_NAMES)


def _entity(name: str):
    if name in MESHES:
        mesh, height = MESHES[name]
        return MeshEnt(mesh_name=mesh, height=height, static=True)
    colour, kind = name.split(" ")
    if kind == "ball":
        return Ball(color=colour, size=0.6)
    if kind == "box":
        return Box(color=colour, size=0.7)
    return Key(color=colour)


def rgba_rows(path: str) -> bytes:
    """The PNG at ``path`` as RGBA bytes, bottom row first (OpenGL's order), as pyglet's
    ``get_data("RGBA", ...)`` gives them."""
    with Image.open(path) as file:
        return file.convert("RGBA").transpose(Image.Transpose.FLIP_TOP_BOTTOM).tobytes()


def _load_texture(cls, path: str):
    """MiniWorld's ``Texture.load`` (the OpenGL texture of a PNG, mipmapped), the pixels decoded by
    Pillow: pyglet converts them to RGBA with a regular expression, slowly, which every new
    process paid for each of the room's textures and meshes; Pillow's decoder is far faster."""
    with Image.open(path) as file:
        width, height = file.size
    tex = pyglet.image.Texture.create(width, height)
    gl.glEnable(tex.target)
    gl.glBindTexture(tex.target, tex.id)
    gl.glTexImage2D(gl.GL_TEXTURE_2D, 0, gl.GL_RGB, width, height, 0, gl.GL_RGBA,
                    gl.GL_UNSIGNED_BYTE, rgba_rows(path))
    gl.glHint(gl.GL_GENERATE_MIPMAP_HINT, gl.GL_NICEST)
    gl.glGenerateMipmap(gl.GL_TEXTURE_2D)
    gl.glTexParameteri(gl.GL_TEXTURE_2D, gl.GL_TEXTURE_MAG_FILTER, gl.GL_LINEAR)
    gl.glTexParameteri(gl.GL_TEXTURE_2D, gl.GL_TEXTURE_MIN_FILTER, gl.GL_LINEAR_MIPMAP_LINEAR)
    gl.glBindTexture(gl.GL_TEXTURE_2D, 0)
    return tex


Texture.load = classmethod(_load_texture)  # also what ObjMesh loads its meshes' textures with


class NavWorld(MiniWorldEnv):
    """A MiniWorld room: ``generate`` lays it out, ``free`` says where the agent fits, ``place``
    puts the camera and ``picture`` takes what it sees."""

    def __init__(self, image_size: int) -> None:
        with contextlib.redirect_stdout(io.StringIO()):  # its frame buffers print MSAA fallbacks
            super().__init__(max_episode_steps=10**9, obs_width=image_size, obs_height=image_size,
                             window_width=64, window_height=64, domain_rand=False)
        # Every texture and mesh now, once per process (MiniWorld caches them), so no reset pays
        # for a first load.
        for texture in WALLS + FLOORS:
            Texture.get(texture)
        for name in catalogue():
            _entity(name)

    # MiniWorldEnv.reset calls this with self.np_random seeded by reset(seed=...).
    def _gen_world(self) -> None:
        rng = self.np_random
        width, depth = (float(rng.uniform(*ROOM_M)) for _ in range(2))
        self.add_rect_room(min_x=0, max_x=width, min_z=0, max_z=depth,
                           wall_tex=str(rng.choice(WALLS)), floor_tex=str(rng.choice(FLOORS)),
                           no_ceiling=True)
        names = catalogue()
        count = int(rng.integers(OBJECTS[0], OBJECTS[1] + 1))
        picked: list[str] = []
        for i in rng.permutation(len(names)):  # distinct names, and one coloured kind at most once
            name = names[i]
            if name not in picked and name.split(" ")[-1] not in [p.split(" ")[-1] for p in picked]:
                picked.append(name)
            if len(picked) == count:
                break
        self.things_entities = [self.place_entity(_entity(name)) for name in picked]
        self.thing_names = picked
        self.agent.radius = 0.4
        self.place_agent(dir=float(rng.integers(4)) * math.pi / 2)

    def generate(self, seed: int) -> None:
        """Lay the room of ``seed`` out (see the module docstring). The camera is set after the
        reset, whose parameter sampling sets it to MiniWorld's defaults."""
        self.reset(seed=seed)
        self.agent.cam_fov_y, self.agent.cam_pitch, self.agent.cam_fwd_disp = FOV_DEG, 0.0, 0.0

    def things(self) -> list[Thing]:
        return [Thing(name, (float(e.pos[0]), float(e.pos[2])), float(e.radius), float(e.height))
                for name, e in zip(self.thing_names, self.things_entities)]

    def free(self, x: float, z: float) -> bool:
        """The agent fits at (x, z): no wall, no object in its circle."""
        return not self.intersect(self.agent, np.array([x, 0.0, z]), self.agent.radius)

    def start_pose(self) -> tuple[float, float, int]:
        """Where ``generate`` put the agent: (x, z, heading in whole turns of 90 degrees, 0-3)."""
        return (float(self.agent.pos[0]), float(self.agent.pos[2]),
                round(math.degrees(self.agent.dir) / 90) % 4)

    def place(self, x: float, z: float, heading: int, pitch: float) -> None:
        """Put the camera at (x, z), facing ``heading`` x 90 degrees, tilted ``pitch`` (up > 0)."""
        self.agent.pos = np.array([x, 0.0, z])
        self.agent.dir = heading * math.pi / 2
        self.agent.cam_pitch = float(pitch)

    def picture(self) -> np.ndarray:
        """The agent's first-person RGB picture, ``image_size`` a side."""
        if NavWorld._static_owner is not self:  # another world's room is in the display list
            self._render_static()
        return np.ascontiguousarray(self.render_obs())

    # MiniWorld compiles the room into OpenGL display list 1, whatever the world: two worlds in
    # one process (an env worker holds several) would draw each other's rooms. So the list is
    # compiled again, in this world's context, whenever another world compiled it last.
    _static_owner: NavWorld | None = None

    def _render_static(self) -> None:
        self.shadow_window.switch_to()
        super()._render_static()
        NavWorld._static_owner = self

    def close(self) -> None:
        if NavWorld._static_owner is self:
            NavWorld._static_owner = None
        super().close()
        self.shadow_window.close()
