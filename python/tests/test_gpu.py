# SPDX-License-Identifier: MIT
"""The CUDA backend through PyTorch tensors (no copies, streams honoured), compared with the
host backend on the same inputs. Skipped without PyTorch, a GPU, or a CUDA backend."""
import numpy as np
import pytest

import kvtier
from conftest import SMALL

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)


def cuda_manager():
    try:
        return kvtier.Manager(**{**SMALL, "backend": "cuda"})
    except kvtier.Error as e:
        pytest.skip(f"CUDA backend unavailable: {e}")


def test_cuda_matches_host_backend():
    rng = np.random.default_rng(7)
    c = kvtier.Config(**SMALL)
    T = 300
    k = rng.standard_normal((c.n_kv_heads, T, c.head_dim)).astype(np.float32)
    v = rng.standard_normal((c.n_kv_heads, T, c.head_dim)).astype(np.float32)
    q = rng.standard_normal((c.n_q_heads, c.obs_window, c.head_dim)).astype(np.float32)
    qd = rng.standard_normal((1, c.n_q_heads, c.head_dim)).astype(np.float32)
    stream = torch.cuda.Stream()
    with kvtier.Manager(**SMALL) as host, cuda_manager() as gpu:
        for m, conv in ((host, lambda a: a),
                        (gpu, lambda a: torch.from_numpy(a).cuda())):
            m.create_seq(1, T)
            with torch.cuda.stream(stream):
                m.prefill_layer(1, 0, conv(k), conv(v), conv(q), stream=stream)
                m.decode_append(0, [1], conv(k[:, :1].transpose(1, 0, 2).copy()),
                                conv(v[:, :1].transpose(1, 0, 2).copy()), stream=stream)
                m.decode_recall(0, [1], conv(qd), stream=stream)
            m.sync(stream)
        for h in range(c.n_kv_heads):
            assert np.array_equal(host.resident_positions(1, 0, h),
                                  gpu.resident_positions(1, 0, h))
            for p in range(0, T, 13):
                hk, hv = host.read_token(1, 0, h, p)
                gk, gv = gpu.read_token(1, 0, h, p)
                assert hk.tobytes() == gk.tobytes() and hv.tobytes() == gv.tobytes()
        np.testing.assert_allclose(gpu.attend(1, 0, qd[0]), host.attend(1, 0, qd[0]),
                                   rtol=1e-5, atol=1e-6)
