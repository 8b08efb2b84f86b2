"""accel simulator benchmarks: functional wall time and cycle-model utilisation.

1. Wall time of the simulator running a 512x512x512 int8 GEMM stream (weights resident in
   WGT, 32-row blocks of A double-buffered, one GEMM instruction per 16-row strip covering
   32x32 tiles) against numpy's int32 matmul of the same size, in the same run.
   Target: simulator within 1.5x of numpy.
2. Cycle-model utilisation (roofline_cycles / cycles) of a low-reuse 512^3 GEMM stream
   (16x16 output blocks, INP and WGT strips loaded per block), single- vs double-buffered.
   Target: double-buffered >= 90% of roofline_cycles.

Both sides run single-threaded: numpy's int32 matmul never uses BLAS, and the simulator's
float32 BLAS calls are pinned to one thread (set before numpy loads), because a
multi-threaded OpenBLAS slows down by an order of magnitude when another process competes
for the cores, which made the comparison depend on unrelated load.

Run: python benchmarks/bench_sim.py [--repeat N] [--png timeline.png]
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402

import numpy as np  # noqa: E402

from accel import Config, Mem, Queue  # noqa: E402
from accel.hw.emitter import Emitter  # noqa: E402
from accel.hw.sim import Simulator  # noqa: E402
from timing import median_times  # noqa: E402

N = 512
T = 16
LOAD, COMPUTE, STORE = Queue.LOAD, Queue.COMPUTE, Queue.STORE


def resident_weight_stream(em: Emitter, rows: int = 32) -> None:
    """C = A @ W.T with W (N x K) resident in WGT and A streamed in double-buffered blocks."""
    em.load(Mem.WGT, 0, N, slot=1, dram_offset=0, dram_ld=N, rows=N, cols=N)
    blocks = N // rows
    for b in range(blocks):
        inp = (b % 2) * rows * N
        acc = (b % 2) * rows * N
        if b >= 2:
            em.dep_pop(COMPUTE, LOAD)
        em.load(Mem.INP, inp, N, slot=0, dram_offset=b * rows * N, dram_ld=N, rows=rows, cols=N)
        em.dep_push(LOAD, COMPUTE)
        em.dep_pop(LOAD, COMPUTE)
        if b >= 2:
            em.dep_pop(STORE, COMPUTE)
        em.gemm(acc, 0, 0, N, N, N, reset=True, ext_out=rows // T, acc_stride_out=T * N,
                ext_in=N // T, acc_stride_in=T)
        for m in range(rows // T):
            # N tiles outer, K tiles inner: acc stride 0 inside is the reduction.
            em.gemm(acc + m * T * N, inp + m * T * N, 0, N, N, N, ext_out=N // T, ext_in=N // T,
                    acc_stride_out=T, wgt_stride_out=T * N, inp_stride_in=T, wgt_stride_in=T)
        em.dep_push(COMPUTE, LOAD)
        em.dep_push(COMPUTE, STORE)
        em.dep_pop(COMPUTE, STORE)
        em.store(acc, N, slot=2, dram_offset=b * rows * N, dram_ld=N, rows=rows, cols=N)
        em.dep_push(STORE, COMPUTE)
    for _ in range(min(blocks, 2)):
        em.dep_pop(COMPUTE, LOAD)
        em.dep_pop(STORE, COMPUTE)


def low_reuse_stream(em: Emitter, double_buffer: bool, block: int = 16) -> None:
    """C = A @ W.T in block x block output tiles, loading the full-K strips of A and W each time."""
    depth = 2 if double_buffer else 1
    strip = block * N
    count = 0
    for i in range(N // block):
        for j in range(N // block):
            buf = count % depth
            if count >= depth:
                em.dep_pop(COMPUTE, LOAD)
            em.load(Mem.INP, buf * strip, N, slot=0, dram_offset=i * strip, dram_ld=N,
                    rows=block, cols=N)
            em.load(Mem.WGT, buf * strip, N, slot=1, dram_offset=j * strip, dram_ld=N,
                    rows=block, cols=N)
            em.dep_push(LOAD, COMPUTE)
            em.dep_pop(LOAD, COMPUTE)
            if count >= depth:
                em.dep_pop(STORE, COMPUTE)
            acc = buf * block * block
            em.gemm(acc, 0, 0, block, N, N, reset=True, ext_out=block // T,
                    acc_stride_out=T * block, ext_in=block // T, acc_stride_in=T)
            for m in range(block // T):
                em.gemm(acc + m * T * block, buf * strip + m * T * N, buf * strip, block, N, N,
                        ext_out=block // T, ext_in=N // T, acc_stride_out=T,
                        wgt_stride_out=T * N, inp_stride_in=T, wgt_stride_in=T)
            em.dep_push(COMPUTE, LOAD)
            em.dep_push(COMPUTE, STORE)
            em.dep_pop(COMPUTE, STORE)
            em.store(acc, block, slot=2, dram_offset=i * block * N + j * block, dram_ld=N,
                     rows=block, cols=block)
            em.dep_push(STORE, COMPUTE)
            count += 1
    for _ in range(min(count, depth)):
        em.dep_pop(COMPUTE, LOAD)
        em.dep_pop(STORE, COMPUTE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--png", help="write the double-buffered timeline here")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (N, N), dtype=np.int8)
    w = rng.integers(-128, 128, (N, N), dtype=np.int8)
    c = np.zeros((N, N), np.int32)
    host = [a.reshape(-1), w.reshape(-1), c.reshape(-1)]
    a32, w32 = a.astype(np.int32), w.astype(np.int32)
    want = a32 @ w32.T

    sim = Simulator(Config())
    em = Emitter(lambda i, ins: sim.check(i, ins, host))
    resident_weight_stream(em)
    stream = em.finish()
    sim.run(stream, host)
    assert (c == want).all(), "simulator result differs from numpy"

    sim_s, ref_s = median_times([lambda: sim.run(stream, host), lambda: a32 @ w32.T], args.repeat)
    print(f"1. functional simulation, {N}x{N}x{N} int8 GEMM ({len(stream)} instructions), "
          f"median of {args.repeat}")
    print(f"   {'':34}{'ours':>10}{'numpy':>10}{'ratio':>8}")
    print(f"   {'wall time (ms): sim vs int32 matmul':34}{sim_s * 1e3:10.2f}{ref_s * 1e3:10.2f}"
          f"{sim_s / ref_s:8.2f}   target <= 1.5")

    print(f"\n2. cycle model, low-reuse {N}^3 GEMM (16x16 output blocks, strips reloaded)")
    print(f"   {'':18}{'cycles':>10}{'roofline':>10}{'ratio':>8}  load  gemm  store")
    results = {}
    for double in (False, True):
        sim = Simulator(Config())
        em = Emitter(lambda i, ins: sim.check(i, ins, host))
        low_reuse_stream(em, double)
        c[...] = 0
        stats = sim.run(em.finish(), host)
        assert (c == want).all()
        results[double] = stats
        u = stats.utilization
        label = "double-buffered" if double else "single-buffered"
        print(f"   {label:18}{stats.cycles:10d}{stats.roofline_cycles:10d}"
              f"{stats.roofline_cycles / stats.cycles:8.2f}  {u['load']:4.0%}  {u['gemm']:4.0%}"
              f"  {u['store']:4.0%}")
    print("   target: double-buffered ratio >= 0.90")
    print("\n   double-buffered timeline (first blocks):")
    head = type(results[True].timeline)([e for e in results[True].timeline.events if e.start < 20000])
    print("   " + head.text(width=72).replace("\n", "\n   "))
    if args.png:
        print(f"   wrote {head.save_png(args.png, title='double-buffered GEMM, first 20k cycles')}")


if __name__ == "__main__":
    main()
