"""The vecunit example backend: its instructions against numpy, its runtime's checks, and
whole Relax models built with tp.build bit-exact against tvm.compile(mod, "llvm") and numpy
on shapes hypothesis draws; composed with accel; small enough to read."""

import ast
import doctest
import io
import pathlib
import re
import tokenize

import numpy as np
import pytest
import tvm
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tvm import relax

import tirpat as tp
from tirpat import device

import vecunit
from vecunit import ALU, INSTRUCTIONS, RUNTIME, VecUnit, VecUnitError
from vecunit import compiler, isa, runtime

PACKAGE = pathlib.Path(vecunit.__file__).parent
tp.register_backend(vecunit.VecUnitBackend)
R = relax.op


# -- the instructions, against numpy -----------------------------------------------------
def _wrap(x):
    return np.asarray(x, np.int64).astype(np.int8)       # int8 arithmetic wraps around


REFERENCE = {   # each instruction's meaning, stated independently of vecunit.isa
    "vmov": lambda a: a,
    "vadd": lambda a, b: _wrap(a.astype(np.int64) + b), "vsub": lambda a, b: _wrap(a.astype(np.int64) - b),
    "vmax": np.maximum, "vmin": np.minimum,
    "vaddi": lambda a, s: _wrap(a.astype(np.int64) + s), "vsubi": lambda a, s: _wrap(a.astype(np.int64) - s),
    "vmaxi": lambda a, s: np.maximum(a, np.int8(s)), "vmini": lambda a, s: np.minimum(a, np.int8(s)),
    "vclip": lambda a, lo, hi: np.maximum(np.minimum(a, np.int8(hi)), np.int8(lo)),
    "vfill": lambda s: np.int8(s),
}
int8s = st.integers(-128, 127)


def test_every_alu_instruction_has_a_reference():
    assert sorted(REFERENCE) == sorted(ALU) and sorted(INSTRUCTIONS) == sorted([*ALU, "vld", "vst"])


def _sources_and_immediates(ins):
    """The register sources and the immediates of ALU instruction ``ins``, by declaration."""
    return ([o.name for o in ins.memory_operands if o.name != "d"],
            [o.name for o in ins.operands if o.kind == "scalar" and o.name != "n"])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(ALU)), st.sampled_from([4, 8, 16]), st.data())
def test_each_instruction_does_what_numpy_does(name, lanes, data):
    ins = ALU[name]
    srcs, imm_names = _sources_and_immediates(ins)
    n = data.draw(st.integers(0, lanes), label="n")
    regs = data.draw(st.lists(st.lists(int8s, min_size=lanes, max_size=lanes), min_size=4, max_size=4))
    imms = data.draw(st.lists(int8s, min_size=len(imm_names), max_size=len(imm_names)))
    with VecUnit(lanes=lanes, regs=4) as s:
        s.vrf[:] = np.array(regs, np.int8).reshape(-1)
        before = s.vrf.copy()
        # destination r0, sources r1, r2 (a source may also be the destination)
        RUNTIME.functions[name](0, *[lanes * (k + 1) for k in range(len(srcs))], *imms, n)
    srcs = [before[lanes * (k + 1):lanes * (k + 2)][:n] for k in range(len(srcs))]
    expect = before.copy()
    expect[:n] = REFERENCE[name](*srcs, *imms)
    np.testing.assert_array_equal(s.vrf, expect)       # lanes past n and other registers untouched
    assert s.stats.instructions == {name: 1} and s.stats.active_lanes == n
    # the declared program, run as the reference, says the same
    values = {"d": before[:lanes], **{r: before[lanes * (k + 1):lanes * (k + 2)] for k, r in enumerate(
        _sources_and_immediates(ins)[0])}, **dict(zip(imm_names, imms)), "n": n}
    np.testing.assert_array_equal(ins.reference(lanes=lanes, **values)["d"], expect[:lanes])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.data())
