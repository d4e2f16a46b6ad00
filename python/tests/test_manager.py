# SPDX-License-Identifier: MIT
"""The binding on the host backend (the reference backend): data round trips, selection,
recall, attention, preemption, the disk tier, and how errors surface."""
import ctypes
import errno
import threading

import numpy as np
import pytest

import kvtier
from conftest import SMALL, DLPackOnly, prefill


def kept_positions(m, seq, layer, h):
    """Resident positions plus the valid, not resident tokens of the latest recall view."""
    bt = m.config.block_tokens
    kept = set(int(p) for p in m.resident_positions(seq, layer, h))
    for ref in m.recall_view(seq, layer, h):
        for i in range(ref.n_valid):
            if not (ref.resident >> i) & 1:
                kept.add(ref.block * bt + i)
    return sorted(kept)


def dense(q, K, V):
    """softmax(q.K^T / sqrt(d)) V in float64."""
    s = (K.astype(np.float64) @ q.astype(np.float64)) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max())
    return (w / w.sum()) @ V.astype(np.float64)


def _cuda_usable():
    try:
        kvtier.Manager(**{**SMALL, "backend": "cuda"}).close()
        return True
    except kvtier.Error as e:
        assert e.errno == errno.ENODEV, e
        return False


def test_config_round_trip_and_auto_backend():
    auto = kvtier.Backend.CUDA if _cuda_usable() else kvtier.Backend.HOST
    with kvtier.Manager(kvtier.Config(**{**SMALL, "backend": "auto"}), n_layers=3) as m:
        assert m.config.backend == auto  # CUDA where the plugin and a device are usable
        assert m.config.n_layers == 3 and m.config.dtype == kvtier.DType.F32
        st = m.stats()
        assert st.live_seqs == 0 and st.device_frames_total > 0 and st.save_threads == 2
        assert set(st.as_dict()) >= {"bytes_h2d", "recall_hits", "disk_blocks_spilled"}


def test_bad_config_raises_with_the_field_named():
    with pytest.raises(kvtier.Error) as e:
        kvtier.Manager(**{**SMALL, "n_q_heads": 7})
    assert e.value.errno == errno.EINVAL
    assert e.value.strerror == kvtier.strerror(-errno.EINVAL)
    assert "n_q_heads" in e.value.detail
    with pytest.raises(ValueError):
        kvtier.Manager(**{**SMALL, "dtype": "f64"})
    with pytest.raises(TypeError):
        kvtier.Manager(**{**SMALL, "n_layers": "four"})
    with pytest.raises(ValueError):
        kvtier.Manager(**{**SMALL, "n_layers": -1})
    with pytest.raises(TypeError, match="not an integer"):
        kvtier.Manager(**{**SMALL, "host_bytes": 1.5e6 + 0.5})
    with kvtier.Manager(**{**SMALL, "host_bytes": 16e6, "model_h2d_gbps": 40}) as m:
        assert m.config.host_bytes <= 16_000_000 and m.config.model_h2d_gbps == 40.0


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_prefill_and_decode_read_back_bit_exact(dtype, rng):
    with kvtier.Manager(**{**SMALL, "dtype": dtype}) as m:
        T = 200
        kv = prefill(m, 3, T, rng)
        assert m.tokens(3, 0) == T and m.info(3).layers_prefilled == 2
        nd = kvtier._tensor.numpy_dtype(int(m.config.dtype))
        k1 = (rng.integers(0, 1 << 14, (1, 2, 32))).astype(nd)
        v1 = (rng.integers(0, 1 << 14, (1, 2, 32))).astype(nd)
        m.decode_append(1, [3], k1, v1)
        assert m.tokens(3, 1) == T + 1 and m.tokens(3, 0) == T
        for layer, (k, v) in kv.items():
            for h in range(2):
                for pos in range(T):
                    rk, rv = m.read_token(3, layer, h, pos)
                    assert rk.tobytes() == k[h, pos].tobytes()
                    assert rv.tobytes() == v[h, pos].tobytes()
        rk, rv = m.read_token(3, 1, 1, T)
        assert rk.tobytes() == k1[0, 1].tobytes() and rv.tobytes() == v1[0, 1].tobytes()
        # a sequence created again under the same id is another one: a later serial
        serial = m.info(3).serial
        assert serial >= 1
        m.destroy_seq(3)
        m.create_seq(3, T)
        assert m.info(3).serial > serial


