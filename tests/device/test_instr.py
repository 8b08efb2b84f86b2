"""Instructions declared once (tp.instr) on made-up memories (tp.Memory): the operands and
roles read off the program, the derived rule and call (argument order), the runtime binding
by name, the reference against numpy, and the planner allocating what Memory.footprint says.
A LOAD-like 2-D DMA with padding and a GEMM-like block of tiles show that an accelerator's
instructions fit the declaration."""

import itertools

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import ir, te, tirx
from tvm.script import tirx as T

import tirpat as tp
from tirpat import device

INP = tp.Memory("INP", "local.dt_inp", "int8", capacity=256, align=16)
ACC = tp.Memory("ACC", "local.dt_acc", "int32", capacity="acc", align=16)
TILE = 4


@tp.instr("dt.load", memories=[INP], fixed={"mem": 0})
def load(tile: int = TILE):
    """A 2-D strided DMA from host memory into a tile of INP, with padding (accel's LOAD)."""
    @T.prim_func
    def program(host: T.handle, offset: T.int32, dst: T.Buffer((tile, tile), "int8", scope="local.dt_inp"),
                rows: T.int32, cols: T.int32, ld: T.int32, pad_top: T.int32, pad_left: T.int32, pad_value: T.int8):
        size = T.int32()
        src = T.match_buffer(host, (size,), "int8")
        for r, c in T.grid(tile, tile):
            dst[r, c] = T.if_then_else(pad_top <= r and r < pad_top + rows and pad_left <= c and c < pad_left + cols,
                                       src[offset + (r - pad_top) * ld + c - pad_left], pad_value)
    return program


def _gemm(reset: int):
    """``acc += inp @ wgt.T`` per tile over two loop levels with strides (accel's GEMM), or,
    with ``reset``, ``acc = 0`` on the same tiles: one runtime function, told apart by ``reset``."""
    def semantics(tile: int = TILE):
        @T.prim_func
        def accumulate(acc: T.Buffer((64,), "int32", scope="local.dt_acc"),
                       inp: T.Buffer((64,), "int8", scope="local.dt_inp"),
                       wgt: T.Buffer((64,), "int8", scope="local.dt_inp"), ext_out: T.int32, ext_in: T.int32,
                       acc_so: T.int32, acc_si: T.int32, inp_so: T.int32, inp_si: T.int32, wgt_so: T.int32,
                       wgt_si: T.int32):
            for o, t, i, j, k in T.grid(ext_out, ext_in, tile, tile, tile):
                acc[o * acc_so + t * acc_si + i * tile + j] += (
                    T.Cast("int32", inp[o * inp_so + t * inp_si + i * tile + k])
                    * T.Cast("int32", wgt[o * wgt_so + t * wgt_si + j * tile + k]))

        @T.prim_func
        def zero(acc: T.Buffer((64,), "int32", scope="local.dt_acc"),
                 inp: T.Buffer((64,), "int8", scope="local.dt_inp"),
                 wgt: T.Buffer((64,), "int8", scope="local.dt_inp"), ext_out: T.int32, ext_in: T.int32,
                 acc_so: T.int32, acc_si: T.int32, inp_so: T.int32, inp_si: T.int32, wgt_so: T.int32, wgt_si: T.int32):
            for o, t, i, j in T.grid(ext_out, ext_in, tile, tile):
                acc[o * acc_so + t * acc_si + i * tile + j] = 0
        return zero if reset else accumulate
    return tp.instr("dt.gemm", memories=[INP, ACC], fixed={"reset": reset}, name="gemm_reset" if reset else "gemm")(
        semantics)


gemm, gemm_reset = _gemm(0), _gemm(1)


@tp.instr("dt.axpy", memories=[INP], requires=[(lambda n, tile: n <= tile, "n={n} is longer than a tile")])
def axpy(tile: int = 8):
    @T.prim_func
    def program(y: T.Buffer((tile,), "int8", scope="local.dt_inp"), x: T.Buffer((tile,), "int8", scope="local.dt_inp"),
                a: T.int8, n: T.int32):
        for i in range(n):
            y[i] = y[i] + a * x[i]
    return program


