"""One partition PrimFunc called at several sites with different constants.

FuseTIR gives structurally equal partitions (layers of one shape) one PrimFunc, and every
site passes its own weights and its own requantise scalars. The scalars become immediates in
the PrimFunc (so that a backend's rules see them), which is only right when each site gets a
PrimFunc with its own values: baking one site's values into the shared function gave the
other sites that site's multiplier, shift and clip (PaddleOCR's classifier, 18 of 20 images
off). Checked against ``tvm.compile(mod, "llvm")`` bit for bit.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
import tvm
from tvm import relax

import tirpat as tp
from tirpat.model.build import bind_params
from models import reference

ROWS, WIDTH = 16, 32


def chain(requant: list) -> tvm.IRModule:
    """int8 layers of one shape, x [16, 32] @ w_i [32, 32] + b_i, each requantised by its own
    ``(multiplier, shift, lo)``: ``clip((y * m + 2^(s-1)) >> s, lo, 127)`` to int8."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((ROWS, WIDTH), "int8"))
    ws = [relax.Var(f"w{i}", relax.TensorType((WIDTH, WIDTH), "int8")) for i in range(len(requant))]
    bs = [relax.Var(f"b{i}", relax.TensorType((WIDTH,), "int32")) for i in range(len(requant))]
    with bb.function("main", [x, *ws, *bs]):
        with bb.dataflow():
            h = x
            for (m, s, lo), w, b in zip(requant, ws, bs):
                y = bb.emit(relax.op.add(relax.op.matmul(h, w, out_dtype="int32"), b))
                y = bb.emit(relax.op.multiply(y, relax.const(m, "int32")))
                y = bb.emit(relax.op.right_shift(relax.op.add(y, relax.const(1 << (s - 1), "int32")),
                                                 relax.const(s, "int32")))
                h = bb.emit(relax.op.astype(relax.op.clip(y, lo, 127), "int8"))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def weights(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    params = {f"w{i}": rng.integers(-128, 128, (WIDTH, WIDTH), dtype=np.int8) for i in range(n)}
    params.update({f"b{i}": rng.integers(-3000, 3000, (WIDTH,), dtype=np.int32) for i in range(n)})
    return params


layer = st.tuples(st.integers(1, 1 << 12), st.integers(8, 16), st.sampled_from([-128, 0]))


@settings(max_examples=6, deadline=None)
@given(first=layer, rest=st.lists(st.one_of(layer, st.none()), min_size=1, max_size=2), seed=st.integers(0, 99))
def test_each_site_computes_with_its_own_constants(first, rest, seed):
    """A layer None repeats the one before it (two sites that may share one PrimFunc)."""
    requant = [first]
    for r in rest:
        requant.append(requant[-1] if r is None else r)
    mod = chain(requant)
    params = weights(len(requant), seed)
    x = np.random.default_rng(seed + 1).integers(-128, 128, (ROWS, WIDTH), dtype=np.int8)
    model = tp.build(mod, "accel, llvm", params=params)
    assert [p.backend for p in model.report.partitions] == ["accel"] * len(requant)
    want = reference(mod, [x, *params.values()])
    np.testing.assert_array_equal(model(x), want)


def test_sites_get_one_primfunc_per_distinct_set_of_scalars():
    """Three sites of one shape, the first and the last with equal requantise constants: two
    PrimFuncs, each with its sites' multiplier and shift as immediates (equal values share)."""
    mod = bind_params(chain([(3, 9, 0), (5, 11, 0), (3, 9, 0)]), weights(3, 0))
    funcs = tp.partition_functions(mod, "accel, llvm")
    immediates = sorted((" * 3\n" in f.script(), " >> 9\n" in f.script(), " * 5\n" in f.script(),
                         " >> 11\n" in f.script()) for *_, f in funcs)
    assert immediates == [(False, False, True, True), (True, True, False, False)]


def test_every_call_site_is_a_layer_of_the_profile():
    """A site's copy (other constants) is the partition it computes: a call lists each site
    as a layer, named as the report names it, the copy's included."""
    mod = bind_params(chain([(3, 9, 0), (5, 11, 0), (3, 9, 0)]), weights(3, 0))
    compiled = tp.build(mod, "accel, llvm")
    compiled(np.random.default_rng(1).integers(-128, 128, (16, 32), dtype=np.int8))
    assert [layer.function for layer in compiled.layers] == [p.function for p in compiled.report.partitions]
    assert len(compiled.layers) == 3 and all(layer.cycles > 0 for layer in compiled.layers)
