"""The static shape of a Relax expression, as Python ints: what rules, reports and backends
read before deciding anything about a tensor.

>>> from tvm import relax
>>> static_shape(relax.Var("x", relax.TensorType((1, 8, 4, 4), "int8")))
(1, 8, 4, 4)
>>> static_shape(relax.Var("y", relax.TensorType(ndim=2, dtype="int8"))) is None
True
"""

from __future__ import annotations

from tvm import relax, tirx

__all__ = ["static_shape"]


def static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    """``expr``'s shape if it is a tensor whose every dimension is a constant, else None (a
    symbolic dimension, an unknown shape, a tuple or an object)."""
    ty = expr.ty
    if not (isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)):
        return None
    values = ty.shape.values
    return tuple(int(d) for d in values) if all(isinstance(d, tirx.IntImm) for d in values) else None