def packed_calls(stmt) -> list:
    calls = []
    tvm_ffi.structural_walk(stmt, (ir.Call, lambda c: calls.append(c) if c.op.name == "tirx.tvm_call_packed" else None))
    return calls


# -- the declaration ----------------------------------------------------------------------
def test_operands_kinds_and_roles_come_from_the_program():
    assert [(o.name, o.kind, o.role, o.dtype) for o in load.operands] == [
        ("src", "host", "read", "int8"), ("offset", "scalar", "read", "int32"), ("dst", "memory", "write", "int8"),
        *((n, "scalar", "read", "int32") for n in ("rows", "cols", "ld", "pad_top", "pad_left")),
        ("pad_value", "scalar", "read", "int8")]
    assert load.arguments[:4] == ("mem", "src", "offset", "dst")     # fixed arguments first
    assert [(o.name, o.role, o.memory.name) for o in gemm.memory_operands] == [
        ("acc", "accumulate", "ACC"), ("inp", "read", "INP"), ("wgt", "read", "INP")]
    # the reset variant writes the accumulator and leaves its sources alone
    assert [(o.name, o.role) for o in gemm_reset.memory_operands] == [("acc", "write"), ("inp", "unused"),
                                                                       ("wgt", "unused")]
    assert gemm.arguments == gemm_reset.arguments and gemm.arguments[0] == "reset"


def test_bad_declarations_are_refused_naming_the_problem():
    def returns(func):
        return lambda tile=4: func

    @T.prim_func
    def stray(x: T.Buffer((4,), "int8", scope="local.nowhere")):
        x[0] = T.int8(0)

    with pytest.raises(ValueError, match="operand x is in scope 'local.nowhere', which is no declared memory's"):
        tp.instr("dt.stray", memories=[INP])(returns(stray))

    @T.prim_func
    def wide(x: T.Buffer((4,), "int32", scope="local.dt_inp")):
        x[0] = 0

    with pytest.raises(TypeError, match="operand x is int32 but memory INP holds int8"):
        tp.instr("dt.wide", memories=[INP])(returns(wide))
    with pytest.raises(TypeError, match="give parameter\\(s\\) tile a default"):
        tp.instr("dt.nodefault", memories=[INP])(lambda tile: wide)
    with pytest.raises(TypeError, match="precondition 'why' takes m, which is neither an operand nor a parameter"):
        tp.instr("dt.axpy2", memories=[INP], requires=[(lambda m: m, "why")])(axpy.semantics)
    with pytest.raises(ValueError, match="'<prefix>.<function>'"):
        tp.instr("axpy", memories=[INP])(axpy.semantics)
    with pytest.raises(ValueError, match="the scope must be 'local.<tag>' or 'global.<tag>'"):
        tp.Memory("X", "accel.x")


def test_call_takes_operands_by_name_checked_complete_in_declared_order():
    y, x = INP.buffer((8,), "Y"), INP.buffer((16,), "X")
    region = type("Region", (), {"buffer": x, "offset": 8})()
    call = axpy.call(n=5, a=tirx.IntImm("int8", 3), x=region, y=y).value
    assert call.args[0].value == "dt.axpy"
    y_ptr, x_ptr, a, n = call.args[1:]
    assert (y_ptr.args[1].args[0].name, int(y_ptr.args[4])) == ("Y", 3)            # rw: accumulate
    assert (x_ptr.args[1].args[0].name, int(x_ptr.args[2]), int(x_ptr.args[4])) == ("X", 8, 1)
    assert (int(a), n) == (3, 5)
    with pytest.raises(TypeError, match="misses operand\\(s\\) n; has no operand\\(s\\) m"):
        axpy.call(y=y, x=x, a=1, m=5)
    with pytest.raises(ValueError, match="operand y is in memory INP \\(local.dt_inp\\), got A in scope 'global'"):
        axpy.call(y=tirx.decl_buffer((8,), "int8", "A"), x=x, a=1, n=5)