def test_loads_and_stores_move_strided_padded_rows(n, data):
    host = np.arange(-60, 60, dtype=np.int8)
    stride = data.draw(st.integers(-3, 3))
    front = data.draw(st.integers(0, n))
    back = data.draw(st.integers(0, n - front))
    first = data.draw(st.integers(0, host.size - 1))
    offset = first - front * stride
    pad = data.draw(int8s)
    inside = [first + i * stride for i in range(n - front - back)]
    ok = all(0 <= i < host.size for i in inside)
    out = np.zeros(20, np.int8)
    with VecUnit(lanes=8, regs=2) as s:
        s.vrf[:] = 99
        try:
            RUNTIME.functions["vld"](8, host, offset, stride, n, front, back, pad)
        except device.BoundsError:
            assert not ok
            return
        RUNTIME.functions["vst"](out, 3, 2, 8, n)
    assert ok
    lanes = [pad] * front + [int(host[i]) for i in inside] + [pad] * back
    assert s.vrf[8:8 + n].tolist() == lanes and s.vrf[8 + n:].tolist() == [99] * (8 - n)
    assert out[3:3 + 2 * n:2].tolist() == lanes and not out[4::2].any()
    # the simulator's loads and stores do what the declared programs do
    loaded = INSTRUCTIONS["vld"].reference(lanes=8, d=np.full(8, 99, np.int8), host=host, offset=offset,
                                           stride=stride, n=n, front=front, back=back, pad=pad)["d"]
    np.testing.assert_array_equal(loaded, s.vrf[8:])
    stored = INSTRUCTIONS["vst"].reference(lanes=8, host=np.zeros(20, np.int8), offset=3, stride=2, src=loaded, n=n)
    np.testing.assert_array_equal(stored["host"], out)


def test_malformed_instructions_are_refused_before_anything_runs():
    x, out = np.arange(16, dtype=np.int8), np.zeros(16, np.int8)
    cases = [
        (("vadd", 0, 16, 32, 17), VecUnitError, "vadd: vector length 17 is outside \\[0, 16\\]"),
        (("vmaxi", 0, 8, 0, 4), VecUnitError, "vmaxi: register address 8 is not a multiple of 16"),
        (("vmax", 0, 16, 512, 4), device.BoundsError, "the vector register file: elements \\[512, 528\\)"),
        (("vld", 0, x, 4, 1, 16, 0, 0, 0), device.BoundsError, "elements \\[4, 20\\) are outside its 16"),
        (("vld", 0, x, 0, 1, 4, 3, 2, 0), VecUnitError, "vld: lanes \\[3, 2\\) are not inside"),
    ]
    for (name, *args), error, message in cases:
        with VecUnit(regs=4) as s:
            RUNTIME.functions["vst"](out, 0, 1, 0, 16)         # queued before the failing one
            with pytest.raises(error, match=message):
                device.invoke(RUNTIME.functions[name], *args)
            assert s.pending == 0                               # the failed call took the stream with it
    assert not out.any()
    frozen = np.zeros(4, np.int8)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        with VecUnit():
            RUNTIME.functions["vst"](frozen, 0, 1, 0, 4)


# -- whole models through tp.build ----------------------------------------------------------
def _compiled_reference(mod, args):
    out = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())["main"](*map(tvm.runtime.tensor, args))
    return out.numpy()


def _function(params, body):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb))
        bb.emit_func_output(out)
    return bb.get()


BINARY = {"add": np.add, "subtract": np.subtract, "maximum": np.maximum, "minimum": np.minimum}


@st.composite
def chains(draw):
    """A chain of 1-4 int8 elementwise operators on tensors of one shape, with a numpy reference."""
    shape = tuple(draw(st.lists(st.integers(1, 24), min_size=1, max_size=3).filter(lambda s: np.prod(s) > 1)))
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from([*BINARY, "relu", "clip"]))
        if op == "clip":
            lo, hi = sorted(draw(st.lists(int8s, min_size=2, max_size=2)))
            steps.append((op, lo, hi))
        elif op == "relu":
            steps.append((op,))
        else:
            other = draw(st.one_of(st.just("input"), int8s))
            first = op == "add" and draw(st.booleans())       # vaddi takes its immediate either side
            steps.append((op, other, first))
    return shape, steps


