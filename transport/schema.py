"""The wire messages between processes, in one place, each with its producer and consumer.

Messages are plain dataclasses that turn into msgpack-ready dicts (``to_wire``) and back
(``from_wire``), where every field is checked: a received message is untrusted input, so a wrong
type, a dtype off the list, a length mismatch or an absurd size raises ``SchemaError`` (a
ValueError) naming the field, and never anything else. numpy arrays travel as arrays; the codec
(transport/codec.py) carries them as raw bytes.

Invariants of a Trajectory:
- the per-token arrays ``token_ids`` (int32), ``loss_mask`` (bool), ``turn_end`` (bool),
  ``behaviour_logprobs`` (float32) and ``policy_version`` (int32) have one length L, the length
  of the whole multi-turn sequence exactly as the model saw and produced it;
- ``loss_mask`` is True on the policy's tokens (assistant tokens incl. end-of-turn); ``turn_end``
  is True on the last policy token of each turn, so it is a subset of ``loss_mask``;
- ``turn_rewards[t]`` is turn t's reward and belongs at the t-th True of ``turn_end``;
- ``policy_version`` is the learner version whose weights produced each policy token (-1 on
  environment tokens); ``behaviour_logprobs`` is 0 there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

SCHEMA_VERSION = 2
MAX_TOKENS = 1 << 20
MAX_TURNS = 1 << 12
MAX_IMAGES = 256
MAX_GROUP = 1 << 12


class SchemaError(ValueError):
    """A message that does not follow the schema."""


@dataclass
class EncodedImage:
    """An image of an observation, PNG-encoded (VLM episodes). Producer: actor; consumer: learner."""

    png: bytes
    height: int
    width: int


@dataclass
class Trajectory:
    """One finished episode as one training sequence. Producer: actor; consumer: learner."""

    run_id: str
    actor_id: int
    episode_id: int
    env_name: str
    seed: int
    group_id: int
    """Episodes of one GRPO group share it (n episodes per seed)."""
    token_ids: np.ndarray
    """int32, Shape: (L,)."""
    loss_mask: np.ndarray
    """bool, Shape: (L,)."""
    turn_end: np.ndarray
    """bool, Shape: (L,), a subset of loss_mask."""
    behaviour_logprobs: np.ndarray
    """float32, Shape: (L,): log-prob of each policy token under the distribution sampled from."""
    policy_version: np.ndarray
    """int32, Shape: (L,): weight version that generated each policy token, -1 elsewhere."""
    turn_rewards: np.ndarray
    """float32, Shape: (T,), T = number of True in turn_end."""
    final_reward: float = 0.0
    """The env's end-of-episode reward (added to the last turn when rewards are placed)."""
    group_size: int = 0
    """0: sent alone. k >= 1: sent with the k members of its group that finished (the actor held
    the group until every member ended): the learner's batches take such groups whole."""
    images: list[EncodedImage] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    """Episode statistics from the actor (success, turns, generation time, ...)."""
    created_at: float = 0.0
    """Unix time the episode finished."""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _check_trajectory(self)

    @property
    def min_policy_version(self) -> int:
        """The oldest weight version in the episode (staleness is measured from it)."""
        versions = self.policy_version[self.loss_mask]
        return int(versions.min()) if versions.size else -1

    def to_wire(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["images"] = [vars(img).copy() for img in self.images]
        return out

    @classmethod
    def from_wire(cls, msg: Any) -> "Trajectory":
        if not isinstance(msg, dict):
            raise SchemaError(f"trajectory must be a map, got {type(msg).__name__}")
        version = msg.get("schema_version")
        if type(version) is not int or version != SCHEMA_VERSION:
            raise SchemaError(f"schema_version {version!r:.40}, expected {SCHEMA_VERSION}")
        names = {f.name for f in fields(cls)}
        unknown = set(msg) - names
        if unknown:
            raise SchemaError(f"unknown fields {sorted(map(str, unknown))}")
        images = msg.get("images", [])
        if not isinstance(images, list) or len(images) > MAX_IMAGES:
            raise SchemaError("images must be a list of at most %d entries" % MAX_IMAGES)
        try:
            kwargs = dict(msg, images=[EncodedImage(**_image_fields(i)) for i in images])
            return cls(**kwargs)
        except TypeError as e:  # a missing required field
            raise SchemaError(str(e)) from None


_ARRAYS = {
    "token_ids": np.int32,
    "loss_mask": np.bool_,
    "turn_end": np.bool_,
    "behaviour_logprobs": np.float32,
    "policy_version": np.int32,
}
_SCALARS = {
    "run_id": str, "actor_id": int, "episode_id": int, "env_name": str, "seed": int,
    "group_id": int, "group_size": int, "final_reward": float, "created_at": float,
    "schema_version": int,
}


def _check_trajectory(t: Trajectory) -> None:
    for name, kind in _SCALARS.items():
        value = getattr(t, name)
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            setattr(t, name, float(value))
            ok = True
        if not ok:
            raise SchemaError(f"{name} must be {kind.__name__}, got {type(value).__name__}")
    if not 0 <= t.group_size <= MAX_GROUP:
        raise SchemaError(f"group_size must be in [0, {MAX_GROUP}], got {t.group_size}")
    length = None
    for name, dtype in _ARRAYS.items():
        arr = _array(name, getattr(t, name), dtype, MAX_TOKENS)
        if length is None:
            length = arr.shape[0]
        elif arr.shape[0] != length:
            raise SchemaError(f"{name} has length {arr.shape[0]}, token_ids has {length}")
    if np.any(t.turn_end & ~t.loss_mask):
        raise SchemaError("turn_end marks a token outside loss_mask")
    rewards = _array("turn_rewards", t.turn_rewards, np.float32, MAX_TURNS)
    if rewards.shape[0] != int(t.turn_end.sum()):
        raise SchemaError(f"{rewards.shape[0]} turn_rewards for {int(t.turn_end.sum())} turn ends")
    if not np.all(np.isfinite(rewards)) or not np.all(np.isfinite(t.behaviour_logprobs)):
        raise SchemaError("turn_rewards and behaviour_logprobs must be finite")
    if not isinstance(t.metrics, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) for k, v in t.metrics.items()
    ):
        raise SchemaError("metrics must map str to numbers")


def _array(name: str, value: Any, dtype, max_len: int) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise SchemaError(f"{name} must be an array, got {type(value).__name__}")
    if value.dtype != np.dtype(dtype):
        raise SchemaError(f"{name} must be {np.dtype(dtype)}, got {value.dtype}")
    if value.ndim != 1 or value.shape[0] > max_len:
        raise SchemaError(f"{name} must be 1-D with at most {max_len} entries, got shape {value.shape}")
    return value


def _image_fields(d: Any) -> dict[str, Any]:
    if not (isinstance(d, dict) and set(d) == {"png", "height", "width"}
            and isinstance(d["png"], bytes) and isinstance(d["height"], int) and isinstance(d["width"], int)):
        raise SchemaError("an image must be {png: bytes, height: int, width: int}")
    return d