# -- the derived rule ---------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.integers(0, 8), st.integers(0, 8), st.integers(1, 8), st.integers(-128, 127).filter(lambda v: v not in (0, 1)))
def test_the_rule_rewrites_the_program_into_the_call_with_its_arguments_in_order(oy, ox, n, a):
    @T.prim_func
    def target(A: T.Buffer((8,), "int8")):
        for t in range(2):
            buf_y = T.alloc_buffer((16,), "int8", scope="local.dt_inp")
            buf_x = T.alloc_buffer((16,), "int8", scope="local.dt_inp")
            for i in range(n):
                buf_y[oy + i] = buf_y[oy + i] + T.int8(a) * buf_x[ox + i]   # (a * x: 0 and 1 simplify it away)

    calls = packed_calls(axpy.rule()(target).body)
    assert len(calls) == 1 and axpy.is_call(calls[0])
    got = axpy.arguments_of(calls[0])
    assert [got["y"].args[1].args[0].name, int(got["y"].args[2]), int(got["y"].args[4])] == ["buf_y", oy, 3]
    assert [got["x"].args[1].args[0].name, int(got["x"].args[2]), int(got["x"].args[4])] == ["buf_x", ox, 1]
    assert (int(got["a"]), int(got["n"])) == (a, n)


def test_a_failing_precondition_declines_with_its_reason():
    @T.prim_func
    def target(A: T.Buffer((8,), "int8"), n: T.int32):
        buf = T.alloc_buffer((16,), "int8", scope="local.dt_inp")
        for i in range(n):
            buf[i] = buf[i] + T.int8(2) * buf[i + 8]

    assert "dt.axpy" not in axpy.rule()(target).script()
    assert "n=n is longer than a tile" in str(tp.explain(axpy.rule(), target))
    assert axpy.check(n=3, tile=8) is None and axpy.check(n=9, tile=8) == "n=9 is longer than a tile"


@tp.instr("dh.relu")
def host_relu():
    """A ReLU over host memory, its buffers as long as its vector length ``n`` (symbolic)."""
    n = tirx.Var("n", "int32")
    dst, src, i = tirx.decl_buffer((n,), "int8", "dst"), tirx.decl_buffer((n,), "int8", "src"), tirx.Var("i", "int32")
    return tirx.PrimFunc([dst, src, n], tirx.For(i, 0, n, tirx.ForKind.SERIAL,
                                                 tirx.BufferStore(dst, tirx.max(src[i], tirx.const(0, "int8")), [i])))


HOST_RT = device.Runtime("dh", type("DhSession", (device.Session,), {}))


@HOST_RT.implement(host_relu)
def _host_relu(s, dst, src, n):
    d, x = device.tensor_view(dst)[:n], device.tensor_view(src)[:n]
    s.enqueue(lambda: d.__setitem__(Ellipsis, np.maximum(x, 0)))


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 4), st.integers(2, 24))     # a 1 x 1 has no loop left to match
def test_a_host_buffer_rule_of_symbolic_length_rewrites_int64_code(rows, cols):
    """Relax's int64 loops: the int32 rule is converted, its buffers' layouts with their
    shapes (else the converted rule referred to its old ``n`` and matched nothing)."""
    X = te.placeholder((tirx.IntImm("int64", rows), tirx.IntImm("int64", cols)), "int8", name="X")
    Y = te.compute(X.shape, lambda i, j: te.max(X[i, j], tirx.const(0, "int8")), name="Y")
    mine = tp.Report()
    with tp.registered(tp.tir_pipeline(host_relu.rule().as_pass(report=mine))) as pipeline:
        relu = tvm.compile(tvm.IRModule({"main": te.create_prim_func([X, Y])}), target="llvm",
                           tir_pipeline=pipeline)["main"]
    assert mine.counts == {"dh.relu": 1}
    x = tvm.runtime.tensor(np.random.default_rng(rows * 100 + cols).integers(-128, 128, (rows, cols), dtype=np.int8))
    y = tvm.runtime.tensor(np.zeros((rows, cols), np.int8))
    with HOST_RT.session_class():     # no planner, no sync in the code: the work runs at the exit,
        relu(x, y)                    # so x must outlive the call
    np.testing.assert_array_equal(y.numpy(), np.maximum(x.numpy(), 0))


