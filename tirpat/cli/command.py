"""What a ``tirpat`` subcommand is: a :class:`Command` in a module of :mod:`tirpat.cli`.

A command module keeps its imports light (``argparse`` and this module at the top; TVM,
numpy and the model level inside ``run``) so that ``tirpat --help`` stays fast, and raises
:class:`CommandError` for anything the user can fix: :func:`tirpat.cli.main` prints it as
one line and exits with status 1.

>>> def arguments(parser):
...     parser.add_argument("name")
>>> def run(args):
...     print(f"hello, {args.name}")
...     return 0
>>> COMMAND = Command("hello", "say hello", "tirpat hello world", arguments, run)
>>> COMMAND.name, COMMAND.example
('hello', 'tirpat hello world')
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

__all__ = ["Command", "CommandError"]


class CommandError(Exception):
    """A problem the user can fix (a bad file, a wrong input): printed as one line, exit 1."""


@dataclass(frozen=True)
class Command:
    """One subcommand: its ``name``, a one-line ``help``, an ``example`` command line shown
    by ``--help``, ``arguments(parser)`` to declare its options and ``run(args) -> int``.

    ``description`` is the longer text under the usage line (defaults to ``help``).
    """

    name: str
    help: str
    example: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str = ""
