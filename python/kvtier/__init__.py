# SPDX-License-Identifier: MIT
"""kvtier: a KV cache manager for long-context LLM serving across GPU memory, pinned host
memory and local disk. This package calls the C library (libkvtier.so) through ctypes.

An engine creates one :class:`Manager` per model replica and calls it from its model forward,
layer by layer::

    import numpy as np, kvtier

    m = kvtier.Manager(n_layers=4, n_kv_heads=2, n_q_heads=8, head_dim=64,
                       dtype="f32", backend="host", recall_blocks=8,
                       recall_cache_bytes=1 << 20)
    m.create_seq(7, prompt_tokens=len(prompt))
    for layer in range(4):                      # prefill
        m.prefill_layer(7, layer, k, v, q_obs)  # k, v: [n_kv_heads][T][head_dim]
    for layer in range(4):                      # one decode step
        m.decode_append(layer, [7], k1, v1)     # k1, v1: [1][n_kv_heads][head_dim]
        m.decode_recall(layer, [7], q1)         # q1: [1][n_q_heads][head_dim]
        out = m.attend(7, layer, q1[0])         # or the engine's kernel over m.frames()

A request whose prompt starts like an earlier one's shares that prefix: the engine names the
prompt by a chain of hashes (hashes[i] covers tokens [0, (i + 1) * hash_tokens)), creates the
sequence with it, loads the matched rows into its own buffer for the attention of the rest,
and prefills only the rest::

    hit = m.create_seq(8, len(prompt), hashes=chain, hash_tokens=16)   # tokens shared
    for layer in range(4):
        k0, v0 = m.load_kv(8, layer, 0, hit)    # the prefix: [n_kv_heads][hit][head_dim]
        ...                                     # the engine's attention of the rest
        m.prefill_chunk(8, layer, hit, k_rest, v_rest, q_obs)   # rows [hit, len(prompt))

Tensors are NumPy arrays on the host and model backends, and on the CUDA backend anything with
``__cuda_array_interface__`` or ``__dlpack__`` (PyTorch CUDA tensors): their pointers are
passed through, never copied, on the stream given (``stream=``: a torch.cuda.Stream, an int
handle or None). A failing call raises :class:`Error` (an OSError whose errno is the library's,
with kvt_strerror's text and the manager's last error) and changes nothing; a bad argument
raises TypeError or ValueError before the library is called.

Threads: a manager belongs to one thread at a time (kvtier.h's concurrency contract); this
binding holds a per-manager lock around every call, so calls from several Python threads are
serialized rather than overlapped.
"""
from __future__ import annotations

import ctypes
import enum
import errno
import logging
import operator
import os
import sys
import threading
import weakref
from ctypes import byref, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass, field, fields
from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np

from . import _capi, _tensor
from ._capi import IterStats, PoolInfo, RecallRef, SchedItem, SeqInfo, Stats

__all__ = [
    "Backend", "DType", "LogLevel", "Config", "Manager", "Scheduler", "Batch", "Error",
    "Stats", "SeqInfo", "RecallRef", "SchedItem", "IterStats", "NO_BLOCK", "PoolInfo", "Tables",
    "Paged",
    "version", "strerror", "set_log_handler", "set_log_level", "log_to_logging",
]

_lib = _capi.load()

#: Entry of a recall_blocks selection that names no block.
NO_BLOCK = 0xFFFFFFFF


class Backend(enum.IntEnum):
    AUTO = 0   #: CUDA when built and a device is usable, else host
    HOST = 1   #: device tier emulated in RAM; the reference backend
    CUDA = 2   #: a real GPU
    MODEL = 3  #: no payload; every transfer timed by a bandwidth and per-call model


class DType(enum.IntEnum):
    F32 = 0
    F16 = 1
    BF16 = 2


class LogLevel(enum.IntEnum):
    ERROR = 0
    WARN = 1
    INFO = 2
    DEBUG = 3


_DTYPE_NAMES = {"f32": DType.F32, "float32": DType.F32, "f16": DType.F16,
                "float16": DType.F16, "bf16": DType.BF16, "bfloat16": DType.BF16}


@dataclass
class Tables:
    """Buffers of one layer's attention tables (struct kvt_attn_tables), filled by
    :meth:`Manager.step_tables`: NumPy arrays on the host and model backends (made by
    :meth:`Manager.tables`), device tensors on the CUDA backend (uint32 or int32, uint64 or
    int64, C-contiguous: PyTorch CUDA tensors, CuPy arrays). Shapes: n_batch [1]; n_tokens and
    n_recall [max_batch][n_kv_heads]; frames [max_batch][n_kv_heads][max_frames]; recall,
    recall_tokens and recall_skip (64-bit) [max_batch][n_kv_heads][max_recall]. Row (i, h)
    attends over resident slots s < n_tokens[i, h] (row s % block_tokens of pool block
    frames[i, h, s // block_tokens]) and, for j < n_recall[i, h], rows t < recall_tokens[i, h,
    j] of pool block recall[i, h, j] whose bit t of recall_skip[i, h, j] is clear."""

    max_batch: int
    max_frames: int
    max_recall: int
    n_batch: Any
    n_tokens: Any
    frames: Any
    n_recall: Any
    recall: Any
    recall_tokens: Any
    recall_skip: Any


@dataclass
class Paged:
    """Buffers of one layer's tables in FlashInfer's paged-KV form (struct kvt_paged_tables),
    filled by :meth:`Manager.step_paged`: int32 NumPy arrays on the host and model backends
    (made by :meth:`Manager.paged`), int32 device tensors on the CUDA backend. Each (member,
    kv head) is one request of one kv head: indptr/indices/last_page_len over the resident part
    (page size block_tokens, pages of :meth:`Manager.kv_caches` with that page size) and
    r_indptr/r_indices over the recalled part (page size 1, tokens also resident removed)."""

    max_batch: int
    max_pages: int
    max_tokens: int
    indptr: Any
    indices: Any
    last_page_len: Any
    r_indptr: Any
    r_indices: Any


def version() -> str:
    """The C library's version, "MAJOR.MINOR.PATCH"."""
    return _lib.kvt_version().decode()


def strerror(err: int) -> str:
    """kvt_strerror: the library's text for an error code (negative or positive errno)."""
    return _lib.kvt_strerror(int(err)).decode()


class Error(OSError):
    """A kvtier call failed. ``errno`` is the positive errno (compare with the errno module),
    ``strerror`` kvt_strerror's text, ``func`` the C function and ``detail`` the manager's
    last error, or the scheduler's for a scheduler call (which names the sequence, layer or
    limit at fault; "" when none)."""

    def __init__(self, err: int, func: str, detail: str = "") -> None:
        text = strerror(err)
        super().__init__(abs(err), text)
        self.func = func
        # the library's last error ends with the same text in parentheses: say it once
        self.detail = detail.removesuffix(f" ({text})")

    def __str__(self) -> str:
        tail = f": {self.detail}" if self.detail else ""
        return f"{self.func}: {self.strerror} [errno {self.errno}]{tail}"


