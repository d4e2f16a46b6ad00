# SPDX-License-Identifier: MIT
"""Turns the tensors a caller passes into the addresses the C library takes, without copying.

Three kinds of objects are understood:
- NumPy arrays (host memory): the host and model backends;
- objects with ``__cuda_array_interface__`` (CuPy, Numba, PyTorch CUDA tensors): device memory;
- objects with ``__dlpack__`` (PyTorch, JAX, CuPy, NumPy >= 1.22): host or device memory,
  as the object's ``__dlpack_device__`` says.

Every tensor must be C-contiguous (row-major, no gaps) and hold exactly the elements the call
expects, of the manager's dtype; anything else raises TypeError or ValueError before the
library is called, so a bad tensor changes nothing.

The other way, :class:`DLView` and :class:`CudaView` export kvtier's memory (the pool's K/V
views) through DLPack, without copies.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import weakref
from typing import Any, Optional, Sequence, Tuple

import numpy as np

HOST = "host"
CUDA = "cuda"

# kvt_dtype -> (name, NumPy dtypes accepted, DLPack (code, bits) accepted, CAI typestrs)
# bf16 has no NumPy type: raw 16-bit patterns (uint16) stand for it, as does ml_dtypes'
# bfloat16 (a 2-byte 'V' dtype named bfloat16).
_DTYPES = {
    0: ("float32", ("float32",), ((2, 32),), ("<f4",)),
    1: ("float16", ("float16",), ((2, 16),), ("<f2",)),
    2: ("bfloat16", ("bfloat16", "uint16"), ((4, 16), (1, 16)), ("<V2", "<u2")),
}
_ITEMSIZE = {0: 4, 1: 2, 2: 2}
# The index arrays of the attention tables (not kvt_dtypes): 32- and 64-bit integers, signed
# types accepted too (PyTorch has no unsigned 32- or 64-bit tensors on every version).
U32, U64 = 100, 101
_DTYPES[U32] = ("uint32", ("uint32", "int32"), ((1, 32), (0, 32)), ("<u4", "<i4"))
_DTYPES[U64] = ("uint64", ("uint64", "int64"), ((1, 64), (0, 64)), ("<u8", "<i8"))
_ITEMSIZE[U32], _ITEMSIZE[U64] = 4, 8
I32 = 102
_DTYPES[I32] = ("int32", ("int32",), ((0, 32),), ("<i4",))
_ITEMSIZE[I32] = 4
U8 = 103
_DTYPES[U8] = ("uint8", ("uint8",), ((1, 8),), ("|u1", "<u1"))
_ITEMSIZE[U8] = 1


# DLPack device types
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
# kvt_dtype (and pseudo dtype) -> DLPack (type code, bits) of an export: kDLInt 0, kDLUInt 1,
# kDLFloat 2, kDLBfloat 4
_DL_EXPORT = {0: (2, 32), 1: (2, 16), 2: (4, 16), U32: (1, 32), U64: (1, 64), I32: (0, 32)}


class DLView:
    """A strided view of host or device memory exported through DLPack without copies:
    ``torch.from_dlpack(view)``, ``numpy.from_dlpack(view)`` (host memory),
    ``cupy.from_dlpack(view)``. bf16 goes out as DLPack's bfloat16 (kDLBfloat, 16 bits), which
    NumPy cannot import (its from_dlpack raises).

    Each export (:meth:`__dlpack__`) keeps `owner`, the manager, alive until its consumer
    releases the tensor; the memory is still freed when the manager is closed, so close it only
    once the tensors over it are gone. The capsule is a legacy "dltensor" one (DLPack 0.8's
    DLManagedTensor) whatever ``max_version`` asks. Streams: kvtier's writes to this memory are
    ordered on the streams its calls are given (``stream=``), by the caller, so ``stream`` is
    accepted (None, -1 or a handle) and ignored: a consumer on another stream synchronizes
    with those itself. ``shape`` and ``strides`` (in bytes) are NumPy's."""

    def __init__(self, ptr: int, shape: Tuple[int, ...], strides: Tuple[int, ...], dtype: int,
                 owner: Any, device_type: int = _DL_CPU, device_id: Optional[int] = 0) -> None:
        if dtype not in _DL_EXPORT:
            raise ValueError(f"DLView: no DLPack type for dtype {dtype}")
        if len(shape) != len(strides):
            raise ValueError(f"DLView: shape {tuple(shape)} and strides {tuple(strides)} "
                             "differ in length")
        self._owner = owner  # keeps the memory's manager alive
        self._ptr, self._dtype = int(ptr), dtype
        self.shape: Tuple[int, ...] = tuple(int(n) for n in shape)
        self.strides: Tuple[int, ...] = tuple(int(st) for st in strides)
        self._device_type = device_type
        self._device_id = device_id  # None: resolved on first use (_cuda_device)

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(DLPack device type, device id): (kDLCPU = 1, 0) or (kDLCUDA = 2, id)."""
        if self._device_id is None:
            self._device_id = _cuda_device()
        return self._device_type, self._device_id

    def __dlpack__(self, stream: Optional[int] = None,
                   max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None,
                   copy: Optional[bool] = None) -> Any:
        """A "dltensor" PyCapsule of this view (DLPack's producer protocol). `stream` is
        ignored (see the class), `max_version` too (the capsule is always a legacy one);
        `dl_device` other than this view's device and ``copy=True`` raise BufferError (an
        export never copies), byte strides that are not whole elements ValueError."""
        if stream is not None and (not isinstance(stream, int) or isinstance(stream, bool)):
            raise TypeError(f"__dlpack__: stream: expected None or an int, "
                            f"got {type(stream).__name__}")
        if copy:
            raise BufferError("__dlpack__: kvtier exports its memory without copies; "
                              "copy=True is not supported")
        device = self.__dlpack_device__()
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError(f"__dlpack__: the view is on DLPack device {device}, "
                              f"not {tuple(dl_device)} (an export never copies)")
        size = _ITEMSIZE[self._dtype]
        if any(st % size for st in self.strides):
            raise ValueError(f"__dlpack__: byte strides {self.strides} are not multiples of "
                             f"the item size ({size})")
        return _dl_export(self._ptr, self.shape, tuple(st // size for st in self.strides),
                          self._dtype, device, self._owner)


class CudaView(DLView):
    """A strided view of device memory, handed to PyTorch, CuPy or Numba through
    ``__cuda_array_interface__`` (``torch.as_tensor(view, device="cuda")``), where bf16 memory
    is described as uint16 (``.view(torch.bfloat16)`` reads it as bf16), or through DLPack
    (``torch.from_dlpack(view)``, as :class:`DLView`), where bf16 is bf16. `dtype` is the
    kvt_dtype (default: from `typestr`, "<u2" taken for bf16); `device_id` the CUDA device
    DLPack names (default: PyTorch's current device when PyTorch is installed, else 0)."""

    def __init__(self, ptr: int, shape: Tuple[int, ...], strides: Tuple[int, ...],
                 typestr: str, owner: Any, dtype: Optional[int] = None,
                 device_id: Optional[int] = None) -> None:
        if dtype is None:
            dtype = _TYPESTR_DTYPE.get(typestr)
            if dtype is None:
                raise ValueError(f"CudaView: no kvt_dtype for typestr {typestr!r}")
        super().__init__(ptr, shape, strides, dtype, owner, _DL_CUDA, device_id)
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "strides": tuple(strides), "typestr": typestr,
            "data": (ptr, False), "version": 3,
        }


