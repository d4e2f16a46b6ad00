# SPDX-License-Identifier: MIT
"""ctypes declarations of kvtier.h: the structures, field for field in the header's order, and
the prototypes of every public function. The layout is checked against the C compiler's in the
test suite (tests/test_layout.py), so a header change that is not mirrored here fails there.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_double,
    c_int,
    c_int32,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Any, Dict, List, Optional

# The version of the C library this binding was written against (major.minor must match).
ABI_MAJOR, ABI_MINOR = 0, 1
CONFIG_VERSION = 1
STATS_VERSION = 1
SCHED_CONFIG_VERSION = 1


class _Struct(Structure):
    """A C structure with a readable repr and a dict view of its fields."""

    def as_dict(self) -> Dict[str, Any]:
        out = {}
        for name, _ in self._fields_:
            val = getattr(self, name)
            out[name] = val.decode() if isinstance(val, bytes) else val
        return out

    @classmethod
    def sized(cls, version: Optional[int] = None) -> Any:
        """A zeroed instance with `size` (and `version`, when given) filled in, as the C
        calls that take a versioned structure expect."""
        s = cls()
        s.size = ctypes.sizeof(cls)
        if version is not None:
            s.version = version
        return s

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()
                         if k not in ("size", "version", "reserved"))
        return f"{type(self).__name__}({body})"


class CConfig(_Struct):
    _fields_ = [
        ("size", c_uint32), ("version", c_uint32),
        ("n_layers", c_uint32), ("n_kv_heads", c_uint32), ("n_q_heads", c_uint32),
        ("head_dim", c_uint32), ("block_tokens", c_uint32),
        ("dtype", c_int),
        ("sink_tokens", c_uint32), ("recent_tokens", c_uint32), ("topk_tokens", c_uint32),
        ("obs_window", c_uint32), ("pool_kernel", c_uint32),
        ("device_bytes", c_uint64), ("host_bytes", c_uint64),
        ("backend", c_int),
        ("save_threads", c_uint32),
        ("staging_bytes", c_uint64),
        ("recall_blocks", c_uint32), ("ws_window", c_uint32),
        ("recall_cache_bytes", c_uint64),
        ("model_h2d_gbps", c_double), ("model_d2h_gbps", c_double),
        ("model_d2d_gbps", c_double), ("model_fused_eff", c_double),
        ("model_call_ns", c_uint32), ("model_launch_ns", c_uint32),
        ("model_fused", c_uint32),
        ("disk_queue_depth", c_uint32),
        ("spill_dir", c_char_p),
        ("disk_bytes", c_uint64),
        ("model_disk_gbps", c_double),
        ("model_disk_ns", c_uint32),
        ("recall_threads", c_uint32),
    ]


class Stats(_Struct):
    """Counters of one manager since its creation (struct kvt_stats; see kvtier.h)."""

    _fields_ = [
        ("size", c_uint32), ("version", c_uint32),
        ("device_frames_total", c_uint64), ("device_frames_used", c_uint64),
        ("device_frames_free", c_uint64),
        ("host_blocks_total", c_uint64), ("host_blocks_used", c_uint64),
        ("host_blocks_free", c_uint64),
        ("bytes_h2d", c_uint64), ("bytes_d2h", c_uint64), ("bytes_d2d", c_uint64),
        ("tokens_saved", c_uint64), ("tokens_appended", c_uint64),
        ("tokens_prompt", c_uint64), ("tokens_resident", c_uint64),
        ("prefill_layers", c_uint64), ("decode_calls", c_uint64),
        ("saves_submitted", c_uint64),
        ("live_seqs", c_uint32), ("save_threads", c_uint32),
        ("bytes_read", c_uint64),
        ("recall_frames_total", c_uint64), ("recall_frames_used", c_uint64),
        ("recall_calls", c_uint64), ("recall_lookups", c_uint64), ("recall_hits", c_uint64),
        ("recall_loads", c_uint64), ("recall_evictions", c_uint64),
        ("preemptions", c_uint64), ("resumes", c_uint64),
        ("model_ns_h2d", c_uint64), ("model_ns_d2h", c_uint64), ("model_ns_d2d", c_uint64),
        ("model_calls_h2d", c_uint64), ("model_calls_d2h", c_uint64),
        ("model_calls_d2d", c_uint64),
        ("disk_blocks_total", c_uint64), ("disk_blocks_used", c_uint64),
        ("disk_blocks_spilled", c_uint64), ("disk_blocks_fetched", c_uint64),
        ("disk_bytes_written", c_uint64), ("disk_bytes_read", c_uint64),
        ("disk_io_errors", c_uint64), ("disk_checksum_errors", c_uint64),
        ("seqs_lost", c_uint64), ("model_ns_disk", c_uint64),
        ("disk_direct", c_uint32), ("disk_uring", c_uint32),
        ("h2d_kernel_launches", c_uint64), ("h2d_dma_batches", c_uint64),
        ("xfer_calibrated", c_uint32), ("xfer_gather_min_4k", c_uint32),
        ("xfer_gather_min_16k", c_uint32), ("xfer_gather_min_64k", c_uint32),
        ("prefix_spans", c_uint64), ("prefix_blocks", c_uint64),
        ("prefix_blocks_idle", c_uint64), ("prefix_blocks_disk", c_uint64),
        ("prefix_blocks_shared", c_uint64), ("prefix_tokens_asked", c_uint64),
        ("prefix_tokens_hit", c_uint64), ("prefix_spans_evicted", c_uint64),
        ("prefix_spans_spilled", c_uint64), ("prefix_spans_restored", c_uint64),
        ("bytes_h2d_history", c_uint64), ("device_meta_bytes", c_uint64),
        ("recall_device_ns", c_uint64), ("recall_device_timed", c_uint64),
    ]


class SeqInfo(_Struct):
    """What a sequence holds and needs (struct kvt_seq_info; see kvtier.h)."""

    _fields_ = [
        ("size", c_uint32), ("prompt_tokens", c_uint32), ("layers_prefilled", c_uint32),
        ("preempted", c_uint32), ("tokens", c_uint32), ("frames_per_layer", c_uint32),
        ("device_frames", c_uint64), ("host_blocks", c_uint64),
        ("recall_ws_frames", c_uint64), ("recall_step_frames", c_uint64),
        ("disk_blocks", c_uint64),
        ("lost", c_int32), ("reserved", c_uint32),
        ("prefix_tokens", c_uint32), ("filled_tokens", c_uint32),
        ("shared_blocks", c_uint64), ("serial", c_uint64),
    ]


class RecallRef(_Struct):
    """One recalled block of a recall view (struct kvt_recall_ref): `frame` is the device
    address of K[block_tokens][head_dim] then V likewise; slots i < n_valid hold positions
    block * block_tokens + i; bit i of `resident` set means token i is also resident."""

    _fields_ = [
        ("frame", c_uint64), ("block", c_uint32), ("n_valid", c_uint32),
        ("resident", c_uint64),
    ]


class CSchedConfig(_Struct):
    _fields_ = [
        ("size", c_uint32), ("version", c_uint32),
        ("max_requests", c_uint32), ("max_tokens", c_uint32),
        ("max_inject_tokens", c_uint64),
        ("ws_control", c_uint32), ("reserved", c_uint32),
        ("stream", c_void_p),
    ]


class SchedItem(_Struct):
    """Work of one request in an iteration: prefill layers [layer_begin, layer_end), or one
    decode step of every layer when `decode` is 1."""

    _fields_ = [
        ("seq", c_uint64), ("layer_begin", c_uint32), ("layer_end", c_uint32),
        ("decode", c_uint32), ("reserved", c_uint32),
    ]


class IterStats(_Struct):
    """Per-iteration figures of the scheduler (struct kvt_sched_iter; see kvtier.h)."""

    _fields_ = [
        ("iteration", c_uint64),
        ("batch_size", c_uint32), ("n_decode", c_uint32), ("n_prefill", c_uint32),
        ("admitted", c_uint32), ("reset", c_uint32), ("preempted", c_uint32),
        ("resumed", c_uint32), ("completed", c_uint32),
        ("prefill_token_layers", c_uint64), ("ws_estimate_frames", c_uint64),
        ("ws_touched_frames", c_uint64), ("blocks_loaded", c_uint64),
        ("recall_lookups", c_uint64), ("recall_hits", c_uint64),
        ("queued", c_uint32), ("reserved", c_uint32),
    ]


class CSchedBatch(_Struct):
    _fields_ = [
        ("items", POINTER(SchedItem)), ("n_items", c_uint32),
        ("completed", POINTER(c_uint64)), ("n_completed", c_uint32),
        ("failed", POINTER(c_uint64)), ("n_failed", c_uint32),
        ("it", IterStats),
    ]


LOG_FN = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_char_p)

class PoolInfo(_Struct):
    """The pool of blocks the attention tables index (struct kvt_pool_info): block i at
    base + i * block_bytes, its K rows then its V rows at v_offset; blocks from first_recall
    on are the recall cache."""

    _fields_ = [
        ("base", c_uint64), ("n_blocks", c_uint64), ("first_recall", c_uint64),
        ("block_bytes", c_uint64), ("v_offset", c_uint64), ("row_bytes", c_uint32),
        ("block_tokens", c_uint32),
    ]


class CAttnTables(_Struct):
    """struct kvt_attn_tables: capacities and the addresses of the caller's buffers."""

    _fields_ = [
        ("size", c_uint32), ("max_batch", c_uint32), ("max_frames", c_uint32),
        ("max_recall", c_uint32), ("n_batch", c_void_p), ("n_tokens", c_void_p),
        ("frames", c_void_p), ("n_recall", c_void_p), ("recall", c_void_p),
        ("recall_tokens", c_void_p), ("recall_skip", c_void_p),
    ]


