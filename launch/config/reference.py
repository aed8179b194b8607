"""`python -m launch.config.reference`: write docs/config-reference.md from launch/config/schema.py.

Every group of the run's schema, each key with its type, its default in the schema and its
docstring (read from the source: attribute docstrings are not kept at run time), and the YAML
files each group can be set to. ``--check`` exits 1 when the file on disk differs (a test runs
it, so the reference cannot go out of date).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import inspect
import sys
import typing
from pathlib import Path

from launch.config import schema as config

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "config-reference.md"


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` and its dataclass bases, read from
    their modules' source."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        source = inspect.getsourcefile(klass)
        assert source is not None, klass  # a dataclass of ours: defined in a file
        tree = ast.parse(Path(source).read_text(encoding="utf-8"))
        node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == klass.__name__)
        body = node.body
        for stmt, after in zip(body, body[1:] + [None]):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                text = ""
                if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                    text = " ".join(str(after.value.value).split())
                docs[stmt.target.id] = text
    return docs


def _type(t) -> str:
    if isinstance(t, type) and issubclass(t, enum.Enum):  # a key's choices
        return " | ".join(str(m.value) for m in t)
    if t is typing.Any:  # a mapping, a list or a word, as the meaning says
        return "any"
    name = getattr(t, "__name__", None)
    if typing.get_origin(t) is typing.Union:
        args = [a for a in typing.get_args(t) if a is not type(None)]
        return " | ".join(_type(a) for a in args) + " | null"
    if typing.get_origin(t) is dict:
        return "mapping"
    return name or str(t)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        if isinstance(f.default, enum.Enum):
            return str(f.default.value)
        if isinstance(f.default, bool):
            return str(f.default).lower()
        return "null" if f.default is None else repr(f.default).replace("'", "")
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if isinstance(value, list):
            return "[" + ", ".join(map(str, value)) + "]"
        return "{}" if value == {} else "(group)"
    return "(required)"


def _rows(prefix: str, cls: type) -> list[str]:
    """A table row per key of ``cls`` under ``prefix``; a nested group's row, then its keys'."""
    cls_hints, cls_docs, rows = typing.get_type_hints(cls), field_docs(cls), []
    for f in dataclasses.fields(cls):
        rows.append(f"| `{prefix}.{f.name}` | {_cell(_type(cls_hints[f.name]))} | {_default(f)} | "
                    f"{_cell(cls_docs[f.name])} |")
        if dataclasses.is_dataclass(cls_hints[f.name]):
            rows += _rows(f"{prefix}.{f.name}", cls_hints[f.name])
    return rows


def render() -> str:
    hints = typing.get_type_hints(config.RunConfig)
    lines = ["# Configuration reference", "",
             "Generated from `launch/config/schema.py` by `python -m launch.config.reference`; do not edit.",
             "Every key is checked when the config is composed: an unknown key, a value of the",
             "wrong type, or a word not among a key's choices fails with Hydra's message naming it.",
             "Defaults below are the schema's; the YAML files of `configs/` set the values a run",
             "starts from.", ""]
    top = [f for f in dataclasses.fields(config.RunConfig) if not dataclasses.is_dataclass(hints[f.name])]
    groups = [f for f in dataclasses.fields(config.RunConfig) if dataclasses.is_dataclass(hints[f.name])]
    docs = field_docs(config.RunConfig)
    lines += ["## Top level", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{f.name}` | {_cell(_type(hints[f.name]))} | {_default(f)} | {_cell(docs[f.name])} |"
              for f in top]
    for g in groups:
        cls = hints[g.name]
        choices = sorted(p.stem for p in (ROOT / "configs" / g.name).glob("*.yaml"))
        lines += ["", f"## `{g.name}`", "", " ".join(cls.__doc__.split())]
        if choices:
            listed = ", ".join(f"`{c}`" for c in choices)
            lines += ["", f"Choices (`configs/{g.name}/`): {listed}."]
        lines += ["", "| key | type | default | meaning |", "|---|---|---|---|"]
        lines += _rows(g.name, cls)
    envs = sorted(p.stem for p in (ROOT / "configs" / "env").glob("*.yaml"))
    lines += ["", "## `env`", "", "The env's own keyword arguments (its factory's; each YAML lists them)."
              " Choices (`configs/env/`): " + ", ".join(f"`{e}`" for e in envs) + ".",
              "", "## `experiment`", "", "Whole-run presets applied last (`configs/experiment/`): "
              + ", ".join(f"`{p.stem}`" for p in sorted((ROOT / "configs" / "experiment").glob("*.yaml")))
              + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.config.reference", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/config-reference.md is out of date")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is out of date: run python -m launch.config.reference", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
