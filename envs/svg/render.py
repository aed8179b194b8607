"""Untrusted SVG to pixels, bounded: checked first, then rendered by resvg in a worker process of
its own, within a time and a memory limit.

Used by the SVG reconstruction env (the model's answers are SVG code) and for its targets. Why a
worker: an answer is hostile input, written by a policy that is rewarded for whatever gets
through. ``check`` refuses what should never reach the renderer; the worker bounds what does (a
render that overruns ``timeout_s`` or dies, say out of its ``memory_bytes``, is killed and the
worker replaced; the caller gets a reason, never a hang).

``check(text)`` -> None, or why the text is refused:
- ``too_large``: over ``MAX_BYTES`` of UTF-8;
- ``dtd``: a DOCTYPE or an ENTITY (entity expansion bombs, external entities);
- ``malformed``: not well-formed XML, or its root is not ``<svg>``;
- ``too_deep`` / ``too_many``: nesting over ``MAX_DEPTH``, elements over ``MAX_ELEMENTS``;
- ``script``: ``<script>``, ``<foreignObject>`` or an ``on*`` event attribute;
- ``external_reference``: an ``href`` other than a fragment (``#id``) or inline data (``data:``),
  or a ``url(...)`` / ``@import`` in a style reaching outside the document (files, the network).

``Renderer.render(text, size)`` -> (an RGB array of ``size`` x ``size`` on white, or None; the
reason: ``ok`` or one of ``check``'s, ``render_error`` (resvg refused it), ``timeout``,
``crashed``). Whatever width and height the SVG declares, it is drawn to ``size`` pixels a side.
``counts`` tallies the reasons. Invariant: a ``render`` returns within ``timeout_s`` plus the time
to start a worker.
"""

from __future__ import annotations

import io
import os
import re
import select
import struct
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import numpy as np

MAX_BYTES = 64 << 10
MAX_DEPTH = 32
MAX_ELEMENTS = 4096
REASONS = ("ok", "too_large", "dtd", "malformed", "too_deep", "too_many", "script",
           "external_reference", "render_error", "timeout", "crashed")
_LOCAL_HREF = re.compile(r"\s*(#|data:)", re.IGNORECASE)
_URL = re.compile(r"url\(\s*['\"]?\s*([^)'\"\s]*)", re.IGNORECASE)
_SCRIPTED = {"script", "foreignobject"}


def check(text: str) -> str | None:
    """None if ``text`` may be rendered, else the reason it may not (see the module docstring)."""
    if len(text.encode("utf-8", "replace")) > MAX_BYTES:
        return "too_large"
    if re.search(r"<!\s*(DOCTYPE|ENTITY)", text, re.IGNORECASE):
        return "dtd"
    depth = count = 0
    parser = ET.XMLPullParser(events=("start", "end"))
    try:
        parser.feed(text)
        parser.close()
        for event, element in parser.read_events():
            if event == "end":
                depth -= 1
                continue
            depth, count = depth + 1, count + 1
            if count == 1 and _local(element.tag) != "svg":
                return "malformed"
            if depth > MAX_DEPTH:
                return "too_deep"
            if count > MAX_ELEMENTS:
                return "too_many"
            why = _element_problem(element)
            if why:
                return why
    except ET.ParseError:
        return "malformed"
    return None if count else "malformed"


def _local(name: str) -> str:
    """A tag or attribute name without its namespace, lowercase."""
    return name.rsplit("}", 1)[-1].lower()


def _element_problem(element: ET.Element) -> str | None:
    if _local(element.tag) in _SCRIPTED:
        return "script"
    for name, value in element.attrib.items():
        key = _local(name)
        if key.startswith("on"):
            return "script"
        if key == "href" and not _LOCAL_HREF.match(value):
            return "external_reference"
        if _reaches_out(value):
            return "external_reference"
    if _local(element.tag) == "style" and element.text and _reaches_out(element.text):
        return "external_reference"
    return None


def _reaches_out(value: str) -> bool:
    """A style value or sheet that loads something: ``@import``, or ``url(...)`` not a fragment."""
    if "@import" in value.lower():
        return True
    return any(target and not target.startswith("#") for target in _URL.findall(value))