class CPagedTables(_Struct):
    """struct kvt_paged_tables: capacities and the addresses of the caller's int32 buffers."""

    _fields_ = [
        ("size", c_uint32), ("max_batch", c_uint32), ("max_pages", c_uint32),
        ("max_tokens", c_uint32), ("indptr", c_void_p), ("indices", c_void_p),
        ("last_page_len", c_void_p), ("r_indptr", c_void_p), ("r_indices", c_void_p),
    ]


# (name, restype, argtypes) of every public function the binding calls.
_PROTOTYPES: List[Any] = [
    ("kvt_version", c_char_p, []),
    ("kvt_strerror", c_char_p, [c_int]),
    ("kvt_log_set", None, [LOG_FN, c_void_p]),
    ("kvt_log_set_level", None, [c_int]),
    ("kvt_manager_create", c_int, [POINTER(CConfig), POINTER(c_void_p)]),
    ("kvt_manager_destroy", None, [c_void_p]),
    ("kvt_manager_last_error", c_char_p, [c_void_p]),
    ("kvt_manager_config", c_int, [c_void_p, POINTER(CConfig)]),
    ("kvt_manager_stats", c_int, [c_void_p, POINTER(Stats)]),
    ("kvt_manager_sync", c_int, [c_void_p, c_void_p]),
    ("kvt_manager_save_event", c_int, [c_void_p, c_void_p]),
    ("kvt_seq_create", c_int, [c_void_p, c_uint64, c_uint32]),
    ("kvt_seq_destroy", c_int, [c_void_p, c_uint64]),
    ("kvt_prefill_layer", c_int,
     [c_void_p, c_uint64, c_uint32, c_void_p, c_void_p, c_void_p, c_void_p]),
    ("kvt_decode_append", c_int,
     [c_void_p, c_uint32, POINTER(c_uint64), c_uint32, c_void_p, c_void_p, c_void_p]),
    ("kvt_seq_resident_positions", c_int,
     [c_void_p, c_uint64, c_uint32, c_uint32, POINTER(c_int32), c_uint32, POINTER(c_uint32)]),
    ("kvt_seq_read_token", c_int,
     [c_void_p, c_uint64, c_uint32, c_uint32, c_uint32, c_void_p, c_void_p]),
    ("kvt_seq_tokens", c_int, [c_void_p, c_uint64, c_uint32, POINTER(c_uint32)]),
    ("kvt_attend", c_int, [c_void_p, c_uint64, c_uint32, c_void_p, c_void_p]),
    ("kvt_seq_preempt", c_int, [c_void_p, c_uint64]),
    ("kvt_seq_resume", c_int, [c_void_p, c_uint64, c_void_p]),
    ("kvt_seq_info", c_int, [c_void_p, c_uint64, POINTER(SeqInfo)]),
    ("kvt_seq_fetch", c_int, [c_void_p, POINTER(c_uint64), c_uint32]),
    ("kvt_seq_spill", c_int, [c_void_p, c_uint64]),
    ("kvt_decode_recall", c_int,
     [c_void_p, c_uint32, POINTER(c_uint64), c_uint32, c_void_p, c_void_p]),
    ("kvt_recall_blocks", c_int,
     [c_void_p, c_uint32, POINTER(c_uint64), c_uint32, c_void_p, c_uint32, c_void_p]),
    ("kvt_recall_device_blocks", c_int,
     [c_void_p, c_uint32, POINTER(c_uint64), c_uint32, c_void_p, c_uint32, c_void_p]),
    ("kvt_step_begin", c_int, [c_void_p, POINTER(c_uint64), c_uint32]),
    ("kvt_step_append", c_int, [c_void_p, c_uint32, c_void_p, c_void_p, c_void_p]),
    ("kvt_step_recall", c_int, [c_void_p, c_uint32, c_void_p, c_void_p]),
    ("kvt_step_recall_blocks", c_int, [c_void_p, c_uint32, c_void_p, c_uint32, c_void_p]),
    ("kvt_step_recall_device_blocks", c_int, [c_void_p, c_uint32, c_void_p, c_uint32, c_void_p]),
    ("kvt_step_end", c_int, [c_void_p]),
    ("kvt_step_tables", c_int, [c_void_p, c_uint32, POINTER(CAttnTables), c_void_p]),
    ("kvt_manager_pool", c_int, [c_void_p, POINTER(PoolInfo)]),
    ("kvt_step_paged", c_int, [c_void_p, c_uint32, POINTER(CPagedTables), c_void_p]),
    ("kvt_attend_batch", c_int,
     [c_void_p, c_uint32, POINTER(c_uint64), c_uint32, c_void_p, c_void_p, c_void_p, c_void_p]),
    ("kvt_step_attend", c_int, [c_void_p, c_uint32, c_void_p, c_void_p, c_void_p, c_void_p]),
    ("kvt_attend_tables", c_int, [c_void_p, POINTER(CAttnTables), c_void_p, c_void_p, c_void_p,
                                  c_void_p, c_uint64, c_void_p]),
    ("kvt_attend_tables_scratch", c_int, [c_void_p, POINTER(CAttnTables), POINTER(c_uint64)]),
    ("kvt_seq_recall_view", c_int,
     [c_void_p, c_uint64, c_uint32, c_uint32, POINTER(RecallRef), c_uint32, POINTER(c_uint32)]),
    ("kvt_seq_frames", c_int,
     [c_void_p, c_uint64, c_uint32, c_uint32, POINTER(c_uint64), c_uint32, POINTER(c_uint32),
      POINTER(c_uint32)]),
    ("kvt_prefix_match", c_int,
     [c_void_p, POINTER(c_uint64), c_uint32, c_uint32, POINTER(c_uint32)]),
    ("kvt_seq_create_prefix", c_int,
     [c_void_p, c_uint64, c_uint32, POINTER(c_uint64), c_uint32, c_uint32, POINTER(c_uint32)]),
    ("kvt_prefill_chunk", c_int,
     [c_void_p, c_uint64, c_uint32, c_uint32, c_uint32, c_uint32, c_void_p, c_void_p, c_void_p,
      c_void_p]),
    ("kvt_seq_load_kv", c_int,
     [c_void_p, c_uint64, c_uint32, c_uint32, c_uint32, c_void_p, c_void_p, c_void_p]),
    ("kvt_sched_create", c_int, [c_void_p, POINTER(CSchedConfig), POINTER(c_void_p)]),
    ("kvt_sched_destroy", None, [c_void_p]),
    ("kvt_sched_submit", c_int, [c_void_p, c_uint64, c_uint32]),
    ("kvt_sched_step", c_int, [c_void_p, POINTER(CSchedBatch)]),
    ("kvt_sched_commit", c_int, [c_void_p]),
    ("kvt_sched_finish", c_int, [c_void_p, c_uint64]),
    ("kvt_sched_pending", c_uint32, [c_void_p]),
    ("kvt_sched_last", c_int, [c_void_p, POINTER(IterStats)]),
    ("kvt_sched_last_error", c_char_p, [c_void_p]),
]