def _chain_model(shape, steps):
    inputs = [relax.Var("x", relax.TensorType(shape, "int8"))]
    for step in steps:
        if step[1:2] == ("input",):
            inputs.append(relax.Var(f"y{len(inputs)}", relax.TensorType(shape, "int8")))

    def body(bb):
        value, extra = inputs[0], iter(inputs[1:])
        for op, *args in steps:
            if op == "relu":
                value = R.nn.relu(value)
            elif op == "clip":
                value = R.clip(value, *args)
            else:
                other = next(extra) if args[0] == "input" else relax.const(args[0], "int8")
                value = getattr(R, op)(*((other, value) if args[1] else (value, other)))
            value = bb.emit(value)
        return value

    return _function(inputs, body)


def _chain_numpy(steps, arrays):
    value, extra = arrays[0].astype(np.int64), iter(arrays[1:])
    for op, *args in steps:
        if op == "relu":
            value = np.maximum(value, 0)
        elif op == "clip":
            value = np.clip(value, *args)
        else:
            other = next(extra) if args[0] == "input" else args[0]
            value = BINARY[op](*((other, value) if args[1] else (value, other)))
        value = _wrap(value).astype(np.int64)
    return value.astype(np.int8)


def _offloaded(model, patterns):
    report = model.report.to_json()
    assert [p["backend"] for p in report["partitions"]] == ["vecunit"] * len(patterns), report
    assert sorted(p.pattern for p in model.report.partitions) == sorted(patterns)
    assert report["on_host"] == [] and all(p.rules for p in model.report.partitions)


