"""An OpenEnv environment of the tests' own whose observation carries a picture: the answer's
colour ("red", "green") paints a 6 x 4 canvas; green ends the episode. ``Unannotated`` is the
same environment with its ``step`` unannotated, so the action class must be named."""

from __future__ import annotations

import numpy as np
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0)}


class Paint(Action):
    colour: str


class Canvas(Observation):
    canvas: list
    note: str = ""


class Painter(Environment):
    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, **kw) -> Canvas:
        return Canvas(canvas=np.zeros((4, 6, 3), np.uint8).tolist(), note="paint it")

    def step(self, action: Paint) -> Canvas:  # type: ignore[override]
        rgb = COLOURS.get(action.colour, (0, 0, 255))
        return Canvas(canvas=np.full((4, 6, 3), rgb, np.uint8).tolist(), note=action.colour,
                      reward=1.0, done=action.colour == "green")

    @property
    def state(self) -> State:
        return self._state


class Unannotated(Painter):
    def step(self, action):  # type: ignore[no-untyped-def]
        return super().step(action)
