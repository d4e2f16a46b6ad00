#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""End-to-end decode loop through kvtier from Python: decode_loop.c's twin, plus prefix reuse.

A small synthetic transformer attention stack (random weights, RMSNorm, real RoPE, GQA)
prefills a long prompt through kvtier and decodes tokens with dynamic recall. It runs on
kvtier's batched attention (kvt_step_attend), and each step checks that attention against
dense attention, computed here from our own copy of every K and V, over exactly the tokens
kvtier kept: the resident sink/top-K/ring positions plus the blocks the step recalled.

Then a second request whose prompt starts with the first one's first three quarters reuses
that prefix from kvtier's prefix cache: it prefills only the rest of its prompt, attending over
the prefix loaded back from the host history, and decodes with the same checks; the prefix
must read back bit for bit as request 1 wrote it. decode_loop.c runs request 1 alone, as does
--no-reuse.

Where an engine calls kvtier, per layer of its forward pass:
  admit     m.create_seq(seq, T, hashes=chain, hash_tokens=HT)   -> tokens shared (matched)
  prefill   m.prefill_layer(seq, layer, k, v, q_obs)  after computing the layer's K, V and the
            last obs_window queries; the engine runs its own (dense) prefill attention
            with a shared prefix: m.load_kv(seq, layer, 0, matched) gives the prefix's K, V;
            the engine computes q, k, v of the rest only and its attention over prefix + rest;
            m.prefill_chunk(seq, layer, matched, k, v, q_obs, kv_from=0) stores the rest
  decode    m.step_begin(seqs)                         once per step: the batch, validated
            m.step_append(layer, k, v)                 the new token's K, V (ring + host)
            m.step_recall(layer, q)                    score host blocks, load the top ones
            m.step_attend(layer, q)                    the batch's attention in one call, or
                                                       the engine's kernel over
                                                       m.step_tables() or m.step_paged()
            m.step_end()                               after the last layer
  done      m.destroy_seq(seq)                         its prefix spans stay cached
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
        q = (h @ self.wq[layer]).reshape(T, N_Q, HEAD_DIM).transpose(1, 0, 2)
        k = (h @ self.wk[layer]).reshape(T, N_KV, HEAD_DIM).transpose(1, 0, 2)
        v = (h @ self.wv[layer]).reshape(T, N_KV, HEAD_DIM).transpose(1, 0, 2)
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
            s = (q[g, c0:c1] * scale) @ k[g // GROUP, :start + c1].T + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[g, c0:c1] = (s / s.sum(-1, keepdims=True)) @ v[g // GROUP, :start + c1]
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


def decode(m, net, a, seq, K, V, T, h_last, token):
    """Decodes a.decode tokens of seq after its T-token prompt, from the last prompt position's
    hidden state h_last, checking every step against dense attention over the tokens kvtier
    kept (K, V: our copy of every layer's K and V, filled in as tokens come). Returns how many
    steps agree."""
    agree = 0
    for step in range(a.decode):
        p = T + step
        token = net.next_token(h_last, token)
        x1 = net.emb[token][None, :]
        worst, mass, kept_sum, recalled_sum, max_kept = 0.0, 0.0, 0, 0, 0
        m.step_begin([seq])
        for layer in range(a.layers):
            q, k, v = net.qkv(layer, x1, [p])
            q1 = np.ascontiguousarray(q[:, 0])  # [N_Q][D]
            m.step_append(layer, k.transpose(1, 0, 2), v.transpose(1, 0, 2))
            K[layer, :, p], V[layer, :, p] = k[:, 0], v[:, 0]
            m.step_recall(layer, q1[None])
            out = m.step_attend(layer, q1[None])[0]  # [N_Q][D] float32
            for h in range(N_KV):
                idx, recalled = kept_tokens(m, seq, layer, h)
                kept_sum += len(idx)
                max_kept = max(max_kept, len(idx))
                recalled_sum += recalled
                for g in range(h * GROUP, (h + 1) * GROUP):
                    want = softmax_weights(q1[g], K[layer, h, idx]) @ V[layer, h, idx]
                    scale = max(np.abs(want).max(), 1e-6)
                    worst = max(worst, np.abs(out[g] - want).max() / scale)
                    # for information: the share of full attention's weight kvtier kept
                    mass += softmax_weights(q1[g], K[layer, h, :p + 1])[idx].sum()
            x1 = x1 + out.reshape(1, -1) @ net.wo[layer]
        m.step_end()
        h_last = x1[0]
        # once p + 1 exceeds what resident and recalled slots hold, fewer tokens are kept
        compressed = p + 1 <= KEPT_MAX or max_kept < p + 1
        ok = worst <= 1e-4 and compressed
        agree += ok
        per = kept_sum // (N_KV * a.layers)
        if not a.quiet or not ok:
            print(f"step {step:3d}  pos {p}  kept {per - recalled_sum // (N_KV * a.layers)}"
                  f"+{recalled_sum // (N_KV * a.layers)}/{p + 1}  "
                  f"max|kvtier-dense(kept)| {worst:.1e} {'ok' if ok else 'MISMATCH'}  "
                  f"full-attention weight kept {mass / (N_Q * a.layers):.2f}")
    return agree


def second_request(m, net, a, K1, V1, say):
    """Request 2: the first three quarters of request 1's prompt (in whole hash spans), then
    tokens of its own, as long as request 1's. Request 1 is done and destroyed; its prefix
    spans are still cached. Returns (decode steps that agree, whether the reuse checks held)."""
    T, obs, seq = a.prompt, CFG["obs_window"], 2
    keep = T * 3 // 4 // HASH_TOKENS * HASH_TOKENS
    prompt = np.concatenate([net.prompt[:keep], net.tokens(T - keep)])
    # SnapKV's selection needs the queries of the prompt's last obs_window positions, and the
    # engine computes queries only for the tokens it prefills: name no span that would leave
    # fewer than obs_window tokens to prefill.
    chain = hash_chain(prompt)[:max(0, T - obs) // HASH_TOKENS]
    t0 = time.perf_counter()
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
        if matched:  # the prefix's K and V, as request 1 wrote them, from the host history
            kp, vp = m.load_kv(seq, layer, 0, matched)
            same = (kp.tobytes() == K1[layer, :, :matched].tobytes()
                    and vp.tobytes() == V1[layer, :, :matched].tobytes())
            if not same:
                print(f"request 2: layer {layer}: the loaded prefix differs from request 1's "
                      "K/V: MISMATCH")
            ok &= same
            k, v = np.concatenate([kp, k], axis=1), np.concatenate([vp, v], axis=1)
        q_obs = np.ascontiguousarray(q[:, -obs:]) if T >= obs else None
        # The layer from position 0 (kv_from=0), as the engine holds it now; passing only the
        # rest (kv_from=matched) works too: kvtier then gathers the prefix from its history.
        m.prefill_chunk(seq, layer, matched, k, v, q_obs, kv_from=0)
        K[layer, :, :T], V[layer, :, :T] = k, v
        attn = causal_attention(q, k, v, start=matched)
        x = x + attn.transpose(1, 0, 2).reshape(T - matched, N_Q * HEAD_DIM) @ net.wo[layer]
    t_prefill = time.perf_counter() - t0
    st = m.stats()
    say(f"\nrequest 2: prompt {T} tokens, the first {keep} as request 1's; {matched} shared "
        f"from the prefix cache (its chain names {len(chain) * HASH_TOKENS}, leaving at least "
        f"{obs} to prefill); {T - matched} prefilled per layer in {t_prefill:.2f} s, over "
        f"{st.bytes_h2d_history / 2**20:.2f} MiB of prefix K/V loaded back")
    agree = decode(m, net, a, seq, K, V, T, x[-1], int(prompt[-1]))
    m.destroy_seq(seq)
    return agree, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", type=int, default=4096, help="prompt tokens (default 4096)")
    ap.add_argument("--decode", type=int, default=32, help="decode steps (default 32)")
    ap.add_argument("--layers", type=int, default=4, help="layers (default 4)")
    ap.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    ap.add_argument("--no-reuse", action="store_true",
                    help="skip the second request (the one that reuses the first's prefix)")
    ap.add_argument("--quiet", action="store_true", help="print only failures and the total")
    a = ap.parse_args()
    if a.prompt < 1 or a.decode < 0 or a.layers < 1:
        ap.error("--prompt and --layers must be >= 1, --decode >= 0")

    # Budgets: every layer's resident set on the device plus a recall cache; every token of
    # every layer in the host tier. Request 2 runs after request 1 is destroyed: it shares
    # request 1's cached prefix spans, and the other spans give their room back as needed.
    bt, frame = CFG["block_tokens"], 2 * CFG["block_tokens"] * HEAD_DIM * 4
    resident_frames = -(-(CFG["sink_tokens"] + CFG["recent_tokens"] + CFG["topk_tokens"])
                        // bt) + 1
    recall_cache = CFG["recall_blocks"] * N_KV * a.layers * 2 * frame
    total = a.prompt + a.decode
    m = kvtier.Manager(**CFG, n_layers=a.layers, recall_cache_bytes=recall_cache,
                       device_bytes=resident_frames * N_KV * a.layers * frame + recall_cache,
                       host_bytes=(-(-total // bt) + 1) * N_KV * a.layers * frame)
    net = Stack(a.layers, a.seed, a.prompt)
    seq = 1
    say = (lambda *args: None) if a.quiet else print
    say(f"kvtier {kvtier.version()} decode loop (Python): {a.layers} layers, {N_KV} kv x "
          f"{N_Q} q heads, d={HEAD_DIM}, f32; sink {CFG['sink_tokens']} + top-K "
          f"{CFG['topk_tokens']} + recent {CFG['recent_tokens']}, recall "
          f"{CFG['recall_blocks']} x {bt}-token blocks; prompt {a.prompt}, decode {a.decode}")

    # Ground truth kept by the "engine": every layer's K and V, prompt and decoded tokens.
    K = np.zeros((a.layers, N_KV, total, HEAD_DIM), np.float32)
    V = np.zeros_like(K)

    # ---- prefill, layer by layer -------------------------------------------------------
    t0 = time.perf_counter()
    x = net.emb[net.prompt]
    pos = np.arange(a.prompt)
    # Named by its hash chain, so that once prefilled its prefix serves later requests; the
    # cache is empty, so nothing is shared now.
    m.create_seq(seq, a.prompt, hashes=hash_chain(net.prompt), hash_tokens=HASH_TOKENS)
    for layer in range(a.layers):
        q, k, v = net.qkv(layer, x, pos)
        obs = min(CFG["obs_window"], a.prompt)
        q_obs = np.ascontiguousarray(q[:, -obs:]) if obs == CFG["obs_window"] else None
        m.prefill_layer(seq, layer, k, v, q_obs)
        K[layer, :, :a.prompt], V[layer, :, :a.prompt] = k, v
        attn = causal_attention(q, k, v)
        x = x + attn.transpose(1, 0, 2).reshape(a.prompt, N_Q * HEAD_DIM) @ net.wo[layer]
    t_prefill = time.perf_counter() - t0
    st = m.stats()
    say(f"prefill: {t_prefill:.2f} s; resident {st.tokens_resident // a.layers} of "
          f"{a.prompt} tokens per layer (all {a.prompt} in the host tier)")

    # ---- decode: append, recall, attend, per layer ---------------------------------------
    t0 = time.perf_counter()
    agree = decode(m, net, a, seq, K, V, a.prompt, x[-1], int(net.prompt[-1]))
    t_decode = time.perf_counter() - t0
    st = m.stats()
    say(f"decode: {t_decode:.2f} s for {a.decode} steps (checks included); recall "
        f"hits {st.recall_hits}/{st.recall_lookups}, {st.recall_loads} blocks loaded")
    m.destroy_seq(seq)  # request 1 is done; its prefix spans stay cached

    # ---- request 2: the same prefix, from the prefix cache -------------------------------
    steps, reused = a.decode, True
    if not a.no_reuse:
        agree2, reused = second_request(m, net, a, K, V, say)
        agree, steps = agree + agree2, steps + a.decode
    m.close()
    print(f"{agree}/{steps} steps agree with dense attention over the kept tokens")
    return 0 if agree == steps and reused else 1


if __name__ == "__main__":
    sys.exit(main())