# -- the runtime's side -------------------------------------------------------------------
RT = device.Runtime("dt", type("DtSession", (device.Session,), {}))


@settings(max_examples=20, deadline=None)
@given(st.permutations(load.arguments), st.lists(st.integers(-50, 50), min_size=10, max_size=10))
def test_implement_binds_the_positional_arguments_by_name_whatever_the_parameter_order(order, values):
    seen = {}
    exec(f"def fn(s, {', '.join(order)}): seen.update(locals())", {"seen": seen}, space := {})  # noqa: S102
    RT.implement(load)(space["fn"])
    RT.functions["load"](*values)
    assert {k: v for k, v in seen.items() if k != "s"} == dict(zip(load.arguments, values))


def test_implement_refuses_what_does_not_match_the_declaration():
    with pytest.raises(TypeError, match="it lacks pad_value; it has pad_valeu, which load does not declare"):
        @RT.implement(load)
        def _(s, mem, src, offset, dst, rows, cols, ld, pad_top, pad_left, pad_valeu):
            pass
    with pytest.raises(TypeError, match="gemm calls dt.gemm\\(reset, acc, .*\\) but axpy calls dt.axpy"):
        RT.implement(gemm, axpy)
    with pytest.raises(ValueError, match="other.fill is not a dt.\\* function"):
        RT.implement(tp.instr("other.fill", memories=[INP])(axpy.semantics))
    seen = []
    RT.implement(gemm, gemm_reset)(lambda s, reset, **rest: seen.append((reset, sorted(rest))))
    RT.functions["gemm"](*range(len(gemm.arguments)))
    assert seen == [(0, sorted(gemm.arguments[1:]))]
    with pytest.raises(TypeError, match="dt.gemm takes 12 arguments"):
        RT.functions["gemm"](1, 2)


def test_a_generic_implementation_gets_the_arguments_in_the_declared_order():
    seen = []

    @RT.implement(gemm, gemm_reset)
    def generic(s, *args):
        seen.append(dict(zip(gemm.arguments, args)))      # the order read off the declaration

    RT.functions["gemm"](*range(len(gemm.arguments)))
    assert seen == [dict(zip(gemm.arguments, range(len(gemm.arguments))))]
    with pytest.raises(TypeError, match="dt.gemm takes 12 arguments \\(reset, acc, inp, wgt, .*\\), got 3"):
        RT.functions["gemm"](1, 2, 3)


# An argument the runtime function gained later (pad_left: 0 keeps an older call's meaning).
padded = tp.instr("dt.load", memories=[INP], fixed={"mem": 0}, added={"pad_left": 0}, name="padded")(load.semantics)


