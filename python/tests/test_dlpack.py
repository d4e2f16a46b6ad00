# SPDX-License-Identifier: MIT
"""DLPack export of the pool's views (Manager.kv_caches(dlpack=True), CudaView) on the host
backend: numpy.from_dlpack shares the memory, an export keeps the manager alive, capsules not
consumed give their entry back, and bf16 goes out as DLPack's bfloat16."""
import ctypes
import gc
import weakref

import numpy as np
import pytest

import kvtier
from kvtier import _tensor
from conftest import SMALL, prefill


def manager(dtype):
    return kvtier.Manager(**{**SMALL, "dtype": dtype})


def tensor_of(capsule):
    """The DLTensor a "dltensor" capsule holds (not consumed: the capsule keeps its name)."""
    return _tensor._DLTensor.from_address(_tensor._capsule_get(capsule, b"dltensor"))


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("paged", [True, False])
def test_from_dlpack_is_the_numpy_view(dtype, paged, rng):
    with manager(dtype) as m:
        prefill(m, 1, 100, rng)
        ps = None if paged else 1
        views = m.kv_caches(ps)
        exports = m.kv_caches(ps, dlpack=True)
        for view, ex in zip(views, exports):
            assert isinstance(ex, _tensor.DLView) and not isinstance(view, _tensor.DLView)
            assert ex.__dlpack_device__() == (1, 0)
            assert ex.shape == view.shape and ex.strides == view.strides
            a = np.from_dlpack(ex)
            assert a.dtype == view.dtype and a.shape == view.shape
            assert a.strides == view.strides
            assert view.any()  # the prefill wrote rows
            np.testing.assert_array_equal(a, view)
            assert np.shares_memory(a, view)
            idx = (view.shape[0] - 1, 0, 0, 3)
            view[idx] = 7.5  # writes through the NumPy view, reads through the import
            assert a[idx] == 7.5


def test_export_keeps_the_manager_alive():
    m = manager("f32")
    alive = weakref.ref(m)
    gc.collect()
    before = len(_tensor._dl_live)
    k, _ = m.kv_caches(dlpack=True)
    kn, _ = m.kv_caches()
    kn[...] = 0
    kn[1, 2, 0, :] = 3.0
    a = np.from_dlpack(k)  # read-only on NumPy 1.x
    del k, kn, m
    gc.collect()
    assert alive() is not None and not alive().closed  # the array's export holds it
    assert len(_tensor._dl_live) == before + 1
    assert a.sum() == 3.0 * SMALL["head_dim"]  # still the pool's memory, readable
    del a
    gc.collect()
    assert alive() is None  # the deleter let it go
    assert len(_tensor._dl_live) == before


