"""The differential corpus at scale: many random int8 models, ``tp.build`` vs ``tvm.compile``.

Builds ``--models`` models of ``tirpat.testing.int8_models`` (seeds ``--start`` onwards; half
of them with epilogues that pass int32, half without, unless ``--overflow`` says otherwise),
each with ``tp.build(mod, TARGET)`` and with ``tvm.compile(mod, "llvm")``, runs both on the
model's inputs and prints a table: models, built, bit-exact, disagreed, failed, and how many
of them ran some MACs on a backend other than the host. Disagreements are grouped by what
their model contains (a partition function called at several sites with different constants;
int32 intermediates that wrap), each with reproducer seeds; failures by their error.

    nice python benchmarks/differential_corpus.py [--models 300] [--start 0] [--target "accel, llvm"]
        [--overflow both|yes|no] [--show 3]

Ctrl-C (or SIGTERM) stops after the model being built and prints the table so far.
A reproducer: ``random_int8_model(SEED, overflow=...)`` and ``compare_with_llvm`` on it
(``--seed SEED --overflow yes|no`` prints that model's layers and the first differing element).
Not run by CI (a few hundred models take a while); the test suite runs the same generator
on a few dozen.
"""

from __future__ import annotations

import argparse
import collections
import re
import signal
import sys
import time
import warnings

from tirpat.testing.int8_models import compare_with_llvm, random_int8_model


def _kind(model) -> str:
    parts = [f"{model.sites} sites of one partition" if model.sites > 1 else "one site per partition",
             "int32 wraps" if model.wraps else "no int32 overflow"]
    return ", ".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=300, help="how many models (default 300)")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--target", default="accel, llvm", help="what tp.build compiles for")
    parser.add_argument("--overflow", choices=["both", "yes", "no"], default="both",
                        help="epilogues that pass int32: alternate (both), always allowed, never")
    parser.add_argument("--show", type=int, default=3, help="reproducer seeds listed per class")
    parser.add_argument("--seed", type=int, help="only this seed: print its model and comparison")
    args = parser.parse_args(argv)
    if args.models < 1:
        parser.error("--models must be at least 1")
    warnings.simplefilter("ignore")           # offload warnings: the report says it per model

    if args.seed is not None:
        model = random_int8_model(args.seed, overflow=args.overflow != "no")
        print(model.describe())
        print(compare_with_llvm(model, args.target))
        return 0

    counts = collections.Counter()
    disagreements = collections.defaultdict(list)     # kind -> [(seed, overflow, differing, size)]
    failures = collections.defaultdict(list)          # error -> [(seed, overflow)]
    stop: list = []       # Ctrl-C or SIGTERM: finish the current model, then print the table so far
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda sig, _frame: stop.append(sig))
    started = time.time()
    for n in range(args.models):
        if stop:
            print(f"stopped after {counts['models']} models", file=sys.stderr)
            break
        seed = args.start + n
        overflow = {"yes": True, "no": False}.get(args.overflow, n % 2 == 1)
        model = random_int8_model(seed, overflow=overflow)
        result = compare_with_llvm(model, args.target)
        counts["models"] += 1
        counts[result.outcome] += 1
        if result.outcome != "failed":
            counts["built"] += 1
            if any(backend != "host" and macs for backend, macs in result.macs.items()):
                counts["offloaded"] += 1
        if result.outcome == "disagreed":
            disagreements[_kind(model)].append((seed, overflow, result.differing, result.size))
        elif result.outcome == "failed":
            failures[re.sub(r"\d{3,}", "N", result.error)].append((seed, overflow))   # one class, any values
        if result.outcome != "bit-exact":      # as found: a long run may be stopped
            print(f"  seed {seed} (--overflow {'yes' if overflow else 'no'}): {result.outcome}, {_kind(model)}: "
                  f"{result.error or f'{result.differing}/{result.size} elements, first {result.example}'}",
                  file=sys.stderr, flush=True)
        if (n + 1) % 25 == 0:
            print(f"  {n + 1} models, {time.time() - started:.0f} s: {counts['bit-exact']} bit-exact, "
                  f"{counts['disagreed']} disagreed, {counts['failed']} failed", file=sys.stderr, flush=True)
    args.models = counts["models"]

    print(f"differential corpus: seeds {args.start}..{args.start + args.models - 1}, tp.build(mod, "
          f"{args.target!r}) vs tvm.compile(mod, 'llvm'), overflow={args.overflow}")
    print(f"{'models':>8} {'built':>8} {'bit-exact':>10} {'disagreed':>10} {'failed':>8} {'offloaded':>10}")
    print(f"{counts['models']:>8} {counts['built']:>8} {counts['bit-exact']:>10} {counts['disagreed']:>10} "
          f"{counts['failed']:>8} {counts['offloaded']:>10}")
    for kind, found in sorted(disagreements.items()):
        seeds = ", ".join(f"--seed {s} --overflow {'yes' if o else 'no'} ({d}/{size} elements)"
                          for s, o, d, size in found[:args.show])
        print(f"disagreed, {kind}: {len(found)}; e.g. {seeds}")
    for error, found in sorted(failures.items()):
        seeds = ", ".join(f"--seed {s} --overflow {'yes' if o else 'no'}" for s, o in found[:args.show])
        print(f"failed ({error}): {len(found)}; e.g. {seeds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