def _candidates() -> List[str]:
    """Where libkvtier.so is looked for, first match wins: $KVTIER_LIBRARY; the library
    directory `meson install` recorded next to this package; the dynamic linker's path."""
    out = []
    env = os.environ.get("KVTIER_LIBRARY")
    if env:
        return [env]
    try:
        from . import _install  # written by meson install

        out.append(os.path.join(_install.LIBDIR, "libkvtier.so.0"))
    except ImportError:
        pass
    out.append("libkvtier.so.0")
    found = ctypes.util.find_library("kvtier")
    if found:
        out.append(found)
    return out


def load() -> ctypes.CDLL:
    """Loads libkvtier and declares its functions; ImportError when it cannot be found or its
    version does not match this binding."""
    errors = []
    lib = None
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            errors.append(f"{path}: {e}")
    if lib is None and any("static TLS" in e for e in errors):
        raise ImportError(
            "kvtier: libkvtier.so needs jemalloc, whose Debian build keeps 2.6 KB of "
            "initial-exec thread-local storage that glibc cannot give a library loaded after "
            "start-up. Start Python with GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096 "
            "(or LD_PRELOAD=libjemalloc.so.2) in its environment. " + "; ".join(errors))
    if lib is None:
        raise ImportError("kvtier: cannot load libkvtier.so (set KVTIER_LIBRARY to its path, or "
                          "install it with `meson install`): " + "; ".join(errors))
    for name, restype, argtypes in _PROTOTYPES:
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    version = lib.kvt_version().decode()
    major, minor = (int(x) for x in version.split(".")[:2])
    if (major, minor) != (ABI_MAJOR, ABI_MINOR):
        raise ImportError(f"kvtier: libkvtier {version} at {lib._name} does not match this "
                          f"binding ({ABI_MAJOR}.{ABI_MINOR}.x)")
    return lib


__all__ = ["CConfig", "Stats", "SeqInfo", "RecallRef", "CSchedConfig", "SchedItem",
           "IterStats", "CSchedBatch", "LOG_FN", "load", "c_size_t"]
