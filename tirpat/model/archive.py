"""The ``.tirpat`` file: a zip archive of the compiled library (``model.so``) and a JSON
manifest (``manifest.json``) that records, besides what :func:`tirpat.load` needs, the
library's size and SHA-256.

:func:`read_archive` checks the archive before anything of it is loaded: the manifest has
every key (with the right kind of value), and the library is whole and is the one the
manifest was written with, else a ``ValueError`` names the file and what is wrong. The
library is extracted into a private temporary directory that is removed whatever happens.

The check finds a damaged or edited file, not a hostile one: whoever writes a ``.tirpat``
can write its manifest too, and loading the library runs its native code (as loading any
shared library does). Load only ``.tirpat`` files you trust.

>>> import tempfile, pathlib
>>> here = pathlib.Path(tempfile.mkdtemp())
>>> (here / "lib.so").write_bytes(b"not really a library")
20
>>> manifest = {"format": FORMAT, "entry": "main", "host": {"kind": "llvm"}, "backends": [], "inputs": [],
...             "report": {}}
>>> write_archive(here / "m.tirpat", here / "lib.so", manifest)
>>> with read_archive(here / "m.tirpat") as (read, library):
...     read["library"]["size"], pathlib.Path(library).read_bytes()
(20, b'not really a library')
>>> with zipfile.ZipFile(here / "m.tirpat") as z:
...     text = z.read(MANIFEST)
>>> with zipfile.ZipFile(here / "cut.tirpat", "w") as z:     # the library cut short, the manifest kept
...     z.writestr(LIBRARY, b"not really"); z.writestr(MANIFEST, text)
>>> with read_archive(here / "cut.tirpat"):                 # doctest: +ELLIPSIS
...     pass
Traceback (most recent call last):
...
ValueError: .../cut.tirpat: its model.so is truncated (or replaced): 10 bytes, the manifest records 20
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["FORMAT", "LIBRARY", "MANIFEST", "write_archive", "read_archive"]

#: The export format's name and version, checked by :func:`read_archive`.
FORMAT = "tirpat-model/1"
LIBRARY, MANIFEST = "model.so", "manifest.json"

# The manifest's keys and the JSON type of each (the library's record is added on writing).
_KEYS = {"format": str, "entry": str, "host": dict, "backends": list, "inputs": list, "report": dict, "library": dict}
_CHUNK = 1 << 20


def write_archive(path: str | os.PathLike, library: str | os.PathLike, manifest: dict,
                  default: Callable[[Any], Any] | None = None) -> None:
    """Write ``library`` and ``manifest`` to the archive ``path``, with the library's size
    and SHA-256 recorded in the manifest's ``library`` entry; ``default`` turns what JSON
    cannot write into what it can (``json.dumps``'s argument)."""
    digest = hashlib.sha256()
    with open(library, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    record = {"name": LIBRARY, "size": os.path.getsize(library), "sha256": digest.hexdigest()}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.write(library, LIBRARY)
        z.writestr(MANIFEST, json.dumps({**manifest, "library": record}, indent=1, default=default))


@contextlib.contextmanager
def read_archive(path: str | os.PathLike) -> Iterator[tuple[dict, str]]:
    """``with read_archive(path) as (manifest, library):`` the archive's manifest, checked,
    and the path of its library, checked against the manifest's size and SHA-256, in a
    temporary directory that is removed when the block ends, normally or not.

    Raises ``FileNotFoundError`` when ``path`` is no file, ``ValueError`` naming ``path``
    and the problem for anything else: not a zip archive, another format, a manifest
    without one of its keys, a missing, truncated or changed library.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file {str(path)!r}")
    with tempfile.TemporaryDirectory(prefix="tirpat-") as tmp:
        library = os.path.join(tmp, LIBRARY)
        try:
            with zipfile.ZipFile(path) as z:
                manifest = _manifest(path, z)
                _extract(path, z, manifest["library"], library)
        except (zipfile.BadZipFile, zlib.error, EOFError) as err:
            raise ValueError(f"{path}: not a model exported by tirpat, or a damaged one ({err})") from None
        yield manifest, library


def _manifest(path: Path, z: zipfile.ZipFile) -> dict:
    """The archive's manifest, with every key and the library's record checked."""
    try:
        text = z.read(MANIFEST)
    except KeyError:
        raise ValueError(f"{path}: not a model exported by tirpat (the archive has no {MANIFEST})") from None
    try:
        manifest = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: its {MANIFEST} is not valid JSON ({err})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: its {MANIFEST} is not a JSON object")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file (format {manifest.get('format')!r})")
    for key, kind in _KEYS.items():
        if key not in manifest:
            why = (f"no record of {LIBRARY}'s SHA-256 (a file written before tirpat checked its library, or an "
                   "edited one): compile the model again" if key == "library" else f"no {key!r}")
            raise ValueError(f"{path}: its manifest has {why}")
        if not isinstance(manifest[key], kind):
            raise ValueError(f"{path}: its manifest's {key!r} is a JSON {type(manifest[key]).__name__}, "
                             f"not a {kind.__name__}")
    record = manifest["library"]
    size, sha256 = record.get("size"), record.get("sha256")
    if not isinstance(size, int) or size < 0 or not isinstance(sha256, str) or len(sha256) != 64:
        raise ValueError(f"{path}: its manifest's record of {LIBRARY} has no valid size and SHA-256 ({record!r})")
    return manifest


def _extract(path: Path, z: zipfile.ZipFile, record: dict, target: str) -> None:
    """Copy the library to ``target``, hashing it as it goes (never more bytes than the
    manifest records, and one: enough to know there are more), and compare."""
    try:
        member = z.open(LIBRARY)
    except KeyError:
        raise ValueError(f"{path}: the archive has no {LIBRARY}, the compiled model") from None
    digest, size = hashlib.sha256(), 0
    with member, open(target, "wb") as out:
        while size <= record["size"]:
            chunk = member.read(min(_CHUNK, record["size"] + 1 - size))
            if not chunk:
                break
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    if size < record["size"]:
        raise ValueError(f"{path}: its {LIBRARY} is truncated (or replaced): {size} bytes, the manifest records "
                         f"{record['size']}")
    if size > record["size"]:
        raise ValueError(f"{path}: its {LIBRARY} is longer than the manifest records ({record['size']} bytes): "
                         "the file was changed after tirpat wrote it")
    if digest.hexdigest() != record["sha256"].lower():
        raise ValueError(f"{path}: its {LIBRARY} does not match the SHA-256 its manifest records: the file was "
                         "changed after tirpat wrote it (or damaged)")
