"""The accel pipeline refuses what it cannot run, with errors that name the statement."""

import numpy as np
import pytest
import tvm

import accel
from tvm.script import tirx as T
from tirpat import device
from tirpat.testing import tile_gemm, tiled_matmul

SCOPES = ("local.accel_inp", "local.accel_wgt", "local.accel_acc")


def test_an_already_scheduled_workload_only_runs_the_pipeline():
    func = tiled_matmul(32, 32, 32, (16, 16, 16), decompose_init=True, scopes=SCOPES)
    ex = accel.build(func)
    assert ex.report.partitions[0].rules == {"accel.load": 2, "accel.gemm": 1, "accel.zero_init": 1, "accel.store": 1}
    rng = np.random.default_rng(0)
    a, b = (rng.integers(-128, 128, (32, 32), dtype=np.int8) for _ in range(2))
    c = np.zeros((32, 32), np.int32)
    with accel.Session():
        ex(a, b, c)
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32).T)


def test_an_unmatched_scratchpad_access_names_the_statement():
    # 8x8 tiles are not the hardware's 16x16x16 GEMM: no rule matches the update.
    func = tiled_matmul(16, 16, 16, (8, 8, 8), decompose_init=True, scopes=SCOPES)
    with pytest.raises(accel.PlanError, match=r"no accel rule matched .*C_local.accel_acc, so it cannot run: C_local_accel_acc\[i_1_init, j_1_init\] = 0"):
        accel.build(func)


def test_a_refusal_names_the_partition_and_operators_its_primfunc_says_it_computes():
    """The planner reads the partition from the function's tirpat.partition attribute, not from
    its name: under an arbitrary name the user still reads which operators accel cannot run."""
    from tirpat.model.partition import PARTITION_ATTR, PartitionOrigin

    func = tiled_matmul(16, 16, 16, (8, 8, 8), decompose_init=True, scopes=SCOPES)
    origin = PartitionOrigin("layer_7", ("relax.matmul", "relax.add"))
    with pytest.raises(accel.PlanError, match=r"^accel cannot run relax\.matmul \+ relax\.add \(partition layer_7\): "):
        accel.build(func.with_attr(PARTITION_ATTR, origin.attr()))
    with pytest.raises(accel.PlanError, match=r"^accel cannot run the function 'main': "):
        accel.build(func)


def test_accel_calls_in_a_parallel_loop_are_rejected():
    func = tiled_matmul(32, 32, 32, (16, 16, 16), decompose_init=True, scopes=SCOPES)
    outer = func.body
    assert isinstance(outer, tvm.tirx.For)
    par = tvm.tirx.For(outer.loop_var, outer.min, outer.extent, tvm.tirx.ForKind.PARALLEL, outer.body)
    with pytest.raises(accel.PlanError, match=f"parallel loop '{outer.loop_var.name}'"):
        accel.build(func.with_body(par))


def test_runtime_errors_keep_their_type_through_compiled_code():
    func = tiled_matmul(32, 32, 32, (16, 16, 16), decompose_init=True, scopes=SCOPES)
    # accel's bare TIR pipeline (no check of the options the code was built for, as
    # accel.build's code has): the first instruction finds out
    module = tvm.compile(tvm.IRModule({"main": func}), target="llvm", tir_pipeline=accel.pipeline_name())
    a = tvm.runtime.tensor(np.zeros((32, 32), np.int8))
    c = tvm.runtime.tensor(np.zeros((32, 32), np.int32))
    with pytest.raises(accel.ScratchpadOverflowError, match="INP"):
        with accel.Session(accel.Config(inp_bytes=256, wgt_bytes=256, acc_bytes=1024)):
            # built for the default Config: its addresses do not fit this one
            device.invoke(module["main"], a, a, c)


def test_an_executable_refuses_a_session_of_another_config():
    ex = accel.build(tiled_matmul(32, 32, 32, (16, 16, 16), decompose_init=True, scopes=SCOPES))
    a, c = np.zeros((32, 32), np.int8), np.zeros((32, 32), np.int32)
    with pytest.raises(device.OptionsMismatch, match="built for accel with inp_bytes=32768, wgt_bytes=262144, "
                                                     "acc_bytes=131072, but the current accel session .* has "
                                                     "inp_bytes=256"):
        with accel.Session(accel.Config(inp_bytes=256, wgt_bytes=256, acc_bytes=1024)):
            ex(a, a, c)


