"""Options written once: a dataclass field carries its command-line flag, help text and default.

``flag(...)`` makes such a field; ``add_flags`` turns a dataclass's fields into ``argparse`` arguments and
``from_args`` builds the dataclass back from the parsed namespace. A subcommand's flags, the config object its
code takes, and the defaults of both then cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Iterable, Protocol, TypeVar

T = TypeVar("T")


class ArgumentAdder(Protocol):
    """An ``argparse`` parser or argument group."""

    def add_argument(self, *names: str, **kwargs: Any) -> Any: ...

_REQUIRED = object()


def flag(default: Any = _REQUIRED, help: str | None = None, *, name: str | None = None, **argparse_kwargs: Any) -> Any:
    """A dataclass field that is also a command-line flag.

    ``name`` defaults to ``--`` and the field's name with dashes; ``argparse_kwargs`` go to ``add_argument``
    (``type``, ``choices``, ``action``, ``nargs``, ``metavar``). Without a default the flag is required.
    """
    metadata = {"flag": name, "help": help, "argparse": argparse_kwargs}
    if default is _REQUIRED:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag_fields(cls: type, exclude: Iterable[type] = ()) -> list[dataclasses.Field]:
    """The fields of ``cls`` that are flags, less those declared by the dataclasses in ``exclude``."""
    skip = {f.name for base in exclude for f in dataclasses.fields(base)}
    return [f for f in dataclasses.fields(cls) if "flag" in f.metadata and f.name not in skip]


def add_flags(parser: ArgumentAdder, cls: type, exclude: Iterable[type] = ()) -> None:
    """One ``add_argument`` per flag field of ``cls`` (less those of ``exclude``), in declaration order."""
    for f in flag_fields(cls, exclude):
        kwargs = dict(f.metadata["argparse"])
        if f.default is dataclasses.MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = f.default
        if f.metadata["help"] is not None:
            kwargs["help"] = f.metadata["help"]
        parser.add_argument(f.metadata["flag"] or "--" + f.name.replace("_", "-"), dest=f.name, **kwargs)


def from_args(cls: type[T], args: argparse.Namespace) -> T:
    """``cls`` built from the namespace's values of its flag fields."""
    return cls(**{f.name: getattr(args, f.name) for f in flag_fields(cls)})