def test_resident_set_is_sink_topk_ring(mgr, rng):
    T = 300
    prefill(mgr, 1, T, rng)
    c = mgr.config
    pos = mgr.resident_positions(1, 0, 0)
    assert pos.dtype == np.int32 and len(pos) == c.sink_tokens + c.topk_tokens + c.recent_tokens
    assert list(pos[:c.sink_tokens]) == list(range(c.sink_tokens))
    assert list(pos[-c.recent_tokens:]) == list(range(T - c.recent_tokens, T))
    assert np.all(np.diff(pos) > 0)


def test_frames_hold_the_resident_rows(mgr, rng):
    """On the host backend the frames are host addresses: what an engine's attention kernel
    reads through kvt_seq_frames must be the tokens' rows (slot rule of docs/design.md)."""
    T = 300
    kv = prefill(mgr, 1, T, rng)
    c = mgr.config
    bt, D, S, R = c.block_tokens, c.head_dim, c.sink_tokens, c.recent_tokens
    frames, n_slots = mgr.frames(1, 1, 1)
    assert n_slots == S + R + c.topk_tokens and len(frames) * bt >= n_slots

    def slot_rows(slot):
        base = int(frames[slot // bt])
        k = np.ctypeslib.as_array((ctypes.c_float * (bt * D)).from_address(base))
        v = np.ctypeslib.as_array((ctypes.c_float * (bt * D)).from_address(base + bt * D * 4))
        r = slot % bt
        return k[r * D:(r + 1) * D], v[r * D:(r + 1) * D]

    k, v = kv[1]
    for p in list(range(S)) + list(range(T - R, T)):
        slot = p if p < S else S + (p - S) % R
        fk, fv = slot_rows(slot)
        assert np.array_equal(fk, k[1, p]) and np.array_equal(fv, v[1, p])


def quest_reference(m, K, T, q, h, resident):
    """Top-r blocks of kv head h by the Quest bound, blocks fully resident excluded."""
    c = m.config
    bt, G = c.block_tokens, c.n_q_heads // c.n_kv_heads
    scores = {}
    for b in range((T + bt - 1) // bt):
        toks = range(b * bt, min(T, (b + 1) * bt))
        if all(t in resident for t in toks):
            continue
        mn, mx = K[h, toks.start:toks.stop].min(0), K[h, toks.start:toks.stop].max(0)
        qs = q[h * G:(h + 1) * G].astype(np.float64)
        scores[b] = max(np.maximum(qs * mn, qs * mx).sum(1))
    order = sorted(scores, key=lambda b: (-scores[b], b))
    return order[:c.recall_blocks], scores


def test_decode_recall_picks_the_quest_top_blocks(mgr, rng):
    T = 400
    kv = prefill(mgr, 1, T, rng)
    c = mgr.config
    k1 = rng.standard_normal((1, 2, 32)).astype(np.float32)
    mgr.decode_append(0, [1], k1, k1)
    q = rng.standard_normal((1, c.n_q_heads, c.head_dim)).astype(np.float32)
    mgr.decode_recall(0, [1], q)
    K = np.concatenate([kv[0][0], k1.reshape(2, 1, 32)], axis=1)
    for h in range(2):
        resident = set(int(p) for p in mgr.resident_positions(1, 0, h))
        want, scores = quest_reference(mgr, K, T + 1, q[0], h, resident)
        got = [ref.block for ref in mgr.recall_view(1, 0, h)]
        assert len(got) == c.recall_blocks and got == sorted(got)
        # equal up to float ties at the cutoff
        cutoff = scores[want[-1]]
        assert set(got) == set(want) or min(scores[b] for b in got) >= cutoff - 1e-4
    st = mgr.stats()
    assert st.recall_calls == 1 and st.recall_loads == 2 * c.recall_blocks


def test_attend_is_dense_attention_over_the_kept_tokens(mgr, rng):
    T = 400
    kv = prefill(mgr, 1, T, rng)
    c = mgr.config
    G = c.n_q_heads // c.n_kv_heads
    K, V = kv[1]
    for step in range(5):
        k1 = rng.standard_normal((1, 2, 32)).astype(np.float32)
        v1 = rng.standard_normal((1, 2, 32)).astype(np.float32)
        mgr.decode_append(1, [1], k1, v1)
        K = np.concatenate([K, k1.reshape(2, 1, 32)], axis=1)
        V = np.concatenate([V, v1.reshape(2, 1, 32)], axis=1)
        q = rng.standard_normal((1, c.n_q_heads, c.head_dim)).astype(np.float32)
        mgr.decode_recall(1, [1], q)
        out = mgr.attend(1, 1, q[0])
        assert out.shape == (c.n_q_heads, c.head_dim) and out.dtype == np.float32
        for g in range(c.n_q_heads):
            h = g // G
            idx = kept_positions(mgr, 1, 1, h)
            assert len(idx) < T + step + 1  # compression happened
            want = dense(q[0, g], K[h, idx], V[h, idx])
            np.testing.assert_allclose(out[g], want, rtol=1e-4, atol=1e-5)


def test_recall_blocks_given_selection(mgr, rng):
    T = 400
    prefill(mgr, 5, T, rng)
    sel = np.full((1, 2, 3), kvtier.NO_BLOCK, np.uint32)
    sel[0, 0, :2] = [4, 7]
    sel[0, 1, 0] = 9
    mgr.recall_blocks(0, [5], sel)
    assert [r.block for r in mgr.recall_view(5, 0, 0)] == [4, 7]
    assert [r.block for r in mgr.recall_view(5, 0, 1)] == [9]
    with pytest.raises(kvtier.Error) as e:
        mgr.recall_blocks(0, [5], np.array([[[1000], [1]]], np.uint32))
    assert e.value.errno == errno.EINVAL and "1000" in e.value.detail
    assert [r.block for r in mgr.recall_view(5, 0, 0)] == [4, 7]  # unchanged
    with pytest.raises(ValueError):
        mgr.recall_blocks(0, [5], np.zeros((1, 3), np.uint32))


def test_recall_device_blocks(mgr, rng):
    """The selection where the backend keeps tensors (host arrays here), int32 with -1 as
    no block; a member naming a block past its history is left out, the others recalled."""
    prefill(mgr, 5, 400, rng)
    prefill(mgr, 6, 400, rng)
    sel = np.full((2, 2, 3), -1, np.int32)
    sel[0, 0, :2] = [4, 7]
    sel[0, 1, 0] = 9
    sel[1, :, 0] = 3
    mgr.recall_device_blocks(0, [5, 6], sel)
    assert [r.block for r in mgr.recall_view(5, 0, 0)] == [4, 7]
    assert [r.block for r in mgr.recall_view(5, 0, 1)] == [9]
    assert [r.block for r in mgr.recall_view(6, 0, 1)] == [3]
    sel[1, 1, 2] = 1000  # past sequence 6's history: it alone is left out
    mgr.recall_device_blocks(0, [5, 6], sel)
    assert [r.block for r in mgr.recall_view(5, 0, 0)] == [4, 7]
    with pytest.raises(kvtier.Error) as e:
        mgr.recall_view(6, 0, 0)
    assert e.value.errno == errno.ESTALE and "selection" in e.value.detail
    with mgr.step([6]):
        mgr.step_recall_device_blocks(0, sel[:1])
    assert [r.block for r in mgr.recall_view(6, 0, 1)] == [9]
    with pytest.raises(ValueError):
        mgr.recall_device_blocks(0, [5, 6], np.zeros((1, 3), np.uint32))
    with pytest.raises(TypeError):
        mgr.recall_device_blocks(0, [5], np.zeros((1, 2, 3), np.float32))


def test_decode_step_is_the_plain_calls_on_its_batch(rng):
    """A step (begin, per layer append and recall, end) leaves a manager exactly where the
    plain calls on the same batch leave a twin: tokens, views, counters."""
    ms = [kvtier.Manager(**SMALL) for _ in range(2)]
    try:
        c = ms[0].config
        for m in ms:
            for seq, T in ((1, 300), (2, 180), (3, 240)):
                prefill(m, seq, T, np.random.default_rng(seq))
        batch = [3, 1, 2]
        for step in range(4):
            ks = rng.standard_normal((c.n_layers, 3, c.n_kv_heads, c.head_dim))
            qs = rng.standard_normal((c.n_layers, 3, c.n_q_heads, c.head_dim))
            ks, qs = ks.astype(np.float32), qs.astype(np.float32)
            for layer in range(c.n_layers):
                ms[0].decode_append(layer, batch, ks[layer], ks[layer])
                ms[0].decode_recall(layer, batch, qs[layer])
            with ms[1].step(batch):
                for layer in range(c.n_layers):
                    ms[1].step_append(layer, ks[layer], ks[layer])
                    ms[1].step_recall(layer, qs[layer])
        sel = np.zeros((3, c.n_kv_heads, 2), np.uint32)
        sel[:, :, 1] = 5
        ms[0].recall_blocks(0, batch, sel)
        ms[1].step_begin(batch)
        ms[1].step_recall_blocks(0, sel)
        ms[1].step_end()
        for seq in batch:
            for layer in range(c.n_layers):
                assert ms[0].tokens(seq, layer) == ms[1].tokens(seq, layer)
                for h in range(c.n_kv_heads):
                    a = [(r.block, r.n_valid) for r in ms[0].recall_view(seq, layer, h)]
                    b = [(r.block, r.n_valid) for r in ms[1].recall_view(seq, layer, h)]
                    assert a == b and a
        a, b = ms[0].stats(), ms[1].stats()
        diff = {f: (getattr(a, f), getattr(b, f)) for f, _t in a._fields_
                if getattr(a, f) != getattr(b, f)}
        assert not diff
    finally:
        for m in ms:
            m.close()


def test_step_tables_are_the_views_and_attend_alone(mgr, rng):
    """step_tables writes, in one call per layer, what frames() and recall_view() give per
    (sequence, kv head), as pool indices; dense attention over the tables and the pool memory
    alone equals attend()."""
    c = mgr.config
    bt, H, D = c.block_tokens, c.n_kv_heads, c.head_dim
    batch = [4, 2, 9]
    for seq, T in zip(batch, (300, 180, 420)):
        prefill(mgr, seq, T, rng)
    p = mgr.pool()
    assert p.block_tokens == bt and p.row_bytes == D * 4 and p.v_offset == bt * D * 4
    rows = p.block_bytes // 4  # f32 words per block
    words = (ctypes.c_float * (p.n_blocks * rows)).from_address(p.base)
    pool = np.ctypeslib.as_array(words).reshape(p.n_blocks, 2, bt, D)  # host backend: RAM
    t = mgr.tables(max_batch=5, max_frames=16, max_recall=c.recall_blocks)
    sel = rng.integers(1, 10, (3, H, c.recall_blocks)).astype(np.uint32)
    with mgr.step(batch):
        for layer in range(c.n_layers):
            q = rng.standard_normal((3, c.n_q_heads, D)).astype(np.float32)
            mgr.step_recall_blocks(layer, sel)
            mgr.step_tables(layer, t)
            assert t.n_batch[0] == 3 and not t.n_tokens[3:].any() and not t.n_recall[3:].any()
            for i, seq in enumerate(batch):
                want = mgr.attend(seq, layer, q[i])
                for h in range(H):
                    fr, ns = mgr.frames(seq, layer, h)
                    assert t.n_tokens[i, h] == ns
                    assert list(t.frames[i, h, :len(fr)]) == list((fr - p.base) // p.block_bytes)
                    assert (t.frames[i, h, len(fr):] == 0xFFFFFFFF).all()
                    refs = mgr.recall_view(seq, layer, h)
                    n = t.n_recall[i, h]
                    assert n == len(refs) > 0
                    assert [int(x) for x in t.recall[i, h, :n]] == [
                        (r.frame - p.base) // p.block_bytes for r in refs]
                    assert (t.recall[i, h, :n] >= p.first_recall).all()
                    assert [int(x) for x in t.recall_skip[i, h, :n]] == [r.resident for r in refs]
                    # the kept tokens of row (i, h), from the tables and the pool alone
                    K = [pool[t.frames[i, h, s // bt], 0, s % bt] for s in range(ns)]
                    V = [pool[t.frames[i, h, s // bt], 1, s % bt] for s in range(ns)]
                    for j in range(n):
                        for r in range(t.recall_tokens[i, h, j]):
                            if not (int(t.recall_skip[i, h, j]) >> r) & 1:
                                K.append(pool[t.recall[i, h, j], 0, r])
                                V.append(pool[t.recall[i, h, j], 1, r])
                    g = c.n_q_heads // H
                    for qh in range(h * g, (h + 1) * g):
                        np.testing.assert_allclose(dense(q[i, qh], np.array(K), np.array(V)),
                                                   want[qh], rtol=2e-5, atol=2e-6)
    # the batched attention: attend() for every member at once, and the log-sum-exp of the
    # tables' tokens
    q = rng.standard_normal((3, c.n_q_heads, D)).astype(np.float32)
    lse = np.zeros((3, c.n_q_heads), np.float32)
    out = mgr.attend_batch(1, batch, q, lse=lse)
    with mgr.step(batch):
        out2 = mgr.step_attend(1, q)
        mgr.step_tables(1, t)
    np.testing.assert_array_equal(out, out2)
    for i, seq in enumerate(batch):
        np.testing.assert_allclose(out[i], mgr.attend(seq, 1, q[i]), rtol=1e-5, atol=1e-6)
        for h in range(H):
            ns, n = t.n_tokens[i, h], t.n_recall[i, h]
            K = [pool[t.frames[i, h, s // bt], 0, s % bt] for s in range(ns)]
            for j in range(n):
                K += [pool[t.recall[i, h, j], 0, r] for r in range(t.recall_tokens[i, h, j])
                      if not (int(t.recall_skip[i, h, j]) >> r) & 1]
            g = c.n_q_heads // H
            for qh in range(h * g, (h + 1) * g):
                logits = np.array(K, np.float64) @ q[i, qh].astype(np.float64) / np.sqrt(D)
                mx = logits.max()
                assert abs(lse[i, qh] - (mx + np.log(np.exp(logits - mx).sum()))) < 1e-4
    # the same over the tables as written (a graph-captured step's form): rows of the
    # members equal, the padding member's row not written
    assert mgr.attend_tables_scratch(t) == 0
    qa = np.concatenate([q, rng.standard_normal((2, c.n_q_heads, D)).astype(np.float32)])
    oa = np.full((5, c.n_q_heads, D), 7.0, np.float32)
    la = np.full((5, c.n_q_heads), 7.0, np.float32)
    assert mgr.attend_tables(t, qa, oa, la) is oa
    np.testing.assert_array_equal(oa[:3], out)
    np.testing.assert_allclose(la[:3], lse, rtol=1e-6)
    assert (oa[3:] == 7.0).all() and (la[3:] == 7.0).all()
    with pytest.raises(ValueError):
        mgr.attend_tables(t, qa[:3])  # q holds max_batch members
    # FlashInfer's paged form over the pool's two views: attention from them alone (the
    # resident part at page size block_tokens, the recalled part at page size 1) is attend()
    pg = mgr.paged(5, 5 * H * 16, 5 * H * c.recall_blocks * bt)
    kc, vc = mgr.kv_caches()
    k1, v1 = mgr.kv_caches(page_size=1)
    assert kc.shape == (p.n_blocks, bt, 1, D) and k1.shape[1:] == (1, 1, D)
    with mgr.step(batch):
        mgr.step_paged(1, pg)
    assert (pg.last_page_len[3 * H:] == 0).all() and (pg.indptr[3 * H:] == pg.indptr[3 * H]).all()
    for i, seq in enumerate(batch):
        for h in range(H):
            r = i * H + h
            pages = pg.indices[pg.indptr[r]:pg.indptr[r + 1]]
            K = [kc[pp, s, 0] for pp in pages[:-1] for s in range(bt)]
            V = [vc[pp, s, 0] for pp in pages[:-1] for s in range(bt)]
            K += [kc[pages[-1], s, 0] for s in range(pg.last_page_len[r])]
            V += [vc[pages[-1], s, 0] for s in range(pg.last_page_len[r])]
            toks = pg.r_indices[pg.r_indptr[r]:pg.r_indptr[r + 1]]
            K += [k1[x, 0, 0] for x in toks]
            V += [v1[x, 0, 0] for x in toks]
            g = c.n_q_heads // H
            want = mgr.attend(seq, 1, q[i])
            for qh in range(h * g, (h + 1) * g):
                np.testing.assert_allclose(dense(q[i, qh], np.array(K), np.array(V)),
                                           want[qh], rtol=2e-5, atol=2e-6)
    with pytest.raises(kvtier.Error) as e:
        mgr.attend_batch(1, [4, 4], q[:2])
    assert e.value.errno == errno.EINVAL
    with pytest.raises(kvtier.Error) as e:  # no step open
        mgr.step_attend(0, q)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(kvtier.Error) as e:  # no step open
        mgr.step_tables(0, t)
    assert e.value.errno == errno.EINVAL
    with mgr.step(batch):
        with pytest.raises(kvtier.Error) as e:
            mgr.step_tables(0, mgr.tables(2, 16, c.recall_blocks))
        assert e.value.errno == errno.ENOSPC
    with pytest.raises(ValueError):
        mgr.step_tables(0, kvtier.Tables(5, 16, 4, *([np.zeros(3, np.uint32)] * 7)))


def test_a_step_is_o_layers_calls(rng):
    """A decode step through the step API and the tables crosses into the library
    2 + 3 * n_layers times, whatever the batch: counted on the model backend (no payload) at
    256 sequences x 32 layers x 8 kv heads, 8K-token prompts, r = 16."""
    block = 2 * 32 * 128 * 2  # K and V of 32 bf16 rows of 128
    recall = 256 * 32 * 8 * 16 * 2 * block
    m = kvtier.Manager(n_layers=32, backend="model", recall_blocks=16,
                       recall_cache_bytes=recall,
                       device_bytes=256 * 32 * 160 * 8 * block + recall,
                       host_bytes=256 * 32 * 260 * 8 * block)  # no payload: no memory taken
    try:
        c = m.config
        H, r, n, L = c.n_kv_heads, 16, 256, c.n_layers
        zeros = np.zeros((n, H, c.head_dim), np.uint16)
        kv = np.zeros((H, 8192, c.head_dim), np.uint16)  # no payload: nothing is read
        q_obs = np.zeros((c.n_q_heads, c.obs_window, c.head_dim), np.uint16)
        for seq in range(n):
            m.create_seq(seq, 8192)
            for layer in range(L):
                m.prefill_layer(seq, layer, kv, kv, q_obs)
        t = m.tables(n, 160, r)
        sel = rng.integers(4, 112, (n, H, r)).astype(np.uint32)  # between sink and top-K
        calls = {"n": 0}
        real = kvtier._lib

        class Counting:
            def __getattr__(self, name):
                fn = getattr(real, name)

                def counted(*a):
                    calls["n"] += 1
                    return fn(*a)
                return counted
        kvtier._lib = Counting()
        try:
            with m.step(list(range(n))):
                for layer in range(L):
                    m.step_append(layer, zeros, zeros)
                    m.step_recall_blocks(layer, sel)
                    m.step_tables(layer, t)
        finally:
            kvtier._lib = real
        assert calls["n"] == 2 + 3 * L, calls
        assert (t.n_recall[:n] > 0).all() and t.n_batch[0] == n
        print(f"\n# a decode step of {n} x {L} x {H}: {calls['n']} library calls from Python "
              f"(per (sequence, layer, kv head) accessors: {2 * n * L * H})")
    finally:
        m.close()


def test_decode_step_errors(mgr, rng):
    prefill(mgr, 1, 100, rng)
    prefill(mgr, 2, 100, rng)
    k = np.zeros((2, 2, 32), np.float32)
    with pytest.raises(kvtier.Error) as e:
        mgr.step_append(0, k, k)
    assert e.value.errno == errno.EINVAL and "no step" in e.value.detail
    with pytest.raises(kvtier.Error) as e:
        mgr.step_end()
    assert e.value.errno == errno.EALREADY
    mgr.step_begin([1, 2])
    with pytest.raises(kvtier.Error) as e:
        mgr.step_begin([1, 1])
    assert e.value.errno == errno.EINVAL
    with pytest.raises(kvtier.Error) as e:
        mgr.step_begin([1, 9])
    assert e.value.errno == errno.ENOENT
    with pytest.raises(ValueError, match="2x2x32"):  # the open step's batch is still [1, 2]
        mgr.step_append(0, k[:1], k[:1])
    mgr.step_append(0, k, k)
    assert mgr.tokens(1, 0) == 101 and mgr.tokens(2, 0) == 101
    mgr.step_end()
    with pytest.raises(RuntimeError):
        with mgr.step([2]):
            mgr.step_append(1, k[:1], k[:1])
            raise RuntimeError("engine failed")
    assert mgr.tokens(2, 1) == 101
    with pytest.raises(kvtier.Error) as e:  # the context manager ended the step
        mgr.step_end()
    assert e.value.errno == errno.EALREADY


def test_errors_carry_errno_text_and_detail_and_change_nothing(mgr, rng):
    T = 100
    prefill(mgr, 1, T, rng)
    with pytest.raises(kvtier.Error) as e:
        mgr.tokens(77, 0)
    assert e.value.errno == errno.ENOENT and e.value.func == "kvt_seq_tokens"
    assert "77" in e.value.detail and mgr.last_error.startswith(e.value.detail)
    assert e.value.strerror not in e.value.detail
    assert isinstance(e.value, OSError) and "kvt_seq_tokens" in str(e.value)
    with pytest.raises(kvtier.Error) as e:
        mgr.create_seq(1, 10)
    assert e.value.errno == errno.EEXIST
    k = np.zeros((2, 2, 32), np.float32)
    with pytest.raises(kvtier.Error) as e:
        mgr.decode_append(0, [1, 1], k, k)
    assert e.value.errno == errno.EINVAL
    assert mgr.tokens(1, 0) == T and mgr.stats().tokens_appended == 0
    # tensors are checked before the library is called
    with pytest.raises(ValueError, match="1x2x32"):
        mgr.decode_append(0, [1], k, k)
    with pytest.raises(TypeError, match="float64"):
        mgr.decode_append(0, [1], k[:1].astype(np.float64), k[:1])
    with pytest.raises(ValueError, match="non-contiguous"):
        kk = np.zeros((1, 2, 64), np.float32)[:, :, ::2]
        mgr.decode_append(0, [1], kk, kk)
    with pytest.raises(TypeError, match="NumPy array"):
        mgr.decode_append(0, [1], b"\0" * 256, k[:1])
    assert mgr.tokens(1, 0) == T


def test_cuda_tensors_are_refused_by_the_host_backend(mgr, rng):
    class FakeCudaArray:
        __cuda_array_interface__ = {"data": (0x10000, False), "shape": (1, 2, 32),
                                    "typestr": "<f4", "version": 3, "strides": None}

    prefill(mgr, 1, 50, rng)
    with pytest.raises(TypeError, match="CUDA array"):
        mgr.decode_append(0, [1], FakeCudaArray(), FakeCudaArray())

    class FakeDLPackCuda:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, stream=None):
            raise AssertionError("must not be exported")

    with pytest.raises(TypeError, match="device type 2"):
        mgr.decode_append(0, [1], FakeDLPackCuda(), FakeDLPackCuda())
    assert mgr.tokens(1, 0) == 50


def test_save_event_needs_the_cuda_backend(mgr):
    class TorchLikeEvent:  # torch.cuda.Event's handle attribute
        cuda_event = 0x1234

    with pytest.raises(kvtier.Error) as e:
        mgr.save_event(TorchLikeEvent())
    assert e.value.errno == errno.ENOTSUP and "device events" in e.value.detail
    with pytest.raises(kvtier.Error) as e:
        mgr.save_event(0)  # no event: refused before the backend is asked
    assert e.value.errno == errno.EINVAL
    with pytest.raises(TypeError):
        mgr.save_event("event")


def test_dlpack_host_tensors_are_taken_without_copy(mgr, rng):
    T = 120
    mgr.create_seq(2, T)
    k = rng.standard_normal((2, T, 32)).astype(np.float32)
    v = rng.standard_normal((2, T, 32)).astype(np.float32)
    q = rng.standard_normal((8, 8, 32)).astype(np.float32)
    mgr.prefill_layer(2, 0, DLPackOnly(k), DLPackOnly(v), DLPackOnly(q))
    for pos in (0, 57, T - 1):
        rk, rv = mgr.read_token(2, 0, 1, pos)
        assert np.array_equal(rk, k[1, pos]) and np.array_equal(rv, v[1, pos])
    with pytest.raises(TypeError, match="dtype code"):
        mgr.prefill_layer(2, 1, DLPackOnly(k.astype(np.float64)), DLPackOnly(v), None)
    assert mgr.info(2).layers_prefilled == 1


def test_preempt_resume_restores_the_device_state(mgr, rng):
    T = 300
    prefill(mgr, 4, T, rng)
    before = {h: mgr.resident_positions(4, 0, h) for h in range(2)}
    rows = [mgr.read_token(4, 0, 0, p) for p in range(T)]
    mgr.preempt(4)
    assert mgr.info(4).preempted == 1 and mgr.info(4).device_frames == 0
    with pytest.raises(kvtier.Error) as e:
        mgr.preempt(4)
    assert e.value.errno == errno.EALREADY
    mgr.resume(4)
    assert mgr.info(4).preempted == 0
    for h in range(2):
        assert np.array_equal(mgr.resident_positions(4, 0, h), before[h])
    for p in range(T):
        rk, rv = mgr.read_token(4, 0, 0, p)
        assert np.array_equal(rk, rows[p][0]) and np.array_equal(rv, rows[p][1])
    assert mgr.stats().preemptions == 1 and mgr.stats().resumes == 1


def test_disk_tier_spill_and_fetch(tmp_path, rng):
    with kvtier.Manager(**SMALL, spill_dir=tmp_path) as m:
        assert m.config.spill_dir == str(tmp_path)
        T = 200
        kv = prefill(m, 8, T, rng)
        m.spill(8)
        info = m.info(8)
        assert info.disk_blocks == info.host_blocks > 0
        assert m.stats().disk_blocks_spilled == info.host_blocks
        assert list(tmp_path.iterdir()) == []  # the spill file has no name
        # each layer's last block (where the next token goes) comes back, the rest stays
        m.fetch([8])
        last = SMALL["n_kv_heads"] * SMALL["n_layers"] if T % SMALL["block_tokens"] else 0
        assert m.info(8).disk_blocks == info.host_blocks - last
        # a token read fetches its block alone, where it is not resident
        k, v = kv[1]
        for pos in range(0, T, 7):
            rk, rv = m.read_token(8, 1, 1, pos)
            assert np.array_equal(rk, k[1, pos]) and np.array_equal(rv, v[1, pos])
        assert 0 < m.info(8).disk_blocks < info.host_blocks - last
    with kvtier.Manager(**SMALL) as m:
        prefill(m, 8, 50, rng)
        with pytest.raises(kvtier.Error) as e:
            m.spill(8)
        assert e.value.errno == errno.ENOTSUP


def test_missing_spill_dir_is_named(tmp_path):
    with pytest.raises(kvtier.Error) as e:
        kvtier.Manager(**SMALL, spill_dir=tmp_path / "absent")
    assert "absent" in e.value.detail


def test_closed_manager_refuses_calls():
    m = kvtier.Manager(**SMALL)
    m.close()
    m.close()
    assert m.closed
    with pytest.raises(ValueError, match="closed"):
        m.create_seq(1, 10)


def test_calls_from_several_threads_are_serialized(mgr, rng):
    """kvtier.h: calls on one manager must not overlap; the binding's lock ensures it."""
    T, steps = 64, 200
    for s in range(4):
        prefill(mgr, s, T, rng, layers=[0])
    k = np.ones((1, 2, 32), np.float32)
    errors = []

    def worker(s):
        try:
            for _ in range(steps):
                mgr.decode_append(0, [s], k, k)
                mgr.tokens(s, 0)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [mgr.tokens(s, 0) for s in range(4)] == [T + steps] * 4
    assert mgr.stats().tokens_appended == 4 * steps


def test_log_handler_receives_library_messages():
    said = []
    kvtier.set_log_handler(lambda level, msg: said.append((level, msg)))
    try:
        with pytest.raises(kvtier.Error):
            kvtier.Manager(**{**SMALL, "block_tokens": 12})
    finally:
        kvtier.set_log_handler(None)
    assert said and said[0][0] == kvtier.LogLevel.WARN and "block_tokens" in said[0][1]


def test_seq_ids_as_numpy_uint64(mgr, rng):
    for s in (10, 11, 12):
        prefill(mgr, s, 40, rng, layers=[0])
    ids = np.array([10, 11, 12], np.uint64)
    k = rng.standard_normal((3, 2, 32)).astype(np.float32)
    mgr.decode_append(0, ids, k, k)
    for i, s in enumerate(ids):
        rk, _ = mgr.read_token(int(s), 0, 1, 40)
        assert np.array_equal(rk, k[i, 1])