def test_pipeline_is_registered_for_tvm_compile():
    func = tiled_matmul(16, 16, 16, (16, 16, 16), decompose_init=True, scopes=SCOPES)
    ex = tvm.compile(tvm.IRModule({"main": func}), target="llvm", tir_pipeline=accel.pipeline_name())
    a = np.ones((16, 16), np.int8)
    ta, tc = tvm.runtime.tensor(a), tvm.runtime.tensor(np.zeros((16, 16), np.int32))
    with accel.Session() as s:
        ex["main"](ta, ta, tc)
    assert (tc.numpy() == 16).all() and s.stats.instructions["GEMM"] == 2


@T.prim_func
def relu_gemm(A: T.Buffer((16, 32), "int8"), W: T.Buffer((32, 32), "int8"), C: T.Buffer((16, 32), "int32")):
    acc = T.alloc_buffer((16, 32), "int32", scope="local.accel_acc")
    a = T.alloc_buffer((16, 32), "int8", scope="local.accel_inp")
    w = T.alloc_buffer((32, 32), "int8", scope="local.accel_wgt")
    for i, j in T.grid(16, 32):
        acc[i, j] = 0
    for i, k in T.grid(16, 32):
        a[i, k] = A[i, k]
    for j, k in T.grid(32, 32):
        w[j, k] = W[j, k]
    for jo, ko, i, j, k in T.grid(2, 2, 16, 16, 16):
        acc[i, jo * 16 + j] = acc[i, jo * 16 + j] + T.Cast("int32", a[i, ko * 16 + k]) * T.Cast("int32", w[jo * 16 + j, ko * 16 + k])
    for i, j in T.grid(16, 32):
        acc[i, j] = T.max(acc[i, j], 0) - 5
    for i, j in T.grid(16, 32):
        C[i, j] = acc[i, j]


def test_hand_scheduled_tvmscript_folds_tile_loops_and_runs_in_place_alu():
    ex = accel.build(relu_gemm)
    assert ex.report.partitions[0].rules == {"accel.zero_init": 1, "accel.load": 2, "accel.gemm": 1, "accel.alu": 1, "accel.store": 1}
    assert ex.report.partitions[0].host_macs == 0 and not ex.report.on_host
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (16, 32), dtype=np.int8)
    w = rng.integers(-128, 128, (32, 32), dtype=np.int8)
    c = np.zeros((16, 32), np.int32)
    with accel.Session() as s:
        ex(a, w, c)
    np.testing.assert_array_equal(c, np.maximum(a.astype(np.int32) @ w.astype(np.int32).T, 0) - 5)
    assert s.stats.instructions["GEMM"] == 2          # reset + one GEMM covering the 2x2 block of tiles
    assert s.stats.macs == 16 * 32 * 32
    assert "loop 2x2" in s.disassembly()
    assert s.stats.instructions["ALU_CHAIN"] == 1 and s.stats.instructions["ALU"] == 0   # max #0, add #-5 in one pass


def test_double_buffering_overlaps_loads_with_compute():
    func = tiled_matmul(256, 256, 256, (16, 16, 16), decompose_init=True, scopes=SCOPES)
    ex = accel.build(func)
    a = np.ones((256, 256), np.int8)
    c = np.zeros((256, 256), np.int32)
    with accel.Session() as s:
        ex(a, a, c)
    busy = s.stats.busy
    # Serial execution would take at least the sum; overlap makes the run much shorter.
    assert s.stats.cycles < 0.8 * (busy["load"] + busy["gemm"] + busy["store"])


@T.prim_func
def two_stores(A: T.Buffer((16, 16), "int8"), W: T.Buffer((16, 16), "int8"),
               relu: T.Buffer((16, 16), "int32"), raw: T.Buffer((16, 16), "int32")):
    acc = T.alloc_buffer((16, 16), "int32", scope="local.accel_acc")
    a = T.alloc_buffer((16, 16), "int8", scope="local.accel_inp")
    w = T.alloc_buffer((16, 16), "int8", scope="local.accel_wgt")
    for i, j in T.grid(16, 16):
        acc[i, j] = 0
    for i, k in T.grid(16, 16):
        a[i, k] = A[i, k]
    for j, k in T.grid(16, 16):
        w[j, k] = W[j, k]
    for i, j, k in T.grid(16, 16, 16):
        acc[i, j] = acc[i, j] + T.Cast("int32", a[i, k]) * T.Cast("int32", w[j, k])
    for i, j in T.grid(16, 16):
        relu[i, j] = T.max(acc[i, j], 0)
    for i, j in T.grid(16, 16):
        raw[i, j] = acc[i, j]


