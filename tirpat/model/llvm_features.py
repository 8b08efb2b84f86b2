"""The instruction set features LLVM knows, by name: what the target parser checks an ``-mattr``
against (LLVM itself ignores a feature it does not know, with a line on stderr each time it
makes a code generator) and what :mod:`tirpat.model.host_cpu` maps ``/proc/cpuinfo``'s names to.

>>> unknown_features(["+avx2", "-fma", "+foo"])
['+foo']
>>> close_features("avx512bwx")
['avx512bw', ...]
"""

from __future__ import annotations

import difflib
import functools
from typing import Iterable

from tvm.target import Target, codegen

from .tvm_noise import UNRECOGNISED_FEATURE, filtered_native_stderr

__all__ = ["features", "all_features", "unknown_features", "close_features"]


def features(target: Target) -> set[str]:
    """The features LLVM generates code for with ``target``: its CPU's, with ``-mattr``."""
    return set(codegen.llvm_get_cpu_features(target))


@functools.cache
def all_features() -> frozenset[str]:
    """Every feature some CPU LLVM knows for this machine's triple has."""
    triple = codegen.llvm_get_system_triple()
    cpus = codegen.llvm_get_cpu_archlist(Target({"kind": "llvm", "mtriple": triple}))
    return frozenset().union(*(features(Target({"kind": "llvm", "mtriple": triple, "mcpu": str(c)})) for c in cpus))


def unknown_features(mattr: Iterable[str], triple: str | None = None) -> list[str]:
    """The items of ``mattr`` (``+name`` or ``-name``) whose feature LLVM does not know for
    ``triple`` (default: this machine's): a feature LLVM knows is one it enables when asked."""
    triple = triple or codegen.llvm_get_system_triple()
    unknown = []
    with filtered_native_stderr(also=UNRECOGNISED_FEATURE):
        for item in mattr:
            name = str(item).lstrip("+-")
            if not name or name not in features(Target({"kind": "llvm", "mtriple": triple, "mattr": [f"+{name}"]})):
                unknown.append(str(item))
    return unknown


def close_features(name: str) -> list[str]:
    """Up to three features LLVM knows for this machine's triple that are spelt like ``name``."""
    return difflib.get_close_matches(name.lstrip("+-"), sorted(all_features()), n=3)
