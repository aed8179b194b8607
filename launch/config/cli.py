"""Command-line flags made from a config dataclass, so a secondary command line (``python -m
launch.model.warm_start``) speaks the run's config names: ``--action-noise`` is ``warm_start.action_noise``.

Called by the secondary entry points. Each field becomes ``--<name with dashes>``, typed as the
field (``null`` for an optional one), with the given defaults (the composed run config's values:
what ``make train`` uses) and the field's docstring as its help.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from launch.config.reference import field_docs


def add_fields(parser: argparse.ArgumentParser, cls: type, defaults: Any,
               skip: typing.Container[str] = ()) -> None:
    """One flag per field of dataclass ``cls`` (but ``skip``), defaulting to ``defaults``' values."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind, optional = _unwrap(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=docs[f.name])
        else:
            parser.add_argument(flag, type=_parser(kind, optional), default=default,
                                help=f"{docs[f.name]} (default: {default})")


def values(args: argparse.Namespace, cls: type, skip: typing.Container[str] = ()) -> dict[str, Any]:
    """The parsed flags of ``cls``'s fields, by field name."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in skip}


def _unwrap(t) -> tuple[type, bool]:
    if typing.get_origin(t) is typing.Union:
        args = [a for a in typing.get_args(t) if a is not type(None)]
        return args[0], True
    return t, False


def _parser(kind: type, optional: bool):
    def parse(text: str):
        if optional and text.lower() in ("null", "none"):
            return None
        return kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error messages
    return parse