def test_an_in_place_epilogue_followed_by_another_reader_is_refused():
    # The ReLU store runs its ALU on the accumulator itself; the second store would then
    # read ReLU'd values: wrong code, so the pipeline refuses it.
    with pytest.raises(accel.PlanError, match="computed acc.* in place .* read again"):
        accel.build(two_stores)


def _relu_matmul(store_at: str):
    """``max(A x B^T, 0)`` tiled 16x16x16 through the accel scopes, its ReLU store placed by
    ``reverse_compute_at`` at loop ``store_at`` ("jo": after the k loop; "ko": inside it)."""
    from tvm import s_tir, te

    A = te.placeholder((32, 32), "int8", name="A")
    B = te.placeholder((32, 32), "int8", name="B")
    r = te.reduce_axis((0, 32), "k")
    C = te.compute((32, 32), lambda i, j: te.sum(A[i, r].astype("int32") * B[j, r].astype("int32"), axis=r), name="C")
    D = te.compute((32, 32), lambda i, j: te.max(C[i, j], 0), name="D")
    sch = s_tir.Schedule(te.create_prim_func([A, B, D]))
    blk = sch.get_sblock("C")
    _, jo, ko = tile_gemm(sch, blk)[:3]
    sch.compute_at(sch.cache_read(blk, 0, "local.accel_inp"), ko)
    sch.compute_at(sch.cache_read(blk, 1, "local.accel_wgt"), ko)
    sch.reverse_compute_at(sch.cache_write(blk, 0, "local.accel_acc"), {"jo": jo, "ko": ko}[store_at])
    sch.reverse_compute_inline(sch.get_sblock("D"))
    sch.decompose_reduction(blk, ko)
    return sch.mod