_TYPESTR_DTYPE = {"<f4": 0, "<f2": 1, "<u2": 2, "<u4": U32, "<u8": U64, "<i4": I32}


def strided_view(ptr: int, shape: Tuple[int, ...], strides: Tuple[int, ...], dtype: int,
                 memory: str, owner: Any, dlpack: bool = False,
                 device_id: Optional[int] = None) -> Any:
    """A view of memory at ptr with these shape and byte strides: a NumPy array over host
    memory (a :class:`DLView` with `dlpack`), a :class:`CudaView` over device memory (on CUDA
    device `device_id`, as :class:`CudaView` says when None). The caller keeps ptr's memory
    alive."""
    tstr = {0: "<f4", 1: "<f2", 2: "<u2"}[dtype]
    if memory == CUDA:
        return CudaView(ptr, shape, strides, tstr, owner, dtype, device_id)
    if dlpack:
        return DLView(ptr, shape, strides, dtype, owner)
    extent = sum((n - 1) * st for n, st in zip(shape, strides)) + _ITEMSIZE[dtype]
    buf = (ctypes.c_uint8 * extent).from_address(ptr)
    return np.ndarray(shape, dtype=np.dtype(tstr), buffer=buf, strides=strides)


def dtype_name(dtype: int) -> str:
    return _DTYPES[dtype][0]


