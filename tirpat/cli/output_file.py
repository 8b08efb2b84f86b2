"""Where a command writes: every output option (``compile -o``/``--report``, ``quantize -o``,
``run -o``/``--timeline``) is checked by :func:`check_output` before any work starts.

A path may be written when its directory exists and is writable and nothing is there, or a
file of the option's own kind (``.tirpat``, ``.onnx``, ``.npz``, ``.png``, ``.json``) that is
not one of the command's inputs. Anything else (a directory, MODEL itself under any name,
a symlink or a hard link to it included, a ``.py`` the user wrote) is a
:class:`~tirpat.cli.command.CommandError`: one line, exit status 1.

>>> import tempfile, pathlib
>>> here = pathlib.Path(tempfile.mkdtemp())
>>> (here / "notes.txt").write_text("keep me")
7
>>> check_output(here / "out.npz", "-o", ".npz")
>>> check_output(here / "notes.txt", "-o", ".npz")
Traceback (most recent call last):
...
tirpat.cli.command.CommandError: .../notes.txt: exists and its name does not end in .npz; not replacing it (remove it, or choose another -o)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from .command import CommandError

__all__ = ["check_output"]

PathLike = str | os.PathLike | None


def check_output(path: str | os.PathLike, option: str, suffix: str, inputs: Mapping[str, PathLike] | None = None,
                 outputs: Mapping[str, PathLike] | None = None, *, stream: bool = True, why: str = "") -> None:
    """Fail before any work when ``option`` cannot write ``path``: a missing or read-only
    directory, a directory in its place, the path of another of the command's ``outputs``
    (``{"-o": path}``), one of its ``inputs`` (``{"MODEL": path, "--inputs": path}``, None
    for one not given), or an existing file whose name does not end in ``suffix``.

    A device such as ``/dev/stdout`` takes the output when ``stream`` is true; otherwise
    it is refused, ``why`` saying why (a .tirpat is written and read back).
    """
    path = Path(path)
    parent = path.parent
    if not parent.is_dir():
        raise CommandError(f"{path}: no such directory {str(parent)!r}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CommandError(f"{path}: cannot write in {str(parent)!r} (permission denied); choose another {option}")
    for name, other in (outputs or {}).items():
        if other is not None and _same_file(path, Path(other)):
            raise CommandError(f"{path}: {option} and {name} name the same file")
    if not path.exists():
        return
    if path.is_dir():
        raise CommandError(f"{path}: is a directory; {option} names the file to write")
    if not path.is_file():
        if stream:
            return
        raise CommandError(f"{path}: not a regular file, so {option} cannot write there" + (f": {why}" if why else ""))
    for name, source in (inputs or {}).items():
        if source is not None and Path(source).exists() and _same_file(path, Path(source)):
            raise CommandError(f"{path}: {option} names {name} itself; choose another {option}")
    if path.suffix.lower() != suffix:
        raise CommandError(f"{path}: exists and its name does not end in {suffix}; not replacing it "
                           f"(remove it, or choose another {option})")


def _same_file(path: Path, other: Path) -> bool:
    """Whether ``path`` and ``other`` name one file: one path after symlinks, or, both
    existing, one file under two names (a hard link: the same device and inode)."""
    if path.resolve() == other.resolve():
        return True
    try:
        return os.path.samefile(path, other)
    except OSError:             # one does not exist (yet): two names, two files
        return False
