"""The compiled kernels of the batched plan (accel.hw.kernels) compute bit for bit what the
numpy steps they replace compute: sums of int8 products exact, int32 additions and products
wrapping, ALU chains step by step as the simulator's ufuncs; and a process loads the kernels an
earlier one compiled (and only those of the same source, constants, TVM and CPU)."""

import numpy as np
import pytest
import tvm_ffi
from hypothesis import given, strategies as st

from accel.hw import kernels
from accel.hw.instructions import ALU_UFUNCS, AluOp, alu_operand


@st.composite
def tap_sums(draw):
    """A tap sum's operands: a source vector of int8 values (-128 and 127 often: the largest
    products), row starts anywhere in it (overlapping rows, repeats), up to the 1024 steps
    float32 sums exactly, and int32 values to add into (near the limits: the sums wrap)."""
    tile = draw(st.sampled_from([2, 4, 16]))
    d, p = draw(st.integers(1, 4)), draw(st.integers(1, tile))
    steps = draw(st.sampled_from([1, 2, 9, 49, 1024]))
    n = draw(st.integers(tile, 3 * tile * p + 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    source = rng.choice(np.array([-128, 127, -1, 0, 1, 5], np.int8), n) if draw(st.booleans()) else \
        rng.integers(-128, 128, n).astype(np.int8)
    xs = rng.integers(0, n - tile + 1, (d, steps, p))
    ws = rng.integers(0, n - tile + 1, (d, steps))
    edge = draw(st.sampled_from([0, 2**31 - 1, -2**31]))
    base = draw(st.integers(0, 5))
    out = (edge - np.sign(edge) * rng.integers(0, 2**24, base + d * p * tile + 3)).astype(np.int32)
    return tile, source, xs, ws, out, base


@given(tap_sums(), st.booleans())
def test_the_tap_sum_kernel_equals_numpys_sum_over_the_taps(drawn, assign):
    tile, source, xs, ws, out, base = drawn
    lanes = np.arange(tile)
    x, w = source[xs[..., None] + lanes], source[ws[..., None] + lanes]
    exact = np.einsum("dspc,dsc->dpc", x.astype(np.int64), w.astype(np.int64)).reshape(-1)
    want = out.copy()
    at = slice(base, base + exact.size)
    want[at] = exact if assign else (want[at].astype(np.int64) + exact).astype(np.int32)     # wraps
    # (from numpy's float32 einsum, as the plan summed before: the same, exact)
    assert (np.einsum("dspc,dsc->dpc", x, w, dtype=np.float32).astype(np.int64).reshape(-1) == exact).all()
    kernels.tap_sum(tile, assign)(source, np.ascontiguousarray(xs), np.ascontiguousarray(ws), out, base)
    np.testing.assert_array_equal(out, want)


def test_kernels_read_and_write_views_at_any_offset():
    """The plan's vectors are views of its workspace at any element offset: no alignment is
    assumed beyond the element's."""
    source = np.arange(41, dtype=np.int8)[1:] % 7
    out = np.zeros(9, np.int32)[1:]
    kernels.tap_sum(4, True)(source, np.array([[[1, 3]]]), np.array([[2]]), out, 0)
    lanes = np.arange(4)
    np.testing.assert_array_equal(out, np.concatenate([source[1 + lanes] * source[2 + lanes],
                                                       source[3 + lanes] * source[2 + lanes]]))


@given(tap_sums(), st.booleans(), st.data())
def test_the_scaled_rows_kernel_equals_numpys_product(drawn, assign, data):
    tile, source, xs, _, out, base = drawn
    starts = np.ascontiguousarray(xs[:, 0, :].reshape(-1))     # as many rows as out holds after base
    w = data.draw(st.integers(0, source.size - 1))
    exact = (source[starts[:, None] + np.arange(tile)].astype(np.int64) * int(source[w])).reshape(-1)
    want = out.copy()
    at = slice(base, base + exact.size)
    want[at] = exact if assign else (want[at].astype(np.int64) + exact).astype(np.int32)     # wraps
    kernels.scaled_rows(tile, assign)(source, starts, w, out, base)
    np.testing.assert_array_equal(out, want)


@st.composite
def gemms(draw):
    """A block product's operands: an int8 source vector (extremes often: -128 * -128 summed is
    the largest sum), rows of ``runs`` runs of ``tile`` anywhere in it (overlapping, odd tiles:
    an odd number of terms), ragged counts of rows and channels (no multiple of the kernel's 4
    rows or its blocks of channels), terms past 1024 (float32's exact limit) and past the
    2**16 the kernel sums before adding, and int32 values to add into near the limits."""
    tile = draw(st.sampled_from([1, 2, 3, 4, 16]))
    runs = draw(st.sampled_from([1, 2, 5, 65]) | st.just(2**16 // tile + 3)) if draw(st.booleans()) else \
        draw(st.integers(1, 8))
    rows = draw(st.integers(1, 9 if runs * tile < 2000 else 2))
    cols = draw(st.integers(1, 40 if runs * tile < 2000 else 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(tile, 400)) if runs * tile < 2000 else runs * tile + 5
    source = np.full(n, draw(st.sampled_from([-128, 127])), np.int8) if draw(st.booleans()) else \
        rng.choice(np.array([-128, 127, -1, 0, 1], np.int8), n) if draw(st.booleans()) else \
        rng.integers(-128, 128, n).astype(np.int8)
    xs = rng.integers(0, n - tile + 1, (rows, runs))
    ws = rng.integers(0, n - tile + 1, (cols, runs))
    base, ld = draw(st.integers(0, 5)), cols + draw(st.integers(0, 3))
    edge = draw(st.sampled_from([0, 2**31 - 1, -2**31]))
    out = (edge - np.sign(edge) * rng.integers(0, 2**20, base + rows * ld + 2)).astype(np.int32)
    return tile, source, xs, ws, out, base, ld


@given(gemms(), st.booleans(), st.sampled_from([None, "x86-64"]))
def test_the_gemm_kernel_equals_numpys_int64_product(drawn, assign, cpu):
    """On this CPU and compiled for x86-64's baseline (SSE2's 128-bit multiply-adds): every
    output set or increased (wrapping) by the exact product, the rest of ``out`` untouched."""
    tile, source, xs, ws, out, base, ld = drawn
    lanes = np.arange(tile)
    x = source[xs[..., None] + lanes].reshape(len(xs), -1).astype(np.int64)
    w = source[ws[..., None] + lanes].reshape(len(ws), -1).astype(np.int64)
    want = out.copy()
    block = want[base:base + len(xs) * ld].reshape(len(xs), ld)[:, :len(ws)]
    block[:] = (x @ w.T if assign else block + x @ w.T).astype(np.int32)     # wraps
    kernels.gemm(tile, assign, cpu)(source, xs, ws, out, base, ld)
    np.testing.assert_array_equal(out, want)


_EDGES = np.array([-2**31, -2**31 + 1, -129, -128, -1, 0, 1, 2, 127, 128, 2**31 - 2, 2**31 - 1], np.int64)


# the chain kernel's codes of two steps by immediates
_TWO = {kernels.SCALE: (AluOp.MUL, AluOp.SHR), kernels.ROUND: (AluOp.ADD, AluOp.SHR),
        kernels.MIN_MAX: (AluOp.MIN, AluOp.MAX), kernels.MAX_MIN: (AluOp.MAX, AluOp.MIN)}


@st.composite
def chains(draw):
    """A chain kernel's program over a vector of int32 values (extremes often: wrap-around,
    clip bounds, shifts by more than 31 or less than 0, halves that round), every step code
    and operand kind, ``rows`` not a multiple of the kernel's block, written in place or apart;
    some steps narrow the rows so far into an int8 target (``(code, lanes, at)``)."""
    tile = draw(st.sampled_from([2, 4, 16]))
    rows = draw(st.integers(1, 40))
    n = rows * tile
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    size = 3 * n + 5        # operands in the first 2 * n + 5, results written in place or after them
    reach = size - n
    values = np.where(rng.random(size) < 0.5, rng.choice(_EDGES, size), rng.integers(-2**31, 2**31, size))
    values = values.astype(np.int32)
    tables = rng.integers(-128, 128, 2 * 256 + 7).astype(np.int8)     # two tables, the second one unaligned
    steps = draw(st.lists(st.tuples(st.sampled_from([*map(int, AluOp), kernels.LOOKUP, kernels.WRAPPED,
                                                     kernels.SATURATED, *_TWO]),
                                    st.sampled_from([kernels.IMM, kernels.RUN, kernels.ROWS, kernels.SPLAT]),
                                    st.sampled_from(list(_EDGES)) | st.integers(-40, 40)), min_size=0, max_size=8))
    bases, program = [], []

    def operand(kind: int, imm: int) -> tuple[int, int]:
        if kind == kernels.IMM:
            return kind, imm
        if kind == kernels.RUN:
            return kind, int(rng.integers(0, reach - n + 1))
        at = sum(b.size for b in bases)
        bases.append(rng.integers(0, reach - tile + 1, rows))
        return kind, at
    in_place = draw(st.booleans())
    program.append((0, kernels.RUN, reach) if in_place else
                   (0, *operand(draw(st.sampled_from([kernels.RUN, kernels.ROWS, kernels.SPLAT])), 0)))
    for code, kind, imm in steps:
        if code in (kernels.WRAPPED, kernels.SATURATED):      # (a block of the target each)
            program.append((code, int(rng.integers(1, tile + 1)), sum(p[0] in (kernels.WRAPPED, kernels.SATURATED)
                                                                      for p in program) * n))
            continue
        if code in _TWO:
            program.append((code, imm, int(rng.choice(_EDGES)) if rng.random() < 0.3 else int(rng.integers(-40, 40))))
            continue
        program.append((code, kernels.IMM, int(rng.choice([0, 256 + 7]))) if code == kernels.LOOKUP else
                       (code, *operand(kind, imm)))
    out = reach
    bases = np.concatenate(bases) if bases else np.zeros(1, np.int64)
    return tile, rows, values, bases, tables, np.array(program, np.int64), out


def _rows(values, bases, kind, value, rows, tile):
    """The ``rows x tile`` values an operand of the chain kernel reads (numpy, int32)."""
    lanes = np.arange(tile)
    if kind == kernels.RUN:
        return values[value + np.arange(rows * tile)].reshape(rows, tile)
    starts = bases[value:value + rows]
    return values[starts[:, None] + (lanes if kind == kernels.ROWS else 0 * lanes)]


@given(chains())
def test_the_chain_kernel_equals_the_alu_ufuncs_step_by_step(drawn):
    """Every step as the simulator's fast paths compute it (ALU_UFUNCS on int32, wrapping; a
    shift's operand clipped to 0..31; a lookup of the value clipped to int8), in one pass; the
    rows so far narrowed as a STORE of that mode narrows them (numpy's cast: the low byte)."""
    tile, rows, values, bases, tables, program, out = drawn
    want = values.copy()
    target = np.zeros(8 * rows * tile, np.int8)
    want_target = target.copy()
    acc = _rows(values, bases, program[0, 1], program[0, 2], rows, tile)
    for code, kind, value in program[1:].tolist():
        if code in (kernels.WRAPPED, kernels.SATURATED):
            narrowed = np.clip(acc, -128, 127) if code == kernels.SATURATED else acc
            want_target[value:value + rows * kind] = narrowed[:, :kind].reshape(-1).astype(np.int8)
            continue
        if code in _TWO:
            for op, imm in zip(_TWO[code], (kind, value)):
                with np.errstate(over="ignore"):
                    acc = ALU_UFUNCS[op](acc, alu_operand(op, np.int32(imm))).astype(np.int32)
            continue
        if code == kernels.LOOKUP:
            acc = tables[value + np.clip(acc, -128, 127) + 128].astype(np.int32)
            continue
        operand = np.int32(value) if kind == kernels.IMM else _rows(values, bases, kind, value, rows, tile)
        with np.errstate(over="ignore"):
            acc = ALU_UFUNCS[AluOp(code)](acc, alu_operand(AluOp(code), operand)).astype(np.int32)
    want[out:out + rows * tile] = acc.reshape(-1)
    got = values.copy()
    kernels.alu_chain(tile)(*(tvm_ffi.from_dlpack(a) for a in (got, bases, tables, program, target)), rows, out)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(target, want_target)


@pytest.mark.parametrize("cpu", [None, "x86-64"])
def test_lookups_read_every_entry_of_their_tables(cpu):
    """Every int8 value (and values past them, clipped) looked up in a table at an odd offset,
    then the results in another: on this CPU (by byte permutes of the table with AVX-512 VBMI) and
    compiled for x86-64's baseline (a load per value) alike; rows not a whole block of the kernel."""
    tile, rows = 16, 21
    values = np.concatenate([np.arange(-168, 168), np.zeros(rows * tile)]).astype(np.int32)
    tables = np.random.default_rng(0).integers(-128, 128, 2 * 256 + 7).astype(np.int8)
    program = np.array([[0, kernels.RUN, 0], [kernels.LOOKUP, kernels.IMM, 263], [kernels.LOOKUP, kernels.IMM, 0]])
    arrays = (values, np.zeros(1, np.int64), tables, program, np.zeros(1, np.int8))
    kernels.alu_chain(tile, cpu)(*(tvm_ffi.from_dlpack(a) for a in arrays), rows, rows * tile)
    first = tables[263 + np.clip(np.arange(-168, 168), -128, 127) + 128]
    np.testing.assert_array_equal(values[rows * tile:], tables[first.astype(np.int64) + 128])


def test_chains_in_one_pass_equal_them_one_after_the_other():
    """WRITE ends a chain and START begins the next over the same rows, which reads what the
    first wrote as the same run (and other rows): the values of the two calls, in one."""
    tile, rows = 4, 21       # (rows: a block of the kernel and part of one)
    rng = np.random.default_rng(0)
    values = rng.integers(-2**31, 2**31, 4 * rows * tile).astype(np.int32)
    bases = rng.integers(0, rows * tile, rows)
    first, second = [[0, kernels.RUN, 0], [int(AluOp.MUL), kernels.IMM, 3]], \
        [[0, kernels.RUN, 2 * rows * tile], [int(AluOp.ADD), kernels.RUN, rows * tile],
         [int(AluOp.MAX), kernels.ROWS, 0]]
    want, got = values.copy(), values.copy()

    def run(values, program, out):
        arrays = (values, bases, np.zeros(1, np.int8), np.array(program, np.int64), np.zeros(1, np.int8))
        kernels.alu_chain(tile)(*(tvm_ffi.from_dlpack(a) for a in arrays), rows, out)
    run(want, first, rows * tile)
    run(want, second, 3 * rows * tile)
    run(got, first + [[kernels.WRITE, kernels.IMM, rows * tile], [kernels.START, *second[0][1:]], *second[1:]],
        3 * rows * tile)
    np.testing.assert_array_equal(got, want)


def test_every_kernel_of_a_tile_comes_from_one_compile():
    """tap_sum, scaled_rows, gemm and alu_chain for this CPU share one compiled module per tile
    (a compile costs ~0.4 s of a model's first call)."""
    before = kernels._module.cache_info().misses
    kernels.tap_sum(5, True), kernels.scaled_rows(5, False), kernels.gemm(5, True), kernels.alu_chain(5)
    assert kernels._module.cache_info().misses == before + 1


def _forget() -> None:
    """No kernels of this process remembered: the next use loads or compiles them."""
    for cached in (kernels._module, kernels.tap_sum, kernels.scaled_rows, kernels.gemm, kernels.alu_chain,
                   kernels.copy_runs):
        cached.cache_clear()


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """An empty kernel cache, as a new machine has (the process' kernels forgotten before and after)."""
    monkeypatch.setattr(kernels, "CACHE", tmp_path)
    _forget()
    yield tmp_path
    _forget()


def _check_tap_sum(tile: int) -> None:
    source = np.arange(3 * tile, dtype=np.int8) - tile
    xs, ws, out = np.array([[[0, tile]]]), np.array([[2 * tile]]), np.zeros(2 * tile, np.int32)
    kernels.tap_sum(tile, assign=True)(source, xs, ws, out, 0)
    wide = source.astype(np.int32)
    np.testing.assert_array_equal(out, np.concatenate([wide[:tile] * wide[2 * tile:],
                                                       wide[tile:2 * tile] * wide[2 * tile:]]))


def test_a_later_process_loads_the_kernels_an_earlier_one_compiled(kernel_cache, monkeypatch):
    _check_tap_sum(4)                       # compiled, and kept
    assert [p.name for p in kernel_cache.iterdir()] == [kernels.cache_path(4).name]
    # the kept library's machine code runs: llvm compiled the kernels once, for the file
    assert kernels._module(4).kind == "library"
    _forget()

    def compile_again(tile, cpu=None):
        raise AssertionError("compiled again instead of loaded")
    monkeypatch.setattr(kernels, "_compile", compile_again)
    _check_tap_sum(4)                       # loaded: the same machine code
    values = np.array([5, -7, 0, 0], np.int32)
    program = np.array([[0, kernels.RUN, 0], [int(AluOp.MUL), kernels.IMM, 3]])
    arrays = (values, np.zeros(1, np.int64), np.zeros(1, np.int8), program, np.zeros(1, np.int8))
    kernels.alu_chain(4)(*(tvm_ffi.from_dlpack(a) for a in arrays), 1, 0)
    assert values.tolist() == [15, -21, 0, 0]


def test_a_damaged_kernel_file_is_compiled_again_and_replaced(kernel_cache, monkeypatch):
    path = kernels.cache_path(4)
    path.write_bytes(b"a library cut short by a full disk")
    _check_tap_sum(4)
    _forget()
    monkeypatch.setattr(kernels, "_compile", lambda tile, cpu=None: pytest.fail("the replaced file was not loaded"))
    _check_tap_sum(4)
    assert [p.name for p in kernel_cache.iterdir()] == [path.name]     # no temporary left


def test_no_cache_keeps_nothing(kernel_cache, monkeypatch):
    monkeypatch.setattr(kernels, "CACHE", None)
    assert kernels.cache_path(4) is None
    _check_tap_sum(4)
    assert not list(kernel_cache.iterdir())


def test_kernels_of_another_source_constants_tvm_or_cpu_are_not_loaded(tmp_path, monkeypatch):
    """What the machine code depends on names its file: a change of any of it compiles anew."""
    monkeypatch.setattr(kernels, "CACHE", tmp_path)
    names = {kernels.cache_path(4), kernels.cache_path(16)}
    edited = tmp_path / "kernels.py"
    edited.write_bytes(open(kernels.__file__, "rb").read().replace(b"_CHAIN_ROWS = 16", b"_CHAIN_ROWS = 4"))
    changes = [("__file__", str(edited)), ("LUT_ENTRIES", kernels.LUT_ENTRIES * 2),
               ("_target", lambda cpu=None: "llvm -mcpu=another")]
    for name, value in changes:
        with monkeypatch.context() as m:
            m.setattr(kernels, name, value)
            names.add(kernels.cache_path(4))
    with monkeypatch.context() as m:
        import tvm
        m.setattr(tvm, "__version__", "0.0")
        names.add(kernels.cache_path(4))
    assert len(names) == 2 + len(changes) + 1