def numpy_dtype(dtype: int) -> np.dtype:
    """The NumPy dtype read-backs use for a kvt_dtype (uint16 bit patterns for bf16)."""
    return np.dtype({0: np.float32, 1: np.float16, 2: np.uint16}[dtype])


def itemsize(dtype: int) -> int:
    return _ITEMSIZE[dtype]


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]


# -- DLPack export ---------------------------------------------------------------------------

class _DLManagedTensor(ctypes.Structure):
    """DLPack 0.8's DLManagedTensor: the tensor, manager_ctx and void (*deleter)(self)."""
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


# the name of a capsule no consumer has taken
_DL_NAME = b"dltensor"


class _DLKeep(ctypes.Array):  # type: ignore[type-arg]
    """The one byte under an export's NumPy array (see _dl_export); its attribute `keep`
    holds the export's shape and strides arrays and its owner."""
    _type_ = ctypes.c_char
    _length_ = 1
    __hash__ = object.__hash__  # by identity, for _dl_live (ctypes arrays are unhashable)


#: The exports not yet released, as their _DLKeep (weakly: an entry goes when its export is
#: released, by its consumer or by the destructor of a capsule no consumer took).
_dl_live: "weakref.WeakSet[_DLKeep]" = weakref.WeakSet()


def _dl_export(ptr: int, shape: Tuple[int, ...], strides: Tuple[int, ...], dtype: int,
               device: Tuple[int, int], owner: Any) -> Any:
    """A "dltensor" capsule of the memory at ptr (strides in elements) that keeps `owner`
    alive until the export is released.

    The capsule and its DLManagedTensor are NumPy's export of a one-byte array over a _DLKeep
    that holds the shape and strides arrays and the owner; their tensor fields are then
    rewritten to describe ptr. Releasing the export, the consumer's call of the deleter or
    the capsule's destructor when no consumer took it, is therefore NumPy's C code, which
    frees its allocation and drops the array (as DLPack has it, the deleter destroys
    manager_ctx; it reads no tensor field), and with it the owner. No Python function is
    called back: a ctypes deleter fails when a consumer calls it with an exception set, as
    NumPy 2.5's from_dlpack does when it refuses bfloat16 (its error became a SystemError)."""
    ndim = len(shape)
    shp = (ctypes.c_int64 * max(ndim, 1))(*shape)
    std = (ctypes.c_int64 * max(ndim, 1))(*strides)
    keep = _DLKeep()
    keep.keep = (shp, std, owner)  # type: ignore[attr-defined]
    capsule = np.frombuffer(keep, np.uint8).__dlpack__()
    m = _DLManagedTensor.from_address(_capsule_get(capsule, _DL_NAME))
    t = m.dl_tensor
    t.data, t.byte_offset = ptr or None, 0
    t.device.device_type, t.device.device_id = device
    t.ndim = ndim
    t.dtype.code, t.dtype.bits = _DL_EXPORT[dtype]
    t.dtype.lanes = 1
    t.shape = ctypes.cast(shp, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(std, ctypes.POINTER(ctypes.c_int64))
    _dl_live.add(keep)
    return capsule


def _cuda_device() -> int:
    """The CUDA device an export of device memory names when none was given: PyTorch's current
    device when PyTorch is installed (the manager does not record its device), else 0."""
    try:
        import torch  # optional; imported only here
        if torch.cuda.is_available():
            return int(torch.cuda.current_device())
    except Exception:
        pass
    return 0


def _contiguous(shape: Sequence[int], strides: Optional[Sequence[int]], unit: int) -> bool:
    """Whether strides (in units of `unit` bytes or elements) describe a C-contiguous layout;
    dimensions of extent 1 may have any stride."""
    if strides is None:
        return True
    want = unit
    for ext, st in zip(reversed(list(shape)), reversed(list(strides))):
        if ext != 1 and st != want:
            return False
        want *= ext
    return True


def stream_handle(stream: Any) -> Optional[int]:
    """A cudaStream_t as an integer from None, an int, a torch.cuda.Stream (``cuda_stream``)
    or any object speaking the ``__cuda_stream__`` protocol."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream or None
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1]) or None
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream) or None
    raise TypeError(f"stream: expected None, an int, or a CUDA stream object, "
                    f"got {type(stream).__name__}")


_cudart = None


def _sync_stream(handle: int) -> None:
    """Waits for a producer's stream (CUDA Array Interface v3 'stream' key)."""
    global _cudart
    if _cudart is None:
        name = ctypes.util.find_library("cudart")
        for cand in ([name] if name else []) + ["libcudart.so", "libcudart.so.13",
                                                "libcudart.so.12"]:
            try:
                _cudart = ctypes.CDLL(cand)
                break
            except OSError:
                continue
        if _cudart is None:
            raise RuntimeError("kvtier: a CUDA array names a stream but libcudart cannot be "
                               "loaded to wait for it")
        _cudart.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        _cudart.cudaStreamSynchronize.restype = ctypes.c_int
    # CAI: 1 = legacy default stream, 2 = per-thread default stream
    rc = _cudart.cudaStreamSynchronize(ctypes.c_void_p({1: 0, 2: 2}.get(handle, handle)))
    if rc != 0:
        raise RuntimeError(f"kvtier: cudaStreamSynchronize failed ({rc}) waiting for a "
                           "CUDA array's producer stream")


def address(obj: Any, *, name: str, shape: Tuple[int, ...], dtype: int, memory: str,
            writable: bool = False, stream: Optional[int] = None) -> Tuple[int, Any]:
    """Returns (address, keepalive) of tensor `obj` after checking that it holds
    prod(shape) elements of kvt_dtype `dtype`, C-contiguous, in `memory` ("host" or "cuda").
    Any shape with that many elements is accepted; `shape` only names the expectation in
    messages. keepalive must outlive the C call."""
    ptr, keep, _ = _resolve(obj, name, shape, dtype, memory, writable, stream)
    return ptr, keep


def address_rows(obj: Any, *, name: str, shape: Tuple[int, ...], dtype: int, memory: str,
                 stream: Optional[int] = None) -> Tuple[int, Any, int]:
    """As :func:`address` for a tensor whose extent along one dimension, the -1 entry of
    `shape`, is the caller's choice: any multiple of the product of the other entries is
    accepted (0 included), and that extent comes back as the third item."""
    if list(shape).count(-1) != 1:
        raise ValueError("address_rows: shape needs exactly one -1 entry")
    ptr, keep, count = _resolve(obj, name, shape, dtype, memory, False, stream)
    return ptr, keep, count // abs(math.prod(shape))


def _resolve(obj: Any, name: str, shape: Tuple[int, ...], dtype: int, memory: str,
             writable: bool, stream: Optional[int]) -> Tuple[int, Any, int]:
    """(address, keepalive, element count) of `obj`, checked as `address` says; a -1 in
    `shape` stands for any extent."""
    free = -1 in shape
    known = abs(math.prod(shape))  # elements per unit of the free extent, or all of them

    def fits(n: int) -> bool:
        return n % known == 0 if free else n == known

    want = "x".join("n" if s == -1 else str(s) for s in shape)
    tname = _DTYPES[dtype][0]
    what = f"{name}: expected a C-contiguous {tname} tensor of {want} elements in {memory} memory"

    if isinstance(obj, np.ndarray):
        if memory != HOST:
            raise TypeError(f"{what}; got a NumPy array (host memory)")
        if obj.dtype.name not in _DTYPES[dtype][1] or obj.dtype.itemsize != _ITEMSIZE[dtype]:
            raise TypeError(f"{what}; got dtype {obj.dtype}")
        if not fits(obj.size):
            raise ValueError(f"{what}; got shape {obj.shape}")
        if not obj.flags.c_contiguous:
            raise ValueError(f"{what}; got a non-contiguous array")
        if writable and not obj.flags.writeable:
            raise ValueError(f"{name}: the array is read-only")
        return obj.ctypes.data, obj, int(obj.size)

    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        if memory != CUDA:
            raise TypeError(f"{what}; got a CUDA array (__cuda_array_interface__): this "
                            "manager's backend works on host memory")
        ptr, readonly = cai["data"]
        if cai["typestr"] not in _DTYPES[dtype][3]:
            raise TypeError(f"{what}; got typestr {cai['typestr']}")
        count = math.prod(cai["shape"])
        if not fits(count):
            raise ValueError(f"{what}; got shape {tuple(cai['shape'])}")
        if not _contiguous(cai["shape"], cai.get("strides"), _ITEMSIZE[dtype]):
            raise ValueError(f"{what}; got strides {cai.get('strides')}")
        if writable and readonly:
            raise ValueError(f"{name}: the CUDA array is read-only")
        producer = cai.get("stream")
        if producer is not None and producer != stream:
            _sync_stream(producer)
        return int(ptr or 0), obj, count

    if hasattr(obj, "__dlpack__"):
        dev_type, _ = obj.__dlpack_device__()
        ok = {HOST: (_DL_CPU, _DL_CUDA_HOST),
              CUDA: (_DL_CUDA, _DL_CUDA_MANAGED, _DL_CUDA_HOST)}[memory]
        if dev_type not in ok:
            raise TypeError(f"{what}; got a DLPack tensor on device type {dev_type}")
        if dev_type in (_DL_CUDA, _DL_CUDA_MANAGED):
            # the producer orders its work before `stream` (DLPack's stream argument;
            # None means the legacy default stream, 1 in DLPack's numbering)
            capsule = obj.__dlpack__(stream=stream if stream is not None else 1)
        else:
            capsule = obj.__dlpack__()
        # Borrowed, not consumed: the capsule keeps its name, so its destructor hands the
        # tensor back to the producer once the capsule is dropped after the call.
        tensor = _DLTensor.from_address(_capsule_get(capsule, b"dltensor"))
        code_bits = (tensor.dtype.code, tensor.dtype.bits)
        if code_bits not in _DTYPES[dtype][2] or tensor.dtype.lanes != 1:
            raise TypeError(f"{what}; got DLPack dtype code {tensor.dtype.code}, "
                            f"{tensor.dtype.bits} bits x {tensor.dtype.lanes}")
        shp = [tensor.shape[i] for i in range(tensor.ndim)]
        count = math.prod(shp)
        if not fits(count):
            raise ValueError(f"{what}; got shape {tuple(shp)}")
        strides = ([tensor.strides[i] for i in range(tensor.ndim)]
                   if tensor.strides else None)
        if not _contiguous(shp, strides, 1):
            raise ValueError(f"{what}; got strides {tuple(strides or ())}")
        return (tensor.data or 0) + tensor.byte_offset, (obj, capsule), count

    if memory == HOST and not writable and isinstance(obj, (list, tuple)):
        arr = np.ascontiguousarray(obj, dtype=numpy_dtype(dtype) if dtype != 2 else np.uint16)
        return _resolve(arr, name, shape, dtype, memory, writable, stream)
    raise TypeError(f"{what}; got {type(obj).__name__} (pass a NumPy array, an object with "
                    "__cuda_array_interface__, or one with __dlpack__)")
