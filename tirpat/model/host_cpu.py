"""What this machine's CPU can run: a host target whose ``-mcpu`` or ``-mattr`` asks for an
instruction set extension the CPU lacks compiles, and its code then stops with an illegal
instruction (SIGILL) when it runs. :func:`check_runs_here` refuses such a target first.

The host's features are what LLVM's name for this CPU implies (the CPU TVM's code
generator detects, ``tvm.target.codegen.llvm_get_system_cpu()``), together with those the
kernel reports in ``/proc/cpuinfo`` (a virtual machine may offer more than its CPU model
says). A target's features are LLVM's for its ``-mcpu`` with its ``-mattr`` applied
(``llvm_get_cpu_features``, implied features included: ``+avx512bw`` needs ``avx512f``).
LLVM's tuning features (``fast-gather``, ``slow-shld``, ``prefer-256-bit``, ...) change
which instructions the compiler prefers, not which exist, and are not compared.

>>> generic = frozenset(features(Target({"kind": "llvm"})))
>>> missing_features(Target({"kind": "llvm", "mattr": ["+avx2"]}), host=generic)
['avx', 'avx2', 'sse3', 'sse4.1', 'sse4.2', 'ssse3']
>>> missing_features(Target({"kind": "llvm", "mattr": ["+fast-gather"]}), host=generic)   # tuning
[]
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from tvm.target import Target, codegen

from .target import TargetError
from .llvm_features import all_features, features

__all__ = ["features", "host_features", "missing_features", "check_runs_here", "describe"]

# LLVM's tuning features, by the prefixes and names X86.td (and AArch64.td) give them
_TUNING = re.compile(r"(fast|slow|tuning|prefer|no-bypass-delay|false-deps|allow-light|idiv[lq]-to|lea-|use-|"
                     r"pad-short|sbb-dep|fuse-|enable-select-opt)|(branchfusion|macrofusion|vzeroupper|ermsb|fsrm|"
                     r"64bit-mode)$")
# /proc/cpuinfo's names of features LLVM spells otherwise (others differ by '.', '-' or '_' only)
_CPUINFO_ALIASES = {"pni": "sse3", "pclmulqdq": "pclmul", "abm": "lzcnt", "lahf_lm": "sahf", "rdrand": "rdrnd",
                    "3dnowprefetch": "prfchw", "bmi1": "bmi", "sha_ni": "sha", "lm": "64bit"}


@functools.cache
def host_features() -> frozenset[str]:
    """The features of this machine's CPU, by LLVM's names: those its LLVM CPU name implies,
    and those ``/proc/cpuinfo`` lists (where the system has one)."""
    found = features(Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()}))
    reported = _cpuinfo_flags()
    if reported:
        by_key = {_key(name): name for name in all_features()}
        found |= {by_key[_key(_CPUINFO_ALIASES.get(flag, flag))] for flag in reported
                  if _key(_CPUINFO_ALIASES.get(flag, flag)) in by_key}
        if "sse4_2" in reported:
            found.add("crc32")          # SSE4.2's CRC32 instruction, a feature of its own in LLVM
    return frozenset(found)


def missing_features(target: Target, host: frozenset[str] | None = None) -> list[str]:
    """The instruction set features ``target`` (an ``llvm`` target) generates code for that
    ``host`` (default: :func:`host_features`) lacks, sorted; tuning features aside."""
    host = host_features() if host is None else host
    return sorted(f for f in features(target) - host if not _TUNING.match(f))


def check_runs_here(target: Target, *, what: str = "", hint: str = "") -> None:
    """A :class:`~tirpat.model.target.TargetError` when code compiled for ``target`` cannot
    run on this CPU: another architecture (``-mtriple``), or features it lacks. ``what``
    names what was compiled for it (default: the target itself), ``hint`` what to do.

    Targets of other kinds than ``llvm`` are not the host's business here (the target
    parser refuses them as hosts)."""
    if target.kind.name != "llvm":
        return
    system = codegen.llvm_get_system_triple()
    triple = str(target.export().get("mtriple") or system)
    what = what or f"the host target {describe(target)!r}"
    cpu = codegen.llvm_get_system_cpu()
    if _arch(triple) != _arch(system):
        raise TargetError(f"{what} is for {_arch(triple)} ({triple}); this machine is {_arch(system)}, so that code "
                          f"cannot run here" + (f"; {hint}" if hint else ""))
    missing = missing_features(target)
    if missing:
        raise TargetError(f"{what} needs {', '.join(missing)}, which this CPU ({cpu}) lacks: its code would stop "
                          "with an illegal instruction here" + (f"; {hint}" if hint else ""))


def describe(target: Target) -> str:
    """``target`` as a target string piece of what sets its instructions: its kind and its
    ``-mtriple``, ``-mcpu`` and ``-mattr`` if given.

    >>> describe(Target({"kind": "llvm", "mcpu": "skylake", "mattr": ["+avx2", "+fma"]}))
    'llvm -mcpu=skylake -mattr=+avx2,+fma'
    """
    config = target.export()
    given = [f"-{key}={value if isinstance(value, str) else ','.join(value)}" for key in ("mtriple", "mcpu", "mattr")
             if (value := config.get(key)) and not (key == "mtriple" and value == codegen.llvm_get_system_triple())]
    return " ".join([target.kind.name, *given])


def _arch(triple: str) -> str:
    return triple.split("-", 1)[0]


def _key(name: str) -> str:
    return re.sub(r"[._-]", "", name.lower())


def _cpuinfo_flags() -> set[str]:
    """The first processor's feature flags in ``/proc/cpuinfo`` (x86: ``flags``, Arm:
    ``Features``), or nothing where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    match = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.M)
    return set(match.group(1).split()) if match else set()
