"""OpenEnv environments (``env=openenv``) through VAGEN's layer: run in the env worker, or served.

An ``OpenEnvSource`` is a ``Source`` of envs/text_env.py in one of two ways:
- ``entry_point: module:Class``: an OpenEnv ``Environment`` subclass (what ``openenv init``
  generates under ``server/``), built in the env worker with ``kwargs`` and called directly;
  importable where its package is installed, or from ``import_path`` (the folder ``openenv
  init`` ran in);
- ``url: http://host:port``: an OpenEnv server (its own ``server/app.py`` run by uvicorn, a
  container, a Space: whatever serves the OpenEnv protocol there), through OpenEnv's own
  ``GenericEnvClient`` over its WebSocket, one session per episode.

Answers become actions through a small mapping: with ``action_field: <name>`` the answer's text
is that field of the action (``{"message": <answer>}`` for the template's echo env; fixed other
fields in ``action_defaults``); with ``action_field: null`` the answer is a JSON object, the
action itself. The action is validated before the environment sees it (the action class's
pydantic model in the worker, the server's published JSON schema, ``/schema``, for a server);
an answer that is not a valid action is refused without calling the environment, told why, and
counted (``actions_valid`` False, ``metrics["invalid"]``).
Observations become the turn's text: the observation's fields other than ``done``, ``reward``
and ``metadata`` (or only ``observation_field``), a field's value alone where there is one,
``name: value`` lines otherwise; fields named in ``image_fields`` (an (H, W, 3) array or nested
lists of 0-255) are shown as pictures instead, for vision-language models. The step's reward is
the turn's env reward, times ``reward_scale``. Success is the observation's
``metadata["success"]`` where the environment reports it, else a turn reward of at least
``success_reward`` where the config sets one, else never (an environment with no notion of
success: the echo env). The episode ends when the observation says ``done``, on success, or at
the layer's ``max_turns``.
Sessions: an OpenEnv server holds a limited number of sessions (``max_concurrent_envs``, 1 in
the template) and refuses more. Each env here opens a session when its episode starts and closes
it when the episode ends, so an env pool larger than the server's limit shares its sessions
over time: a start that finds the server full retries for ``session_wait_s`` and then fails,
naming the server's refusal and the two settings that fix it (the pool's env slots, the server's
limit). Seeds are passed to the environment's ``reset(seed=...)``: determinism is the
environment's. The map of an episode is its first observation; an environment whose start never
varies (the echo env) has one map and plays with ``held_out: false``. No warm start (OpenEnv
environments carry no reference answers) and no reasoning judge (no state in words).
"""

from __future__ import annotations

import json
import time
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs.registry import load
from envs.text_env import Outcome, TextEnv, takes_text_layer

_BASE_FIELDS = ("done", "reward", "metadata")
_CAPACITY = "CAPACITY_REACHED"