def render_png(text: str, size: int) -> bytes:
    """resvg's PNG of ``text`` at ``size`` x ``size`` on white (in the worker)."""
    import resvg_py

    return bytes(resvg_py.svg_to_bytes(svg_string=text, width=size, height=size,
                                       background="#ffffff", skip_system_fonts=True))


_HEADER = struct.Struct("<II")
"""A frame's header: a number (the size asked; the answer's status, 0 drawn, 1 refused by
resvg), then the payload's length."""


def _serve(render_name: str, memory_bytes: int) -> None:
    """The worker (a ``python -c`` subprocess calling this): a render per request on stdin, its
    answer on stdout, until stdin closes."""
    import importlib
    import resource

    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    module, _, name = render_name.partition(":")
    render = getattr(importlib.import_module(module), name)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = stdin.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return
        size, n = _HEADER.unpack(header)
        text = stdin.read(n).decode("utf-8", "replace")
        try:
            status, payload = 0, render(text, size)
        except Exception as e:  # noqa: BLE001 - resvg's refusal is an answer, not a crash
            status, payload = 1, f"{type(e).__name__}: {e}"[:200].encode()
        stdout.write(_HEADER.pack(status, len(payload)) + payload)
        stdout.flush()


class Renderer:
    """Renders checked SVG in a worker process (see the module docstring); close it when done.

    The worker is a plain subprocess (``_serve``), not a multiprocessing child, so an env worker
    of the pool, itself a daemonic process, may own one. ``render`` names the function it calls
    ("module:function"), resvg's by default."""

    def __init__(self, *, timeout_s: float = 5.0, memory_bytes: int = 1 << 30,
                 render: str = "envs.svg.render:render_png") -> None:
        self.timeout_s, self.memory_bytes, self._render = timeout_s, memory_bytes, render
        self.counts: Counter[str] = Counter()
        self._process: subprocess.Popen | None = None

    def render(self, text: str, size: int) -> tuple[np.ndarray | None, str]:
        reason = check(text)
        if reason is None:
            png, reason = self._in_worker(text, size)
            if png is not None:
                self.counts["ok"] += 1
                return _decode(png, size), "ok"
        self.counts[reason] += 1
        return None, reason

    def _in_worker(self, text: str, size: int) -> tuple[bytes | None, str]:
        if self._process is None or self._process.poll() is not None:
            self._start()
        data = text.encode("utf-8", "replace")
        deadline = time.monotonic() + self.timeout_s
        try:
            self._process.stdin.write(_HEADER.pack(size, len(data)) + data)
            self._process.stdin.flush()
            header = self._read(_HEADER.size, deadline)
            if header is None:
                self._stop()
                return None, "timeout"
            status, n = _HEADER.unpack(header)
            payload = self._read(n, deadline)
            if payload is None:
                self._stop()
                return None, "timeout"
        except (BrokenPipeError, EOFError, OSError):  # the worker died (its memory limit, a crash)
            self._stop()
            return None, "crashed"
        return (payload, "ok") if status == 0 else (None, "render_error")

    def _read(self, n: int, deadline: float) -> bytes | None:
        """``n`` bytes of the worker's answer, or None at the deadline; EOFError if it died."""
        out = self._process.stdout
        chunks, left = [], n
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([out], [], [], wait)[0]:
                return None
            chunk = os.read(out.fileno(), left)
            if not chunk:
                raise EOFError("the render worker closed its output")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _start(self) -> None:
        code = (f"from envs.svg.render import _serve; _serve({self._render!r}, "
                f"{int(self.memory_bytes)})")
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        self._process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, env=env, cwd=os.getcwd())

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=5)
            for pipe in (self._process.stdin, self._process.stdout):
                pipe.close()
        self._process = None

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> "Renderer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _decode(png: bytes, size: int) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        rgb = np.asarray(image.convert("RGB"))
    if rgb.shape != (size, size, 3):  # a non-square viewBox keeps its aspect: pad it with white
        canvas = np.full((size, size, 3), 255, np.uint8)
        h, w = min(size, rgb.shape[0]), min(size, rgb.shape[1])
        canvas[:h, :w] = rgb[:h, :w]
        rgb = canvas
    return rgb