def _as_enum(cls: Any, value: Any, names: Optional[dict] = None) -> Any:
    if isinstance(value, str):
        key = value.lower()
        if names and key in names:
            return names[key]
        try:
            return cls[value.upper()]
        except KeyError:
            raise ValueError(f"unknown {cls.__name__} {value!r}") from None
    return cls(value)


@dataclass
class Config:
    """struct kvt_config, with KVT_CONFIG_INIT's defaults (Llama-3-8B geometry, 32-token blocks,
    sink 128 / recent 512 / top-K 4096, 1 GiB device and 4 GiB host tiers). Field meanings and
    limits are kvtier.h's; the library validates them at Manager creation."""

    n_layers: int = 32
    n_kv_heads: int = 8
    n_q_heads: int = 32
    head_dim: int = 128
    block_tokens: int = 32
    dtype: DType = DType.BF16
    sink_tokens: int = 128
    recent_tokens: int = 512
    topk_tokens: int = 4096
    obs_window: int = 32
    pool_kernel: int = 7
    device_bytes: int = 1 << 30
    host_bytes: int = 4 << 30
    backend: Backend = Backend.AUTO
    save_threads: int = 2
    staging_bytes: int = 32 << 20
    recall_blocks: int = 0
    ws_window: int = 12
    recall_cache_bytes: int = 0
    model_h2d_gbps: float = 53.0
    model_d2h_gbps: float = 53.0
    model_d2d_gbps: float = 1500.0
    model_fused_eff: float = 0.8
    model_call_ns: int = 2000
    model_launch_ns: int = 5000
    model_fused: int = 1
    disk_queue_depth: int = 64
    spill_dir: Optional[Union[str, os.PathLike]] = None
    disk_bytes: int = 0
    model_disk_gbps: float = 6.0
    model_disk_ns: int = 80000
    recall_threads: int = 0

    def __post_init__(self) -> None:
        self.dtype = _as_enum(DType, self.dtype, _DTYPE_NAMES)
        self.backend = _as_enum(Backend, self.backend)

    def _to_c(self) -> Tuple[_capi.CConfig, Optional[bytes]]:
        c = _capi.CConfig.sized(_capi.CONFIG_VERSION)
        spill = os.fsencode(self.spill_dir) if self.spill_dir is not None else None
        for f in fields(self):
            if f.name == "spill_dir":
                c.spill_dir = spill
                continue
            val = getattr(self, f.name)
            try:
                if isinstance(getattr(c, f.name), float):  # a double field
                    setattr(c, f.name, float(val))
                    continue
                if isinstance(val, float) and not val.is_integer():
                    raise TypeError(f"{val} is not an integer")
                setattr(c, f.name, int(val))
            except (TypeError, ValueError) as e:
                raise TypeError(f"Config.{f.name}: {e}") from None
            if getattr(c, f.name) != int(val):
                raise ValueError(f"Config.{f.name}: {val} does not fit the C field")
        return c, spill  # spill keeps the path's bytes alive while c points at them

    @classmethod
    def _from_c(cls, c: _capi.CConfig) -> "Config":
        kw = {}
        for f in fields(cls):
            val = getattr(c, f.name)
            kw[f.name] = os.fsdecode(val) if f.name == "spill_dir" and val is not None else val
        return cls(**kw)


