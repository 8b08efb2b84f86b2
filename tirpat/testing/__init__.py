"""Testing helpers for rule authors: PrimFunc generators and reference implementations.

>>> from tirpat.testing import copy_nests, reference_copy_rule, run
"""

from .reference import COPY_FUNC, reference_copy_rule, run, tensor_view
from .strategies import (
    CopyCase,
    ElementwiseCase,
    TiledReductionCase,
    copy_nests,
    elementwise_nests,
    legalized_matmul,
    random_array,
    tile_gemm,
    tiled_matmul,
    tiled_reductions,
)

__all__ = [
    "COPY_FUNC", "CopyCase", "ElementwiseCase", "TiledReductionCase", "copy_nests",
    "elementwise_nests", "legalized_matmul", "random_array", "reference_copy_rule", "run", "tensor_view",
    "tile_gemm", "tiled_matmul", "tiled_reductions",
]
