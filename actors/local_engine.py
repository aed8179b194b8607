"""A vLLM engine in this process, behind the part of AsyncLLM's interface the actor uses.

vLLM's ``AsyncLLM`` always runs its engine core in a child process. The single-process topology
(``topology=local``, launch/topology/local_cluster.py) wants the engine here, in the process that also trains,
so ``InProcessEngine`` wraps vLLM's synchronous ``LLMEngine`` (its core in-process, the model on
a uni-process executor) and steps it from one thread of its own. To the actor it looks like an
AsyncLLM: ``generate`` is an async iterator over a request's outputs; ``pause_generation`` /
``resume_generation``, ``collective_rpc``, ``reset_prefix_cache``, ``reset_encoder_cache`` and
``update_weight_version`` are coroutines; ``shutdown`` is not. The worker extension
(actors/vllm_extension.py) runs in this process too, so ``collective_rpc("receive_weights")``
takes the learner's weights straight from transport/inprocess.py's channel.

Invariants: only the engine thread touches the LLMEngine (it is not thread-safe): every call
is queued to it and runs between two engine steps. A request's outputs reach the event loop
that asked for it. ``pause_generation("keep")`` returns once no step will run before
``resume_generation``; ``"wait"`` first lets the requests in flight finish, holding new ones
back until the resume. A failing step fails every request in flight with its error, as a dead
engine would. ``shutdown`` ends the thread and the engine core; it tears down torch.distributed's
default group too (vLLM's engine core does), so it comes after everything that uses it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from concurrent.futures import Future
from typing import Any, AsyncIterator, Callable

log = logging.getLogger(__name__)


class InProcessEngine:
    """An LLMEngine stepped by a thread of its own, with AsyncLLM's coroutines (see above)."""

    def __init__(self, engine_args) -> None:
        """Builds the engine (in its thread); raises what building it raises."""
        self._calls: queue.SimpleQueue[tuple[Callable[[Any], Any], Future]] = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._held: list[Callable[[Any], Any]] = []  # requests that came during a "wait" pause
        self._holding = self._paused = self._stopping = False
        self._idle: list[Future] = []  # a "wait" pause waits for the requests in flight to end
        self._wake = threading.Event()
        self._lock = threading.Lock()  # orders _submit against the thread's last drain
        built: Future = Future()
        self._thread = threading.Thread(target=self._serve, args=(engine_args, built),
                                        name="vllm-in-process", daemon=True)
        self._thread.start()
        built.result()

    # --- AsyncLLM's interface -----------------------------------------------------------------
    async def generate(self, prompt, params, request_id: str, lora_request=None) -> AsyncIterator[Any]:
        """The request's outputs, the last one ``finished`` (what vLLM's ``step`` returns);
        ``lora_request``: the adapter it is sampled with (None: the base weights)."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (loop, outputs)
        finished = False
        try:
            await self._call(lambda engine: self._add(engine, request_id, prompt, params, lora_request))
            while not finished:
                out = await outputs.get()
                if isinstance(out, BaseException):
                    raise out
                finished = out.finished
                yield out
        finally:
            self._streams.pop(request_id, None)
            if not finished and not self._stopping:  # cancelled: no reply awaited
                self._submit(lambda engine: engine.abort_request([request_id]))

    async def pause_generation(self, mode: str = "keep") -> None:
        if mode not in ("keep", "wait"):
            raise ValueError(f"pause mode must be 'keep' or 'wait', got {mode!r}")
        if mode == "wait":
            idle: Future = Future()

            def hold(engine) -> None:
                self._holding = True
                self._idle.append(idle)

            await self._call(hold)
            await asyncio.wrap_future(idle)

        def pause(engine) -> None:
            self._paused = True

        await self._call(pause)

    async def resume_generation(self) -> None:
        def resume(engine) -> None:
            self._paused = self._holding = False
            held, self._held = self._held, []
            for add in held:
                add(engine)

        await self._call(resume)

    async def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list:
        return await self._call(lambda engine: engine.collective_rpc(method, args=args, kwargs=kwargs))

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return await self._call(lambda engine: engine.reset_prefix_cache(reset_running_requests))

    async def reset_encoder_cache(self) -> None:
        await self._call(lambda engine: engine.reset_encoder_cache())

    async def update_weight_version(self, version: str) -> None:
        await self._call(lambda engine: engine.set_weight_version(version))

    def shutdown(self) -> None:
        """Stop the engine thread and the engine core (idempotent)."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        self._thread.join()

    # --- the engine thread --------------------------------------------------------------------
    def _add(self, engine, request_id: str, prompt, params, lora_request) -> None:
        from vllm.sampling_params import RequestOutputKind

        params = params.clone()
        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output a request: the actor's need

        def add(e) -> None:
            e.add_request(request_id, prompt, params, lora_request=lora_request)

        if self._holding:
            self._held.append(add)
        else:
            add(engine)

    def _serve(self, engine_args, built: Future) -> None:
        # Read when the engine is built (it would put the core in a child process), then restored.
        before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            from vllm.v1.engine.llm_engine import LLMEngine

            engine = LLMEngine.from_engine_args(engine_args, enable_multiprocessing=False)
        except BaseException as e:  # noqa: BLE001 - handed to the constructor's caller
            built.set_exception(e)
            return
        finally:
            if before is None:
                del os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]
            else:
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before
        built.set_result(None)
        try:
            self._loop(engine)
        finally:
            error = RuntimeError("the in-process engine is shut down")
            with self._lock:
                self._stopping = True  # also after a failed step: no call is queued from now on
            for loop, outputs in list(self._streams.values()):
                loop.call_soon_threadsafe(outputs.put_nowait, error)
            while True:  # calls still queued: nobody will run them
                try:
                    _, future = self._calls.get_nowait()
                except queue.Empty:
                    break
                if future.set_running_or_notify_cancel():
                    future.set_exception(error)
            engine.engine_core.shutdown()

    def _loop(self, engine) -> None:
        while not self._stopping:
            self._run_calls(engine)
            busy = engine.has_unfinished_requests()
            if self._holding and not busy:
                for idle in self._idle:
                    idle.set_result(None)
                self._idle.clear()
            if not busy or self._paused:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                outputs = engine.step()
            except Exception as e:
                log.exception("engine step failed")
                for loop, stream in list(self._streams.values()):
                    loop.call_soon_threadsafe(stream.put_nowait, e)
                raise
            for out in outputs:
                target = self._streams.get(out.request_id)
                if target is not None:
                    loop, stream = target
                    loop.call_soon_threadsafe(stream.put_nowait, out)

    def _run_calls(self, engine) -> None:
        while True:
            try:
                fn, future = self._calls.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(engine))
            except BaseException as e:  # noqa: BLE001 - the caller's to handle
                future.set_exception(e)

    def _submit(self, fn: Callable[[Any], Any]) -> Future:
        future: Future = Future()
        with self._lock:
            if self._stopping:
                future.set_exception(RuntimeError("the in-process engine is shut down"))
                return future
            self._calls.put((fn, future))
        self._wake.set()
        return future

    async def _call(self, fn: Callable[[Any], Any]) -> Any:
        return await asyncio.wrap_future(self._submit(fn))
