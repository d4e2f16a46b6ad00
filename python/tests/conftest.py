# SPDX-License-Identifier: MIT
"""Shared fixtures of the binding's tests, and TAP lines for CI's summary (KVTIER_TAP=1)."""
import os

import numpy as np
import pytest

import kvtier

# A small geometry with every mechanism active: GQA (4 query heads per kv head), 16-token
# blocks, sink 16 / recent 32 / top-K 64, recall of 4 blocks per kv head.
SMALL = dict(n_layers=2, n_kv_heads=2, n_q_heads=8, head_dim=32, block_tokens=16,
             dtype="f32", backend="host", sink_tokens=16, recent_tokens=32, topk_tokens=64,
             obs_window=8, pool_kernel=3, device_bytes=4 << 20, host_bytes=16 << 20,
             recall_blocks=4, recall_cache_bytes=1 << 20, save_threads=2,
             staging_bytes=1 << 20)


@pytest.fixture
def mgr():
    with kvtier.Manager(**SMALL) as m:
        yield m


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


class DLPackOnly:
    """Hides an array behind the DLPack protocol alone (no NumPy or CUDA array interface), so
    that the binding must take it, and its shape, through DLPack."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def prefill(m, seq, T, rng, layers=None):
    """Creates seq with a T-token prompt and prefills every layer with random K/V; returns
    {layer: (k, v)} as written."""
    c = m.config
    m.create_seq(seq, T)
    kv = {}
    dt = kvtier._tensor.numpy_dtype(int(c.dtype))

    def cast(a):  # float32 to the manager's dtype (bf16: the top 16 bits)
        return (a.view(np.uint32) >> 16).astype(np.uint16) if dt == np.uint16 else a.astype(dt)

    for layer in range(c.n_layers) if layers is None else layers:
        k = cast(rng.standard_normal((c.n_kv_heads, T, c.head_dim)).astype(np.float32))
        v = cast(rng.standard_normal((c.n_kv_heads, T, c.head_dim)).astype(np.float32))
        q = cast(rng.standard_normal((c.n_q_heads, c.obs_window, c.head_dim)).astype(np.float32))
        m.prefill_layer(seq, layer, k, v, q)
        kv[layer] = (k, v)
    return kv


_results = []


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _results.append((report.nodeid, report.outcome, ""))


def pytest_collectreport(report):
    if report.skipped:  # a whole module skipped (e.g. the GPU tests without a GPU)
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        _results.append((report.nodeid, "skipped", reason))


def pytest_terminal_summary(terminalreporter):
    if os.environ.get("KVTIER_TAP") != "1":
        return
    for i, (name, outcome, reason) in enumerate(_results, 1):
        if outcome == "passed":
            terminalreporter.write_line(f"ok {i} - {name}")
        elif outcome == "skipped":
            terminalreporter.write_line(f"ok {i} - {name} # SKIP {reason}".rstrip())
        else:
            terminalreporter.write_line(f"not ok {i} - {name}")
