"""A user-defined rule beside ``accel.rules()``: offload int32 vector additions on the host.

accel's own rules only handle code that a schedule already staged through the scratchpad
scopes. This rule, written with tirpat's public API, takes plain CPU code,
``out[i] = x[i] + y[i]``, and turns it into LOAD, LOAD, ALU ADD, STORE through two ACC
buffers that it allocates itself; accel's planner gives them addresses like any other.

    python examples/custom_rule.py
"""

import numpy as np
import tvm
from tvm import te, tirx

import accel
import tirpat as tp
from accel.hw.instructions import ALU, LOAD, STORE, AluOp, Mem, StoreMode
from accel.compiler.planner import plan_pass
from accel.compiler.rules import ACC, address

i = tp.is_var("i")
X, Y, OUT = (tp.is_buffer(name, dtype="int32", scope="global") for name in ("x", "y", "out"))
vector_add = tp.is_nest([tp.loop(i, extent=tp.wildcard("n"))], tp.is_store(OUT, [i], X[i] + Y[i]))


def offload_add(m: tp.Match) -> tirx.Stmt | None:
    """The LOAD, LOAD, ALU ADD, STORE sequence for a matched ``vector_add`` of whole ACC
    vectors (16 lanes, the default tile); None declines any other length."""
    n = int(m["n"])
    if n % 16:
        return None          # decline: an ALU step covers whole 16-lane vectors
    regions = [m.region(name) for name in ("x", "y", "out")]
    a = tirx.decl_buffer((n,), "int32", "add_a", scope=ACC)
    b = tirx.decl_buffer((n,), "int32", "add_b", scope=ACC)
    def load(r, buf):
        return LOAD[Mem.ACC].call(host=r.buffer, elem_offset=r.offset, sram_addr=address(buf, 0), sram_ld=n,
                                  rows=1, cols=n, dram_ld=0, pad_top=0, pad_bottom=0, pad_left=0, pad_right=0,
                                  pad_value=0)

    return tirx.SeqStmt([
        tirx.AllocBuffer(a), tirx.AllocBuffer(b),
        load(regions[0], a), load(regions[1], b),
        ALU[AluOp.ADD, False].call(dst_addr=address(a, 0), src_addr=address(b, 0), imm=0, ext_out=1,
                                   ext_in=n // 16, dst_stride_out=0, dst_stride_in=16, src_stride_out=0, src_stride_in=16),
        STORE[StoreMode.INT32].call(host=regions[2].buffer, elem_offset=regions[2].offset,
                                    sram_addr=address(a, 0), sram_ld=n, rows=1, cols=n, dram_ld=n,
                                    dram_step=1),
    ])


def main() -> None:
    """Add the rule beside accel's, compile a 256-element addition with it, and check the
    result on the simulator bit for bit."""
    config = accel.Config()
    rw = accel.rules(config) | tp.Rewriter.from_pattern(vector_add, offload_add, name="user.vector_add")
    tp.register_pipeline("accel_with_vector_add", rw, after=[plan_pass(config)])

    x = te.placeholder((256,), "int32", name="x")
    y = te.placeholder((256,), "int32", name="y")
    out = te.compute((256,), lambda k: x[k] + y[k], name="out")
    mod = tvm.IRModule({"main": te.create_prim_func([x, y, out])})
    ex = tvm.compile(mod, target="llvm", tir_pipeline="accel_with_vector_add")
    print(rw.report)

    rng = np.random.default_rng(0)
    xs, ys = (rng.integers(-2**30, 2**30, 256, dtype=np.int32) for _ in range(2))
    result = tvm.runtime.tensor(np.zeros(256, np.int32))
    with accel.Session() as session:
        ex["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(ys), result)
    print(session.disassembly())
    assert rw.report.counts == {"user.vector_add": 1}
    assert np.array_equal(result.numpy(), xs + ys)
    print("bit-exact: True")


if __name__ == "__main__":
    main()