@pytest.mark.parametrize("generic", [False, True])
def test_a_call_compiled_before_an_added_argument_gets_its_value_in_its_place(generic):
    seen = []
    if generic:
        RT.implement(padded)(lambda s, *args: seen.append(dict(zip(padded.arguments, args))))
    else:
        RT.implement(padded)(lambda s, **args: seen.append(args))
    values = dict(zip(padded.arguments, range(10, 20)))
    RT.functions["load"](*values.values())
    RT.functions["load"](*(v for n, v in values.items() if n != "pad_left"))
    assert seen == [values, {**values, "pad_left": 0}]
    with pytest.raises(TypeError, match=r"dt.load takes 10 arguments \(mem, .*\) or 9 without pad_left, got 8"):
        RT.functions["load"](*range(8))
    # the compiler's side reads an older call the same way
    host, dst = tirx.decl_buffer((16,), "int8", "H"), INP.buffer((TILE, TILE), "d")
    older = padded.call(src=host, offset=0, dst=dst, rows=4, cols=4, ld=4, pad_top=0, pad_left=0, pad_value=0)
    older = tirx.call_packed(*(a for i, a in enumerate(older.value.args)
                               if i != 1 + padded.arguments.index("pad_left")))
    assert padded.is_call(older) and not load.is_call(older)
    assert padded.arguments_of(older)["pad_left"].value == 0
    for bad in ({"dst": 0}, {"mem": 0}, {"pad_left": 1.5}, {"nothing": 0}):
        with pytest.raises(TypeError, match="added arguments are scalar operands \\(not fixed\\) with integer"):
            tp.instr("dt.load", memories=[INP], fixed={"mem": 0}, added=bad)(load.semantics)
    with pytest.raises(TypeError, match="padded calls dt.load\\(mem, .*\\) but load calls dt.load"):
        RT.implement(padded, load)


