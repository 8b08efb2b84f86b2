"""Testing helpers for rule authors: PrimFunc generators and reference implementations; for
backend authors, a differential test of a built model against llvm.

>>> from tirpat.testing import assert_matches_llvm, copy_nests, reference_copy_rule, run
"""

from .differential import assert_matches_llvm, llvm_reference, random_inputs
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
    "assert_matches_llvm", "llvm_reference", "random_inputs",
    "COPY_FUNC", "ELEMENTWISE_OPS", "REDUCTIONS", "UNARY_OPS", "Access", "CopyCase", "ElementwiseCase",
    "ReductionCase", "TiledReductionCase", "UnaryCase", "copy_nests", "elementwise_nests", "legalized_matmul",
    "random_array", "reduction_nests", "reference_copy_rule", "run", "tensor_view", "tile_gemm", "tiled_matmul",
    "tiled_reductions", "unary_nests",
]
