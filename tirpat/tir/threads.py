"""Thread launches a replacement brings in, merged with its kernel's.

An intrinsic's impl often launches its own threads (``T.launch_thread("threadIdx.x", 32)``
around an mma or ldmatrix call). ``Schedule.tensorize`` puts the impl inside the kernel and
TVM's ``UnifyThreadBinding`` then gives every launch of a thread tag in a kernel one
variable, launched once at the kernel's top. tirpat rewrites after that pass, so the
rewriter does the same for the launches its replacements add: a launch of a tag the kernel
already launches is merged into it (its variable becomes the kernel's), and a launch of a
new tag is moved to the bottom of the kernel's launches, where later replacements in the
same kernel merge into it. Outside any kernel a launch starts one and stays where it is.

>>> merge_thread_launches(func.body)   # doctest: +SKIP
"""

from __future__ import annotations

import tvm_ffi
from tvm import tirx

from .analysis import const_int, dtype_of, simplify, substitute

_THREAD_EXTENT = "thread_extent"


class ThreadLaunchError(ValueError):
    """Two launches of one thread tag in one kernel disagree on the number of threads."""


def launches_threads(stmt) -> bool:
    """True when ``stmt`` launches threads (a ``thread_extent`` attribute on an IterVar)."""
    found = []

    def on_attr(node):
        if _launch(node):
            found.append(node)

    tvm_ffi.structural_walk(stmt, (tirx.AttrStmt, on_attr))
    return bool(found)


def _launch(node) -> bool:
    return type(node) is tirx.AttrStmt and node.attr_key == _THREAD_EXTENT and isinstance(node.node, tirx.IterVar)


def merge_thread_launches(stmt):
    """``stmt`` with every thread launch nested inside a kernel merged into the kernel's
    launch of that tag (moved to the kernel's top when it has none). Raises
    :class:`ThreadLaunchError` when two launches of a tag in a kernel have different extents.
    """
    failure: list = []

    def kernel(root):
        launched: dict = {}  # tag -> (variable, extent) of the kernel's launch of it
        kept, moved, renames = [], [], []  # the top launches, the launches moved up, merged variables

        def merge(launch) -> bool:
            """True when ``launch``'s tag is launched already: its variable becomes that one."""
            tag = launch.node.thread_tag
            if tag not in launched:
                return False
            var, extent = launched[tag]
            if not _same(extent, launch.value):
                failure.append(ThreadLaunchError(
                    f"{tag} is launched with {launch.value} threads inside a kernel that launches it with "
                    f"{extent}: all launches of {tag} in a kernel must have the same extent"))
            renames.append((launch.node.var, _as(var, launch.node.var)))
            return True

        node = root
        while _launch(node):  # the launches directly nested at the kernel's top
            if not merge(node):
                kept.append(node)
                launched[node.node.thread_tag] = (node.node.var, node.value)
            node = node.body

        def inner(launch, mut):
            if failure or not _launch(launch):
                return mut.default_mutate(launch)
            if not merge(launch):
                launched[launch.node.thread_tag] = (launch.node.var, launch.value)
                moved.append(launch)
            return mut.mutate(launch.body)

        body = tvm_ffi.structural_mutate(node, [(tirx.AttrStmt, inner)])
        if not renames and not moved:
            return root
        if renames:
            body = substitute(body, renames)
        for launch in reversed(kept + moved):
            body = tirx.AttrStmt(launch.node, _THREAD_EXTENT, launch.value, body)
        return body

    def outer(node, mut):
        if failure or not _launch(node):
            return mut.default_mutate(node)
        return kernel(node)

    result = tvm_ffi.structural_mutate(stmt, [(tirx.AttrStmt, outer)])
    if failure:
        raise failure[0]
    return result


def _same(a, b) -> bool:
    return a.same_as(b) or const_int(simplify(a - b)) == 0


def _as(var, like):
    """``var`` in the integer type of ``like`` (thread variables may differ in width)."""
    return var if dtype_of(var) == dtype_of(like) else tirx.Cast(dtype_of(like), var)