# -- the reference semantics --------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 4), st.integers(0, 4), st.integers(0, 3), st.integers(0, 3), st.integers(-128, 127))
def test_the_load_reference_is_the_padded_strided_copy(rows, cols, top, left, pad_value):
    rows, cols = min(rows, TILE - top), min(cols, TILE - left)
    host = np.arange(-60, 60, dtype=np.int8)
    ld, offset = 7, 5
    expect = np.full((TILE, TILE), pad_value, np.int8)
    for r, c in itertools.product(range(rows), range(cols)):
        expect[top + r, left + c] = host[offset + r * ld + c]
    got = load.reference(src=host, offset=offset, dst=np.zeros((TILE, TILE), np.int8), rows=rows, cols=cols, ld=ld,
                         pad_top=top, pad_left=left, pad_value=pad_value)
    np.testing.assert_array_equal(got["dst"], expect)
    assert set(got) == {"dst"}


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 2), st.integers(1, 2), st.data())
def test_the_gemm_reference_is_a_block_of_tile_products(ext_out, ext_in, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    inp, wgt = (rng.integers(-128, 128, 64, dtype=np.int8) for _ in range(2))
    acc = rng.integers(-1000, 1000, 64, dtype=np.int32)
    # output tiles side by side (outer stride 2 tiles, inner 1), sources stepping through K
    strides = dict(acc_so=32, acc_si=16, inp_so=16, inp_si=32, wgt_so=32, wgt_si=16)
    got = gemm.reference(acc=acc, inp=inp, wgt=wgt, ext_out=ext_out, ext_in=ext_in, **strides)["acc"]
    expect = acc.copy()
    for o, t in itertools.product(range(ext_out), range(ext_in)):
        a = inp[o * 16 + t * 32:][:16].reshape(TILE, TILE).astype(np.int32)
        w = wgt[o * 32 + t * 16:][:16].reshape(TILE, TILE).astype(np.int32)
        expect[o * 32 + t * 16:][:16] += (a @ w.T).reshape(-1)
    np.testing.assert_array_equal(got, expect)
    zeroed = acc.copy()
    for o, t in itertools.product(range(ext_out), range(ext_in)):
        zeroed[o * 32 + t * 16:][:16] = 0
    got = gemm_reset.reference(acc=acc, inp=inp, wgt=wgt, ext_out=ext_out, ext_in=ext_in, **strides)
    np.testing.assert_array_equal(got["acc"], zeroed)


# -- the memory and the planner -----------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.sampled_from([1, 4, 16]), st.booleans(), st.lists(st.integers(1, 3), max_size=2))
def test_the_planner_allocates_what_the_memory_footprint_says(size, align, double, extents):
    mem = tp.Memory("M", "local.dt_m", "int8", capacity=4096, align=align, double_buffer=double)
    first = mem.buffer((size,), "first")
    second = mem.buffer((1,), "second")
    host = tirx.decl_buffer((1,), "int8", "H")
    use = tirx.SeqStmt([tirx.Evaluate(tirx.call_packed("dt.use", b.access_ptr("w"), host)) for b in (first, second)])
    body = tirx.SeqStmt([tirx.AllocBuffer(first), tirx.AllocBuffer(second), use])
    loops = [tirx.Var(f"l{k}", "int32") for k in range(len(extents))]
    for var, extent in reversed(list(zip(loops, extents))):
        body = tirx.For(var, 0, extent, tirx.ForKind.SERIAL, body)
    func = tirx.PrimFunc([host], body).with_attr("global_symbol", "main")
    planned = device.ScratchpadPlanner("dt", [mem]).plan(func)
    address = [c.args[1] for c in packed_calls(planned.body) if c.args[0].value == "dt.use"][1]
    # the second buffer starts where the first's footprint ends: on the first iteration
    # (every loop variable 0) its address is that footprint; it alternates when doubled
    first_iteration = tvm.sym.Analyzer()
    for var in loops:
        first_iteration.bind(var, tirx.IntImm("int32", 0))
    repeated = int(np.prod(extents)) > 1
    assert int(first_iteration.simplify(address)) == mem.footprint(size, repeated=repeated)
    assert ("% 2" in str(address)) == (repeated and double)


def test_memory_capacity_and_alignment_follow_the_options():
    assert ACC.capacity_of({"acc": 1024}) == 1024 and ACC.bind({"acc": 8}).capacity == 8
    with pytest.raises(KeyError, match="its capacity is the option 'acc', which the options \\['x'\\] do not have"):
        ACC.capacity_of({"x": 1})
    with pytest.raises(ValueError, match="depends on the backend's options; pass options="):
        ACC.capacity_of()
    a = ACC.buffer((24,), "a")      # 32 elements aligned, 16 more than the capacity
    use = tirx.Evaluate(tirx.call_packed("dt.use", a.access_ptr("w")))
    func = tirx.PrimFunc([], tirx.SeqStmt([tirx.AllocBuffer(a), use]))
    with pytest.raises(device.ScratchpadOverflow, match="scratchpad ACC overflows by 64 bytes"):
        device.ScratchpadPlanner("dt", [ACC], {"acc": 16}).plan(func.with_attr("global_symbol", "f"))


def test_the_planner_checks_declared_operands_against_their_memories():
    x = ACC.buffer((16,), "x")
    y = INP.buffer((16,), "y")
    bad = axpy.call(y=y, x=y, a=1, n=4)          # well-formed: both in INP
    body = tirx.SeqStmt([tirx.AllocBuffer(x), tirx.AllocBuffer(y), bad])
    planner = device.ScratchpadPlanner("dt", [INP, ACC], {"acc": 64}, instructions=[axpy, gemm, gemm_reset])
    planner.plan(tirx.PrimFunc([], body).with_attr("global_symbol", "ok"))
    wrong = tirx.Evaluate(tirx.call_packed("dt.axpy", y.access_ptr("rw"), x.access_ptr("r"), 1, 4))
    with pytest.raises(device.PlanError, match="axpy takes x in INP, but gets x of ACC"):
        planner.plan(tirx.PrimFunc([], tirx.SeqStmt([tirx.AllocBuffer(x), tirx.AllocBuffer(y), wrong]))
                     .with_attr("global_symbol", "wrong"))
    assert planner.instruction_of(gemm_reset.call(**{o.name: 0 for o in gemm.operands}).value) is gemm_reset


# -- a fixed argument in the program's place ------------------------------------------------
@tp.instr("dt.narrow", memories=[ACC], fixed={"mode": 1, "deps": -1})
def narrow_store(tile: int = TILE):
    """A store whose runtime function takes its mode in the middle and a flag word last:
    both fixed, both kept where the program declares them."""
    @T.prim_func
    def program(out: T.Buffer((tile,), "int8"), mode: T.int32, src: T.Buffer((tile,), "int32", scope="local.dt_acc"),
                shift: T.int32, deps: T.int32):
        for i in range(tile):
            out[i] = T.Cast("int8", T.if_then_else(mode == 1, src[i] >> shift, src[i]))
    return program


def test_a_fixed_scalar_parameter_keeps_its_place_and_specialises_the_program():
    assert narrow_store.arguments == ("out", "mode", "src", "shift", "deps")
    assert [o.name for o in narrow_store.operands] == ["out", "src", "shift"]
    assert repr(narrow_store) == "<instruction narrow_store: dt.narrow(out, mode=1, src, shift, deps=-1)>"
    # the reference runs the program with mode fixed to 1: the shift applies
    got = narrow_store.reference(out=np.zeros(TILE, "int8"), src=np.array([256, 512, -1024, 7], "int32"), shift=8)
    assert got["out"].tolist() == [1, 2, -4, 0]
    out, src = tirx.decl_buffer((TILE,), "int8", "o"), ACC.buffer((TILE,), "s")
    call = packed_calls(narrow_store.call(out=out, src=src, shift=3))[0]
    assert [a.value for a in (call.args[2], call.args[5])] == [1, -1]
    assert narrow_store.is_call(call)
    assert narrow_store.arguments_of(call)["shift"].value == 3
    other = packed_calls(tirx.Evaluate(tirx.call_packed("dt.narrow", out, 2, src.access_ptr("r"), 3, -1)))[0]
    assert not narrow_store.is_call(other)       # another mode: another instruction


def test_a_fixed_buffer_parameter_is_refused():
    @T.prim_func
    def program(x: T.Buffer((4,), "int8", scope="local.dt_inp")):
        x[0] = T.int8(0)

    with pytest.raises(TypeError, match="fixed argument x is a buffer parameter"):
        tp.instr("dt.fixbuf", memories=[INP], fixed={"x": 1})(lambda tile=4: program)


# -- what a planner asks: the elements an instruction writes -------------------------------------
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 4), st.integers(0, 4), st.integers(0, 3), st.integers(0, 3))
def test_elements_written_are_the_stores_of_the_program(rows, cols, top, left):
    rows, cols = min(rows, TILE - top), min(cols, TILE - left)
    got = load.elements_written("dst", rows=rows, cols=cols, pad_top=top, pad_left=left, ld=7)
    # the LOAD-like program stores its whole tile (the padding too), flattened row-major
    assert got.tolist() == list(range(TILE * TILE))
    acc = gemm_reset.elements_written("acc", ext_out=2, ext_in=rows, acc_so=32, acc_si=cols * 16)
    want = sorted({o * 32 + t * cols * 16 + k for o in range(2) for t in range(rows) for k in range(TILE * TILE)})
    assert acc.tolist() == want