@settings(max_examples=8, deadline=None)
@given(chains(), st.sampled_from([4, 16]))
def test_elementwise_chains_are_exact(chain, lanes):
    shape, steps = chain
    mod = _chain_model(shape, steps)
    model = tp.build(mod, f"vecunit -lanes={lanes}, llvm", strict=True)
    args = [np.random.default_rng(len(steps)).integers(-128, 128, shape, dtype=np.int8)
            for _ in mod["main"].params]
    got = model(*args)
    np.testing.assert_array_equal(got, _compiled_reference(mod, args))
    np.testing.assert_array_equal(got, _chain_numpy(steps, args))
    _offloaded(model, ["vecunit.elementwise"])
    stats = model.stats["vecunit"]
    axis = max(k for k, d in enumerate(shape) if d > 1)      # vectors along the last axis longer than 1
    assert stats.instructions["vst"] == -(-shape[axis] // lanes) * int(np.prod(shape[:axis]))


def _max_pool_numpy(x, size, stride, dilation, padding, ceil, layout):
    if layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    out_hw = []
    for d in range(2):
        span = x.shape[2 + d] + padding[d] + padding[d + 2] - dilation[d] * (size[d] - 1) - 1
        out = (-(-span // stride[d]) if ceil else span // stride[d]) + 1
        if ceil and (out - 1) * stride[d] >= x.shape[2 + d] + padding[d]:
            out -= 1            # the last window must start inside the input or its leading padding
        out_hw.append(out)
    big = np.full((*x.shape[:2], x.shape[2] + padding[0] + padding[2] + stride[0] * size[0] * 2,
                   x.shape[3] + padding[1] + padding[3] + stride[1] * size[1] * 2), -128, np.int8)
    big[:, :, padding[0]:padding[0] + x.shape[2], padding[1]:padding[1] + x.shape[3]] = x
    out = np.full((*x.shape[:2], *out_hw), -128, np.int8)
    for r in range(size[0]):
        for s in range(size[1]):
            h0, w0 = r * dilation[0], s * dilation[1]
            window = big[:, :, h0:h0 + stride[0] * out_hw[0]:stride[0], w0:w0 + stride[1] * out_hw[1]:stride[1]]
            out = np.maximum(out, window)
    return out.transpose(0, 2, 3, 1) if layout == "NHWC" else out


@st.composite
def pools(draw):
    size = tuple(draw(st.lists(st.integers(1, 3), min_size=2, max_size=2)))
    stride = tuple(draw(st.lists(st.integers(1, 3), min_size=2, max_size=2)))
    dilation = tuple(draw(st.lists(st.integers(1, 2), min_size=2, max_size=2)))
    padding = tuple(draw(st.integers(0, size[k % 2] - 1)) for k in range(4))
    hw = [draw(st.integers(dilation[d] * (size[d] - 1) + 1, 20)) for d in range(2)]
    c = draw(st.integers(1, 5))
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    shape = (1, c, *hw) if layout == "NCHW" else (1, *hw, c)
    return shape, size, stride, dilation, padding, draw(st.booleans()), layout


@settings(max_examples=8, deadline=None)
@given(pools(), st.sampled_from([8, 16]))
def test_max_pooling_is_exact(pool, lanes):
    shape, size, stride, dilation, padding, ceil, layout = pool
    arg = np.random.default_rng(sum(shape)).integers(-128, 128, shape, dtype=np.int8)
    expect = _max_pool_numpy(arg, size, stride, dilation, padding, ceil, layout)
    assume(expect.size > 1)             # a single element is no vector: vecunit declines it
    x = relax.Var("x", relax.TensorType(shape, "int8"))
    mod = _function([x], lambda bb: R.nn.max_pool2d(x, size, stride, padding, dilation, ceil, layout=layout))
    model = tp.build(mod, f"vecunit -lanes={lanes}, llvm", strict=True)
    got = model(arg)
    np.testing.assert_array_equal(got, _compiled_reference(mod, [arg]))
    np.testing.assert_array_equal(got, expect)
    _offloaded(model, ["vecunit.max_pool2d"])
    assert model.stats["vecunit"].instructions["vmax"] == model.stats["vecunit"].instructions["vld"]


# -- with accel, and what stays on the host ----------------------------------------------
def _residual_block(h=6, w=10, c=8):
    """accel: conv2d + bias + requantise; vecunit: residual add + ReLU, then a max pool (NHWC)."""
    x = relax.Var("x", relax.TensorType((1, h, w, c), "int8"))
    k = relax.Var("k", relax.TensorType((3, 3, c, c), "int8"))
    b = relax.Var("b", relax.TensorType((c,), "int32"))

    def body(bb):
        y = bb.emit(R.nn.conv2d(x, k, padding=1, data_layout="NHWC", kernel_layout="HWIO", out_dtype="int32"))
        y = bb.emit(R.right_shift(R.add(R.add(y, b), relax.const(128, "int32")), relax.const(8, "int32")))
        q = bb.emit(R.astype(R.clip(y, -128, 127), "int8"))
        r = bb.emit(R.nn.relu(R.add(q, x)))
        return R.nn.max_pool2d(r, (2, 2), (2, 2), layout="NHWC")

    return _function([x, k, b], body)


def test_composed_with_accel():
    mod = _residual_block()
    model = tp.build(mod, "accel, vecunit, llvm", strict=True)
    rng = np.random.default_rng(0)
    args = [rng.integers(-128, 128, (1, 6, 10, 8), dtype=np.int8), rng.integers(-128, 128, (3, 3, 8, 8), dtype=np.int8),
            rng.integers(-4000, 4000, (8,), dtype=np.int32)]
    np.testing.assert_array_equal(model(*args), _compiled_reference(mod, args))
    report = model.report.to_json()
    # accel, first, takes the convolution and the max pool (both backends offer one), vecunit the add + ReLU
    assert sorted((p["backend"], p["pattern"]) for p in report["partitions"]) == [
        ("accel", "accel.conv2d"), ("accel", "accel.pool"), ("vecunit", "vecunit.elementwise")]
    assert report["macs"]["accel"] == report["total_macs"] > 0 and report["on_host"] == []
    assert set(model.stats) == {"accel", "vecunit"} and model.stats["vecunit"].instructions["vadd"] > 0


def test_what_vecunit_declines_stays_on_the_host_with_the_reason():
    x = relax.Var("x", relax.TensorType((4, 8), "int8"))
    b = relax.Var("b", relax.TensorType((8,), "int8"))
    f = relax.Var("f", relax.TensorType((4, 8), "float32"))
    mod = _function([x, b, f], lambda bb: R.add(R.astype(R.add(x, b), "float32"), R.nn.relu(f)))
    with pytest.warns(tp.OffloadWarning):
        model = tp.build(mod, "vecunit, llvm")
    reasons = {h["var"] if "var" in h else h["op"]: h["reason"] for h in model.report.to_json()["on_host"]}
    assert any("no broadcasting on vecunit" in r for r in reasons.values()), reasons
    assert any("vecunit computes int8 vectors" in r for r in reasons.values()), reasons
    args = [np.arange(32, dtype=np.int8).reshape(4, 8), np.arange(8, dtype=np.int8), np.ones((4, 8), np.float32)]
    np.testing.assert_array_equal(model(*args), _compiled_reference(mod, args))


def test_too_few_registers_leave_the_partition_on_the_host_and_say_so(tmp_path, monkeypatch):
    shape = (4, 20)
    mod = _chain_model(shape, [("add", "input", False), ("maximum", "input", False), ("relu",)])
    with pytest.warns(tp.OffloadWarning, match="vecunit could not lower it .*ScratchpadOverflow: .*scratchpad VRF "
                      "overflows .* live: "):
        model = tp.build(mod, "vecunit -regs=2, llvm")
    rng = np.random.default_rng(0)
    args = [rng.integers(-128, 128, shape, dtype=np.int8) for _ in model.inputs]
    np.testing.assert_array_equal(model(*args), _compiled_reference(mod, args))
    with pytest.raises(tp.OffloadError, match="ScratchpadOverflow"):
        tp.build(mod, "vecunit -regs=2, llvm", strict=True)
    # reported as on the host, and the model needs no vecunit to run: none of its code is in it
    (part,) = model.report.partitions
    text = str(model.report)
    assert f"vecunit: {part.function}" not in text
    assert re.search(rf"  on the host:\n    {part.function} \(vecunit.elementwise\): add \+ .*, 0 MACs: vecunit could "
                     r"not lower it \(its TIR passes or rules raised ScratchpadOverflow", text), text
    assert model.backends == [] and model.stats == {}
    assert model.profile().startswith(f"vecunit: nothing ran on it (its partition {part.function} ran on the host: "
                                      "vecunit could not lower it")
    path = model.export(tmp_path / "fell_back.tirpat")
    monkeypatch.setattr(tp.model.backend, "_REGISTRY", {k: v for k, v in tp.backends().items() if k != "vecunit"})
    loaded = tp.load(path)
    np.testing.assert_array_equal(loaded(*args), _compiled_reference(mod, args))
    assert loaded.profile() == model.profile()


def test_the_profile_of_statistics_without_a_summary_lists_their_fields():
    model = tp.build(_chain_model((4, 20), [("relu",)]), "vecunit, llvm")
    assert model.profile() == "vecunit: nothing ran yet (call the model first)"
    model(np.zeros((4, 20), np.int8))
    # 4 rows of 20 elements: two 16-lane vectors a row (16 + 4 lanes used of 32)
    assert model.profile() == ("vecunit:\n  instructions: vld 8, vmaxi 8, vst 8\n  active_lanes: 240\n"
                               "  issued_lanes: 384\n  bytes: load 80, store 80")
    once = model.profile()
    model(np.zeros((4, 20), np.int8))
    assert model.profile() == once      # each call's statistics, not the session's since it was made


def test_a_device_error_in_a_model_call_arrives_as_itself(monkeypatch):
    model = tp.build(_chain_model((4, 20), [("relu",)]), "vecunit, llvm")
    narrow = vecunit.VecUnit(lanes=4)          # a device narrower than the code was compiled for
    narrow.options = {"lanes": 16, "regs": 32}  # that says it is not: only the device can tell
    monkeypatch.setattr(vecunit.VecUnitBackend, "session", lambda self, opts: narrow)
    with pytest.raises(VecUnitError, match="vld: vector length 16 is outside \\[0, 4\\]"):
        model(np.zeros((4, 20), np.int8))
    assert narrow.pending == 0


def test_code_built_for_other_options_refuses_the_session(monkeypatch):
    """The options travel with the code: a session made for other lanes (or that does not
    say which) is refused before the device does anything, called directly or in a model."""
    mod = _chain_model((4, 20), [("relu",)])
    x = np.zeros((4, 20), np.int8)
    executable = tvm.compile(mod, "llvm", relax_pipeline=tp.relax_pipeline("vecunit -lanes=8, llvm"),
                             tir_pipeline=tp.TIR_PIPELINE)
    run = relax.VirtualMachine(executable, tvm.cpu())["main"]
    with VecUnit(lanes=8) as s:
        run(tvm.runtime.tensor(x))
    assert s.stats.instructions["vld"] > 0
    with VecUnit() as s:
        with pytest.raises(device.OptionsMismatch, match="built for vecunit with lanes=8, but the current vecunit "
                                                         "session \\(VecUnit\\) has lanes=16"):
            run(tvm.runtime.tensor(x))
    assert s.stats.instructions == {}
    with pytest.raises(device.OptionsMismatch, match="this thread's default vecunit session"):
        run(tvm.runtime.tensor(x))
    silent = VecUnit(lanes=8)
    silent.options = None
    with silent, pytest.raises(device.OptionsMismatch, match="does not say which options it runs"):
        run(tvm.runtime.tensor(x))
    model = tp.build(mod, "vecunit -lanes=8, llvm")
    monkeypatch.setattr(vecunit.VecUnitBackend, "session", lambda self, opts: VecUnit(lanes=16))
    with pytest.raises(device.OptionsMismatch, match="this model's vecunit options say lanes=16, but its code "
                                                     "was compiled for lanes=8"):
        model(x)


def test_export_and_load():
    mod = _chain_model((3, 40), [("subtract", 5, False), ("clip", -20, 30)])
    model = tp.build(mod, "vecunit -lanes=8, llvm")
    x = np.arange(-60, 60, dtype=np.int8).reshape(3, 40)
    path = model.export(pathlib.Path(__import__("tempfile").mkdtemp()) / "m.tirpat")
    loaded = tp.load(path)
    np.testing.assert_array_equal(loaded(x), _chain_numpy([("subtract", 5, False), ("clip", -20, 30)], [x]))
    assert loaded.stats["vecunit"].instructions["vclip"] == 3 * 5


# -- the package itself ----------------------------------------------------------------
def code_lines(path: pathlib.Path) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docstrings)


def test_the_package_is_smaller_than_before_its_declarations():
    # 265 code lines before vecunit's instructions and register file were declared with tp.instr / tp.Memory
    total = sum(code_lines(p) for p in PACKAGE.glob("*.py"))
    assert 100 < total < 265, total


def test_the_hardware_side_imports_no_compiler_code():
    for module in ("isa.py", "runtime.py"):
        tree = ast.parse((PACKAGE / module).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not imported & {"compiler", "backend", "vecunit.compiler", "vecunit.backend"}, module
        assert "tirpat.model" not in imported


@pytest.mark.parametrize("module", [vecunit, isa, runtime, compiler, vecunit.backend], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
