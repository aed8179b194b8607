"""The wire messages between processes, in one place, each with its producer and consumer.

Messages are plain dataclasses, checked when built. A Trajectory travels as typed msgpack
(``to_bytes`` / ``from_bytes``): msgspec decodes it against ``_WireTrajectory`` in compiled code
(every field's type, unknown and missing fields, ranges), and ``from_bytes`` checks in a few
vectorised passes what a type cannot say (lengths, flags, finiteness). A received message is
untrusted input: anything wrong raises ``SchemaError`` (a ValueError) naming the field, or
``CodecError`` for bytes that are not msgpack, and never anything else; nothing is unpickled.

On the wire the per-token arrays are raw little-endian bytes whose dtype the schema fixes
(``token_ids`` and ``policy_version`` int32, ``behaviour_logprobs`` float32), ``loss_mask`` and
``turn_end`` travel as one ``flags`` byte a token (bit 0 loss_mask, bit 1 turn_end: 0, 1 or 3),
``turn_rewards`` as float32 bytes. Decoded arrays are read-only, zero-copy views of the message.

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

import math
from dataclasses import dataclass, field, fields
from typing import Annotated, Any

import msgspec
import numpy as np

from transport.codec import CodecError

SCHEMA_VERSION = 3
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

    def to_bytes(self) -> bytes:
        """The trajectory as typed msgpack (the module docstring's layout)."""
        try:
            return _ENCODER.encode(self._wire_fields())
        except (TypeError, msgspec.EncodeError) as e:
            raise CodecError(f"cannot encode the trajectory: {e}") from None

    def to_wire(self) -> dict[str, Any]:
        """The fields as msgpack-ready builtins, the arrays as their wire bytes (for tools and
        tests; ``to_bytes`` packs the same without copying the arrays first)."""
        return {k: v.tobytes() if isinstance(v, memoryview) else v
                for k, v in self._wire_fields().items()}

    def _wire_fields(self) -> dict[str, Any]:
        flags = self.loss_mask.view(np.uint8) | (self.turn_end.view(np.uint8) << 1)
        out = {name: getattr(self, name) for name in _SCALARS}
        out.update(
            token_ids=_le(self.token_ids, "<i4"), flags=memoryview(flags),
            behaviour_logprobs=_le(self.behaviour_logprobs, "<f4"),
            policy_version=_le(self.policy_version, "<i4"),
            turn_rewards=_le(self.turn_rewards, "<f4"),
            images=[vars(img).copy() for img in self.images], metrics=dict(self.metrics),
        )
        return out

    @classmethod
    def from_bytes(cls, payload: bytes | bytearray | memoryview) -> "Trajectory":
        """A received message as a checked Trajectory; ``SchemaError`` or ``CodecError`` else."""
        try:
            wire = _DECODER.decode(payload)
        except msgspec.ValidationError as e:
            raise SchemaError(_version_error(payload) or str(e)) from None
        except Exception as e:  # noqa: BLE001 - msgspec raises e.g. UnicodeDecodeError for bad str
            raise CodecError(f"malformed message: {type(e).__name__}: {e}"[:300]) from None
        if wire.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"schema_version {wire.schema_version}, expected {SCHEMA_VERSION}")
        flags = wire.flags
        length = len(flags)
        if length > MAX_TOKENS:
            raise SchemaError(f"{length} tokens, the limit is {MAX_TOKENS}")
        for name in ("token_ids", "behaviour_logprobs", "policy_version"):
            if len(getattr(wire, name)) != 4 * length:
                raise SchemaError(f"{name} has length {len(getattr(wire, name)) / 4:g}, "
                                  f"flags has {length}")
        if flags.translate(None, b"\x00\x01\x03"):
            raise SchemaError("flags must be 0, 1 or 3 (turn_end marks a token outside loss_mask)")
        turns = flags.count(3)
        if len(wire.turn_rewards) != 4 * turns:
            raise SchemaError(f"{len(wire.turn_rewards) / 4:g} turn_rewards for {turns} turn ends")
        logprobs = np.frombuffer(wire.behaviour_logprobs, "<f4")
        rewards = np.frombuffer(wire.turn_rewards, "<f4")
        # Finite float32 values sum to a finite float64; a nan or an inf does not.
        if not (math.isfinite(logprobs.sum(dtype=np.float64))
                and math.isfinite(rewards.sum(dtype=np.float64))):
            raise SchemaError("turn_rewards and behaviour_logprobs must be finite")
        bits = np.frombuffer(flags, np.uint8)
        values = {name: getattr(wire, name) for name in _SCALARS}
        return cls._checked(
            **values, token_ids=np.frombuffer(wire.token_ids, "<i4"), loss_mask=bits.astype(bool),
            turn_end=bits == 3, behaviour_logprobs=logprobs,
            policy_version=np.frombuffer(wire.policy_version, "<i4"), turn_rewards=rewards,
            images=[EncodedImage(i.png, i.height, i.width) for i in wire.images],
            metrics=wire.metrics,
        )

    @classmethod
    def _checked(cls, **values: Any) -> "Trajectory":
        """Built from fields ``from_bytes`` has checked: skips ``__post_init__``'s second pass."""
        self = cls.__new__(cls)
        self.__dict__.update(values)
        return self


class _WireImage(msgspec.Struct, forbid_unknown_fields=True):
    png: bytes
    height: int
    width: int


class _WireTrajectory(msgspec.Struct, forbid_unknown_fields=True):
    """A Trajectory on the wire (module docstring); the per-token fields are views of the bytes."""

    schema_version: int
    run_id: str
    actor_id: int
    episode_id: int
    env_name: str
    seed: int
    group_id: int
    token_ids: memoryview
    flags: bytes
    behaviour_logprobs: memoryview
    policy_version: memoryview
    turn_rewards: memoryview
    final_reward: float
    group_size: Annotated[int, msgspec.Meta(ge=0, le=MAX_GROUP)]
    images: Annotated[list[_WireImage], msgspec.Meta(max_length=MAX_IMAGES)]
    metrics: dict[str, int | float | bool]
    created_at: float


class _Version(msgspec.Struct):
    schema_version: Any = None


def _plain(obj: Any) -> Any:
    """numpy scalars (a metric computed with numpy) travel as Python numbers."""
    if isinstance(obj, np.generic) and isinstance(obj.item(), (bool, int, float)):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__}")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_plain)
_DECODER = msgspec.msgpack.Decoder(_WireTrajectory)


def _version_error(payload: Any) -> str | None:
    """For a message that failed the schema: "schema_version 2, expected 3" when that is why."""
    try:
        version = msgspec.msgpack.decode(payload, type=_Version).schema_version
    except Exception:  # noqa: BLE001 - only a better message is at stake
        return None
    if version == SCHEMA_VERSION and type(version) is int:
        return None
    return f"schema_version {version!r:.40}, expected {SCHEMA_VERSION}"


def _le(arr: np.ndarray, dtype: str) -> memoryview:
    """The array's wire bytes (a view where it is contiguous and of that dtype already)."""
    return memoryview(np.ascontiguousarray(arr, dtype=dtype)).cast("B")


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