@tp.instr("dt.maybe", memories=[INP])
def maybe(tile: int = 8):
    @T.prim_func
    def program(y: T.Buffer((tile,), "int8", scope="local.dt_inp"), n: T.int32, k: T.int32):
        for i in range(n):
            y[i * 2] = T.int8(1)
            if i < k:
                y[i * 2 + 1] = T.int8(2)          # only maybe: not surely written
    return program


@tp.instr("dt.masked", memories=[INP])
def masked(tile: int = 8):
    @T.prim_func
    def program(y: T.Buffer((tile,), "int8", scope="local.dt_inp"), n: T.int32):
        for i in range(n):
            y[T.bitwise_and(i, 3)] = T.int8(3)
    return program


def test_elements_written_leave_out_conditional_stores_and_refuse_what_they_cannot_evaluate():
    assert maybe.elements_written("y", n=3, k=2).tolist() == [0, 2, 4]
    with pytest.raises(ValueError, match="elements_written\\(\\) evaluates integer arithmetic"):
        masked.elements_written("y", n=3)
    with pytest.raises(ValueError, match="'n' is not a buffer operand \\(buffer operands: y\\)"):
        maybe.elements_written("n", n=3)
    with pytest.raises(ValueError, match="needs the value of ext_out"):
        gemm_reset.elements_written("acc", ext_in=1, acc_so=0, acc_si=0)
