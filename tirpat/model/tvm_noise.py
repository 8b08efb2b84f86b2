"""TVM 0.27's stray debug lines, kept off the user's terminal.

Saving or loading any Relax VM executable makes TVM 0.27 log one ``Warning: Scope Saving:``
(or ``Scope Loaded:``) line per memory scope (``src/runtime/vm/executable.cc``, a debug
print left at warning level), and a Relax frontend that failed leaves a ``BlockBuilder
destroyed with remaining blocks!`` warning for when it is freed. They say nothing a user can
act on, and they break "quiet in a pipe" (and "the error is the last line").
:func:`filtered_native_stderr` captures the process's native stderr (file descriptor 2,
where TVM's C++ logging writes) while a block runs and passes every other line through once
it ends.

>>> with filtered_native_stderr():
...     pass
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

__all__ = ["filtered_native_stderr", "NOISE", "UNRECOGNISED_FEATURE"]

#: Lines of native stderr that are dropped.
NOISE = re.compile(r"vm/executable\.cc:\d+: Warning: Scope (Saving|Loaded):"
                   r"|block_builder\.cc:\d+: Warning: BlockBuilder destroyed with remaining blocks!")


#: What LLVM prints for each -mattr feature it does not know, whenever it makes a code generator
#: (the target parser refuses such a feature itself: tirpat.model.target).
UNRECOGNISED_FEATURE = re.compile(r"is not a recognized feature for this target")


@contextlib.contextmanager
def filtered_native_stderr(also: re.Pattern | None = None) -> Iterator[None]:
    """Run the block with fd 2 captured, then write what it printed, less :data:`NOISE` (and
    the lines ``also`` finds)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                    if not NOISE.search(line) and not (also is not None and also.search(line))]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
