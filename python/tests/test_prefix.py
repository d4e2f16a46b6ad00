# SPDX-License-Identifier: MIT
"""Prefix reuse and prefill in pieces through the binding, on the host backend: a chunked
prefill and a prefill of the rest after a shared prefix give what a whole prefill gives (the
resident set, every row read back, the recall views and attention), a match changes nothing,
and bad calls raise with the library's message and change nothing."""
import errno

import numpy as np
import pytest

import kvtier
from conftest import SMALL, DLPackOnly

HT = 16  # hash_tokens: one 16-token block per hash


def cast(a, dt):
    """float32 to the manager's dtype (bf16: the top 16 bits)."""
    return (a.view(np.uint32) >> 16).astype(np.uint16) if dt == np.uint16 else a.astype(dt)


def make_prompt(m, rng, T, base=None, shared=0):
    """{layer: (k, v, q_obs)} of a T-token prompt; rows below `shared` are base's."""
    c = m.config
    dt = kvtier._tensor.numpy_dtype(int(c.dtype))
    out = {}
    for layer in range(c.n_layers):
        k, v, q = (cast(rng.standard_normal(s).astype(np.float32), dt)
                   for s in ((c.n_kv_heads, T, c.head_dim), (c.n_kv_heads, T, c.head_dim),
                             (c.n_q_heads, c.obs_window, c.head_dim)))
        if shared:
            k[:, :shared], v[:, :shared] = base[layer][0][:, :shared], base[layer][1][:, :shared]
        out[layer] = (k, v, q)
    return out


def chain(tag, n):
    """A hash chain: its first hashes equal another chain's where the prompts share them."""
    return [(tag << 32) + i for i in range(n)]


def prefill_whole(m, seq, p):
    for layer, (k, v, q) in p.items():
        m.prefill_layer(seq, layer, k, v, q)


