"""``tp.Schedule``: ``s_tir.Schedule`` without TVM's Python argument check, the same primitives."""

import pytest
import tvm_ffi
from tvm import s_tir, te
from tvm.s_tir.schedule import _type_checker

import tirpat as tp


def _func():
    a = te.placeholder((64, 32), "int32", name="a")
    b = te.compute((64, 32), lambda i, j: a[i, j] + 1, name="b")
    c = te.compute((64, 32), lambda i, j: b[i, j] * 2, name="c")
    return te.create_prim_func([a, c])


def _steps(sch):
    """A few primitives on ``sch`` and on a copy of it; the copy's module."""
    sch.compute_inline(sch.get_sblock("b"))
    i, j = sch.get_loops(sch.get_sblock("c"))
    sch.split(i, [None, 16])
    copy = sch.copy()
    copy.transform_layout(copy.get_sblock("c"), ("write", 0), lambda i, j: (j, i))
    return copy


@pytest.fixture
def checks_fail(monkeypatch):
    """TVM's Python type check of a Schedule method's arguments raises when it runs."""
    def refuse(*_):
        raise AssertionError("TVM's Python type check ran")
    monkeypatch.setattr(_type_checker, "_type_check", refuse)


def test_primitives_and_copies_skip_the_python_type_check(checks_fail):
    copy = _steps(tp.Schedule(_func()))
    assert type(copy) is tp.Schedule
    with pytest.raises(AssertionError, match="type check ran"):       # what the fixture catches
        s_tir.Schedule(_func())


def test_the_same_modules_and_traces_as_tvms_schedule():
    ours, tvms = tp.Schedule(_func()), s_tir.Schedule(_func())
    ours_copy, tvms_copy = _steps(ours), _steps(tvms)
    for a, b in ((ours, tvms), (ours_copy, tvms_copy)):
        assert tvm_ffi.structural_equal(a.mod, b.mod)
        assert str(a.trace) == str(b.trace)


def test_a_wrongly_typed_argument_is_still_a_type_error():
    sch = tp.Schedule(_func())
    with pytest.raises(TypeError):
        sch.compute_inline(2.5)
    with pytest.raises(TypeError):
        sch.get_loops(None)
