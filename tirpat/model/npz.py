"""Named arrays from an ``.npz`` file, never unpickled.

Calibration data (``tp.quantize``) and a model's inputs (``tirpat run --inputs``) come as an
``.npz`` keyed by name. numpy falls back to pickle for a file that is neither an ``.npz`` nor
an ``.npy`` (a model passed by mistake, a text file), and an ``.npz`` of Python objects needs
pickle too; its error then advises ``allow_pickle=True``, which is not advice for a user who
gave the wrong file. :func:`load_npz` never loads a pickle and says what the file is instead.

>>> import pathlib, tempfile
>>> bad = pathlib.Path(tempfile.mkdtemp(), "bad.npz")
>>> _ = bad.write_text("x,y\\n1,2\\n")
>>> load_npz(bad)
Traceback (most recent call last):
tirpat.model.npz.NotAnNpzError: not an .npz of arrays (neither a zip archive of .npy arrays nor an .npy file)
>>> np.savez(bad.with_name("good.npz"), x=np.arange(3))
>>> load_npz(bad.with_name("good.npz"))
{'x': array([0, 1, 2])}
"""

from __future__ import annotations

import os
import zipfile

import numpy as np

__all__ = ["load_npz", "NotAnNpzError"]


class NotAnNpzError(ValueError):
    """A file that is not an ``.npz`` of arrays; the message says what it is instead."""


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` at ``path``, by name, in the file's order.

    Raises ``FileNotFoundError`` for a missing file and :class:`NotAnNpzError` (a
    ``ValueError``) for anything else that is not an ``.npz`` of arrays: a single ``.npy``
    array (it has no names), another kind of file, an archive of Python objects.
    """
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            raise NotAnNpzError(f"a single .npy array of shape {list(loaded.shape)}, not an .npz of named arrays")
        with loaded:
            # (numpy gives a member that is no .npy as its bytes: a .tirpat, any zip, would "load")
            others = [member for member in loaded.zip.namelist() if not member.endswith(".npy")]
            if others:
                raise NotAnNpzError(f"a zip archive of other files than .npy arrays ({', '.join(others[:3])}"
                                    f"{', ...' if len(others) > 3 else ''}), not an .npz")
            return {name: loaded[name] for name in loaded.files}
    except (FileNotFoundError, NotAnNpzError):
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise NotAnNpzError(f"not an .npz of arrays ({_why_not(path, err)})") from err


def _why_not(path: str | os.PathLike, err: Exception) -> str:
    """Why numpy could not read ``path`` as arrays, without its advice to unpickle it."""
    if "allow_pickle" not in str(err):
        return str(err)
    if zipfile.is_zipfile(path):
        return "it holds arrays of Python objects, which are not loaded"
    return "neither a zip archive of .npy arrays nor an .npy file"