class OpenEnvSource:
    """An OpenEnv environment, in this process or behind a server (see the module docstring)."""

    has_reference = False

    def __init__(self, *, entry_point: str | None, url: str | None, import_path: str | None,
                 kwargs: Mapping[str, Any] | None,
                 action_class: str | None, action_field: str | None,
                 action_defaults: Mapping[str, Any] | None, observation_field: str | None,
                 image_fields: Sequence[str], reward_scale: float, success_reward: float | None,
                 task: str, session_wait_s: float) -> None:
        if (entry_point is None) == (url is None):
            raise ValueError("give the OpenEnv environment as exactly one of entry_point "
                             f"(module:Class) or url (a server), got entry_point={entry_point!r}, url={url!r}")
        self.name = f"OpenEnv {entry_point or url}"
        self.task = task
        self.answer_is = (f"the action's {action_field}" if action_field else
                          "the action as one JSON object")
        self.example = "hello" if action_field else '{"...": "..."}'
        self.action_field, self.action_defaults = action_field, dict(action_defaults or {})
        self.observation_field, self.image_fields = observation_field, tuple(image_fields)
        self.reward_scale = float(reward_scale)
        self.success_reward = None if success_reward is None else float(success_reward)
        self.session_wait_s = float(session_wait_s)
        self.url = url.rstrip("/") if url else None
        self._client: Any = None
        self._first = ""
        if entry_point is not None:
            if import_path:
                _importable(import_path)
            env_class = load(entry_point, "entry_point")
            self.env = env_class(**dict(kwargs or {}))
            self._action_class = (load(action_class, "action_class") if action_class
                                  else _step_action_class(env_class))
            self._schema = None
        else:
            if kwargs:
                raise ValueError("kwargs build an environment in this process (entry_point); a "
                                 "server builds its own")
            self.env, self._action_class = None, None
            self._schema = _action_schema(self.url)

    @property
    def draws(self) -> bool:
        return bool(self.image_fields)

    def start(self, seed: int) -> Outcome:
        if self.env is not None:
            observation = _fields(self.env.reset(seed=seed))
        else:
            self.end()
            self._client = self._open_session()
            observation = _served(self._client.reset(seed=seed))
        outcome = self._outcome(observation)
        self._first = json.dumps(observation, sort_keys=True, default=str)
        return Outcome(outcome.text, images=outcome.images)

    def layout(self) -> str:
        return self._first

    def act(self, answer: str) -> Outcome:
        action, problem = self._action(answer)
        if problem:
            return Outcome(f"Your answer is not a valid action ({problem}); nothing was played.",
                           valid=False)
        if self.env is not None:
            observation = _fields(self.env.step(action))
        else:
            observation = _served(self._client.step(action))
        return self._outcome(observation)

    def _action(self, answer: str) -> tuple[Any, str]:
        """(the action, "") or (None, why the answer is none)."""
        if self.action_field:
            fields = {**self.action_defaults, self.action_field: answer}
        else:
            try:
                fields = json.loads(answer)
            except json.JSONDecodeError as e:
                return None, f"not JSON: {e.msg} at character {e.pos}"
            if not isinstance(fields, dict):
                return None, f"a JSON object is wanted, got {type(fields).__name__}"
            fields = {**self.action_defaults, **fields}
        if self._action_class is not None:
            import pydantic

            try:
                return self._action_class.model_validate(fields), ""
            except pydantic.ValidationError as e:
                return None, "; ".join(f"{'.'.join(map(str, err['loc'])) or 'action'}: {err['msg']}"
                                       for err in e.errors()[:3])
        import jsonschema

        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(self._schema)
                                                 .iter_errors(fields))
        if error is not None:
            where = ".".join(map(str, error.absolute_path)) or "action"
            return None, f"{where}: {error.message}"
        return fields, ""

    def _outcome(self, observation: Mapping[str, Any]) -> Outcome:
        reward = float(observation.get("reward") or 0.0)
        metadata = observation.get("metadata") or {}
        if "success" in metadata:
            success = bool(metadata["success"])
        else:
            success = self.success_reward is not None and reward >= self.success_reward
        shown = {k: v for k, v in observation.items() if k not in _BASE_FIELDS}
        images = [np.asarray(shown.pop(name), dtype=np.uint8) for name in self.image_fields
                  if shown.get(name) is not None]
        if self.observation_field is not None:
            if self.observation_field not in shown:
                raise ValueError(f"{self.name}'s observation has no field {self.observation_field!r}: "
                                 f"it has {sorted(shown)}")
            shown = {self.observation_field: shown[self.observation_field]}
        if len(shown) == 1:
            text = _text(next(iter(shown.values())))
        else:
            text = "\n".join(f"{name}: {_text(value)}" for name, value in shown.items())
        return Outcome(text, reward=self.reward_scale * reward,
                       done=bool(observation.get("done")) or success, success=success, images=images)

    def _open_session(self) -> Any:
        """A new session on the server, waiting up to ``session_wait_s`` while it is full."""
        from openenv.core.generic_client import GenericEnvClient

        deadline = time.monotonic() + self.session_wait_s
        while True:
            client = GenericEnvClient(base_url=self.url).sync()
            try:
                client.connect()
                client.state()  # the server refuses a session beyond its limit at the first message
                return client
            except RuntimeError as e:
                client.close()
                if _CAPACITY not in str(e):
                    raise
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"the OpenEnv server at {self.url} had no free session for "
                        f"{self.session_wait_s:.0f} s ({e}): it serves fewer sessions at once than "
                        "this run's env slots (actors.env_workers x actors.envs_per_worker); lower "
                        "them, raise the server's max_concurrent_envs, or wait longer "
                        "(env.session_wait_s)") from None
                time.sleep(0.2)

    def end(self) -> None:
        """Close the episode's session (a server's); the environment in this process stays."""
        if self._client is not None:
            client, self._client = self._client, None
            client.close()

    def reference(self, rng: np.random.Generator, noise: float) -> tuple[str, bool]:
        raise ValueError(f"{self.name} has no reference answers")

    def close(self) -> None:
        self.end()
        if self.env is not None:
            own = getattr(self.env, "close", None)
            if own is not None:
                own()


