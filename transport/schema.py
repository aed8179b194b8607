"""The wire messages between processes, in one place, each with its producer and consumer.

Messages are plain dataclasses, checked when built. A Trajectory travels as typed msgpack
(``to_bytes`` / ``from_bytes``): msgspec decodes it against ``_WireTrajectory`` in compiled code
(every field's type, unknown and missing fields, ranges), and ``from_bytes`` checks what a
type cannot say: the lengths, then the flags and finiteness in one compiled pass that also
makes the arrays and the Trajectory (transport/wire.py; numpy where it is not built). The
sender's encoding is compiled too (msgspec's bytes, written by transport/wire.py where it can,
by msgspec itself otherwise). A received message is untrusted input: anything wrong raises
``SchemaError`` (a ValueError) naming the field, or ``CodecError`` for bytes that are not
msgpack, and never anything else; nothing is unpickled.

On the wire the per-token arrays are raw little-endian bytes whose dtype the schema fixes
(``token_ids`` and ``policy_version`` int32, ``behaviour_logprobs`` float32), ``loss_mask`` and
``turn_end`` travel as one ``flags`` byte a token (0 an environment token, 1 a policy token, 2
the policy token that ends a turn: loss_mask + turn_end, so the wire cannot express a turn end
outside loss_mask), ``turn_rewards`` as float32 bytes. Decoded arrays are read-only, zero-copy
views of the message, loss_mask and turn_end excepted.

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

from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
import numpy as np

from transport import wire
from transport.codec import CodecError

SCHEMA_VERSION = 4
MAX_TOKENS = 1 << 20
MAX_TURNS = 1 << 12
MAX_IMAGES = 256
MAX_GROUP = 1 << 12
GROUP_STRIDE = 10**9
INCARNATION_STRIDE = 10**6
"""An actor's group ids: ``actor_id * GROUP_STRIDE + incarnation * INCARNATION_STRIDE + k`` for
its incarnation's k-th group, unique across actors and their restarts (actors/groups.py)."""


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
    """Episodes of one GRPO group share it (n episodes per seed); it names the actor's
    incarnation that played it (``GROUP_STRIDE``)."""
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

    @property
    def origin(self) -> str:
        """``"<actor_id>/<incarnation>"``: the incarnation that sent it, from ``group_id``."""
        return f"{self.actor_id}/{self.group_id % GROUP_STRIDE // INCARNATION_STRIDE}"

    def to_bytes(self) -> bytes:
        """The trajectory as typed msgpack (the module docstring's layout)."""
        try:
            return _ENCODER.encode(self._wire_fields())
        except (TypeError, msgspec.EncodeError) as e:
            raise CodecError(f"cannot encode the trajectory: {e}") from None

    def encode_into(self, buffer: bytearray) -> None:
        """``to_bytes`` written over ``buffer``, which is resized to fit: a sender that reuses one
        buffer encodes into memory that stays mapped and warm instead of a fresh bytes object a
        message. Compiled where it can be (transport/wire.py), through msgspec otherwise."""
        if wire.encode_into(self, buffer):  # compiled, the common case; msgspec for the rest
            return
        try:
            _ENCODER.encode_into(self._wire_fields(), buffer)
        except (TypeError, msgspec.EncodeError) as e:
            raise CodecError(f"cannot encode the trajectory: {e}") from None

    def to_wire(self) -> dict[str, Any]:
        """The fields as msgpack-ready builtins, the arrays as their wire bytes (for tools and
        tests; ``to_bytes`` packs the same without copying the arrays first)."""
        out = {k: v.tobytes() if isinstance(v, memoryview) else v
               for k, v in self._wire_fields().items()}
        out.update(images=[dict(img) for img in out["images"]], metrics=dict(self.metrics))
        return out

    def _wire_fields(self) -> dict[str, Any]:
        """The wire fields, the arrays as views of their bytes (copied only where the dtype or
        the layout is not the wire's), the images and metrics as they are (not copied)."""
        return {
            "schema_version": self.schema_version, "run_id": self.run_id,
            "actor_id": self.actor_id, "episode_id": self.episode_id, "env_name": self.env_name,
            "seed": self.seed, "group_id": self.group_id,
            "token_ids": _le(self.token_ids, "<i4"),
            "flags": self._flags(),
            "behaviour_logprobs": _le(self.behaviour_logprobs, "<f4"),
            "policy_version": _le(self.policy_version, "<i4"),
            "turn_rewards": _le(self.turn_rewards, "<f4"),
            "final_reward": self.final_reward, "group_size": self.group_size,
            "images": [vars(img) for img in self.images], "metrics": self.metrics,
            "created_at": self.created_at,
        }

    def _flags(self) -> bytes:
        packed = wire.pack(self.loss_mask, self.turn_end)
        if packed is None:
            raise SchemaError("turn_end marks a token outside loss_mask, or their lengths differ")
        return packed

    @classmethod
    def from_bytes(cls, payload: bytes | bytearray | memoryview) -> "Trajectory":
        """A received message as a checked Trajectory; ``SchemaError`` or ``CodecError`` else."""
        try:
            msg = _DECODER.decode(payload)
        except msgspec.ValidationError as e:
            raise SchemaError(_version_error(payload) or str(e)) from None
        except Exception as e:  # noqa: BLE001 - msgspec raises e.g. UnicodeDecodeError for bad str
            raise CodecError(f"malformed message: {type(e).__name__}: {e}"[:300]) from None
        if msg.schema_version != SCHEMA_VERSION:
            raise SchemaError(f"schema_version {msg.schema_version}, expected {SCHEMA_VERSION}")
        built = wire.trajectory(cls, EncodedImage, msg, MAX_TOKENS)
        if built is None:  # transport/_wire.c is not built
            built = _trajectory(cls, msg)
        if type(built) is int:
            raise _invalid(msg, built)
        return built


