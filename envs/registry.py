"""The env registry: build a built-in env by name, with its YAML defaults, through gymnasium.

Called by the env worker (envs/worker.py: ``make_env`` builds each env from its ``EnvFactory``),
the env worker pool (envs/pool.py) and launch code; ``make`` is re-exported as ``envs.make``.
Every env is registered with gymnasium under ``IDS[name]`` (``vagen/FrozenLake-v0``, ...), so
``gymnasium.make("vagen/FrozenLake-v0", **config)`` builds it too, once ``envs`` is imported.
Invariants:
- ``make(name, **resolve_config(name, overrides))`` builds the env of ``configs/env/<name>.yaml``
  with ``overrides`` applied; every key is a keyword argument of the env's ``make_env``.
- ``gymnasium.make`` adds no wrapper (registered without the order enforcer and the passive
  checker; tests run gymnasium's ``check_env`` on every env instead), so the env's own methods
  (``system_prompt``, ``state_text``, ``solve``) are reachable on what ``make`` returns.
- An env's module is imported only when it is made or its config checked, so importing ``envs``
  stays light; the simulators come with the envs' construction, not their modules.
- What a config asks of an env is answered without building one: ``check_config`` binds its
  keys to the factory's signature, ``has_solver`` reads ``_SOLVERS``, ``images_per_observation``
  reads ``_IMAGES``; the values are the env's to judge when it is built.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import yaml

from envs.protocol import Env

# name -> "module:factory"; the factory takes the YAML's keys as keyword arguments.
_FACTORIES = {
    "frozenlake": "envs.frozenlake:make_env",
    "sokoban": "envs.sokoban:make_env",
    "action_words": "envs.action_words:make_env",
    "gym": "envs.gym_game:make_env",  # any gymnasium env: configs/env/gym.yaml
    "primitive_skill": "envs.primitive_skill.game:make_env",  # ManiSkill 3
    "svg": "envs.svg.env:make_env",  # SVG reconstruction
    "navigation": "envs.navigation.game:make_env",  # first person, MiniWorld
    "textarena": "envs.textarena_game:make_env",  # TextArena's single-player games
    "reasoning_gym": "envs.reasoning_task:make_env",  # reasoning-gym's procedural tasks
    "openenv": "envs.openenv_env:make_env",  # OpenEnv environments, in-process or served
}
NAMES: tuple[str, ...] = tuple(_FACTORIES)
IDS: dict[str, str] = {"frozenlake": "vagen/FrozenLake-v0", "sokoban": "vagen/Sokoban-v0",
                       "action_words": "vagen/ActionWords-v0", "gym": "vagen/GymText-v0",
                       "primitive_skill": "vagen/PrimitiveSkill-v0", "svg": "vagen/SVG-v0",
                       "navigation": "vagen/Navigation-v0", "textarena": "vagen/TextArena-v0",
                       "reasoning_gym": "vagen/ReasoningGym-v0", "openenv": "vagen/OpenEnv-v0"}
"""Each env's gymnasium id."""
for _name, _id in IDS.items():
    if _id not in gym.registry:
        gym.register(_id, entry_point=_FACTORIES[_name], order_enforce=False,
                     disable_env_checker=True)
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "env"
_IMAGES = {"svg": 2}  # the target, and beside it the last drawing
_SOLVERS: dict[str, bool | str] = {
    "frozenlake": True, "sokoban": True, "primitive_skill": True, "navigation": True,  # the game's solve
    "svg": True,  # the target's own SVG
    "action_words": False,  # nothing to solve: any answer scores by its words
    "gym": "envs.gym_game:has_solver",  # the gymnasium env's: a function of the config
    "reasoning_gym": "envs.reasoning_task:has_solver",  # the task's reference answers, where they score
    "textarena": False, "openenv": False,  # no solvers or reference answers in the source
}
"""Each env's ``has_solver`` as its config decides it, so it is known without building the env:
a bool, or a "module:function" of the config."""


def images_per_observation(name: str) -> int:
    """The most images one observation of env ``name`` shows (1 unless it says more): the
    inference engine is sized for max_turns times this many images a prompt."""
    return _IMAGES.get(name, 1)


def has_solver(name: str, config: Mapping[str, Any]) -> bool:
    """Whether env ``name`` built with ``config`` can solve its episodes (its ``has_solver``:
    the warm start's demonstrations need it), building no env. An importable "module:callable"
    has none here: demonstrations are made of registry envs only (``make``)."""
    if ":" in name:
        return False
    _check_name(name)
    solver = _SOLVERS[name]
    return solver if isinstance(solver, bool) else bool(load(solver)(config))


