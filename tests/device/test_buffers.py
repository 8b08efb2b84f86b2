"""The host buffer table: slots, zero-copy views, bounds checks, aliasing, borrowed tensors."""

import gc
import itertools
import types

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given
from hypothesis import strategies as st

from tirpat.device import BoundsError, BufferTable, SlotError, strided_view, tensor_view
from tirpat.device.buffers import host_span


def test_numpy_views_of_the_same_memory_share_a_slot_and_partial_overlaps_do_not():
    table = BufferTable()
    a = np.zeros(64, np.int32)
    s = table.slot(a)
    assert table.slot(a.reshape(8, 8)) == table.slot(a.reshape(4, 16)) == s
    assert table.slot(a.view(np.uint32)) != s            # another dtype: another slot
    tail = table.slot(a[32:])
    assert tail != s
    # ... but the byte ranges say where they overlap
    assert table.byte_range(s, 32, 64) == table.byte_range(tail, 0, 32)
    lo, hi = table.byte_range(s, 0, 64)
    assert hi - lo == a.nbytes


def test_views_are_zero_copy_and_numpy_arrays_are_kept_alive():
    table = BufferTable()
    slot = table.slot(np.arange(16, dtype=np.int8))      # no other reference to the array
    gc.collect()
    view = table.view(slot, 0, (4, 4))
    assert view.tolist() == np.arange(16).reshape(4, 4).tolist()
    view[0, 0] = 99
    assert table[slot][0] == 99


def test_borrowed_tensors_are_viewed_in_place_and_released():
    table = BufferTable()
    t = tvm.runtime.tensor(np.arange(6, dtype=np.int32))
    owned = table.slot(np.zeros(3, np.int8))
    slot = table.slot(t)
    assert table.slot(t) == slot
    table.view(slot, 2, (2,), write=True)[...] = [-1, -2]
    np.testing.assert_array_equal(t.numpy(), [0, 1, -1, -2, 4, 5])
    table.release_borrowed()
    with pytest.raises(SlotError, match=f"buffer slot {slot} is not in the buffer table"):
        table[slot]
    assert table[owned] is not None                      # numpy slots stay
    assert table.slot(tvm.runtime.tensor(np.zeros(2, np.int32))) == slot   # the free slot is reused
    assert len(table) == 2


def test_bad_host_buffers_are_named():
    table = BufferTable()
    with pytest.raises(TypeError, match="got list"):
        table.slot([1, 2])
    with pytest.raises(TypeError, match="got NoneType"):
        table.slot(None)
    with pytest.raises(ValueError, match="not C-contiguous"):
        table.slot(np.zeros((4, 4))[:, 1])
    strided = types.SimpleNamespace(shape=(2, 2), strides=(1, 2), dtype="int8", data_ptr=lambda: 0)
    with pytest.raises(ValueError, match=r"strides \(1, 2\) is not compact"):
        table.slot(strided)
    with pytest.raises(SlotError, match="slot 7"):
        table.view(7, 0, (1,))


def test_read_only_arrays_are_views_that_refuse_writes():
    table = BufferTable()
    ro = np.arange(8, dtype=np.int16)
    ro.flags.writeable = False
    slot = table.slot(ro)
    assert table.view(slot, 0, (8,)).tolist() == list(range(8))
    with pytest.raises(ValueError, match=f"host buffer slot {slot} is read-only"):
        table.view(slot, 0, (8,), write=True)


def test_tensor_view_handles_scalars_and_empty_tensors():
    assert tensor_view(tvm.runtime.tensor(np.array(7, np.int32))).tolist() == [7]
    assert tensor_view(tvm.runtime.tensor(np.zeros((0, 3), np.float32))).size == 0


@given(st.integers(-3, 40), st.lists(st.integers(0, 4), min_size=1, max_size=3),
       st.lists(st.integers(-7, 7), min_size=3, max_size=3))
def test_strided_views_are_bounds_checked_exactly(offset, shape, strides):
    flat = np.arange(32)
    strides = strides[:len(shape)]
    indices = [offset + sum(i * s for i, s in zip(point, strides))
               for point in itertools.product(*(range(e) for e in shape))]
    if any(not 0 <= i < flat.size for i in indices):
        with pytest.raises(BoundsError, match=r"elements \[-?\d+, -?\d+\) are outside its 32 elements"):
            strided_view(flat, offset, shape, strides)
        return
    view = strided_view(flat, offset, shape, strides)
    assert view.shape == tuple(shape)
    assert sorted(view.reshape(-1).tolist()) == sorted(indices)


@given(st.sampled_from(["int8", "int16", "int32", "float32", "int64"]),
       st.lists(st.integers(0, 5), min_size=0, max_size=3), st.integers(0, 3), st.booleans())
def test_host_span_of_a_tensor_covers_its_first_to_its_last_element(dtype, shape, start, strided):
    """The span replay compares call after call: for a compact tensor (read in C) and for a
    strided one, from its first element to one past its last, as numpy sees the same memory."""
    base = np.zeros(4 + 2 * int(np.prod(shape, dtype=np.int64)) * 2 + 8, dtype)
    flat = base[start:start + int(np.prod(shape, dtype=np.int64)) * (2 if strided else 1)]
    array = flat.reshape(*shape, 2)[..., 0] if strided else flat.reshape(shape)
    tensor = tvm_ffi.from_dlpack(array)
    address, nbytes, kind = host_span(tensor)
    assert kind == np.dtype(dtype).str
    if array.size == 0:
        assert nbytes == 0
        return
    first = array.__array_interface__["data"][0]
    last = first + sum((d - 1) * s for d, s in zip(array.shape, array.strides))
    assert (address, nbytes) == (first, last + array.itemsize - first)