def prefill_pieces(m, seq, p, start, step, mode):
    """Prefills every layer from `start` in chunks of `step` tokens (the rest at once when
    0); each chunk's tensors hold rows from 0 (mode 0), from the chunk's start (1) or from
    half-way (2)."""
    for layer, (k, v, q) in p.items():
        T, pos = k.shape[1], start
        while pos < T:
            n = min(step, T - pos) if step else T - pos
            frm = (0, pos, pos // 2)[mode]
            last = pos + n == T
            got = m.prefill_chunk(seq, layer, pos, np.ascontiguousarray(k[:, frm:pos + n]),
                                  np.ascontiguousarray(v[:, frm:pos + n]),
                                  q if last else None, kv_from=frm)
            assert got == n
            if not last:  # the layer is not prefilled until its last chunk
                assert m.info(seq).layers_prefilled == layer
            pos += n


def check_same(m, a, b, p, rng):
    """(m, a) and (m, b) hold the prompt p alike: resident positions, frames' rows, the whole
    history (load_kv and read_token), and the recall views and attention after one recall
    with the same queries."""
    c = m.config
    T = p[0][0].shape[1]
    for layer, (k, v, _) in p.items():
        for seq in (a, b):
            kk, vv = m.load_kv(seq, layer, 0, T)
            assert kk.tobytes() == k.tobytes() and vv.tobytes() == v.tobytes()
        for h in range(c.n_kv_heads):
            assert np.array_equal(m.resident_positions(a, layer, h),
                                  m.resident_positions(b, layer, h))
            fa, sa = m.frames(a, layer, h)
            fb, sb = m.frames(b, layer, h)
            assert sa == sb and len(fa) == len(fb)
            for pos in range(0, T, 5):
                ra, rb = m.read_token(a, layer, h, pos), m.read_token(b, layer, h, pos)
                assert ra[0].tobytes() == rb[0].tobytes() == k[h, pos].tobytes()
                assert ra[1].tobytes() == rb[1].tobytes() == v[h, pos].tobytes()
        q = rng.standard_normal((1, c.n_q_heads, c.head_dim)).astype(np.float32)
        qm = cast(q, kvtier._tensor.numpy_dtype(int(c.dtype)))
        m.decode_recall(layer, [a], qm)
        m.decode_recall(layer, [b], qm)
        for h in range(c.n_kv_heads):
            va = [(r.block, r.n_valid, r.resident) for r in m.recall_view(a, layer, h)]
            vb = [(r.block, r.n_valid, r.resident) for r in m.recall_view(b, layer, h)]
            assert va == vb
        if c.dtype == kvtier.DType.F32:
            assert m.attend(a, layer, q[0]).tobytes() == m.attend(b, layer, q[0]).tobytes()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_chunked_prefill_equals_whole(dtype, rng):
    with kvtier.Manager(**{**SMALL, "dtype": dtype}) as m:
        T = 300
        p = make_prompt(m, rng, T)
        m.create_seq(1, T)
        prefill_whole(m, 1, p)
        for step, mode in ((1 << 30, 1), (7, 1), (64, 0), (100, 2), (17, 0)):
            m.create_seq(2, T)
            prefill_pieces(m, 2, p, 0, step, mode)
            assert m.info(2).layers_prefilled == SMALL["n_layers"]
            check_same(m, 1, 2, p, rng)
            m.destroy_seq(2)


def test_chunks_in_progress_are_readable_not_decodable(mgr, rng):
    T = 120
    p = make_prompt(mgr, rng, T)
    k, v, q = p[0]
    mgr.create_seq(1, T)
    assert mgr.prefill_chunk(1, 0, 0, np.ascontiguousarray(k[:, :40]),
                             np.ascontiguousarray(v[:, :40])) == 40
    info = mgr.info(1)
    assert info.layers_prefilled == 0 and info.tokens == 0
    assert info.filled_tokens == 0  # layer 1 holds nothing yet
    assert mgr.tokens(1, 0) == 0
    kk, vv = mgr.load_kv(1, 0, 10, 30)
    assert kk.shape == (2, 30, 32) and np.array_equal(kk, k[:, 10:40])
    assert np.array_equal(vv, v[:, 10:40])
    with pytest.raises(kvtier.Error) as e:
        mgr.decode_append(0, [1], k[:, :1].transpose(1, 0, 2).copy(),
                          v[:, :1].transpose(1, 0, 2).copy())
    assert e.value.errno == errno.EINVAL and "not prefilled" in e.value.detail
    mgr.prefill_layer(1, 0, k, v, q)  # the rest, from the whole layer's tensors
    assert mgr.tokens(1, 0) == T and mgr.info(1).layers_prefilled == 1


@pytest.mark.parametrize("variant", ["rest", "rest-chunks", "from-zero", "whole-layer"])
def test_prefix_shared_sequence_equals_whole(variant, rng):
    with kvtier.Manager(**SMALL) as m:
        c = m.config
        # P: 150 tokens, 9 spans (144 tokens) cached once its layers are prefilled
        pp = make_prompt(m, rng, 150)
        hp = chain(1, 9)
        assert m.create_seq(100, 150, hashes=hp, hash_tokens=HT) == 0
        prefill_whole(m, 100, pp)
        assert m.prefix_match(hp, HT) == 144
        assert m.stats().prefix_spans == 9
        # S: 200 tokens, its first 6 spans (96 tokens) P's, then its own
        ps = make_prompt(m, rng, 200, base=pp, shared=96)
        hs = np.array(chain(1, 6) + chain(2, 6), np.uint64)
        assert m.prefix_match(hs, HT) == 96
        m.create_seq(1, 200)
        prefill_whole(m, 1, ps)
        assert m.create_seq(2, 200, hashes=hs, hash_tokens=HT) == 96
        info = m.info(2)
        assert info.prefix_tokens == 96 and info.filled_tokens == 96
        shared = 6 * c.n_layers * c.n_kv_heads  # one block per span
        assert info.shared_blocks == shared and info.host_blocks == shared
        for layer in range(c.n_layers):  # the prefix reads back as P wrote it
            kk, vv = m.load_kv(2, layer, 0, 96)
            assert np.array_equal(kk, pp[layer][0][:, :96])
            assert np.array_equal(vv, pp[layer][1][:, :96])
        if variant == "rest":
            prefill_pieces(m, 2, ps, 96, 0, 1)
        elif variant == "rest-chunks":
            prefill_pieces(m, 2, ps, 96, 40, 1)
        elif variant == "from-zero":  # as an engine holds the layer after load_kv
            prefill_pieces(m, 2, ps, 96, 0, 0)
        else:
            prefill_whole(m, 2, ps)
        check_same(m, 1, 2, ps, rng)
        # its own 6 spans are cached now, shared with it
        assert m.info(2).shared_blocks == 12 * c.n_layers * c.n_kv_heads
        assert m.prefix_match(hs, HT) == 192
        st = m.stats()
        assert st.prefix_spans == 9 + 6
        assert st.prefix_tokens_asked == 150 + 200 and st.prefix_tokens_hit == 96
        m.destroy_seq(1)
        m.destroy_seq(2)
        m.destroy_seq(100)
        st = m.stats()  # every span stays cached, idle
        assert st.prefix_blocks == 15 * c.n_layers * c.n_kv_heads
        assert st.prefix_blocks_idle == st.prefix_blocks and st.prefix_blocks_shared == 0
        assert st.host_blocks_used == st.prefix_blocks and st.live_seqs == 0


def test_whole_prompt_is_never_shared(mgr, rng):
    p = make_prompt(mgr, rng, 64)
    h = chain(5, 4)
    mgr.create_seq(1, 64, hashes=h, hash_tokens=HT)
    prefill_whole(mgr, 1, p)
    assert mgr.prefix_match(h, HT) == 64
    assert mgr.create_seq(2, 64, hashes=h, hash_tokens=HT) == 48  # one span recomputed
    assert mgr.prefix_match(h, 2 * HT) == 0  # another granularity
    assert mgr.prefix_match(h[1:], HT) == 0  # a chain starting later
    assert mgr.prefix_match([], HT) == 0


def test_match_has_no_side_effect(mgr, rng):
    p = make_prompt(mgr, rng, 100)
    h = chain(3, 6)
    mgr.create_seq(1, 100, hashes=h, hash_tokens=HT)
    prefill_whole(mgr, 1, p)
    mgr.destroy_seq(1)
    st0, err0 = mgr.stats().as_dict(), mgr.last_error
    for _ in range(3):
        assert mgr.prefix_match(h, HT) == 96
        assert mgr.prefix_match(np.array(h[:3], np.uint64), HT) == 48
        assert mgr.prefix_match(chain(4, 6), HT) == 0
    assert mgr.stats().as_dict() == st0 and mgr.last_error == err0


def test_errors_raise_with_the_library_message_and_change_nothing(mgr, rng):
    T = 80
    p = make_prompt(mgr, rng, T)
    k, v, q = p[0]
    h = chain(6, 5)
    mgr.create_seq(1, T, hashes=h, hash_tokens=HT)
    mgr.prefill_chunk(1, 0, 0, np.ascontiguousarray(k[:, :32]), np.ascontiguousarray(v[:, :32]))
    st0, info0 = mgr.stats().as_dict(), mgr.info(1).as_dict()

    def fails(code, func, text, call, *args, **kw):
        with pytest.raises(kvtier.Error) as e:
            call(*args, **kw)
        assert e.value.errno == code and e.value.func == func, e.value
        assert text in e.value.detail and mgr.last_error.startswith(e.value.detail)

    fails(errno.EINVAL, "kvt_prefix_match", "not a positive multiple of block_tokens",
          mgr.prefix_match, h, 24)
    fails(errno.EINVAL, "kvt_seq_create_prefix", "longer than its prompt",
          mgr.create_seq, 2, 79, hashes=h, hash_tokens=HT)
    fails(errno.EEXIST, "kvt_seq_create_prefix", "", mgr.create_seq, 1, T, hashes=h,
          hash_tokens=HT)
    fails(errno.EINVAL, "kvt_prefill_chunk", "the layer holds 32 of 80 positions",
          mgr.prefill_chunk, 1, 0, 31, k[:, 31:40].copy(), v[:, 31:40].copy())
    fails(errno.EINVAL, "kvt_prefill_chunk", "rows from 33",  # kv_from past pos
          mgr.prefill_chunk, 1, 0, 32, k[:, 33:40].copy(), v[:, 33:40].copy(), kv_from=33)
    fails(errno.EINVAL, "kvt_prefill_chunk", "NULL q_obs",  # a last chunk that selects
          mgr.prefill_chunk, 1, 0, 32, k[:, 32:].copy(), v[:, 32:].copy())
    fails(errno.ENOENT, "kvt_prefill_chunk", "9", mgr.prefill_chunk, 9, 0, 0, k, v)
    fails(errno.EINVAL, "kvt_seq_load_kv", "past the 32 in its history",
          mgr.load_kv, 1, 0, 0, 33)
    fails(errno.EINVAL, "kvt_seq_load_kv", "no positions", mgr.load_kv, 1, 0, 0, 0)
    fails(errno.ENOENT, "kvt_seq_load_kv", "9", mgr.load_kv, 9, 0, 0, 1)
    # arguments the binding refuses before the library is called
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        mgr.prefix_match([1, 1 << 64], HT)
    with pytest.raises(ValueError, match="negative"):
        mgr.prefix_match(np.array([1, -2]), HT)
    with pytest.raises(TypeError, match="integer"):
        mgr.prefix_match([1.5], HT)
    with pytest.raises(TypeError, match="dtype float64"):
        mgr.prefix_match(np.array([1.0]), HT)
    with pytest.raises(TypeError):
        mgr.prefix_match("abc", HT)
    with pytest.raises(ValueError, match="unsigned 32-bit"):
        mgr.prefix_match(h, 1 << 32)  # ctypes would have wrapped it to 0
    with pytest.raises(ValueError, match="required with hashes"):
        mgr.create_seq(2, T, hashes=h)
    with pytest.raises(ValueError, match="without hashes"):
        mgr.create_seq(2, T, hash_tokens=HT)
    with pytest.raises(ValueError, match="hold no position"):
        mgr.prefill_chunk(1, 0, 32, k[:, :32].copy(), v[:, :32].copy(), kv_from=0)
    with pytest.raises(ValueError, match="2xnx32"):
        mgr.prefill_chunk(1, 0, 32, np.zeros((2, 5, 31), np.float32), k)
    with pytest.raises(ValueError, match="2x8x32"):  # v's rows must be k's
        mgr.prefill_chunk(1, 0, 32, k[:, 32:40].copy(), v[:, 32:41].copy())
    with pytest.raises(ValueError, match="unsigned 32-bit"):
        mgr.prefill_chunk(1, 0, -1, k, v)
    with pytest.raises(ValueError, match="2x4x32"):
        mgr.load_kv(1, 0, 0, 4, np.empty((2, 3, 32), np.float32), np.empty((2, 4, 32),
                                                                            np.float32))
    with pytest.raises(ValueError, match="read-only"):
        ro = np.empty((2, 4, 32), np.float32)
        ro.flags.writeable = False
        mgr.load_kv(1, 0, 0, 4, ro, ro)
    with pytest.raises(ValueError, match="both or neither"):
        mgr.load_kv(1, 0, 0, 4, np.empty((2, 4, 32), np.float32))
    assert mgr.stats().as_dict() == st0 and mgr.info(1).as_dict() == info0


def test_load_kv_into_given_outputs_and_dlpack_chunks(mgr, rng):
    # the row count comes from the DLPack tensor alone
    T = 70
    p = make_prompt(mgr, rng, T)
    mgr.create_seq(1, T)
    for layer, (k, v, q) in p.items():
        assert mgr.prefill_chunk(1, layer, 0, DLPackOnly(k[:, :50].copy()),
                                 DLPackOnly(v[:, :50].copy())) == 50
        assert mgr.prefill_chunk(1, layer, 50, DLPackOnly(k), DLPackOnly(v), q,
                                 kv_from=0) == 20
    ko, vo = np.full((2, 25, 32), np.nan, np.float32), np.full((2, 25, 32), np.nan, np.float32)
    got = mgr.load_kv(1, 1, 45, 25, ko, vo)
    assert got[0] is ko and got[1] is vo
    assert np.array_equal(ko, p[1][0][:, 45:]) and np.array_equal(vo, p[1][1][:, 45:])
    assert mgr.stats().bytes_h2d_history == 2 * 2 * 25 * 32 * 4


def test_stats_and_info_fields_are_readable(mgr):
    st = mgr.stats().as_dict()
    for name in ("prefix_spans", "prefix_blocks", "prefix_blocks_idle", "prefix_blocks_disk",
                 "prefix_blocks_shared", "prefix_tokens_asked", "prefix_tokens_hit",
                 "prefix_spans_evicted", "prefix_spans_spilled", "prefix_spans_restored",
                 "bytes_h2d_history"):
        assert st[name] == 0
    assert mgr.create_seq(4, 10) == 0
    info = mgr.info(4).as_dict()
    assert info["prefix_tokens"] == 0 and info["filled_tokens"] == 0
    assert info["shared_blocks"] == 0


def test_spans_go_to_the_spill_file_and_come_back(tmp_path, rng):
    """With a disk tier an evicted span is written to the spill file and a later match reads
    it back."""
    c = kvtier.Config(**SMALL)
    group = 2 * c.block_tokens * c.head_dim * 4 * c.n_kv_heads  # one block group's bytes
    with kvtier.Manager(**{**SMALL, "host_bytes": 24 * group, "n_layers": 1},
                        spill_dir=tmp_path) as m:
        pa = make_prompt(m, rng, 160)
        ha = chain(7, 10)
        m.create_seq(1, 160, hashes=ha, hash_tokens=HT)
        prefill_whole(m, 1, pa)
        m.destroy_seq(1)
        pb = make_prompt(m, rng, 320)  # needs room: A's idle spans go to disk
        m.create_seq(2, 320)
        prefill_whole(m, 2, pb)
        st = m.stats()
        assert st.prefix_spans_spilled > 0 and st.prefix_blocks_disk > 0
        assert m.prefix_match(ha, HT) == 160  # spans in the spill file count
        m.destroy_seq(2)
        assert m.create_seq(3, 160, hashes=ha, hash_tokens=HT) == 144
        assert m.stats().prefix_spans_restored > 0
        kk, vv = m.load_kv(3, 0, 0, 144)
        assert np.array_equal(kk, pa[0][0][:, :144]) and np.array_equal(vv, pa[0][1][:, :144])
