#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""End-to-end decode loop through kvtier from Python: decode_loop.c's twin, over a batch.

A small synthetic transformer attention stack (random weights, RMSNorm, real RoPE, GQA)
prefills a batch of prompts through kvtier (--batch, default 4; mixed lengths: member 0's is
--prompt, the others' about 3/4, 1/2 and 1/4 of it, over again) and decodes them together with
dynamic recall: each token is one decode step over the whole batch, so the library calls per
step are 3 per layer + 2, whatever the batch, and each layer's attention for the batch is one
call to kvtier's batched attention (kvt_step_attend). Each step checks every member's attention
against dense attention, computed here from our own copy of every K and V, over exactly the
tokens kvtier kept for it: the resident sink/top-K/ring positions plus the blocks the step
recalled. At the end it prints the decode throughput (batch x steps / the steps' wall time,
the checks excluded), the share of it inside kvtier's calls, and the calls per step.

Then a second request, whose prompt starts with member 0's first three quarters, reuses that
prefix from kvtier's prefix cache: it prefills only the rest of its prompt, attending over the
prefix loaded back from the host history, and decodes (a batch of one) with the same checks;
the prefix must read back bit for bit as member 0 wrote it. Member 0 is decode_loop.c's
request (the same weights and prompt from the same seed and --prompt); decode_loop.c runs it
alone, as does --batch 1 --no-reuse.

Where an engine calls kvtier, per layer of its forward pass:
  admit     m.create_seq(seq, T, hashes=chain, hash_tokens=HT)   -> tokens shared (matched)
  prefill   m.prefill_layer(seq, layer, k, v, q_obs)  after computing the layer's K, V and the
            last obs_window queries; the engine runs its own (dense) prefill attention
            with a shared prefix: m.load_kv(seq, layer, 0, matched) gives the prefix's K, V;
            the engine computes q, k, v of the rest only and its attention over prefix + rest;
            m.prefill_chunk(seq, layer, matched, k, v, q_obs, kv_from=0) stores the rest
  decode    m.step_begin(seqs)          once per step: the batch (n sequences), validated
            m.step_append(layer, k, v)  the batch's new tokens' K, V, [n][n_kv_heads][D]
                                        (ring + host); row i is member seqs[i]
            m.step_recall(layer, q)     the batch's queries [n][n_q_heads][D]: score each
                                        member's host blocks, load the top ones
            m.step_attend(layer, q)     the batch's attention, [n][n_q_heads][D], in one
                                        call, or the engine's kernel over m.step_tables()
                                        or m.step_paged()
            m.step_end()                after the last layer
  done      m.destroy_seq(seq)          its prefix spans stay cached
Run: GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096 python3 examples/decode_loop.py
(with KVTIER_LIBRARY=build/libkvtier.so and PYTHONPATH=python in a source tree).
"""
import argparse
import hashlib
import sys
import time

import numpy as np

import kvtier

# The geometry of decode_loop.c: GQA with 4 query heads per kv head.
D_MODEL, N_KV, N_Q, HEAD_DIM, VOCAB = 256, 2, 8, 64, 512
GROUP = N_Q // N_KV
CFG = dict(dtype="f32", backend="host", n_kv_heads=N_KV, n_q_heads=N_Q, head_dim=HEAD_DIM,
           block_tokens=16, sink_tokens=16, recent_tokens=128, topk_tokens=256,
           obs_window=32, pool_kernel=7, recall_blocks=8, ws_window=12, save_threads=2)
KEPT_MAX = (CFG["sink_tokens"] + CFG["recent_tokens"] + CFG["topk_tokens"]
            + CFG["recall_blocks"] * CFG["block_tokens"])
HASH_TOKENS = CFG["block_tokens"]  # one hash per block, as vLLM's prefix caching names blocks


def rope(x, pos):
    """Llama rotary embedding ("rotate_half": dims i and i + D/2), theta 10000.
    x: [heads][T][D], pos: [T]."""
    half = HEAD_DIM // 2
    freq = 10000.0 ** (-np.arange(half, dtype=np.float64) * 2 / HEAD_DIM)
    ang = np.asarray(pos, np.float64)[:, None] * freq[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def mm(a, b):
    """a @ b of float32 matrices through einsum, several times faster than matmul where NumPy
    has only the reference BLAS (as Debian's has)."""
    return np.einsum("tk,kn->tn", a, b)


def rms_norm(x):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)


def softmax_weights(q, K):
    """softmax(q.K^T / sqrt(D)) in float64; q: [D], K: [n][D]."""
    s = K.astype(np.float64) @ q.astype(np.float64) / np.sqrt(HEAD_DIM)
    w = np.exp(s - s.max())
    return w / w.sum()


class SplitMix64:
    """decode_loop.c's generator, so both programs build the same model from the same seed:
    splitmix64, uniform = (x >> 40) * 2^-23 - 1 in [-1, 1) as float32."""

    def __init__(self, seed):
        self.seed, self.n = np.uint64(seed), 0

    def raw(self, count):
        with np.errstate(over="ignore"):
            i = np.arange(self.n + 1, self.n + count + 1, dtype=np.uint64)
            z = self.seed + i * np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        self.n += count
        return z ^ (z >> np.uint64(31))

    def uniform(self, *shape):
        x = (self.raw(int(np.prod(shape))) >> np.uint64(40)).astype(np.float32)
        return (x / np.float32(1 << 23) - np.float32(1)).reshape(shape)


Q_GAIN = np.float32(8)  # folded into Wq: peaked softmax, so which tokens are kept matters


class Stack:
    """decode_loop.c's model: embeddings [VOCAB][D_MODEL], per layer Wq, Wk, Wv, Wo with
    entries uniform / sqrt(fan_in) (Wq times Q_GAIN), drawn in that order, then the prompt."""

    def __init__(self, layers, seed, prompt):
        rng = SplitMix64(seed)
        sm, sq = np.float32(1 / 16), np.float32(1 / np.sqrt(N_Q * HEAD_DIM))
        self.emb = rng.uniform(VOCAB, D_MODEL)
        self.wq, self.wk, self.wv, self.wo = [], [], [], []
        for _ in range(layers):
            self.wq.append(rng.uniform(D_MODEL, N_Q * HEAD_DIM) * sm * Q_GAIN)
            self.wk.append(rng.uniform(D_MODEL, N_KV * HEAD_DIM) * sm)
            self.wv.append(rng.uniform(D_MODEL, N_KV * HEAD_DIM) * sm)
            self.wo.append(rng.uniform(N_Q * HEAD_DIM, D_MODEL) * sq)
        self.prompt = (rng.raw(prompt) % np.uint64(VOCAB)).astype(np.int64)
        self.rng = rng  # the second request's own tokens come after these draws

    def tokens(self, n):
        return (self.rng.raw(n) % np.uint64(VOCAB)).astype(np.int64)

    def next_token(self, x, current):
        """Greedy with tied embeddings, never the current token (the residual still holds
        its own embedding, which would always win)."""
        logits = self.emb @ x
        logits[current] = -np.inf
        return int(np.argmax(logits))

    def qkv(self, layer, x, pos):
        """Post-RoPE q [N_Q][T][D], k, v [N_KV][T][D] of hidden states x [T][D_MODEL]."""
        h = rms_norm(x)
        T = x.shape[0]
        q = mm(h, self.wq[layer]).reshape(T, N_Q, HEAD_DIM).transpose(1, 0, 2)
        k = mm(h, self.wk[layer]).reshape(T, N_KV, HEAD_DIM).transpose(1, 0, 2)
        v = mm(h, self.wv[layer]).reshape(T, N_KV, HEAD_DIM).transpose(1, 0, 2)
        return (np.ascontiguousarray(rope(q, pos)), np.ascontiguousarray(rope(k, pos)),
                np.ascontiguousarray(v))


def causal_attention(q, k, v, start=0, chunk=256):
    """The engine's dense prefill attention: [N_Q][T][D] out of the queries q of positions
    [start, start + T) over k, v of positions [0, start + T) (start > 0: a prefix came from
    the cache), computed in query chunks so only the causal part of the scores is formed."""
    T = q.shape[1]
    out = np.empty_like(q)
    scale = np.float32(1.0 / np.sqrt(HEAD_DIM))
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        mask = np.triu(np.full((c1 - c0, start + c1), -np.inf, np.float32), start + c0 + 1)
        for g in range(N_Q):
            s = np.einsum("qd,kd->qk", q[g, c0:c1] * scale, k[g // GROUP, :start + c1]) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[g, c0:c1] = np.einsum("qk,kd->qd", s / s.sum(-1, keepdims=True),
                                      v[g // GROUP, :start + c1])
    return out


def hash_chain(tokens):
    """The engine's names for a prompt's prefixes: hashes[i] stands for tokens
    [0, (i + 1) * HASH_TOKENS), each folding in the one before (vLLM's block hashes do the
    same), as unsigned 64-bit integers. Only whole spans are named."""
    out, prev = [], b""
    for i in range(len(tokens) // HASH_TOKENS):
        span = np.asarray(tokens[i * HASH_TOKENS:(i + 1) * HASH_TOKENS], np.int64)
        prev = hashlib.blake2b(prev + span.tobytes(), digest_size=8).digest()
        out.append(int.from_bytes(prev, "little"))
    return out


def kept_tokens(m, seq, layer, h):
    """What kvtier's attention for (seq, layer, kv head h) reads: resident positions plus
    the valid, not resident slots of each recalled block."""
    bt = m.config.block_tokens
    kept = set(m.resident_positions(seq, layer, h).tolist())
    recalled = 0
    for ref in m.recall_view(seq, layer, h):
        for i in range(ref.n_valid):
            if not (ref.resident >> i) & 1:
                kept.add(ref.block * bt + i)
                recalled += 1
    return np.array(sorted(kept)), recalled


class Clock:
    """Decode figures: wall time of the steps without the checks, the part of it inside
    kvtier's calls (in all and per call) and how many calls, the checks' time, and the tokens
    decoded."""

    def __init__(self):
        self.step_s = self.kv_s = self.check_s = 0.0
        self.calls = self.steps = self.tokens = 0
        self.per_call = {}

    def kv(self, fn, *args):
        """fn(*args), a kvtier call of the decode step, timed and counted."""
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            dt = time.perf_counter() - t0
            self.kv_s += dt
            self.calls += 1
            self.per_call[fn.__name__] = self.per_call.get(fn.__name__, 0.0) + dt


def decode(m, net, a, seqs, Ks, Vs, Ts, h_last, tokens, clock):
    """Decodes a.decode tokens of every member of the batch seqs together: member i has a
    Ts[i]-token prompt, h_last[i] is the hidden state of its last prompt position and tokens[i]
    its last token. Each token is one kvtier decode step over the whole batch; at every step
    each member's attention is checked against dense attention over the tokens kvtier kept for
    it (Ks[i], Vs[i]: our copy of member i's every layer's K and V, filled in as tokens come).
    Returns how many (member, step) pairs agree; adds the steps' figures to clock."""
    n = len(seqs)
    Ts = np.asarray(Ts, np.int64)
    tokens, x_last = list(tokens), np.asarray(h_last)
    agree, norm = 0, N_KV * a.layers
    for step in range(a.decode):
        t_step = time.perf_counter()
        check_s = 0.0
        P = Ts + step  # each member's position
        tokens = [net.next_token(x_last[i], tokens[i]) for i in range(n)]
        x = net.emb[tokens]  # [n][D_MODEL]
        worst, mass = np.zeros(n), np.zeros(n)
        kept_sum, recalled_sum, max_kept = (np.zeros(n, np.int64) for _ in range(3))
        clock.kv(m.step_begin, seqs)
        for layer in range(a.layers):
            q, k, v = net.qkv(layer, x, P)  # row i of the T axis is member i
            qb = np.ascontiguousarray(q.transpose(1, 0, 2))  # [n][N_Q][D]
            kb = np.ascontiguousarray(k.transpose(1, 0, 2))  # [n][N_KV][D]
            vb = np.ascontiguousarray(v.transpose(1, 0, 2))
            clock.kv(m.step_append, layer, kb, vb)
            clock.kv(m.step_recall, layer, qb)
            out = clock.kv(m.step_attend, layer, qb)  # [n][N_Q][D] float32
            t_check = time.perf_counter()
            for i, (seq, p) in enumerate(zip(seqs, P)):
                K, V = Ks[i], Vs[i]
                K[layer, :, p], V[layer, :, p] = kb[i], vb[i]
                for h in range(N_KV):
                    idx, recalled = kept_tokens(m, seq, layer, h)
                    kept_sum[i] += len(idx)
                    max_kept[i] = max(max_kept[i], len(idx))
                    recalled_sum[i] += recalled
                    for g in range(h * GROUP, (h + 1) * GROUP):
                        want = softmax_weights(qb[i, g], K[layer, h, idx]) @ V[layer, h, idx]
                        scale = max(np.abs(want).max(), 1e-6)
                        worst[i] = max(worst[i], np.abs(out[i, g] - want).max() / scale)
                        # for information: the share of full attention's weight kvtier kept
                        mass[i] += softmax_weights(qb[i, g], K[layer, h, :p + 1])[idx].sum()
            check_s += time.perf_counter() - t_check
            x = x + mm(out.reshape(n, -1), net.wo[layer])
        clock.kv(m.step_end)
        x_last = x
        clock.step_s += time.perf_counter() - t_step - check_s
        clock.check_s += check_s
        clock.steps += 1
        clock.tokens += n
        # once p + 1 exceeds what resident and recalled slots hold, fewer tokens are kept
        ok = (worst <= 1e-4) & ((P + 1 <= KEPT_MAX) | (max_kept < P + 1))
        agree += int(ok.sum())
        res, rec = (kept_sum - recalled_sum) // norm, recalled_sum // norm
        mass /= N_Q * a.layers

        def line(i):
            return (f"pos {P[i]}  kept {res[i]}+{rec[i]}/{P[i] + 1}  max|kvtier-dense(kept)| "
                    f"{worst[i]:.1e} {'ok' if ok[i] else 'MISMATCH'}  "
                    f"full-attention weight kept {mass[i]:.2f}")
        if n == 1:
            if not a.quiet or not ok[0]:
                print(f"step {step:3d}  {line(0)}")
            continue
        if not a.quiet:  # the batch in one line: means over its members, the worst error
            print(f"step {step:3d}  {n} seqs, pos {P.min()}..{P.max()}  kept {res.mean():.0f}"
                  f"+{rec.mean():.0f} of {P.mean() + 1:.0f} (mean)  max|kvtier-dense(kept)| "
                  f"{worst.max():.1e} {int(ok.sum())}/{n} ok  full-attention weight kept "
                  f"{mass.mean():.2f}")
        for i in np.flatnonzero(~ok):
            print(f"step {step:3d}  seq {seqs[i]}  {line(i)}")
    return agree


def prefill(m, net, seq, prompt, layers, K, V):
    """Prefills sequence seq with prompt, named by its hash chain so that its prefix serves
    later requests, layer by layer with the engine's dense attention; fills K, V (our copy)
    with the prompt's K and V. Returns the hidden state of the last prompt position."""
    T = len(prompt)
    x = net.emb[prompt]
    pos = np.arange(T)
    m.create_seq(seq, T, hashes=hash_chain(prompt), hash_tokens=HASH_TOKENS)
    for layer in range(layers):
        q, k, v = net.qkv(layer, x, pos)
        obs = min(CFG["obs_window"], T)
        q_obs = np.ascontiguousarray(q[:, -obs:]) if obs == CFG["obs_window"] else None
        m.prefill_layer(seq, layer, k, v, q_obs)
        K[layer, :, :T], V[layer, :, :T] = k, v
        attn = causal_attention(q, k, v)
        x = x + mm(attn.transpose(1, 0, 2).reshape(T, N_Q * HEAD_DIM), net.wo[layer])
    return x[-1]


def second_request(m, net, a, seq, K1, V1, say):
    """Request 2 (sequence id seq): the first three quarters of member 0's prompt (in whole
    hash spans), then tokens of its own, as long as member 0's. The batch is done and
    destroyed; its prefix spans are still cached. Returns (decode steps that agree, whether
    the reuse checks held)."""
    T, obs = a.prompt, CFG["obs_window"]
    keep = T * 3 // 4 // HASH_TOKENS * HASH_TOKENS
    prompt = np.concatenate([net.prompt[:keep], net.tokens(T - keep)])
    # SnapKV's selection needs the queries of the prompt's last obs_window positions, and the
    # engine computes queries only for the tokens it prefills: name no span that would leave
    # fewer than obs_window tokens to prefill.
    chain = hash_chain(prompt)[:max(0, T - obs) // HASH_TOKENS]
    t0, h2d0 = time.perf_counter(), m.stats().bytes_h2d_history
    hit = m.prefix_match(chain, HASH_TOKENS)  # the admission question; changes nothing
    matched = m.create_seq(seq, T, hashes=chain, hash_tokens=HASH_TOKENS)
    want = min(keep, len(chain) * HASH_TOKENS)
    ok = matched == hit == want and m.info(seq).prefix_tokens == matched
    if matched != want:
        print(f"request 2: {matched} tokens shared from the prefix cache, expected {want}: "
              "MISMATCH")

    K = np.zeros((a.layers, N_KV, T + a.decode, HEAD_DIM), np.float32)
    V = np.zeros_like(K)
    x = net.emb[prompt[matched:]]  # hidden states of the rest only
    pos = np.arange(matched, T)
    for layer in range(a.layers):
        q, k, v = net.qkv(layer, x, pos)  # the rest's q, k, v
        if matched:  # the prefix's K and V, as member 0 wrote them, from the host history
            kp, vp = m.load_kv(seq, layer, 0, matched)
            same = (kp.tobytes() == K1[layer, :, :matched].tobytes()
                    and vp.tobytes() == V1[layer, :, :matched].tobytes())
            if not same:
                print(f"request 2: layer {layer}: the loaded prefix differs from member 0's "
                      "K/V: MISMATCH")
            ok &= same
            k, v = np.concatenate([kp, k], axis=1), np.concatenate([vp, v], axis=1)
        q_obs = np.ascontiguousarray(q[:, -obs:]) if T >= obs else None
        # The layer from position 0 (kv_from=0), as the engine holds it now; passing only the
        # rest (kv_from=matched) works too: kvtier then gathers the prefix from its history.
        m.prefill_chunk(seq, layer, matched, k, v, q_obs, kv_from=0)
        K[layer, :, :T], V[layer, :, :T] = k, v
        attn = causal_attention(q, k, v, start=matched)
        x = x + mm(attn.transpose(1, 0, 2).reshape(T - matched, N_Q * HEAD_DIM),
                     net.wo[layer])
    t_prefill = time.perf_counter() - t0
    h2d = m.stats().bytes_h2d_history - h2d0
    say(f"\nrequest 2: prompt {T} tokens, the first {keep} as member 0's; {matched} shared "
        f"from the prefix cache (its chain names {len(chain) * HASH_TOKENS}, leaving at least "
        f"{obs} to prefill); {T - matched} prefilled per layer in {t_prefill:.2f} s, over "
        f"{h2d / 2**20:.2f} MiB of prefix K/V loaded back")
    clock = Clock()
    agree = decode(m, net, a, [seq], [K], [V], [T], x[-1:], [int(prompt[-1])], clock)
    say(f"request 2 decode: {clock.step_s + clock.check_s:.2f} s for {a.decode} steps, "
        f"{clock.check_s:.2f} s of it the checks")
    m.destroy_seq(seq)
    return agree, ok


def prompt_lengths(prompt, batch):
    """Mixed lengths: member 0's is prompt (decode_loop.c's request), then about 3/4, 1/2 and
    1/4 of it, over again, each a little shorter than the last (off block boundaries)."""
    return [max(1, prompt * (4 - i % 4) // 4 - 7 * i) for i in range(batch)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4,
                    help="sequences decoded together (default 4)")
    ap.add_argument("--prompt", type=int, default=2048,
                    help="member 0's prompt tokens; the others' are shorter (default 2048)")
    ap.add_argument("--decode", type=int, default=32, help="decode steps (default 32)")
    ap.add_argument("--layers", type=int, default=4, help="layers (default 4)")
    ap.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    ap.add_argument("--no-reuse", action="store_true",
                    help="skip the second request (the one that reuses member 0's prefix)")
    ap.add_argument("--quiet", action="store_true", help="print only failures and the totals")
    a = ap.parse_args()
    if a.batch < 1 or a.prompt < 1 or a.decode < 0 or a.layers < 1:
        ap.error("--batch, --prompt and --layers must be >= 1, --decode >= 0")

    lengths = prompt_lengths(a.prompt, a.batch)
    seqs = list(range(1, a.batch + 1))  # member i is sequence i + 1; request 2 comes after
    # Budgets: every member's every layer's resident set on the device plus a recall cache
    # (room for two steps' recalls of the whole batch); every token of every member in the
    # host tier. Request 2 runs after the batch is destroyed: it shares member 0's cached
    # prefix spans, and the other spans give their room back as needed.
    bt, frame = CFG["block_tokens"], 2 * CFG["block_tokens"] * HEAD_DIM * 4
    resident_frames = -(-(CFG["sink_tokens"] + CFG["recent_tokens"] + CFG["topk_tokens"])
                        // bt) + 1
    recall_cache = CFG["recall_blocks"] * N_KV * a.layers * a.batch * 2 * frame
    host_blocks = sum(-(-(T + a.decode) // bt) + 1 for T in lengths)
    m = kvtier.Manager(**CFG, n_layers=a.layers, recall_cache_bytes=recall_cache,
                       device_bytes=(resident_frames * N_KV * a.layers * frame * a.batch
                                     + recall_cache),
                       host_bytes=host_blocks * N_KV * a.layers * frame)
    net = Stack(a.layers, a.seed, a.prompt)
    # member 0's prompt is decode_loop.c's; the others' are drawn after it
    prompts = [net.prompt] + [net.tokens(T) for T in lengths[1:]]
    say = (lambda *args: None) if a.quiet else print
    say(f"kvtier {kvtier.version()} decode loop (Python): {a.layers} layers, {N_KV} kv x "
        f"{N_Q} q heads, d={HEAD_DIM}, f32; sink {CFG['sink_tokens']} + top-K "
        f"{CFG['topk_tokens']} + recent {CFG['recent_tokens']}, recall "
        f"{CFG['recall_blocks']} x {bt}-token blocks; batch {a.batch}, prompts "
        f"{', '.join(map(str, lengths))}, decode {a.decode}")

    # Ground truth kept by the "engine": every member's every layer's K and V, prompt and
    # decoded tokens.
    Ks = [np.zeros((a.layers, N_KV, T + a.decode, HEAD_DIM), np.float32) for T in lengths]
    Vs = [np.zeros_like(K) for K in Ks]

    # ---- prefill, member by member, layer by layer ----------------------------------------
    # Each is named by its hash chain, so that once prefilled its prefix serves later
    # requests; the cache is empty and the prompts differ, so nothing is shared now.
    t0 = time.perf_counter()
    h_last = np.stack([prefill(m, net, seq, p, a.layers, K, V)
                       for seq, p, K, V in zip(seqs, prompts, Ks, Vs)])
    t_prefill = time.perf_counter() - t0
    st = m.stats()
    say(f"prefill: {t_prefill:.2f} s; resident {st.tokens_resident // a.layers} of "
        f"{sum(lengths)} tokens per layer (all in the host tier)")

    # ---- decode the batch together: per step begin; append, recall, attend per layer; end --
    clock = Clock()
    agree = decode(m, net, a, seqs, Ks, Vs, lengths, h_last, [int(p[-1]) for p in prompts],
                   clock)
    st = m.stats()
    say(f"decode: {clock.step_s + clock.check_s:.2f} s for {a.decode} steps of {a.batch} "
        f"sequences, {clock.check_s:.2f} s of it the checks; recall hits "
        f"{st.recall_hits}/{st.recall_lookups}, {st.recall_loads} blocks loaded")
    for seq in seqs:  # the batch is done; its prefix spans stay cached
        m.destroy_seq(seq)

    # ---- request 2: member 0's prefix, from the prefix cache ------------------------------
    steps, reused = a.batch * a.decode, True
    if not a.no_reuse:
        agree2, reused = second_request(m, net, a, a.batch + 1, Ks[0], Vs[0], say)
        agree, steps = agree + agree2, steps + a.decode
    m.close()

    if clock.steps:
        per_step = clock.calls / clock.steps
        print(f"decode throughput: {clock.tokens / clock.step_s:.0f} tokens/s (batch {a.batch} x "
              f"{clock.steps} steps in {clock.step_s:.3f} s, the checks excluded); inside "
              f"kvtier {clock.kv_s:.3f} s ({100 * clock.kv_s / clock.step_s:.0f}% of the "
              f"steps); {per_step:g} kvtier calls per step (3 per layer + 2, whatever the "
              f"batch)")
        print("inside kvtier per step: " + ", ".join(
            f"{name} {1e3 * t / clock.steps:.2f} ms" for name, t in clock.per_call.items()))
    reuse = "" if a.no_reuse else f" + request 2's {a.decode}"
    print(f"{agree}/{steps} steps agree with dense attention over the kept tokens "
          f"(batch {a.batch} x {a.decode}{reuse})")
    return 0 if agree == steps and reused else 1


if __name__ == "__main__":
    sys.exit(main())