def _uint(name: str, value: Any, bits: int) -> int:
    """value as an int in [0, 2^bits), or TypeError/ValueError naming the argument (ctypes
    would wrap it silently)."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}") from None
    if v < 0 or v >> bits:
        raise ValueError(f"{name}: {v} is not an unsigned {bits}-bit integer")
    return v


def _hash_array(hashes: Any) -> Tuple[Any, int]:
    """(uint64 C array, n) of a hash chain: a sequence of ints in [0, 2^64) or a
    one-dimensional NumPy integer array of non-negative values, copied into the C array."""
    if isinstance(hashes, np.ndarray):
        if hashes.ndim != 1:
            raise ValueError(f"hashes: expected a one-dimensional array, got shape "
                             f"{hashes.shape}")
        if hashes.dtype.kind not in "iu":
            raise TypeError(f"hashes: expected unsigned 64-bit integers, got dtype "
                            f"{hashes.dtype}")
        if hashes.dtype.kind == "i" and hashes.size and hashes.min() < 0:
            raise ValueError("hashes: hashes are unsigned 64-bit integers; got a negative one")
        arr = np.ascontiguousarray(hashes, dtype=np.uint64)
        return (c_uint64 * arr.size).from_buffer_copy(arr), int(arr.size)
    if isinstance(hashes, (str, bytes)):
        raise TypeError(f"hashes: expected a sequence of integers, got {type(hashes).__name__}")
    vals = [_uint("hashes", h, 64) for h in hashes]
    return (c_uint64 * len(vals))(*vals), len(vals)


def _seq_array(seqs: Any) -> Tuple[Any, int]:
    """(uint64 C array, n) for a sequence id, a list of ids or a uint64 NumPy array."""
    if isinstance(seqs, np.ndarray) and seqs.dtype == np.uint64 and seqs.flags.c_contiguous:
        return seqs.ctypes.data_as(ctypes.POINTER(c_uint64)), int(seqs.size)
    if isinstance(seqs, (int, np.integer)):
        seqs = [seqs]
    ids = [int(s) for s in seqs]
    if any(s < 0 or s >= 1 << 64 for s in ids):
        raise ValueError("seqs: sequence ids are unsigned 64-bit integers")
    return (c_uint64 * len(ids))(*ids), len(ids)


class Manager:
    """A kvtier manager (kvt_manager): both tier arenas, the sequences, the save threads and,
    with ``spill_dir``, the disk tier. Build it from a :class:`Config`, keyword overrides, or
    both: ``Manager(cfg, host_bytes=8 << 30)``. Use it as a context manager or call
    :meth:`close`; it is also closed when garbage-collected."""

    def __init__(self, config: Optional[Config] = None, **overrides: Any) -> None:
        self._m: Optional[int] = None
        self._lock = threading.RLock()
        self._scheds: "weakref.WeakSet[Scheduler]" = weakref.WeakSet()
        cfg = Config(**{**(config.__dict__ if config else {}), **overrides})
        c, _spill = cfg._to_c()
        handle = c_void_p()
        err, said = _capture_log(lambda: _lib.kvt_manager_create(byref(c), byref(handle)))
        if err:  # no manager, so no last error: its detail is what the library logged
            raise Error(err, "kvt_manager_create", "; ".join(said))
        self._m = handle.value
        out = _capi.CConfig.sized(_capi.CONFIG_VERSION)
        self._call(_lib.kvt_manager_config, byref(out))
        #: The effective configuration (backend resolved from AUTO).
        self.config: Config = Config._from_c(out)
        self._memory = _tensor.CUDA if self.config.backend == Backend.CUDA else _tensor.HOST
        c0 = self.config
        self._H, self._Hq, self._D = c0.n_kv_heads, c0.n_q_heads, c0.head_dim
        self._dt = int(c0.dtype)
        self._step_n = 0  # members of the open decode step (step_begin), 0: none

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Closes this manager's schedulers, waits for pending saves, frees every sequence and
        both arenas (kvt_manager_destroy). Idempotent."""
        with self._lock:
            for s in list(self._scheds):
                s.close()
            if self._m is not None:
                _lib.kvt_manager_destroy(self._m)
                self._m = None

    def __enter__(self) -> "Manager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def closed(self) -> bool:
        return self._m is None

    def _h(self) -> int:
        if self._m is None:
            raise ValueError("kvtier: the manager is closed")
        return self._m

    def _check(self, err: int, func: str) -> None:
        if err:
            detail = _lib.kvt_manager_last_error(self._m).decode() if self._m else ""
            raise Error(err, func, detail)

    def _call(self, fn: Any, *args: Any) -> None:
        """fn(manager, *args) under the lock; a failure raises Error named after fn."""
        with self._lock:
            self._check(fn(self._h(), *args), fn.__name__)

    @property
    def last_error(self) -> str:
        """kvt_manager_last_error: detail of the latest failed call ("" when none failed)."""
        with self._lock:
            return _lib.kvt_manager_last_error(self._h()).decode()

    def _t(self, obj: Any, name: str, shape: Tuple[int, ...], stream: Optional[int],
           writable: bool = False) -> Tuple[int, Any]:
        return _tensor.address(obj, name=name, shape=shape, dtype=self._dt, memory=self._memory,
                               writable=writable, stream=stream)

    # -- manager -----------------------------------------------------------------------------

    def stats(self) -> Stats:
        """kvt_manager_stats: the manager's counters (a :class:`Stats`; ``.as_dict()``)."""
        out = Stats.sized(_capi.STATS_VERSION)
        self._call(_lib.kvt_manager_stats, byref(out))
        return out

    def sync(self, stream: Any = None) -> None:
        """kvt_manager_sync: waits for every pending save and the work queued on stream."""
        self._call(_lib.kvt_manager_sync, _tensor.stream_handle(stream))

    def save_event(self, event: Any) -> None:
        """kvt_manager_save_event: records into `event` (a cudaEvent_t as an int, or a
        torch.cuda.Event: its ``cuda_event``; PyTorch creates an event at its first record,
        so record it once before) the point at which every save queued so far has left the
        device; wait for it on a stream (``torch.cuda.current_stream().wait_event(e)``) to
        order work after the saves without a host sync. Raises Error (ENOTSUP) off the CUDA
        backend."""
        if hasattr(event, "cuda_event"):
            handle = int(event.cuda_event)
        elif isinstance(event, int) and not isinstance(event, bool):
            handle = event
        else:
            raise TypeError(f"event: expected an int or a torch.cuda.Event, "
                            f"got {type(event).__name__}")
        self._call(_lib.kvt_manager_save_event, handle or None)

    # -- sequences ---------------------------------------------------------------------------

    def create_seq(self, seq: int, prompt_tokens: int, hashes: Any = None,
                   hash_tokens: Optional[int] = None) -> int:
        """Registers sequence id `seq` with a prompt of prompt_tokens tokens and returns how
        many leading tokens it shares from the prefix cache (0 without hashes).

        Without `hashes`: kvt_seq_create. With them: kvt_seq_create_prefix, `hashes` being
        the prompt's chain (ints in [0, 2^64) or a NumPy uint64 array; hashes[i] stands for
        tokens [0, (i + 1) * hash_tokens), hash_tokens a multiple of block_tokens, the chain
        no longer than the prompt). The sequence shares the longest cached run of the chain,
        but never the prompt's last obs_window tokens (the queries the selection needs; the
        last token only when the prefill selects nothing): every layer then holds positions [0, matched) in its history,
        and its prefill is of the rest (:meth:`prefill_chunk` from `matched`, or
        :meth:`prefill_layer` with the whole layer). Once all its layers are prefilled, its
        own spans are cached for later requests, and stay cached after destroy_seq until the
        host tier needs their room."""
        seq = _uint("seq", seq, 64)
        prompt_tokens = _uint("prompt_tokens", prompt_tokens, 32)
        if hashes is None:
            if hash_tokens is not None:
                raise ValueError("hash_tokens: given without hashes")
            self._call(_lib.kvt_seq_create, seq, prompt_tokens)
            return 0
        if hash_tokens is None:
            raise ValueError("hash_tokens: required with hashes")
        chain, n = _hash_array(hashes)
        matched = c_uint32()
        self._call(_lib.kvt_seq_create_prefix, seq, prompt_tokens, chain, n,
                   _uint("hash_tokens", hash_tokens, 32), byref(matched))
        return matched.value

    def prefix_match(self, hashes: Any, hash_tokens: int) -> int:
        """kvt_prefix_match: how many leading tokens of a prompt with this hash chain the
        prefix cache holds (a multiple of hash_tokens; spans in the spill file count). Changes
        nothing, not even the cache's LRU order: vLLM's get_num_new_matched_tokens. The count
        create_seq then shares is at most this, and leaves the observation window."""
        chain, n = _hash_array(hashes)
        tokens = c_uint32()
        self._call(_lib.kvt_prefix_match, chain, n, _uint("hash_tokens", hash_tokens, 32),
                   byref(tokens))
        return tokens.value

    def destroy_seq(self, seq: int) -> None:
        """kvt_seq_destroy: frees the sequence's device frames and host blocks."""
        self._call(_lib.kvt_seq_destroy, seq)

    def info(self, seq: int) -> SeqInfo:
        """kvt_seq_info: what the sequence holds and needs (a :class:`SeqInfo`)."""
        out = SeqInfo.sized()
        self._call(_lib.kvt_seq_info, seq, byref(out))
        return out

    def tokens(self, seq: int, layer: int) -> int:
        """kvt_seq_tokens: tokens written to (seq, layer); 0 before its prefill."""
        n = c_uint32()
        self._call(_lib.kvt_seq_tokens, seq, layer, byref(n))
        return n.value

    def prefill_layer(self, seq: int, layer: int, k: Any, v: Any, q_obs: Any = None,
                      stream: Any = None) -> None:
        """kvt_prefill_layer: k and v hold [n_kv_heads][prompt_tokens][head_dim] of the layer
        (post-RoPE keys), q_obs [n_q_heads][obs_window][head_dim] post-RoPE queries of the last
        obs_window prompt positions (None when no selection happens). SnapKV selects the
        top-K tokens, sink/top-K/ring go to device frames, the whole layer to the host tier.
        After a shared prefix or earlier chunks (:meth:`prefill_chunk`) it prefills the rest
        of the layer, still from the whole layer's tensors."""
        st = _tensor.stream_handle(stream)
        with self._lock:
            T = self.info(seq).prompt_tokens
            # the second items (keepalives) hold the tensors until the call returned
            pk, _k = self._t(k, "k", (self._H, T, self._D), st)
            pv, _v = self._t(v, "v", (self._H, T, self._D), st)
            pq, _q = (None, None)
            if q_obs is not None:
                pq, _q = self._t(q_obs, "q_obs", (self._Hq, self.config.obs_window, self._D),
                                 st)
            self._call(_lib.kvt_prefill_layer, seq, layer, pk, pv, pq, st)

    def prefill_chunk(self, seq: int, layer: int, pos: int, k: Any, v: Any, q_obs: Any = None,
                      kv_from: Optional[int] = None, stream: Any = None) -> int:
        """kvt_prefill_chunk: prefills positions [pos, pos + n) of one layer and returns n.

        k and v hold [n_kv_heads][rows][head_dim], the rows of positions [kv_from, pos + n):
        n is rows - (pos - kv_from). kv_from defaults to pos (the chunk alone); 0 passes the
        layer from its start (the prefix from :meth:`load_kv`, then the rest, as the engine's
        attention used them). Rows below pos must be those the history holds: the library
        does not compare them. pos must be the positions the layer holds so far: its shared
        prefix (create_seq's result, or ``info(seq).prefix_tokens``) plus its earlier
        chunks. The chunk's rows go to the host history; the last chunk (pos + n ==
        prompt_tokens) takes q_obs as prefill_layer does and completes the layer bit for bit
        as prefill_layer with the whole layer would (rows below kv_from come from the host
        history, gathered into a transient buffer of one layer's K and V). Until then the
        layer is not prefilled: decode refuses it, load_kv reads it."""
        st = _tensor.stream_handle(stream)
        seq = _uint("seq", seq, 64)
        pos = _uint("pos", pos, 32)
        kv_from = pos if kv_from is None else _uint("kv_from", kv_from, 32)
        with self._lock:
            pk, _k, rows = _tensor.address_rows(k, name="k", shape=(self._H, -1, self._D),
                                                dtype=self._dt, memory=self._memory,
                                                stream=st)
            pv, _v = self._t(v, "v", (self._H, rows, self._D), st)
            n = rows - (pos - kv_from)
            if n < 1:
                raise ValueError(f"k, v: {rows} rows from position {kv_from} hold no position "
                                 f"at or past pos {pos}")
            pq, _q = (None, None)
            if q_obs is not None:
                pq, _q = self._t(q_obs, "q_obs", (self._Hq, self.config.obs_window, self._D),
                                 st)
            self._call(_lib.kvt_prefill_chunk, seq, _uint("layer", layer, 32), pos,
                       _uint("n", n, 32), kv_from, pk, pv, pq, st)
        return n

    def load_kv(self, seq: int, layer: int, pos: int, n: int, k_out: Any = None,
                v_out: Any = None, stream: Any = None) -> Tuple[Any, Any]:
        """kvt_seq_load_kv: the K and V rows of positions [pos, pos + n) of (seq, layer) from
        the host history, bit-exact, as [n_kv_heads][n][head_dim] of the manager's dtype:
        the matched prefix (and earlier chunks) that the engine's prefill of the rest attends
        over. Returns (k_out, v_out). On the host and model backends they are NumPy arrays,
        allocated when not given (uint16 bit patterns for bf16; the model backend writes
        nothing, and they stay zero). On the CUDA backend pass both, dense device tensors (a
        head's n rows follow one another): the load is one gather queued on `stream`, so read
        them in stream order."""
        st = _tensor.stream_handle(stream)
        seq = _uint("seq", seq, 64)
        pos, n = _uint("pos", pos, 32), _uint("n", n, 32)
        if (k_out is None) != (v_out is None):
            raise ValueError("k_out, v_out: pass both or neither")
        if k_out is None:
            if self._memory != _tensor.HOST:
                raise TypeError("k_out, v_out: the CUDA backend loads into device memory; "
                                "pass two device tensors of "
                                f"{self._H}x{n}x{self._D} elements")
            alloc = np.zeros if self.config.backend == Backend.MODEL else np.empty
            k_out = alloc((self._H, n, self._D), _tensor.numpy_dtype(self._dt))
            v_out = alloc((self._H, n, self._D), _tensor.numpy_dtype(self._dt))
        with self._lock:
            pk, _k = self._t(k_out, "k_out", (self._H, n, self._D), st, writable=True)
            pv, _v = self._t(v_out, "v_out", (self._H, n, self._D), st, writable=True)
            self._call(_lib.kvt_seq_load_kv, seq, _uint("layer", layer, 32), pos, n, pk, pv,
                       st)
        return k_out, v_out

    def decode_append(self, layer: int, seqs: Any, k: Any, v: Any, stream: Any = None) -> None:
        """kvt_decode_append: appends one token per sequence to `layer`; k and v hold
        [n][n_kv_heads][head_dim]. All or nothing."""
        st = _tensor.stream_handle(stream)
        ids, n = _seq_array(seqs)
        with self._lock:
            pk, _k = self._t(k, "k", (n, self._H, self._D), st)
            pv, _v = self._t(v, "v", (n, self._H, self._D), st)
            self._call(_lib.kvt_decode_append, layer, ids, n, pk, pv, st)

    def decode_recall(self, layer: int, seqs: Any, q: Any, stream: Any = None) -> None:
        """kvt_decode_recall: scores each sequence's host blocks of `layer` against its decode
        queries q ([n][n_q_heads][head_dim], the manager's dtype) and makes the top
        recall_blocks per kv head resident in the recall cache; replaces the recall views."""
        st = _tensor.stream_handle(stream)
        ids, n = _seq_array(seqs)
        with self._lock:
            pq, _q = self._t(q, "q", (n, self._Hq, self._D), st)
            self._call(_lib.kvt_decode_recall, layer, ids, n, pq, st)

    def recall_blocks(self, layer: int, seqs: Any, blocks: Any, stream: Any = None) -> None:
        """kvt_recall_blocks: as decode_recall with the selection given: blocks is
        [n][n_kv_heads][r] host block indices (host memory; NO_BLOCK entries are ignored)."""
        st = _tensor.stream_handle(stream)
        ids, n = _seq_array(seqs)
        b, r = self._blocks(blocks, n)
        self._call(_lib.kvt_recall_blocks, layer, ids, n, b.ctypes.data, r, st)

    def recall_device_blocks(self, layer: int, seqs: Any, blocks: Any,
                             stream: Any = None) -> None:
        """kvt_recall_device_blocks: recall_blocks with the selection where the backend keeps
        its tensors: a CUDA tensor on the CUDA backend (an engine's own top-k output, read
        on the device in stream order), a host array on the others. blocks holds
        [n][n_kv_heads][r] uint32 or int32 block indices (-1, NO_BLOCK, ignored). The sizing
        counts n_kv_heads * r frames per member, and a member naming a block past its
        history is left out: its views raise Error (ESTALE) until recalled again."""
        st = _tensor.stream_handle(stream)
        ids, n = _seq_array(seqs)
        with self._lock:
            pb, _b, r = _tensor.address_rows(blocks, name="blocks", shape=(n, self._H, -1),
                                             dtype=_tensor.U32, memory=self._memory,
                                             stream=st)
            self._call(_lib.kvt_recall_device_blocks, layer, ids, n, pb, r, st)

    def _blocks(self, blocks: Any, n: int) -> Tuple[Any, int]:
        """A selection of n sequences as a contiguous uint32 array [n][n_kv_heads][r], and
        its r; ValueError for any other size."""
        b = np.ascontiguousarray(blocks, dtype=np.uint32)
        if b.size == 0 or b.size % (n * self._H):
            raise ValueError(f"blocks: expected [{n}][{self._H}][r] block indices, "
                             f"got shape {b.shape}")
        return b, b.size // (n * self._H)

    # -- decode steps ------------------------------------------------------------------------

    def step_begin(self, seqs: Any) -> None:
        """kvt_step_begin: opens a decode step over the batch seqs (validated once, its
        spilled last blocks read back), closing the open one; step_append, step_recall and
        step_recall_blocks then take tensors whose row i is member i. A failure leaves the
        open step as it was."""
        ids, n = _seq_array(seqs)
        with self._lock:
            self._call(_lib.kvt_step_begin, ids, n)
            self._step_n = n

    def step_end(self) -> None:
        """kvt_step_end: closes the open step (Error EALREADY when none is)."""
        with self._lock:
            self._call(_lib.kvt_step_end)
            self._step_n = 0

    def step(self, seqs: Any) -> "_Step":
        """A decode step as a context manager: ``with m.step(ids): m.step_append(...)``
        begins it and ends it on leaving (also on an exception)."""
        return _Step(self, seqs)

    def step_append(self, layer: int, k: Any, v: Any, stream: Any = None) -> None:
        """kvt_step_append: decode_append on the open step's batch; k and v hold
        [n][n_kv_heads][head_dim]."""
        st = _tensor.stream_handle(stream)
        with self._lock:
            n = self._step_n
            if not n:  # the library says why
                self._call(_lib.kvt_step_append, layer, None, None, st)
            pk, _k = self._t(k, "k", (n, self._H, self._D), st)
            pv, _v = self._t(v, "v", (n, self._H, self._D), st)
            self._call(_lib.kvt_step_append, layer, pk, pv, st)

    def step_recall(self, layer: int, q: Any, stream: Any = None) -> None:
        """kvt_step_recall: decode_recall on the open step's batch; q holds
        [n][n_q_heads][head_dim]."""
        st = _tensor.stream_handle(stream)
        with self._lock:
            n = self._step_n
            if not n:
                self._call(_lib.kvt_step_recall, layer, None, st)
            pq, _q = self._t(q, "q", (n, self._Hq, self._D), st)
            self._call(_lib.kvt_step_recall, layer, pq, st)

    def step_recall_blocks(self, layer: int, blocks: Any, stream: Any = None) -> None:
        """kvt_step_recall_blocks: recall_blocks on the open step's batch; blocks is
        [n][n_kv_heads][r] host block indices."""
        st = _tensor.stream_handle(stream)
        with self._lock:
            n = self._step_n
            if not n:
                self._call(_lib.kvt_step_recall_blocks, layer, None, 1, st)
            b, r = self._blocks(blocks, n)
            self._call(_lib.kvt_step_recall_blocks, layer, b.ctypes.data, r, st)

    def step_recall_device_blocks(self, layer: int, blocks: Any, stream: Any = None) -> None:
        """kvt_step_recall_device_blocks: recall_device_blocks on the open step's batch."""
        st = _tensor.stream_handle(stream)
        with self._lock:
            n = self._step_n
            if not n:
                self._call(_lib.kvt_step_recall_device_blocks, layer, None, 1, st)
            pb, _b, r = _tensor.address_rows(blocks, name="blocks", shape=(n, self._H, -1),
                                             dtype=_tensor.U32, memory=self._memory,
                                             stream=st)
            self._call(_lib.kvt_step_recall_device_blocks, layer, pb, r, st)

    # -- attention tables ----------------------------------------------------------------------

    def pool(self) -> PoolInfo:
        """kvt_manager_pool: the pool of blocks the attention tables index (a
        :class:`PoolInfo`: block i at base + i * block_bytes, V rows at v_offset)."""
        out = PoolInfo()
        self._call(_lib.kvt_manager_pool, byref(out))
        return out

    def tables(self, max_batch: int, max_frames: int, max_recall: int) -> Tables:
        """Host buffers (NumPy) for :meth:`step_tables` on the host and model backends, at
        these capacities; on the CUDA backend make a :class:`Tables` of device tensors."""
        H = self.config.n_kv_heads
        for name, v in (("max_batch", max_batch), ("max_frames", max_frames),
                        ("max_recall", max_recall)):
            _uint(name, v, 32)
        return Tables(max_batch, max_frames, max_recall, np.zeros(1, np.uint32),
                      np.zeros((max_batch, H), np.uint32),
                      np.zeros((max_batch, H, max_frames), np.uint32),
                      np.zeros((max_batch, H), np.uint32),
                      np.zeros((max_batch, H, max_recall), np.uint32),
                      np.zeros((max_batch, H, max_recall), np.uint32),
                      np.zeros((max_batch, H, max_recall), np.uint64))

    def step_tables(self, layer: int, tables: Tables, stream: Any = None) -> None:
        """kvt_step_tables: one layer's attention tables of the open step's batch into
        `tables` (one library call for the whole batch; on the CUDA backend the copies are
        queued on `stream`)."""
        t, H = tables, self.config.n_kv_heads
        st = _tensor.stream_handle(stream)
        c, _keep = self._c_tables(tables, st, writable=True)
        self._call(_lib.kvt_step_tables, layer, byref(c), st)

    def _c_tables(self, t: Tables, st: Optional[int], writable: bool
                  ) -> Tuple[Any, List[Any]]:
        """struct kvt_attn_tables over t's buffers, and what must outlive the call."""
        H = self.config.n_kv_heads
        keep = []
        c = _capi.CAttnTables.sized()
        c.max_batch, c.max_frames, c.max_recall = t.max_batch, t.max_frames, t.max_recall
        for name, dt, shape in (
                ("n_batch", _tensor.U32, (1,)), ("n_tokens", _tensor.U32, (t.max_batch, H)),
                ("frames", _tensor.U32, (t.max_batch, H, t.max_frames)),
                ("n_recall", _tensor.U32, (t.max_batch, H)),
                ("recall", _tensor.U32, (t.max_batch, H, t.max_recall)),
                ("recall_tokens", _tensor.U32, (t.max_batch, H, t.max_recall)),
                ("recall_skip", _tensor.U64, (t.max_batch, H, t.max_recall))):
            ptr, k = _tensor.address(getattr(t, name), name=name, shape=shape, dtype=dt,
                                     memory=self._memory, writable=writable, stream=st)
            setattr(c, name, ptr)
            keep.append(k)
        return c, keep

    def attend_tables_scratch(self, tables: Tables) -> int:
        """kvt_attend_tables_scratch: bytes of device scratch :meth:`attend_tables` needs
        for tables of these capacities (0 on the host backend)."""
        c, _keep = self._c_tables(tables, None, writable=False)
        n = c_uint64()
        self._call(_lib.kvt_attend_tables_scratch, byref(c), byref(n))
        return n.value

    def attend_tables(self, tables: Tables, q: Any, out: Any = None, lse: Any = None,
                      scratch: Any = None, stream: Any = None) -> Any:
        """kvt_attend_tables: the batched attention over tables :meth:`step_tables` wrote,
        for a decode step captured in a CUDA graph (the work depends on the tables'
        capacities only): q and out [max_batch][n_q_heads][head_dim] (out allocated on the
        host backend when None), lse optional [max_batch][n_q_heads] float32; members past
        the tables' n_batch are not written. On the CUDA backend `scratch` is a device tensor
        (uint8, C-contiguous) of at least :meth:`attend_tables_scratch` bytes. Returns out."""
        st = _tensor.stream_handle(stream)
        n = tables.max_batch
        with self._lock:
            c, keep = self._c_tables(tables, st, writable=False)
            pq, po, pl, out, keep2 = self._attend_io(n, q, out, lse, st)
            ps, nb = 0, 0
            if scratch is not None:
                shape = getattr(scratch, "shape", None)
                if shape is None or len(shape) != 1:
                    raise ValueError("scratch: a one-dimensional uint8 tensor")
                nb = int(shape[0])
                ps, ks = _tensor.address(scratch, name="scratch", shape=(nb,), dtype=_tensor.U8,
                                         memory=self._memory, writable=True, stream=st)
                keep.append(ks)
            self._call(_lib.kvt_attend_tables, byref(c), pq, po, pl or None, ps or None, nb,
                       st)
        return out

    def paged(self, max_batch: int, max_pages: int, max_tokens: int) -> Paged:
        """Host buffers (int32 NumPy) for :meth:`step_paged` at these capacities."""
        rows = _uint("max_batch", max_batch, 32) * self.config.n_kv_heads
        return Paged(max_batch, _uint("max_pages", max_pages, 32),
                     _uint("max_tokens", max_tokens, 32), np.zeros(rows + 1, np.int32),
                     np.zeros(max_pages, np.int32), np.zeros(rows, np.int32),
                     np.zeros(rows + 1, np.int32), np.zeros(max_tokens, np.int32))

    def step_paged(self, layer: int, paged: Paged, stream: Any = None) -> None:
        """kvt_step_paged: the open step's attention inputs of `layer` in FlashInfer's
        paged-KV form, into `paged` (one library call for the batch)."""
        p, rows = paged, paged.max_batch * self.config.n_kv_heads
        st = _tensor.stream_handle(stream)
        keep = []
        c = _capi.CPagedTables.sized()
        c.max_batch, c.max_pages, c.max_tokens = p.max_batch, p.max_pages, p.max_tokens
        for name, shape in (("indptr", (rows + 1,)), ("indices", (p.max_pages,)),
                            ("last_page_len", (rows,)), ("r_indptr", (rows + 1,)),
                            ("r_indices", (p.max_tokens,))):
            ptr, k = _tensor.address(getattr(p, name), name=name, shape=shape,
                                     dtype=_tensor.I32, memory=self._memory, writable=True,
                                     stream=st)
            setattr(c, name, ptr)
            keep.append(k)
        self._call(_lib.kvt_step_paged, layer, byref(c), st)

    def kv_caches(self, page_size: Optional[int] = None, dlpack: bool = False
                  ) -> Tuple[Any, Any]:
        """The pool of blocks as FlashInfer's paged K and V caches of one kv head, NHD layout
        [pages][page_size][1][head_dim], views without copies (NumPy arrays on the host
        backend; on the CUDA backend :class:`~kvtier._tensor.CudaView` objects, with
        ``__cuda_array_interface__`` (bf16 as uint16) and DLPack (bf16 as bf16:
        ``torch.from_dlpack(k)``)): page_size block_tokens (the default; page p = pool block
        p, the indices of :meth:`step_paged`'s resident part) or 1 (page x = a token row, its
        r_indices). With `dlpack`, the host backend's views are
        :class:`~kvtier._tensor.DLView` objects too (DLPack on the CPU device:
        ``numpy.from_dlpack(k)``, except bf16, which NumPy cannot import). Valid while the
        manager is open: a DLPack export keeps this object alive until its consumer lets it
        go, but :meth:`close` frees the memory regardless."""
        p = self.pool()
        bt, rb, es = p.block_tokens, p.row_bytes, _tensor.itemsize(self._dt)
        ps = bt if page_size is None else page_size
        if ps == bt:
            shape = (p.n_blocks, bt, 1, self._D)
            strides = (p.block_bytes, rb, rb, es)
        elif ps == 1:
            shape = (max(p.n_blocks * 2 * bt - bt, 0), 1, 1, self._D)
            strides = (rb, rb, rb, es)
        else:
            raise ValueError(f"page_size: block_tokens ({bt}) or 1, not {ps}")
        return (_tensor.strided_view(p.base, shape, strides, self._dt, self._memory, self,
                                     dlpack),
                _tensor.strided_view(p.base + p.v_offset, shape, strides, self._dt,
                                     self._memory, self, dlpack))

    def _attend_io(self, n: int, q: Any, out: Any, lse: Any, st: Optional[int]
                   ) -> Tuple[int, int, int, Any, List[Any]]:
        """Addresses of q, out (allocated on the host when None) and lse (may be None) of a
        batched attention over n members, and what must outlive the call."""
        if out is None:
            if self._memory != _tensor.HOST:
                raise ValueError("out: pass a device tensor on the CUDA backend")
            out = np.empty((n, self._Hq, self._D), _tensor.numpy_dtype(self._dt))
        pq, kq = self._t(q, "q", (n, self._Hq, self._D), st)
        po, ko = self._t(out, "out", (n, self._Hq, self._D), st, writable=True)
        pl, kl = 0, None
        if lse is not None:
            pl, kl = _tensor.address(lse, name="lse", shape=(n, self._Hq), dtype=0,
                                     memory=self._memory, writable=True, stream=st)
        return pq, po, pl, out, [kq, ko, kl]

    def attend_batch(self, layer: int, seqs: Any, q: Any, out: Any = None, lse: Any = None,
                     stream: Any = None) -> Any:
        """kvt_attend_batch: decode attention of `layer` for the batch seqs in one call, over
        the tokens the attention tables name (resident set and latest recall view): q and out
        [n][n_q_heads][head_dim] of the manager's dtype (out allocated on the host backend
        when None), lse (optional) [n][n_q_heads] float32, the log-sum-exp per query head.
        Returns out."""
        st = _tensor.stream_handle(stream)
        ids, n = _seq_array(seqs)
        with self._lock:
            pq, po, pl, out, _keep = self._attend_io(n, q, out, lse, st)
            self._call(_lib.kvt_attend_batch, layer, ids, n, pq, po, pl or None, st)
        return out

    def step_attend(self, layer: int, q: Any, out: Any = None, lse: Any = None,
                    stream: Any = None) -> Any:
        """kvt_step_attend: attend_batch on the open step's batch. Returns out."""
        st = _tensor.stream_handle(stream)
        with self._lock:
            n = self._step_n
            if not n:
                self._call(_lib.kvt_step_attend, layer, None, None, None, st)
            pq, po, pl, out, _keep = self._attend_io(n, q, out, lse, st)
            self._call(_lib.kvt_step_attend, layer, pq, po, pl or None, st)
        return out

    def _counted(self, fn: Any, ctype: Any, args: Tuple[Any, ...], tail: Tuple[Any, ...] = ()
                 ) -> Any:
        """A `fn(m, *args, out, cap, n_out, *tail)` query: once for the count, then, when it
        answers -ENOSPC, again with room for that many."""
        n = c_uint32()
        with self._lock:
            h = self._h()
            out = (ctype * 0)()
            err = fn(h, *args, None, 0, byref(n), *tail)
            if err == -errno.ENOSPC and n.value:
                out = (ctype * n.value)()
                err = fn(h, *args, out, n.value, byref(n), *tail)
            self._check(err, fn.__name__)
        return out

    def resident_positions(self, seq: int, layer: int, kv_head: int) -> np.ndarray:
        """kvt_seq_resident_positions: positions resident on the device for (seq, layer,
        kv_head), ascending (sink, top-K, ring), as an int32 array."""
        out = self._counted(_lib.kvt_seq_resident_positions, ctypes.c_int32,
                            (seq, layer, kv_head))
        return np.ctypeslib.as_array(out).copy() if len(out) else np.zeros(0, np.int32)

    def recall_view(self, seq: int, layer: int, kv_head: int) -> List[RecallRef]:
        """kvt_seq_recall_view: the blocks the latest recall made resident for (seq, layer,
        kv_head), ascending; :class:`Error` with errno ESTALE when a frame went to another
        block since (recall again)."""
        return list(self._counted(_lib.kvt_seq_recall_view, RecallRef, (seq, layer, kv_head)))

    def frames(self, seq: int, layer: int, kv_head: int) -> Tuple[np.ndarray, int]:
        """kvt_seq_frames: (device addresses of the resident set's frames as uint64, number of
        slots holding tokens). Slot s is row s % block_tokens of frames[s // block_tokens]."""
        slots = c_uint32()
        out = self._counted(_lib.kvt_seq_frames, c_uint64, (seq, layer, kv_head),
                            (byref(slots),))
        arr = np.ctypeslib.as_array(out).copy() if len(out) else np.zeros(0, np.uint64)
        return arr, slots.value

    def read_token(self, seq: int, layer: int, kv_head: int, pos: int
                   ) -> Tuple[np.ndarray, np.ndarray]:
        """kvt_seq_read_token: the K and V rows of token `pos`, bit-exact, as host arrays of
        the manager's dtype (uint16 bit patterns for bf16), from whichever tier holds it."""
        k = np.empty(self._D, _tensor.numpy_dtype(self._dt))
        v = np.empty(self._D, _tensor.numpy_dtype(self._dt))
        self._call(_lib.kvt_seq_read_token, seq, layer, kv_head, pos, k.ctypes.data,
                   v.ctypes.data)
        return k, v

    def attend(self, seq: int, layer: int, q: Any, out: Optional[np.ndarray] = None
               ) -> np.ndarray:
        """kvt_attend: reference decode attention of (seq, layer) over its resident set plus
        its latest recall view. q is [n_q_heads][head_dim] float32 in host memory; returns
        `out` (allocated when None), [n_q_heads][head_dim] float32."""
        shape = (self._Hq, self._D)
        qa = np.ascontiguousarray(q, dtype=np.float32)
        if qa.size != self._Hq * self._D:
            raise ValueError(f"q: expected {self._Hq}x{self._D} float32, got shape {qa.shape}")
        if out is None:
            out = np.empty(shape, np.float32)
        elif (out.dtype != np.float32 or out.size != qa.size or not out.flags.c_contiguous
              or not out.flags.writeable):
            raise ValueError(f"out: expected a writable C-contiguous float32 array of "
                             f"{self._Hq}x{self._D}")
        self._call(_lib.kvt_attend, seq, layer, qa.ctypes.data, out.ctypes.data)
        return out

    # -- preemption and the disk tier ----------------------------------------------------------

    def preempt(self, seq: int) -> None:
        """kvt_seq_preempt: frees the sequence's device frames; its history stays whole."""
        self._call(_lib.kvt_seq_preempt, seq)

    def resume(self, seq: int, stream: Any = None) -> None:
        """kvt_seq_resume: rebuilds a preempted sequence's device state bit for bit."""
        self._call(_lib.kvt_seq_resume, seq, _tensor.stream_handle(stream))

    def fetch(self, seqs: Any) -> None:
        """kvt_seq_fetch: reads back, in one batched read, the spilled blocks that the
        sequences' next decode step appends to (each layer's last block); every call fetches
        the blocks it touches itself, so this only moves the reads ahead of time."""
        ids, n = _seq_array(seqs)
        self._call(_lib.kvt_seq_fetch, ids, n)

    def spill(self, seq: int) -> None:
        """kvt_seq_spill: writes every host block of seq to the spill file now."""
        self._call(_lib.kvt_seq_spill, seq)