def test_unconsumed_capsule_gives_its_entry_back():
    with manager("f32") as m:
        k, v = m.kv_caches(page_size=1, dlpack=True)
        kn, vn = m.kv_caches(page_size=1)
        gc.collect()
        before = len(_tensor._dl_live)
        cap = v.__dlpack__()
        assert len(_tensor._dl_live) == before + 1
        t = tensor_of(cap)
        assert t.data == vn.ctypes.data and t.byte_offset == 0
        assert (t.device.device_type, t.device.device_id) == (1, 0)
        assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (2, 32, 1)
        assert tuple(t.shape[i] for i in range(t.ndim)) == vn.shape
        # strides in elements, not bytes
        assert tuple(t.strides[i] for i in range(t.ndim)) == tuple(s // 4 for s in vn.strides)
        del t, cap  # never consumed: its destructor calls the deleter
        assert len(_tensor._dl_live) == before


def test_bf16_exports_as_bfloat16():
    with manager("bf16") as m:
        k, _ = m.kv_caches(dlpack=True)
        kn, _ = m.kv_caches()
        assert kn.dtype == np.uint16  # the NumPy view: bit patterns
        gc.collect()
        before = len(_tensor._dl_live)
        cap = k.__dlpack__()
        t = tensor_of(cap)
        assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (4, 16, 1)  # kDLBfloat
        assert tuple(t.strides[i] for i in range(t.ndim)) == tuple(s // 2 for s in kn.strides)
        del t, cap
        assert len(_tensor._dl_live) == before
        # NumPy has no bfloat16: its from_dlpack refuses the capsule (RuntimeError on NumPy
        # 1.x, BufferError on 2.x), with its own error, and the refused export is given back.
        # NumPy 2.5 releases it with that error set: a Python deleter (ctypes) turned it into
        # a SystemError there (seen on an H200 machine, 2026-12-04)
        with pytest.raises((BufferError, TypeError, RuntimeError)):
            np.from_dlpack(k)
        gc.collect()
        assert len(_tensor._dl_live) == before


def test_release_while_an_exception_propagates():
    """An export released while an exception is in flight (its capsule or its import a local
    of the frame the exception leaves) keeps that exception: the release runs no Python."""
    with manager("f32") as m:
        k, _ = m.kv_caches(dlpack=True)
        gc.collect()
        before = len(_tensor._dl_live)

        def refuse(consume):
            held = np.from_dlpack(k) if consume else k.__dlpack__()
            assert len(_tensor._dl_live) == before + 1 and held is not None
            raise KeyError("kept")

        for consume in (False, True):
            with pytest.raises(KeyError, match="kept"):
                refuse(consume)
            gc.collect()
            assert len(_tensor._dl_live) == before


def test_dlpack_arguments():
    with manager("f16") as m:
        k, _ = m.kv_caches(dlpack=True)
        gc.collect()
        before = len(_tensor._dl_live)
        for stream in (None, -1, 0, 1, 12345):  # accepted and ignored
            assert tensor_of(k.__dlpack__(stream=stream)).ndim == 4
        cap = k.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
        assert ctypes.pythonapi.PyCapsule_IsValid(ctypes.py_object(cap), b"dltensor")
        del cap
        with pytest.raises(TypeError):
            k.__dlpack__(stream="default")
        with pytest.raises(BufferError):
            k.__dlpack__(copy=True)
        with pytest.raises(BufferError):
            k.__dlpack__(dl_device=(2, 0))
        assert len(_tensor._dl_live) == before


def test_strides_must_be_whole_elements():
    buf = np.zeros(16, np.float32)
    v = _tensor.DLView(buf.ctypes.data, (2, 2), (8, 6), 0, buf)
    with pytest.raises(ValueError):
        v.__dlpack__()
    ok = _tensor.DLView(buf.ctypes.data, (2, 2), (8, 4), 0, buf)
    np.testing.assert_array_equal(np.from_dlpack(ok), buf[:4].reshape(2, 2))


def test_cuda_view_speaks_both_protocols():
    # device memory is never touched by an export: a host address stands in for it
    buf = np.zeros((4, 8), np.uint16)
    v = _tensor.strided_view(buf.ctypes.data, (4, 8), (16, 2), 2, _tensor.CUDA, buf,
                             device_id=3)
    assert isinstance(v, _tensor.CudaView)
    assert v.__cuda_array_interface__["typestr"] == "<u2"  # bf16 as uint16 there
    assert v.__dlpack_device__() == (2, 3)
    cap = v.__dlpack__(stream=1)
    t = tensor_of(cap)
    assert (t.device.device_type, t.device.device_id) == (2, 3)
    assert (t.dtype.code, t.dtype.bits) == (4, 16)  # and bf16 here
    assert tuple(t.strides[i] for i in range(2)) == (8, 1)
    del t, cap
    with pytest.raises(BufferError):
        v.__dlpack__(dl_device=(1, 0))
    # without a device id: PyTorch's current device, or 0 without PyTorch
    w = _tensor.CudaView(buf.ctypes.data, (4, 8), (16, 2), "<f2", buf)
    assert w.__dlpack_device__() == (2, _tensor._cuda_device())
    assert tensor_of(w.__dlpack__()).dtype.code == 2
