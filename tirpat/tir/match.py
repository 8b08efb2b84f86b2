"""Matching, as users call it: one node (:func:`match`), or every site in a function
(:func:`find_all`). The search itself is :mod:`tirpat.tir.engine`'s.

>>> i, j = tp.is_var("i"), tp.is_var("j")
>>> A = tvm.te.placeholder((4, 8), "float32", name="A")
>>> func = tp.lower(tvm.te.create_prim_func([A, tvm.te.compute((8, 4), lambda i, j: A[j, i], name="B")]))
>>> (m,) = tp.find_all(tp.is_nest([i, j], tp.is_store(tp.is_buffer("B"), [i, j], tp.wildcard("v"))), func)
>>> m["v"], [l.loop_var.name for l in m.loops], m.region("B").strides
(A[j, i], ['i', 'j'], (4, 1))
"""

from __future__ import annotations

from tvm import ir, tirx

from .analysis import has_blocks
from .canonical import canonicalize
from .engine import Match
from .pattern import Pattern
from .scan import Report, Rule, RuleIndex, Scan


def match(pattern: Pattern, node, context: tuple = ()) -> Match | None:
    """Match ``pattern`` against ``node`` (canonicalised first); a Match or None.
    ``context`` are the For loops around ``node``, outermost first.

    >>> x = tvm.tirx.Var("x", "int32")
    >>> tp.match(tp.is_var("i") + 1, x + 1)["i"].name
    'x'
    """
    if not isinstance(pattern, Pattern):
        raise TypeError(f"match expects a tirpat pattern first, got {type(pattern).__name__} {pattern!r}")
    return pattern.match(node, context)


def find_all(pattern: Pattern, func_or_stmt) -> list[Match]:
    """Every non-overlapping match in pre-order (an outer match wins).

    ``func_or_stmt`` is a PrimFunc, an IRModule (every PrimFunc) or a statement, lowered
    (``tp.lower``): a function that still has ``T.sblock`` blocks is an error.
    """
    if not isinstance(pattern, Pattern):
        raise TypeError(f"find_all expects a tirpat pattern first, got {type(pattern).__name__} {pattern!r}")
    found: list = []
    index = RuleIndex([Rule(pattern, found.append, "find_all")])
    if isinstance(func_or_stmt, ir.IRModule):
        targets = [(gv.name_hint, f) for gv, f in func_or_stmt.functions.items() if isinstance(f, tirx.PrimFunc)]
    elif isinstance(func_or_stmt, tirx.PrimFunc):
        targets = [(None, func_or_stmt)]
    elif isinstance(func_or_stmt, tirx.Stmt):
        targets = [(None, func_or_stmt)]
    else:
        raise TypeError(f"find_all looks in a PrimFunc, an IRModule or a Stmt, got {type(func_or_stmt).__name__}")
    for name, target in targets:
        body = target.body if isinstance(target, tirx.PrimFunc) else target
        if has_blocks(body):
            what = f"function {name}" if name else "the function" if isinstance(target, tirx.PrimFunc) else "the statement"
            raise ValueError(f"find_all: {what} still has T.sblock blocks; patterns match lowered TIR: "
                             f"tp.lower(...) it first")
        params = target.params if isinstance(target, tirx.PrimFunc) else ()
        Scan(index, Report(), name, params, find_only=True).run(canonicalize(body))
    return found
