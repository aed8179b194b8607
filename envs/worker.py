"""The env worker process: the shell that hosts M envs and answers the pool's batched requests.

Started by ``EnvPool`` (envs/pool.py), which passes ``worker_main`` as a process target together
with one end of a multiprocessing Pipe and the factory spec (an ``EnvFactory``, which
envs/registry.py's ``make_env`` builds); nothing else calls into this module.

Pipe protocol (only bytes: transport/codec.py msgpack, at most ``MAX_PIPE_BYTES`` a message):
- On start, exactly one message: ``{"ready": pid}``, or ``{"init_error": str}`` and exit.
- Then per request ``{"op", "envs": [env index], "args": [arg]}`` exactly one reply: a list with
  one ``to_wire`` result per env, in order (envs/wire.py). ``{"op": "close"}`` or a closed pipe
  ends the worker, which closes every env on the way out.
Invariants:
- An env that raises (or returns what the wire cannot carry) fails only its own slot, as
  ``EpisodeFailure("env_error: ...")``; the worker lives on.
- SIGINT is ignored: Ctrl-C is the parent's to handle, and the parent stops its workers.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from envs.protocol import to_observation, to_step_result
from envs.registry import EnvFactory, make_env
from envs.wire import EpisodeFailure, to_wire
from transport.codec import CodecError, decode, encode

MAX_PIPE_BYTES = 1 << 30


def worker_main(conn, factory: EnvFactory, num_envs: int) -> None:
    """The worker process: build M envs, then answer requests until "close" or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    try:
        envs = [make_env(factory) for _ in range(num_envs)]
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send_bytes(encode({"init_error": f"{type(e).__name__}: {e}"}))
        return
    conn.send_bytes(encode({"ready": os.getpid()}))
    try:
        while True:
            try:
                request = decode(conn.recv_bytes(), max_bytes=MAX_PIPE_BYTES)
            except EOFError:  # the pool is gone
                return
            if request["op"] == "close":
                return
            replies = [_run(envs[i], request["op"], arg) for i, arg in zip(request["envs"], request["args"])]
            conn.send_bytes(_encode_replies(replies))
    finally:
        for env in envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - one env's failing close must not skip the others
                pass


def _run(env, op: str, arg: Any) -> dict:
    try:
        if op == "reset":
            return to_wire(to_observation(env.reset(seed=arg)[0]))
        if op == "step":
            return to_wire(to_step_result(env.step(arg)))
        return to_wire(getattr(env, op)())  # system_prompt, state_text
    except Exception as e:  # noqa: BLE001 - an env error is this slot's result
        return to_wire(EpisodeFailure(f"env_error: {type(e).__name__}: {e}"[:500]))


def _encode_replies(replies: list[dict]) -> bytes:
    try:
        return encode(replies)
    except CodecError:  # some env returned something the wire cannot carry: fail only those slots
        out = []
        for r in replies:
            try:
                encode(r)
                out.append(r)
            except CodecError as e:
                out.append(to_wire(EpisodeFailure(f"env_error: CodecError: {e}")))
        return encode(out)
