"""A workload written in TVMScript (not TE), compiled for accel and checked against numpy.

    python examples/tvmscript_workload.py
"""

import numpy as np
from tvm.script import tirx as T

import accel


@T.prim_func(s_tir=True)
def scaled_dense(A: T.Buffer((48, 96), "int8"), W: T.Buffer((80, 96), "int8"), out: T.Buffer((48, 80), "int32")):
    acc = T.sblock_alloc_buffer((48, 80), "int32")
    for i, j, k in T.grid(48, 80, 96):
        with T.sblock("acc"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                acc[vi, vj] = 0
            acc[vi, vj] = acc[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", W[vj, vk])
    for i, j in T.grid(48, 80):
        with T.sblock("scale"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = T.max(acc[vi, vj] * 3 - 7, -100000)


def main():
    ex = accel.build(scaled_dense)
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (48, 96), dtype=np.int8)
    w = rng.integers(-128, 128, (80, 96), dtype=np.int8)
    out = np.zeros((48, 80), np.int32)
    with accel.Session() as session:
        ex(a, w, out)
    expect = np.maximum((a.astype(np.int64) @ w.astype(np.int64).T) * 3 - 7, -100000)
    print(ex.report)
    print(f"cycles {session.stats.cycles}, bit-exact: {np.array_equal(out, expect)}")
    assert np.array_equal(out, expect)


if __name__ == "__main__":
    main()
