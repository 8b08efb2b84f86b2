"""Testing helpers for rule authors: PrimFunc generators and reference implementations.

>>> from tirpat.testing import copy_nests, reference_copy_rule, run
"""

from .reference import COPY_FUNC, reference_copy_rule, run, tensor_view
from .strategies import (
    ELEMENTWISE_OPS,
    REDUCTIONS,
    UNARY_OPS,
    Access,
    CopyCase,
    ElementwiseCase,
    ReductionCase,
    TiledReductionCase,
    UnaryCase,
    copy_nests,
    elementwise_nests,
    legalized_matmul,
    random_array,
    reduction_nests,
    tile_gemm,
    tiled_matmul,
    tiled_reductions,
    unary_nests,
)

__all__ = [
    "COPY_FUNC", "ELEMENTWISE_OPS", "REDUCTIONS", "UNARY_OPS", "Access", "CopyCase", "ElementwiseCase",
    "ReductionCase", "TiledReductionCase", "UnaryCase", "copy_nests", "elementwise_nests", "legalized_matmul",
    "random_array", "reduction_nests", "reference_copy_rule", "run", "tensor_view", "tile_gemm", "tiled_matmul",
    "tiled_reductions", "unary_nests",
]
