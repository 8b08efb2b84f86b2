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
from tvm import ir, tirx

from .analysis import const_int, dtype_of, simplify, substitute

_THREAD_EXTENT = "thread_extent"


class ThreadLaunchError(ValueError):
    """Two launches of one thread tag in one kernel disagree on the number of threads."""


def launches_threads(stmt) -> bool:
    """True when ``stmt`` launches threads (a ``thread_extent`` attribute, or a loop bound
    to a thread)."""
    found = []

    def on_stmt(node):
        if _launch(node) is not None:
            found.append(node)

    tvm_ffi.structural_walk(stmt, ((tirx.AttrStmt, tirx.For), on_stmt))
    return bool(found)


def _launch(node):
    """``(tag, variable, extent)`` of a thread launch: ``AttrStmt(thread_extent)`` in lowered
    TIR, a thread-bound loop before ``LowerOpaqueBlock``; else None."""
    kind = type(node)
    if kind is tirx.AttrStmt and node.attr_key == _THREAD_EXTENT and isinstance(node.node, tirx.IterVar):
        return node.node.thread_tag, node.node.var, node.value
    if kind is tirx.For and int(node.kind) == int(tirx.ForKind.THREAD_BINDING) and node.thread_binding is not None \
            and const_int(node.min) == 0:
        return node.thread_binding.thread_tag, node.loop_var, node.extent
    return None


def _relaunch(launch, body, tag, var, extent):
    """``launch`` (an AttrStmt or a thread-bound loop) around ``body``."""
    if type(launch) is tirx.AttrStmt:
        return tirx.AttrStmt(launch.node, _THREAD_EXTENT, launch.value, body)
    return tirx.For(launch.loop_var, launch.min, launch.extent, launch.kind, body, launch.thread_binding,
                    launch.annotations, launch.step)


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
            tag, var, extent = _launch(launch)
            if tag not in launched:
                launched[tag] = (var, extent)
                return False
            known, known_extent = launched[tag]
            if not _same(known_extent, extent):
                failure.append(ThreadLaunchError(
                    f"{tag} is launched with {extent} threads inside a kernel that launches it with "
                    f"{known_extent}: all launches of {tag} in a kernel must have the same extent"))
            renames.append((var, _as(known, var)))
            return True

        node = root
        while _launch(node) is not None:  # the launches directly nested at the kernel's top
            if not merge(node):
                kept.append(node)
            node = node.body

        def inner(stmt, mut):
            if failure or _launch(stmt) is None:
                return mut.default_mutate(stmt)
            if not merge(stmt):
                moved.append(stmt)
            return mut.mutate(stmt.body)

        body = tvm_ffi.structural_mutate(node, [((tirx.AttrStmt, tirx.For), inner)])
        if not renames and not moved:
            return root
        if renames:
            body = substitute(body, renames)
        # Moved launches take the form of the kernel's own (loops before LowerOpaqueBlock).
        form = kept[-1]
        for launch in reversed(moved):
            tag, var, extent = _launch(launch)
            if type(form) is tirx.For and type(launch) is not tirx.For:
                body = tirx.For(var, tirx.IntImm(dtype_of(var), 0), extent, tirx.ForKind.THREAD_BINDING, body,
                                tirx.IterVar(ir.Range.from_min_extent(0, extent), var, 1, tag))
            elif type(form) is tirx.AttrStmt and type(launch) is not tirx.AttrStmt:
                body = tirx.AttrStmt(tirx.IterVar(ir.Range.from_min_extent(0, extent), var, 1, tag),
                                     _THREAD_EXTENT, extent, body)
            else:
                body = _relaunch(launch, body, tag, var, extent)
        for launch in reversed(kept):
            body = _relaunch(launch, body, *_launch(launch))
        return body

    def outer(node, mut):
        if failure or _launch(node) is None:
            return mut.default_mutate(node)
        return kernel(node)

    result = tvm_ffi.structural_mutate(stmt, [((tirx.AttrStmt, tirx.For), outer)])
    if failure:
        raise failure[0]
    return result


def _same(a, b) -> bool:
    return a.same_as(b) or const_int(simplify(a - b)) == 0


def _as(var, like):
    """``var`` in the integer type of ``like`` (thread variables may differ in width)."""
    return var if dtype_of(var) == dtype_of(like) else tirx.Cast(dtype_of(like), var)
