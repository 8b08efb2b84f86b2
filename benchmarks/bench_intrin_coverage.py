"""How many of TVM's registered TensorIntrins work as ``Rewriter.from_module`` rules.

For every TensorIntrin registered by ``tvm.s_tir.tensor_intrin.*``: build
``tp.Rewriter.from_module({"pattern": desc, "replacement": impl})``, build a target that runs
the lowered desc on 2 tiles of bigger buffers (``tirpat.testing.intrin.tile_target``), apply
the rule and record the outcome:

- ``rewritten``: the rule fired, and every access the rewritten code makes stays inside the
  tile the site works on;
- ``UNSOUND``: the rule fired, but the rewritten code may read or write outside its tile
  (``tirpat.testing.intrin.tile_escapes``: a vector load running past a row of a strided
  tile, say); an independent check on the rewriter's output;
- ``no match``: the reason is the nearest miss of ``tp.explain(rw, target)`` (its failure
  line; the explanation's first line only says "no match in main");
- ``rule error`` / ``target error`` / ``rewrite error``: the exception text.

Two layouts: ``tiled`` (shape ``2*S``, index ``t*S[d] + i``: strided sub-regions at an
offset in every dimension) and ``stacked`` (shape ``(2,) + S``, index ``(t,) + i``: compact
sub-regions one rank down); each also with int64 loops and indices (``/i64``, the index type
Relax emits; the int32 desc is then converted to int64, as ``tensorize`` converts it). Run:
``python benchmarks/bench_intrin_coverage.py [--layout tiled|stacked|both] [--index-dtype
int32|int64|both] [--filter SUBSTRING] [--verbose]``. Importing the intrinsics takes about
15 s; the rest about 2 s.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time

import tirpat as tp
from tirpat.testing.intrin import registered_intrins, tile_escapes, tile_target

LAYOUTS = ("tiled", "stacked")
INDEX_DTYPES = ("int32", "int64")


def case_name(layout: str, index_dtype: str) -> str:
    return layout if index_dtype == "int32" else f"{layout}/i64"


def first_line(text: str) -> str:
    lines = [l.strip() for l in str(text).strip().splitlines() if l.strip()]
    return lines[0] if lines else ""


def _error_line(err: Exception) -> str:
    """The most telling line of an exception: TVM's ``Check failed``/error line if any."""
    lines = [l.strip() for l in str(err).strip().splitlines() if l.strip()]
    for l in reversed(lines):
        if re.search(r"Error|Check failed|error:", l):
            return f"{type(err).__name__}: {l}"
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"


def classify(name, desc, impl, layout, index_dtype="int32"):
    """``(status, reason)`` for one intrinsic on one layout and index type."""
    try:
        rw = tp.Rewriter.from_module({"pattern": desc, "replacement": impl}, name=name)
    except Exception as err:  # noqa: BLE001 - reported, not raised
        return "rule error", _error_line(err)
    try:
        target = tile_target(desc, layout=layout, index_dtype=index_dtype)
    except Exception as err:  # noqa: BLE001
        return "target error", _error_line(err)
    try:
        new = rw(target)
    except Exception as err:  # noqa: BLE001
        return "rewrite error", _error_line(err)
    if rw.report.counts.get(name):
        bad = tile_escapes(new, layout)
        if bad:
            return "UNSOUND", f"{len(bad)} access(es) outside the tile, e.g. {bad[0]}"
        return "rewritten", ""
    ex = tp.explain(rw, target)
    if ex.misses:
        return "no match", ex.misses[0].failure.reason.strip().splitlines()[0]
    return "no match", first_line(ex)


def reason_group(reason: str) -> str:
    """A reason with names, index expressions and numbers blanked, to count failures by kind."""
    r = re.sub(r"(parameter|region of|bound to|buffer\(?s?\)?) \w+", r"\1 X", reason)
    r = re.sub(r"\w+\[[^\]]*\]", "X[...]", r)
    r = re.sub(r"\[[^\]]*\]", "[...]", r)
    r = re.sub(r"(starts at element|found|offsets) [^,]*", r"\1 ...", r)
    r = re.sub(r"\d+", "N", r)
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", choices=LAYOUTS + ("both",), default="both")
    ap.add_argument("--index-dtype", choices=INDEX_DTYPES + ("both",), default="both")
    ap.add_argument("--filter", default="", help="only intrinsics whose name contains this")
    ap.add_argument("--verbose", action="store_true", help="print the target and explanation of failures")
    args = ap.parse_args(argv)
    cases = [(l, d) for d in (INDEX_DTYPES if args.index_dtype == "both" else (args.index_dtype,))
             for l in (LAYOUTS if args.layout == "both" else (args.layout,))]
    layouts = [case_name(l, d) for l, d in cases]

    from tvm.s_tir import TensorIntrin

    t0 = time.perf_counter()
    intrins = [(m, n) for m, n in registered_intrins() if args.filter in n]
    t_import = time.perf_counter() - t0
    rows = []
    t1 = time.perf_counter()
    for module, name in intrins:
        ti = TensorIntrin.get(name)
        results = {case_name(l, d): classify(name, ti.desc, ti.impl, l, d) for l, d in cases}
        rows.append((module, name, results))
        if args.verbose:
            for (layout, dtype), (status, reason) in zip(cases, results.values()):
                if status not in ("rewritten",):
                    print(f"--- {name} [{case_name(layout, dtype)}] {status}: {reason}")
                    try:
                        target = tile_target(ti.desc, layout=layout, index_dtype=dtype)
                        print(target.script())
                        print(tp.explain(tp.Rewriter.from_module({"pattern": ti.desc, "replacement": ti.impl}, name),
                                         target))
                    except Exception as err:  # noqa: BLE001
                        print("   ", _error_line(err))
    t_run = time.perf_counter() - t1

    wn = max(len(n) for _, n, _ in rows) if rows else 10
    head = f"{'module':<18} {'intrinsic':<{wn}} " + " ".join(f"{l:<13}" for l in layouts) + " reason (first layout that fails)"
    print(head)
    print("-" * len(head))
    for module, name, results in rows:
        statuses = " ".join(f"{results[l][0]:<13}" for l in layouts)
        reason = next((results[l][1] for l in layouts if results[l][0] != "rewritten"), "")
        print(f"{module:<18} {name:<{wn}} {statuses} {reason}")
    print()
    total = len(rows)
    print(f"{total} intrinsics (import {t_import:.1f} s, rules+targets+rewrites {t_run:.1f} s)")
    for layout in layouts:
        counts = collections.Counter(r[layout][0] for _, _, r in rows)
        share = counts["rewritten"] / total if total else 0.0
        print(f"[{layout}] rewritten {counts['rewritten']}/{total} = {share:.0%}; "
              + ", ".join(f"{s} {c}" for s, c in counts.most_common() if s != "rewritten"))
        by_module = collections.defaultdict(collections.Counter)
        for module, _, r in rows:
            by_module[module][r[layout][0] == "rewritten"] += 1
        print("    by module: " + ", ".join(f"{m} {c[True]}/{c[True] + c[False]}" for m, c in sorted(by_module.items())))
        groups = collections.Counter((r[layout][0], reason_group(r[layout][1])) for _, _, r in rows
                                     if r[layout][0] != "rewritten")
        for (status, group), c in groups.most_common():
            print(f"    {c:4d}  {status}: {group}")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