def _importable(folder: str) -> None:
    """Puts ``folder`` (where ``openenv init`` wrote an environment's package) on the import path."""
    import os
    import sys

    folder = os.path.abspath(os.path.expanduser(folder))
    if not os.path.isdir(folder):
        raise ValueError(f"import_path {folder!r} is not a directory")
    if folder not in sys.path:
        sys.path.insert(0, folder)


def _served(result: Any) -> dict[str, Any]:
    """A server's answer (OpenEnv's client ``StepResult``: the observation's own fields apart
    from done, reward and metadata) as one dict, as ``_fields`` gives an observation here."""
    return {**result.observation, "done": result.done, "reward": result.reward,
            "metadata": result.metadata or result.observation.get("metadata") or {}}


def _fields(observation: Any) -> dict[str, Any]:
    """An OpenEnv observation (a pydantic model) as a plain dict."""
    return observation.model_dump() if hasattr(observation, "model_dump") else dict(observation)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _step_action_class(env_class: type) -> type:
    """The action class ``env_class.step`` is annotated with (``action_class`` names it where
    the annotation does not)."""
    hints = typing.get_type_hints(env_class.step)
    hints.pop("return", None)
    found = next(iter(hints.values()), None)
    if not (isinstance(found, type) and hasattr(found, "model_validate")):
        raise ValueError(f"{env_class.__name__}.step names no pydantic action class: give it as "
                         "env.action_class=module:Class")
    return found


def _action_schema(url: str) -> dict[str, Any]:
    """The server's action JSON schema (its ``/schema``), with a message if it does not answer."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/schema", timeout=10) as response:
            return json.load(response)["action"]
    except (urllib.error.URLError, OSError, KeyError, ValueError) as e:
        raise RuntimeError(f"no OpenEnv server answers at {url} ({url}/schema: {e}); start it "
                           "first, or check env.url") from None


@takes_text_layer
def make_env(*, entry_point: str | None = None, url: str | None = None,
             import_path: str | None = None, kwargs: Mapping[str, Any] | None = None, action_class: str | None = None,
             action_field: str | None = "message", action_defaults: Mapping[str, Any] | None = None,
             observation_field: str | None = None, image_fields: Sequence[str] = (),
             reward_scale: float = 1.0, success_reward: float | None = None, task: str = "",
             session_wait_s: float = 20.0, **layer: Any) -> TextEnv:
    """The OpenEnv environment ``entry_point`` (in this process) or at ``url`` (a server) in
    VAGEN's layer; ``layer`` is TextEnv's settings."""
    source = OpenEnvSource(entry_point=entry_point, url=url, import_path=import_path, kwargs=kwargs,
                           action_class=action_class, action_field=action_field, action_defaults=action_defaults,
                           observation_field=observation_field, image_fields=image_fields,
                           reward_scale=reward_scale, success_reward=success_reward, task=task,
                           session_wait_s=session_wait_s)
    return TextEnv(source, **layer)