def _trajectory(cls: type[Trajectory], msg: "_WireTrajectory") -> Trajectory | int:
    """``wire.trajectory`` in Python: the Trajectory of a decoded message, or ``wire``'s int
    saying why it is invalid."""
    length = len(msg.flags)
    if length > MAX_TOKENS:
        return wire.TOO_LONG
    if not (len(msg.token_ids) == len(msg.behaviour_logprobs) == len(msg.policy_version)
            == 4 * length) or len(msg.turn_rewards) % 4:
        return wire.BAD_LENGTHS
    arrays = wire.columns(msg.flags, msg.token_ids, msg.behaviour_logprobs, msg.policy_version,
                          msg.turn_rewards)
    if type(arrays) is int:
        return arrays
    # Built from checked fields: skips __post_init__'s second pass (and a call's kwargs).
    self = cls.__new__(cls)
    self.__dict__.update(
        run_id=msg.run_id, actor_id=msg.actor_id, episode_id=msg.episode_id,
        env_name=msg.env_name, seed=msg.seed, group_id=msg.group_id,
        **dict(zip(_ARRAY_FIELDS, arrays)), final_reward=msg.final_reward,
        group_size=msg.group_size,
        images=[EncodedImage(i.png, i.height, i.width) for i in msg.images],
        metrics=msg.metrics, created_at=msg.created_at, schema_version=msg.schema_version,
    )
    return self


def _invalid(msg: "_WireTrajectory", why: int) -> SchemaError:
    """What is wrong with a message that ``wire`` found invalid (``why``)."""
    length = len(msg.flags)
    if why == wire.TOO_LONG:
        return SchemaError(f"{length} tokens, the limit is {MAX_TOKENS}")
    if why == wire.BAD_LENGTHS:
        for name in ("token_ids", "behaviour_logprobs", "policy_version"):
            if len(getattr(msg, name)) != 4 * length:
                return SchemaError(f"{name} has length {len(getattr(msg, name)) / 4:g}, "
                                   f"flags has {length}")
        return SchemaError(f"turn_rewards has {len(msg.turn_rewards)} bytes, not float32s")
    if why == wire.BAD_FLAG:
        return SchemaError("flags must be 0, 1 or 2 (an environment token, a policy token, a "
                           "turn's last policy token)")
    if why == wire.NON_FINITE:
        return SchemaError("turn_rewards and behaviour_logprobs must be finite")
    return SchemaError(f"{len(msg.turn_rewards) / 4:g} turn_rewards for {why} turn ends")


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
    flags: memoryview
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


_ARRAY_FIELDS = ("token_ids", "loss_mask", "turn_end", "behaviour_logprobs", "policy_version",
                 "turn_rewards")
"""The order of ``wire.columns``' arrays."""
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
    """The array's wire bytes (a view where it is contiguous and of that dtype already; msgpack
    packs a buffer's bytes whatever its item type)."""
    return np.ascontiguousarray(arr, dtype=dtype).data


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
