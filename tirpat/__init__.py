"""tirpat: a pattern language and rewriter for TVM's lowered tensor IR.

>>> import tirpat as tp
>>> i, j = tp.is_var("i"), tp.is_var("j")
>>> A, B = tp.is_buffer("A"), tp.is_buffer("B")
>>> copy = tp.is_nest([i, j], tp.is_store(B, [i, j], A[i, j]))
>>> rw = tp.Rewriter.from_pattern(copy, lambda m: None)
"""

from .explain import Explanation, explain
from .match import Match, find_all, match
from .module_rule import rewriter
from .pattern import (
    Pattern,
    affine,
    is_buffer,
    is_call,
    is_const,
    is_copy,
    is_for,
    is_if,
    is_load,
    is_nest,
    is_seq,
    is_store,
    is_var,
    loop,
    max,
    min,
    wildcard,
)
from .pipeline import lower, lower_blocks, register_pipeline
from .region import CopyRegion, Region, RegionError, padding
from .rewrite import Report, RewriteError, Rewriter, Rule, Site

__all__ = [
    "CopyRegion", "Explanation", "Match", "Pattern", "Region", "RegionError", "Report",
    "RewriteError", "Rewriter", "Rule", "Site", "affine", "explain", "find_all", "is_buffer",
    "is_call", "is_const", "is_copy", "is_for", "is_if", "is_load", "is_nest", "is_seq",
    "is_store", "is_var", "loop", "lower", "lower_blocks", "match", "max", "min", "padding",
    "register_pipeline", "rewriter", "wildcard",
]