def factory_of(name: str) -> Callable[..., Env]:
    """What builds env ``name`` (a registry name or an importable "module:callable") from its
    config's keywords: the callable itself, its module imported, no env built."""
    if ":" not in name:
        _check_name(name)
        name = _FACTORIES[name]
    return load(name)


def load(spec: str, name: str = "a factory") -> Any:
    """The class or function that ``spec`` ("module:Class" or "module:function") names, its
    module imported; ValueError naming the setting (``name``) for a spec without one."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"{name} must be module:Class (or module:function), got {spec!r}")
    return getattr(importlib.import_module(module), attr)


def _check_name(name: str) -> None:
    if name not in _FACTORIES:
        raise ValueError(f"unknown env {name!r}; expected one of {NAMES}")


def make(name: str, *, step_delay_s: float = 0.0, **config: Any) -> Env:
    """A new env ``name`` built with ``config`` (its factory's defaults for missing keys).

    ``step_delay_s`` > 0 makes every ``reset`` and ``step`` take that much longer inside the env,
    holding its worker as a slow local simulator does (a remote simulator's latency, which holds
    no worker, is the actors' ``env_latency_s``).
    Raises ValueError for an unknown name or a bad setting, TypeError for an unknown key.
    """
    _check_name(name)
    if step_delay_s < 0:
        raise ValueError(f"step_delay_s must be >= 0, got {step_delay_s}")
    # Through a spec holding the settings: gymnasium.make's own parameters (``id``...) would
    # swallow an env's keys of the same name (envs/gym_game.py has an ``id``).
    env = gym.make(dataclasses.replace(gym.spec(IDS[name]), kwargs=dict(config)))
    return DelayedEnv(env, step_delay_s) if step_delay_s else env


EnvFactory = tuple[str, dict]
"""(name, config): a registry name for ``make(name, **config)``, or an importable
"module:callable" called as ``callable(**config)``. Plain data, so it crosses to the worker."""


def make_env(factory: EnvFactory) -> Env:
    """Build one env from a factory spec (the env worker builds each of its envs with it)."""
    name, config = factory
    if ":" in name:
        return load(name)(**config)
    return make(name, **config)


class DelayedEnv(gym.Wrapper):
    """``env`` whose reset and step each sleep ``delay_s`` first (see ``make``)."""

    def __init__(self, env: Env, delay_s: float) -> None:
        super().__init__(env)
        self.delay_s = delay_s

    def system_prompt(self) -> str:
        return self.env.system_prompt()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        time.sleep(self.delay_s)
        return self.env.reset(seed=seed, options=options)

    def step(self, action: str):
        time.sleep(self.delay_s)
        return self.env.step(action)

    def state_text(self) -> str:
        return self.env.state_text()


def check_config(name: str, config: Mapping[str, Any]) -> None:
    """Raise ValueError naming the env and the key if its factory would not take ``config``'s
    keys (one it does not take, one it needs that is missing): binds them to the factory's
    signature, building no env, so a misspelt key fails when the run is configured, without
    starting a simulator. The values are the env's to judge when it is built: an
    actor's env pool whose envs do not build fails to start with the env's own message
    (envs/pool.py's EnvPoolError)."""
    try:
        inspect.signature(factory_of(name)).bind(**config)
    except TypeError as e:
        raise ValueError(f"env {name!r}: {e}") from None


def load_config(name: str) -> dict[str, Any]:
    """The settings of ``configs/env/<name>.yaml`` as a plain dict."""
    _check_name(name)
    with open(CONFIG_DIR / f"{name}.yaml", encoding="utf-8") as f:
        config = yaml.safe_load(f) or {}
    if not isinstance(config, dict):
        kind = type(config).__name__
        raise ValueError(f"configs/env/{name}.yaml must hold a mapping, not a {kind}")
    return config


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Command-line env settings, ``key=value`` each with a YAML value, as a dict."""
    pairs = [item.split("=", 1) for item in items]
    if bad := [item for item, pair in zip(items, pairs) if len(pair) != 2]:
        raise ValueError(f"env settings are key=value, got {bad}")
    return {key: yaml.safe_load(value) for key, value in pairs}


def resolve_config(name: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Env ``name``'s keyword arguments: its YAML's under ``overrides``. An importable
    "module:callable" has no YAML: ``overrides`` alone."""
    return dict(overrides) if ":" in name else {**load_config(name), **overrides}
