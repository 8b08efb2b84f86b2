"""The ``tirpat`` command line (also ``python -m tirpat``).

::

    tirpat targets                                  registered backends, options, types, defaults
    tirpat compile MODEL -t "accel, llvm" -o m.tirpat [--report r.json] [--verbose] [--records DIR]
    tirpat run m.tirpat [--inputs in.npz] [-o out.npz] [--profile] [--timeline t.png|t.json]
    tirpat quantize MODEL.onnx -o OUT.onnx [--calibration calib.npz] [--per-channel]
    tirpat tune MODEL -t "accel, llvm" --trials N --records DIR [--rpc HOST:PORT:KEY]
    tirpat rpc-server --tracker HOST:PORT --key KEY [--host 127.0.0.1]

Each command is one module of this package defining ``COMMAND``, a
:class:`~tirpat.cli.command.Command`; :func:`main` finds every such module, so adding a
command is adding a module. Problems the user can fix (a missing file, a malformed target,
an input of the wrong shape) are one line on stderr and exit status 1; usage errors exit
with 2; ``--debug`` shows the traceback instead.

>>> main(["targets"])        # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pkgutil
import sys
import traceback
import warnings
from typing import Iterator, Sequence

from .command import Command, CommandError

__all__ = ["main", "commands", "Command", "CommandError"]

PROG = "tirpat"


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (and exit status 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def commands() -> dict[str, Command]:
    """Every command of the ``tirpat`` CLI by name: each module of this package with a ``COMMAND``.

    >>> sorted(commands())[:3]      # doctest: +SKIP
    ['compile', 'run', 'targets']
    """
    found = {}
    for info in pkgutil.iter_modules(__path__):
        command = getattr(importlib.import_module(f"{__name__}.{info.name}"), "COMMAND", None)
        if isinstance(command, Command):
            found[command.name] = command
    return dict(sorted(found.items()))


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="tirpat: compile models for accelerators through TVM, "
                     "with each backend's TIR patterns doing the offload.",
                     epilog=f"'{PROG} COMMAND --help' shows a command's options and an example.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)
    parser.commands = {}        # each command's parser, to report a usage error in its name
    for command in commands().values():
        p = sub.add_parser(command.name, help=command.help, description=command.description or command.help,
                           epilog=f"example:\n  {command.example}", formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an error")
        command.arguments(p)
        p.set_defaults(command=command)
        parser.commands[command.name] = p
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tirpat")
    except PackageNotFoundError:
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tirpat`` command line with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    command: Command | None = getattr(args, "command", None)
    if extra:       # argparse reports these as the top-level parser's: say the command's name and help
        (parser.commands[command.name] if command else parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if command is None:
        parser.print_help(sys.stderr)
        return 2
    prog = f"{PROG} {command.name}"
    try:
        with _warnings_as_lines(prog):
            return int(command.run(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:         # `tirpat targets | head`: the reader left, nothing to say
        sys.stderr.close()
        return 1
    except Exception as err:  # noqa: BLE001 - the command line reports every failure as one line
        if args.debug:
            traceback.print_exc()
        print(f"{prog}: error: {describe(err)}", file=sys.stderr)
        return 1


_LIMIT = 600


def describe(err: BaseException) -> str:
    """An exception as one line: its message (lines joined), with the exception's type
    where the type says something the message may not.

    >>> describe(ValueError("bad\\n  thing"))
    'bad thing'
    >>> describe(FileNotFoundError(2, "No such file or directory", "m.onnx"))
    'm.onnx: No such file or directory'
    >>> describe(KeyError("no backend named 'x'"))
    "no backend named 'x'"
    >>> import struct
    >>> describe(struct.error("argument out of range"))
    'struct.error: argument out of range'
    """
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        return f"{err.filename}: {err.strerror}"
    message = err.args[0] if type(err) is KeyError and len(err.args) == 1 and isinstance(err.args[0], str) else err
    text = " ".join(line.strip() for line in str(message).splitlines() if line.strip()) or repr(err)
    kind = type(err)
    if not isinstance(err, CommandError) and kind.__module__ != "builtins" and not kind.__name__.endswith("TargetError"):
        # a bare "error" (struct.error, zlib.error) says which module it came from
        name = f"{kind.__module__}.{kind.__name__}" if kind.__name__.lower() == "error" else kind.__name__
        text = f"{name}: {text}"
    if len(text) > _LIMIT:
        text = text[:_LIMIT] + " ... (--debug shows all of it)"
    return text


@contextlib.contextmanager
def _warnings_as_lines(prog: str) -> Iterator[None]:
    """Show Python warnings as ``prog: warning: message``, not with a source line."""
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"{prog}: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield
