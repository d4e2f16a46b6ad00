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


def test_cuda_prefix_and_chunks_match_host():
    """Chunked prefill, a prefix-shared sequence whose last chunk is assembled from the host
    history in the device scratch buffer, and load_kv into torch CUDA tensors, against the
    host backend on the same inputs."""
    rng = np.random.default_rng(9)
    c = kvtier.Config(**SMALL)
    H, D, T, P, HT = c.n_kv_heads, c.head_dim, 200, 96, 16
    layers = range(c.n_layers)
    k1 = [rng.standard_normal((H, T, D)).astype(np.float32) for _ in layers]
    v1 = [rng.standard_normal((H, T, D)).astype(np.float32) for _ in layers]
    k2 = [np.concatenate([k[:, :P], rng.standard_normal((H, T - P, D)).astype(np.float32)],
                         axis=1) for k in k1]
    v2 = [np.concatenate([v[:, :P], rng.standard_normal((H, T - P, D)).astype(np.float32)],
                         axis=1) for v in v1]
    q = [rng.standard_normal((c.n_q_heads, c.obs_window, D)).astype(np.float32) for _ in layers]
    h1 = [(1 << 32) + i for i in range(T // HT)]
    h2 = h1[:P // HT] + [(2 << 32) + i for i in range(T // HT - P // HT)]
    stream = torch.cuda.Stream()
    loaded = {}
    with kvtier.Manager(**SMALL) as host, cuda_manager() as gpu:
        for m, conv in ((host, lambda a: np.ascontiguousarray(a)),
                        (gpu, lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda())):
            assert m.create_seq(1, T, hashes=h1, hash_tokens=HT) == 0
            with torch.cuda.stream(stream):
                for layer in layers:
                    m.prefill_chunk(1, layer, 0, conv(k1[layer][:, :70]),
                                    conv(v1[layer][:, :70]), stream=stream)
                    m.prefill_chunk(1, layer, 70, conv(k1[layer]), conv(v1[layer]),
                                    conv(q[layer]), kv_from=0, stream=stream)
            m.sync(stream)
            assert m.create_seq(2, T, hashes=h2, hash_tokens=HT) == P
            with torch.cuda.stream(stream):
                for layer in layers:
                    if m is gpu:
                        ko = torch.empty((H, P, D), dtype=torch.float32, device="cuda")
                        vo = torch.empty_like(ko)
                        m.load_kv(2, layer, 0, P, ko, vo, stream=stream)
                        ko, vo = ko.cpu().numpy(), vo.cpu().numpy()  # in stream order
                    else:
                        ko, vo = m.load_kv(2, layer, 0, P)
                    loaded[m is gpu, layer] = ko.tobytes() + vo.tobytes()
                    # the rest alone: the last chunk gathers rows [0, P) from the history
                    m.prefill_chunk(2, layer, P, conv(k2[layer][:, P:]),
                                    conv(v2[layer][:, P:]), conv(q[layer]), stream=stream)
            m.sync(stream)
        for layer in layers:
            assert loaded[True, layer] == loaded[False, layer]
            assert loaded[False, layer] == k1[layer][:, :P].tobytes() + v1[layer][:, :P].tobytes()
            for seq in (1, 2):
                for h in range(H):
                    assert np.array_equal(host.resident_positions(seq, layer, h),
                                          gpu.resident_positions(seq, layer, h))
                    for p in range(0, T, 11):
                        hk, hv = host.read_token(seq, layer, h, p)
                        gk, gv = gpu.read_token(seq, layer, h, p)
                        assert hk.tobytes() == gk.tobytes() and hv.tobytes() == gv.tobytes()
        assert gpu.stats().bytes_h2d_history == host.stats().bytes_h2d_history > 0


def test_batched_attention_views_and_save_event_on_cuda():
    """One decode step of a batch on both backends: the step's batched attention, the same over
    the tables kvt_step_tables wrote into torch device tensors (kvt_attend_tables, the
    graph-capturable form), the pool's views through DLPack and the CUDA array interface, and
    the save event ordering a torch stream after the saves."""
    rng = np.random.default_rng(11)
    c = kvtier.Config(**SMALL)
    H, Hq, D = c.n_kv_heads, c.n_q_heads, c.head_dim
    lens, seqs = (300, 180, 90), [1, 2, 3]
    n, mb, mf, mr = len(seqs), 4, 32, c.recall_blocks
    ks = [[rng.standard_normal((H, T, D)).astype(np.float32) for _ in range(c.n_layers)]
          for T in lens]
    vs = [[rng.standard_normal((H, T, D)).astype(np.float32) for _ in range(c.n_layers)]
          for T in lens]
    qo = rng.standard_normal((Hq, c.obs_window, D)).astype(np.float32)
    kn = rng.standard_normal((n, H, D)).astype(np.float32)
    vn = rng.standard_normal((n, H, D)).astype(np.float32)
    qd = rng.standard_normal((n, Hq, D)).astype(np.float32)
    stream = torch.cuda.Stream()
    out = {}
    with kvtier.Manager(**SMALL) as host, cuda_manager() as gpu:
        for m, conv in ((host, lambda a: np.ascontiguousarray(a)),
                        (gpu, lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda())):
            with torch.cuda.stream(stream):
                for i, s in enumerate(seqs):
                    m.create_seq(s, lens[i])
                    for layer in range(c.n_layers):
                        m.prefill_layer(s, layer, conv(ks[i][layer]), conv(vs[i][layer]),
                                        conv(qo), stream=stream)
                with m.step(seqs):
                    m.step_append(0, conv(kn), conv(vn), stream=stream)
                    m.step_recall(0, conv(qd), stream=stream)
                    if m is host:
                        out[False] = m.step_attend(0, qd)
                        continue
                    o = torch.empty((n, Hq, D), dtype=torch.float32, device="cuda")
                    m.step_attend(0, conv(qd), o, stream=stream)
                    dev = dict(device="cuda", dtype=torch.int32)
                    t = kvtier.Tables(mb, mf, mr, torch.zeros(1, **dev),
                                      torch.zeros((mb, H), **dev),
                                      torch.zeros((mb, H, mf), **dev),
                                      torch.zeros((mb, H), **dev),
                                      torch.zeros((mb, H, mr), **dev),
                                      torch.zeros((mb, H, mr), **dev),
                                      torch.zeros((mb, H, mr), device="cuda",
                                                  dtype=torch.int64))
                    m.step_tables(0, t, stream=stream)
                    qa = torch.zeros((mb, Hq, D), dtype=torch.float32, device="cuda")
                    qa[:n] = conv(qd)
                    oa = torch.full((mb, Hq, D), 7.0, dtype=torch.float32, device="cuda")
                    scratch = torch.empty(m.attend_tables_scratch(t), dtype=torch.uint8,
                                          device="cuda")
                    m.attend_tables(t, qa, oa, scratch=scratch, stream=stream)
                    ev = torch.cuda.Event()
                    ev.record(stream)  # PyTorch creates the event at its first record
                    m.save_event(ev)
                    stream.wait_event(ev)
            m.sync(stream)
            if m is gpu:
                torch.cuda.synchronize()
                out[True] = o.cpu().numpy()
                assert int(t.n_batch.cpu()[0]) == n
                assert (oa[n:].cpu().numpy() == 7.0).all()  # padding rows not written
                np.testing.assert_allclose(oa[:n].cpu().numpy(), out[True], rtol=1e-5,
                                           atol=1e-6)
                kc, vc = m.kv_caches()
                kd = torch.from_dlpack(kc)
                ka = torch.as_tensor(kc, device="cuda")
                assert kd.shape == ka.shape and kd.dtype == torch.float32
                assert torch.equal(kd[:8], ka[:8])
                assert kd.data_ptr() == ka.data_ptr()  # no copy
        np.testing.assert_allclose(out[True], out[False], rtol=1e-5, atol=1e-6)


def test_device_selection_on_cuda():
    """An engine's own selection as a torch int32 CUDA tensor (-1: no block), read on the
    device, against the host backend given the same selection as a NumPy array: the same
    views, and the member naming a block past its history left out on both."""
    rng = np.random.default_rng(13)
    c = kvtier.Config(**SMALL)
    H, D, lens = c.n_kv_heads, c.head_dim, (300, 200)
    sel = np.full((2, H, 3), -1, np.int32)
    sel[0, :, :2] = [[4, 7]] * H
    sel[1, :, 0] = 3
    bad = sel.copy()
    bad[1, H - 1, 2] = 1000
    ks = {s: [rng.standard_normal((H, T, D)).astype(np.float32) for _ in range(c.n_layers)]
          for s, T in zip((1, 2), lens)}
    qo = rng.standard_normal((c.n_q_heads, c.obs_window, D)).astype(np.float32)
    stream = torch.cuda.Stream()
    with kvtier.Manager(**SMALL) as host, cuda_manager() as gpu:
        for m, conv in ((host, lambda a: np.ascontiguousarray(a)),
                        (gpu, lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda())):
            with torch.cuda.stream(stream):
                for s, T in zip((1, 2), lens):
                    m.create_seq(s, T)
                    for layer in range(c.n_layers):
                        m.prefill_layer(s, layer, conv(ks[s][layer]), conv(ks[s][layer]),
                                        conv(qo), stream=stream)
                m.recall_device_blocks(0, [1, 2], conv(sel), stream=stream)
                with m.step([1, 2]):
                    m.step_recall_device_blocks(1, conv(bad), stream=stream)
            m.sync(stream)
        named = 0
        for layer in range(c.n_layers):
            for h in range(H):
                a = [(r.block, r.n_valid) for r in host.recall_view(1, layer, h)]
                b = [(r.block, r.n_valid) for r in gpu.recall_view(1, layer, h)]
                assert a == b and {x[0] for x in a} <= {4, 7}  # less what is resident
                named += len(a)
        assert named > 0
        for h in range(H):  # sequence 2 on layer 0: its well-formed selection
            assert ([r.block for r in host.recall_view(2, 0, h)] ==
                    [r.block for r in gpu.recall_view(2, 0, h)])
        for m in (host, gpu):
            with pytest.raises(kvtier.Error) as e:
                m.recall_view(2, 1, 0)
            assert "selection" in e.value.detail