def test_an_in_place_epilogue_inside_the_reduction_loop_is_refused():
    """Storing ReLU(partial sums) inside the k loop is valid TIR (TVM's CPU build is right),
    but the ALU would clobber the accumulator the next k step adds to: refused, by name."""
    rng = np.random.default_rng(3)
    a, b = rng.integers(-128, 128, (32, 32), dtype="int8"), rng.integers(-128, 128, (32, 32), dtype="int8")
    want = np.maximum(a.astype("int32") @ b.astype("int32").T, 0)
    for store_at in ("jo", "ko"):
        ex = tvm.compile(_relu_matmul(store_at), target="llvm")
        out = tvm.runtime.tensor(np.zeros((32, 32), "int32"))
        ex["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
        np.testing.assert_array_equal(out.numpy(), want)
    ex = accel.build(_relu_matmul("jo"))
    out = np.zeros((32, 32), "int32")
    with accel.Session():
        ex(a, b, out)
    np.testing.assert_array_equal(out, want)
    with pytest.raises(accel.PlanError, match="in place for its store inside loop 'k_0'.*next iteration reads"):
        accel.build(_relu_matmul("ko"))


@T.macro
def _zero_and_stage(A, W, acc, a, w):
    """acc (16x32) = 0; A (16x16) and W (32x16) into their scratchpads."""
    for i, j in T.grid(16, 32):
        acc[i, j] = 0
    for i, k in T.grid(16, 16):
        a[i, k] = A[i, k]
    for j, k in T.grid(32, 16):
        w[j, k] = W[j, k]


def _gemm_then(epilogue_cols: int, store_inside: bool):
    """acc (16x32) = A x W^T in two column tiles (loop jo), then ``acc += 5`` on columns
    ``0:epilogue_cols`` and a store of all 32 columns: as separate nests after the loop, or
    (``store_inside``) one ``C = acc + 5`` store inside jo, over the whole accumulator."""

    @T.prim_func
    def func(A: T.Buffer((16, 16), "int8"), W: T.Buffer((32, 16), "int8"), C: T.Buffer((16, 32), "int32")):
        acc = T.alloc_buffer((16, 32), "int32", scope="local.accel_acc")
        a = T.alloc_buffer((16, 16), "int8", scope="local.accel_inp")
        w = T.alloc_buffer((32, 16), "int8", scope="local.accel_wgt")
        _zero_and_stage(A, W, acc, a, w)
        for jo in range(2):
            for i, j, k in T.grid(16, 16, 16):
                acc[i, jo * 16 + j] = acc[i, jo * 16 + j] + T.Cast("int32", a[i, k]) * T.Cast("int32", w[jo * 16 + j, k])
            if store_inside:
                for i, j in T.grid(16, 32):
                    C[i, j] = acc[i, j] + 5
        if not store_inside:
            for i, j in T.grid(16, epilogue_cols):
                acc[i, j] = acc[i, j] + 5
            for i, j in T.grid(16, 32):
                C[i, j] = acc[i, j]

    return func


def test_an_alu_nest_on_part_of_a_vector_is_refused_not_widened():
    """The ALU works on whole 16-lane vectors: on columns 0:20 it would also add 5 to
    columns 20:32, which are stored afterwards. Columns 0:32 run; 0:20 is refused by name."""
    rng = np.random.default_rng(4)
    a, w = rng.integers(-128, 128, (16, 16), dtype="int8"), rng.integers(-128, 128, (32, 16), dtype="int8")
    ex = accel.build(_gemm_then(32, False))
    out = np.zeros((16, 32), "int32")
    with accel.Session():
        ex(a, w, out)
    np.testing.assert_array_equal(out, a.astype("int32") @ w.astype("int32").T + 5)
    with pytest.raises(accel.PlanError, match=r"no accel rule matched this access to scratchpad buffer acc.*\+ 5"):
        accel.build(_gemm_then(20, False))


def test_an_epilogue_over_tiles_the_loop_still_accumulates_is_refused():
    """Inside jo the in-place +5 covers both tiles, and the next jo accumulates on tile 1."""
    with pytest.raises(accel.PlanError, match="inside loop 'jo'.*reads acc before writing it anew"):
        accel.build(_gemm_then(32, True))


@T.prim_func
def reset_one_tile_per_round(A: T.Buffer((16, 16), "int8"), W: T.Buffer((32, 16), "int8"),
                             C: T.Buffer((16, 32), "int32")):
    acc = T.alloc_buffer((16, 32), "int32", scope="local.accel_acc")
    a = T.alloc_buffer((16, 16), "int8", scope="local.accel_inp")
    w = T.alloc_buffer((32, 16), "int8", scope="local.accel_wgt")
    _zero_and_stage(A, W, acc, a, w)
    for r in range(2):
        for i, j in T.grid(16, 16):  # tile 0 is reset every round, tile 1 is not
            acc[i, j] = 0
        for i, j, k in T.grid(16, 16, 16):
            acc[i, j] = acc[i, j] + T.Cast("int32", a[i, k]) * T.Cast("int32", w[j, k])
        for i, j, k in T.grid(16, 16, 16):
            acc[i, 16 + j] = acc[i, 16 + j] + T.Cast("int32", a[i, k]) * T.Cast("int32", w[16 + j, k])
        for i, j in T.grid(16, 32):
            C[i, j] = acc[i, j] + 5


def test_a_reset_of_part_of_the_accumulator_does_not_count_as_writing_it_anew():
    """The next round resets tile 0 only, then adds onto tile 1, which the +5 clobbered."""
    with pytest.raises(accel.PlanError, match="inside loop 'r'.*reads acc before writing it anew"):
        accel.build(reset_one_tile_per_round)


def test_a_site_a_rule_cannot_offload_is_declined_with_its_reason():
    """The report and tp.explain say why accel left a matched site alone."""
    import tirpat as tp

    func = _gemm_then(20, False)
    _, report = accel.rules().rewrite(func)
    why = "20 columns are not whole 16-lane vectors, and the lanes after them are read on"
    assert {d.rule for d in report.declined if why in d.reason} == {"accel.alu"}
    assert all(d.rule == "accel.alu" for d in report.declined)
    assert why in str(tp.explain(accel.rules(), func))