@dataclass
class Batch:
    """One iteration's work from :meth:`Scheduler.step`: `items` (prefills first, then decodes),
    the requests that `completed` at the previous commit (their frames are freed; destroy the
    sequences when done with them), those that `failed` (history lost: fail and destroy them),
    and the iteration's figures `it`."""

    items: List[SchedItem] = field(default_factory=list)
    completed: List[int] = field(default_factory=list)
    failed: List[int] = field(default_factory=list)
    it: IterStats = field(default_factory=IterStats)

    @property
    def prefills(self) -> List[SchedItem]:
        return [i for i in self.items if not i.decode]

    @property
    def decodes(self) -> List[SchedItem]:
        return [i for i in self.items if i.decode]


class _Step:
    """Manager.step's context manager: kvt_step_begin on entering, kvt_step_end on leaving."""

    def __init__(self, m: Manager, seqs: Any) -> None:
        self._m, self._seqs = m, seqs

    def __enter__(self) -> Manager:
        self._m.step_begin(self._seqs)
        return self._m

    def __exit__(self, *exc: Any) -> None:
        with self._m._lock:
            if self._m._step_n and self._m._m is not None:
                _lib.kvt_step_end(self._m._m)
                self._m._step_n = 0


class Scheduler:
    """SparseServe's working-set-aware admission over a manager (kvt_sched): the engine creates
    each request's sequence, :meth:`submit`\\ s it, then per iteration calls :meth:`step`,
    executes the batch and calls :meth:`commit`. On a GPU, pass the engine's ``stream`` (the
    loads of the requests a step resumes go on it)."""

    def __init__(self, manager: Manager, max_requests: int = 256, max_tokens: int = 8192,
                 max_inject_tokens: int = 2048 * 32, ws_control: bool = True,
                 stream: Any = None) -> None:
        self._s: Optional[int] = None
        self._m = manager
        c = _capi.CSchedConfig.sized(_capi.SCHED_CONFIG_VERSION)
        c.max_requests, c.max_tokens = max_requests, max_tokens
        c.max_inject_tokens, c.ws_control = max_inject_tokens, 1 if ws_control else 0
        # the stream the resumes of step() go on (the engine's: see kvt_sched_config.stream)
        c.stream = _tensor.stream_handle(stream)
        handle = c_void_p()
        with manager._lock:
            manager._call(_lib.kvt_sched_create, byref(c), byref(handle))
            self._s = handle.value
            manager._scheds.add(self)

    def close(self) -> None:
        """kvt_sched_destroy; the manager's sequences stay as they are. Idempotent."""
        with self._m._lock:
            if self._s is not None:
                _lib.kvt_sched_destroy(self._s)
                self._s = None

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _h(self) -> int:
        if self._s is None or self._m._m is None:
            raise ValueError("kvtier: the scheduler is closed")
        return self._s

    def _call(self, fn: Any, *args: Any) -> None:
        """fn(scheduler, *args) under the manager's lock; a failure raises Error with the
        scheduler's detail (kvt_sched_last_error)."""
        with self._m._lock:
            err = fn(self._h(), *args)
            if err:
                raise Error(err, fn.__name__, _lib.kvt_sched_last_error(self._s).decode())

    @property
    def last_error(self) -> str:
        """kvt_sched_last_error: detail of the latest failed call ("" when none failed)."""
        with self._m._lock:
            return _lib.kvt_sched_last_error(self._h()).decode()

    def submit(self, seq: int, max_new_tokens: int) -> None:
        """kvt_sched_submit: queues live, not yet prefilled sequence seq for max_new_tokens."""
        self._call(_lib.kvt_sched_submit, seq, max_new_tokens)

    def step(self) -> Batch:
        """kvt_sched_step: forms the next iteration's batch (preempting/resuming as needed)."""
        b = _capi.CSchedBatch()
        with self._m._lock:
            self._call(_lib.kvt_sched_step, byref(b))
            items = [SchedItem.from_buffer_copy(b.items[i]) for i in range(b.n_items)]
            done = [b.completed[i] for i in range(b.n_completed)]
            failed = [b.failed[i] for i in range(b.n_failed)]
        return Batch(items, done, failed, IterStats.from_buffer_copy(b.it))

    def commit(self) -> None:
        """kvt_sched_commit: the engine executed the current batch."""
        self._call(_lib.kvt_sched_commit)

    def finish(self, seq: int) -> None:
        """kvt_sched_finish: removes seq now (finished early or failed)."""
        self._call(_lib.kvt_sched_finish, seq)

    @property
    def pending(self) -> int:
        """Requests queued or running (not completed)."""
        with self._m._lock:
            return int(_lib.kvt_sched_pending(self._h()))

    def last(self) -> IterStats:
        """kvt_sched_last: figures of the iteration committed last."""
        out = IterStats()
        self._call(_lib.kvt_sched_last, byref(out))
        return out


# -- logging -----------------------------------------------------------------------------------

# One trampoline, installed into the library the first time it is needed and kept for the life
# of the process (a save thread may be inside it at any time), dispatching to Python state.
_log_cb: Optional[Any] = None
_log_user: Optional[Callable[[LogLevel, str], None]] = None
_log_capture: Optional[List[str]] = None
_log_lock = threading.Lock()


def _log_dispatch(_user: Any, level: int, msg: bytes) -> None:
    try:
        text = msg.decode(errors="replace")
        cap = _log_capture
        if cap is not None:
            cap.append(text.removeprefix("kvtier: "))
        fn = _log_user
        if fn is not None:
            fn(LogLevel(level), text)
        else:
            sys.stderr.write(text + "\n")
    except Exception:  # an exception must not cross into C
        pass


def _log_hook() -> None:
    global _log_cb
    if _log_cb is None:
        _log_cb = _capi.LOG_FN(_log_dispatch)
        _lib.kvt_log_set(_log_cb, None)


def _capture_log(call: Callable[[], int]) -> Tuple[int, List[str]]:
    """Runs call() with the library's messages also collected (a failed kvt_manager_create
    has no manager to hold its last error); they still reach the handler, or stderr."""
    global _log_capture
    said: List[str] = []
    with _log_lock:
        _log_hook()
        _log_capture = said
        try:
            err = call()
        finally:
            _log_capture = None
    return err, said


def set_log_handler(fn: Optional[Callable[[LogLevel, str], None]]) -> None:
    """Routes the library's messages to fn(level, message), or back to stderr when None.
    fn may be called from the library's save threads; it must not call into a manager."""
    global _log_user
    with _log_lock:
        _log_user = fn
        _log_hook()


def log_to_logging(logger: Optional[logging.Logger] = None) -> None:
    """Routes the library's messages to a `logging` logger (default: "kvtier")."""
    log = logger or logging.getLogger("kvtier")
    levels = {LogLevel.ERROR: logging.ERROR, LogLevel.WARN: logging.WARNING,
              LogLevel.INFO: logging.INFO, LogLevel.DEBUG: logging.DEBUG}
    set_log_handler(lambda level, msg: log.log(levels[level], "%s", msg))


def set_log_level(level: Union[LogLevel, int, str]) -> None:
    """kvt_log_set_level: the threshold of library messages (overrides $KVT_LOG)."""
    _lib.kvt_log_set_level(int(_as_enum(LogLevel, level)))
