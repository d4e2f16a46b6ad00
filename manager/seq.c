/* SPDX-License-Identifier: MIT */
/*
 * Sequences and the SnapStream data path: prefill (select, gather the resident set into device
 * frames, save the layer into the host history), decode append (ring slot write plus
 * write-through save), and the reads over both tiers.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "huge.h"
#include "policy.h"
#include "prefix.h"
#include "recall.h"
#include "seq.h"
#include "spill.h"

static inline uint64_t ptr_u64(const void *p)
{
	return (uint64_t)(uintptr_t)p;
}

/* 0, or -EINVAL recorded when layer is out of range. */
static int check_layer(struct kvt_manager *m, uint32_t layer)
{
	if (layer < m->cfg.n_layers)
		return 0;
	return kvt_fail(m, -EINVAL, "layer %u out of range (%u layers)", layer, m->cfg.n_layers);
}

static struct kvt_seq *find_seq(struct kvt_manager *m, uint64_t seq, int *err)
{
	struct kvt_seq *s = kvt_seqmap_get(&m->seqs, seq);

	if (!s)
		*err = kvt_fail(m, -ENOENT, "sequence %llu is not live", (unsigned long long)seq);
	return s;
}

/* The sequence's layer, prefilled; or NULL with the error recorded. */
static struct kvt_seq_layer *find_layer(struct kvt_manager *m, uint64_t seq, uint32_t layer,
					struct kvt_seq **sp, int *err)
{
	struct kvt_seq *s;

	*err = check_layer(m, layer);
	if (*err)
		return NULL;
	s = kvt_seq_usable(m, seq, NULL, err);
	if (!s)
		return NULL;
	if (s->layers[layer].n_tokens == 0) {
		*err = kvt_fail(m, -EINVAL, "sequence %llu: layer %u is not prefilled",
				(unsigned long long)seq, layer);
		return NULL;
	}
	if (sp)
		*sp = s;
	return &s->layers[layer];
}

static void snapkv_params(const struct kvt_manager *m, uint32_t prompt, struct kvt_snapkv *p)
{
	*p = (struct kvt_snapkv){
		.n_kv_heads = m->cfg.n_kv_heads,
		.n_q_heads = m->cfg.n_q_heads,
		.head_dim = m->cfg.head_dim,
		.dtype = m->cfg.dtype,
		.prompt_tokens = prompt,
		.obs_window = m->cfg.obs_window,
		.sink = m->cfg.sink_tokens,
		.recent = m->cfg.recent_tokens,
		.topk = m->cfg.topk_tokens,
		.pool_kernel = m->cfg.pool_kernel,
	};
}

/* A new sequence's state, zeroed but for its identity and geometry, not yet in the map; NULL
   with the error recorded. */
static struct kvt_seq *seq_new(struct kvt_manager *m, uint64_t seq, uint32_t prompt_tokens,
			       int *err)
{
	struct kvt_snapkv sp;
	struct kvt_seq *s;
	uint32_t count;
	/* (aligned_alloc takes a multiple of the alignment) */
	size_t bytes = sizeof(*s) + (size_t)m->cfg.n_layers * sizeof(s->layers[0]) +
		       DIV_UP((size_t)m->bt_n * sizeof(*s->bt), 64) * 64;

	if (prompt_tokens == 0 || prompt_tokens > INT32_MAX) {
		*err = kvt_fail(m, -EINVAL, "sequence %llu: prompt of %u tokens (1..2^31-1)",
				(unsigned long long)seq, prompt_tokens);
		return NULL;
	}
	if (kvt_seqmap_get(&m->seqs, seq)) {
		*err = kvt_fail(m, -EEXIST, "sequence %llu is already live",
				(unsigned long long)seq);
		return NULL;
	}
	snapkv_params(m, prompt_tokens, &sp);
	count = kvt_snapkv_count(&sp);
	s = kvt_aligned_alloc(_Alignof(struct kvt_seq), bytes);
	if (!s) {
		*err = kvt_fail(m, -ENOMEM, "sequence %llu: no memory for its state",
				(unsigned long long)seq);
		return NULL;
	}
	memset(s, 0, bytes);
	/* its place among the live ones: a freed one first, so that the places stay dense */
	if (m->slots.n_free) {
		s->slot = m->slots.free[--m->slots.n_free];
	} else if (m->slots.n_made < UINT32_MAX &&
		   !kvt_reserve((void **)&m->slots.free, &m->slots.cap, m->slots.n_made + 1,
				sizeof(*m->slots.free))) {
		s->slot = m->slots.n_made++; /* (room to give it back made now: free cannot fail) */
	} else {
		free(s);
		*err = kvt_fail(m, -ENOMEM, "sequence %llu: no memory for its state",
				(unsigned long long)seq);
		return NULL;
	}
	s->bt = (struct kvt_blk_ticket *)&s->layers[m->cfg.n_layers];
	s->id = seq;
	s->prompt_tokens = prompt_tokens;
	s->valid_topk = count;
	s->n_frames = DIV_UP(m->slots_sr + count, m->cfg.block_tokens);
	return s;
}

/* Frees a sequence's state after its tier memory went back (tables, prefix state). */
static void seq_free(struct kvt_manager *m, struct kvt_seq *s)
{
	for (uint32_t l = 0; l < m->cfg.n_layers; l++)
		kvt_huge_free(s->layers[l].groups);
	kvt_seq_px_free(s->px);
	if (ALWAYS(m->slots.n_free < m->slots.cap))
		m->slots.free[m->slots.n_free++] = s->slot;
	free(s);
	m->seq_frees++;
}

KVT_API int kvt_seq_create(struct kvt_manager *m, uint64_t seq, uint32_t prompt_tokens)
{
	struct kvt_seq *s;
	int err = 0;

	if (!m)
		return -EINVAL;
	s = seq_new(m, seq, prompt_tokens, &err);
	if (!s)
		return err;
	err = kvt_idmap_put(&m->seqs, seq, s);
	if (err) {
		seq_free(m, s);
		return kvt_fail(m, err, "sequence %llu: cannot grow the sequence table",
				(unsigned long long)seq);
	}
	s->serial = ++m->seq_creates;
	return 0;
}

/* 0, or -EINVAL recorded when a hash chain's arguments are malformed. */
static int check_chain(struct kvt_manager *m, const uint64_t *hashes, uint32_t n_hashes,
		       uint32_t hash_tokens, const char *what)
{
	if (n_hashes && !hashes)
		return kvt_fail(m, -EINVAL, "%s: NULL hashes", what);
	if (hash_tokens == 0 || (hash_tokens & (m->cfg.block_tokens - 1)))
		return kvt_fail(m, -EINVAL,
				"%s: hash_tokens %u is not a positive multiple of block_tokens %u",
				what, hash_tokens, m->cfg.block_tokens);
	if ((uint64_t)n_hashes * hash_tokens > INT32_MAX)
		return kvt_fail(m, -EINVAL, "%s: a chain of %u hashes of %u tokens", what, n_hashes,
				hash_tokens);
	return 0;
}

KVT_API int kvt_prefix_match(struct kvt_manager *m, const uint64_t *hashes, uint32_t n_hashes,
			     uint32_t hash_tokens, uint32_t *tokens)
{
	int err;

	if (!m)
		return -EINVAL;
	if (!tokens)
		return kvt_fail(m, -EINVAL, "prefix match: NULL tokens");
	err = check_chain(m, hashes, n_hashes, hash_tokens, "prefix match");
	if (err)
		return err;
	*tokens = kvt_prefix_run(m, hashes, n_hashes, hash_tokens, UINT32_MAX) * hash_tokens;
	return 0;
}

/* Holds the cached run of s's chain (at most max spans), reading spans on disk back; returns
   the spans it keeps (held, in the host tier) in px->spans. */
static uint32_t share_run(struct kvt_manager *m, struct kvt_seq_px *px, uint32_t max)
{
	uint32_t k = kvt_prefix_run(m, px->chain, px->n_chain, px->hash_tokens, max), ok;
	uint64_t disk;

	for (uint32_t i = 0; i < k; i++) {
		px->spans[i] = kvt_prefix_span(m, px->chain[i]);
		kvt_prefix_hold(m, px->spans[i]);
	}
	disk = kvt_prefix_disk_groups(px->spans, k);
	/* room for spans on disk (held: no eviction takes them); short of it, the restore
	   stops at the first of them */
	if (disk && disk <= UINT32_MAX)
		kvt_spill_room(m, (uint32_t)disk);
	ok = kvt_prefix_restore(m, px->spans, k);
	if (ok < k) /* (an empty chain has no spans array: NULL + 0 is undefined) */
		kvt_prefix_unhold(m, px->spans + ok, k - ok);
	return ok;
}

KVT_API int kvt_seq_create_prefix(struct kvt_manager *m, uint64_t seq, uint32_t prompt_tokens,
				  const uint64_t *hashes, uint32_t n_hashes, uint32_t hash_tokens,
				  uint32_t *matched_tokens)
{
	uint32_t full = 0, per, k, rest, layers_ok = 0;
	struct kvt_seq_px *px;
	struct kvt_seq *s;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!matched_tokens)
		return kvt_fail(m, -EINVAL, "create: NULL matched_tokens");
	err = check_chain(m, hashes, n_hashes, hash_tokens, "create");
	if (err)
		return err;
	if ((uint64_t)n_hashes * hash_tokens > prompt_tokens)
		return kvt_fail(
			m, -EINVAL,
			"sequence %llu: a chain of %u hashes of %u tokens is longer than its "
			"prompt of %u",
			(unsigned long long)seq, n_hashes, hash_tokens, prompt_tokens);
	s = seq_new(m, seq, prompt_tokens, &err);
	if (!s)
		return err;
	px = s->px = kvt_seq_px_new(m, n_hashes);
	if (!px)
		goto nomem;
	full = DIV_UP(prompt_tokens, m->cfg.block_tokens);
	for (; layers_ok < m->cfg.n_layers; layers_ok++) {
		s->layers[layers_ok].groups =
			kvt_huge_realloc(NULL, (size_t)full * sizeof(uint32_t));
		if (!s->layers[layers_ok].groups)
			goto nomem;
		s->layers[layers_ok].cap_groups = full;
	}
	if (kvt_idmap_reserve(&m->seqs, 1))
		goto nomem;
	if (n_hashes)
		memcpy(px->chain, hashes, (size_t)n_hashes * sizeof(*hashes));
	px->n_chain = n_hashes;
	px->hash_tokens = hash_tokens;
	/* Nothing can fail from here. The whole prompt is never shared, nor, when the prefill
	   selects, the observation window, whose queries the engine computes with the rest. A
	   new stamp: the groups an earlier call pinned may be spilled for the spans' room. */
	s->stamp = ++m->stamp;
	rest = s->valid_topk && m->cfg.obs_window > 1 ? m->cfg.obs_window : 1;
	k = share_run(m, px, (prompt_tokens - rest) / hash_tokens);
	px->n_spans = k;
	px->prefix_tokens = k * hash_tokens;
	per = hash_tokens >> m->lbt;
	for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
		struct kvt_seq_layer *ly = &s->layers[l];

		for (uint32_t i = 0; i < k; i++)
			for (uint32_t j = 0; j < per; j++) {
				uint32_t g = px->spans[i]->ids[l * per + j];

				ly->groups[ly->n_groups++] = g;
				m->px.href[g]++;
			}
		px->fill[l] = px->prefix_tokens;
	}
	for (uint32_t i = 0; i < k; i++)
		s->save_ticket = px->spans[i]->ticket > s->save_ticket ? px->spans[i]->ticket
								       : s->save_ticket;
	s->bulk_ticket = s->save_ticket;
	ALWAYS(kvt_idmap_put(&m->seqs, seq, s) == 0); /* room reserved above */
	s->serial = ++m->seq_creates;
	m->st.prefix_tokens_asked += prompt_tokens;
	m->st.prefix_tokens_hit += px->prefix_tokens;
	*matched_tokens = px->prefix_tokens;
	return 0;
nomem:
	seq_free(m, s);
	return kvt_fail(m, -ENOMEM, "sequence %llu: no memory for its state",
			(unsigned long long)seq);
}

/* Returns a layer's tier memory to the pools and frees its tables. */
static void release_layer(struct kvt_manager *m, struct kvt_seq *s, struct kvt_seq_layer *ly)
{
	if (ly->frames && !s->preempted)
		ALWAYS(kvt_pool_free(&m->dev, ly->frames, s->n_frames) == 0);
	if (ly->groups && s->n_spilled)
		kvt_spill_release_layer(m, s, ly);
	else if (ly->groups)
		kvt_host_release(m, ly->groups, ly->n_groups);
	free(ly->frames);
	kvt_huge_free(ly->groups);
	free(ly->topk);
	*ly = (struct kvt_seq_layer){0};
}

KVT_API int kvt_seq_destroy(struct kvt_manager *m, uint64_t seq)
{
	struct kvt_seq *s;
	int err = 0;

	if (!m)
		return -EINVAL;
	s = find_seq(m, seq, &err);
	if (!s)
		return err;
	/* Its host blocks may still be the target of a pending scatter, or read by a load still
	   queued on the device, and its frames written by one: let them land before the blocks
	   and frames can be handed to someone else. */
	m->ops->save_wait(m->be, s->save_ticket);
	err = kvt_dev_quiesce(m);
	if (err)
		return kvt_fail(m, err, "destroy: sequence %llu: waiting for the device: %s",
				(unsigned long long)seq, m->be->err);
	kvt_recall_drop_seq(m, s);
	kvt_recall_free_seq(m, s);
	for (uint32_t l = 0; l < m->cfg.n_layers; l++)
		release_layer(m, s, &s->layers[l]);
	ALWAYS(s->n_spilled == 0); /* every spilled group was in a table */
	if (s->px)
		kvt_prefix_unhold(m, s->px->spans, s->px->n_spans);
	kvt_idmap_del(&m->seqs, seq);
	seq_free(m, s);
	return 0;
}

/* Where the rows of a resident-set gather come from: the caller's K tensor [H][L][D] (V at
   + v_minus_k, modulo 2^64), or the layer's host history (host = true). */
struct row_src {
	bool host;
	uint64_t k, v_minus_k, head_bytes;
};

/* Appends one copy run (pos .. pos+n of head h's K and V to slots slot .. slot+n) to the list,
   split at frame boundaries (and host block boundaries for a host source), merged with the
   previous entry when both sides continue it. */
static void emit_run(struct kvt_manager *m, const struct kvt_seq_layer *ly, uint32_t *nx,
		     const struct row_src *src, uint32_t h, uint32_t pos, uint32_t slot, uint32_t n)
{
	uint32_t bt = m->cfg.block_tokens, mask = bt - 1;

	while (n) {
		uint32_t take = n < bt - (slot & mask) ? n : bt - (slot & mask);
		uint64_t from, dst = kvt_dev_row(m, ly, h, slot);
		struct kvt_xfer *prev = *nx ? &m->xf[*nx - 1] : NULL;

		if (src->host) {
			take = take < bt - (pos & mask) ? take : bt - (pos & mask);
			from = kvt_host_row(m, ly, h, pos);
		} else {
			from = src->k + h * src->head_bytes + (uint64_t)pos * m->row_bytes;
		}
		if (prev && prev->src + prev->bytes == from && prev->dst + prev->bytes == dst &&
		    (slot & mask) && (!src->host || (pos & mask))) {
			prev->bytes += take * m->row_bytes;
		} else {
			/* gather_entries_per_head bounds the list its callers reserved */
			if (NEVER(*nx == m->xf_cap))
				return;
			m->xf[(*nx)++] = (struct kvt_xfer){
				.src = from,
				.dst = dst,
				.bytes = take * m->row_bytes,
				.reps = 2, /* K, then V */
				.src_stride = src->host ? m->v_offset : src->v_minus_k,
				.dst_stride = m->v_offset,
			};
		}
		pos += take;
		slot += take;
		n -= take;
	}
}

/* The end of the run of consecutive positions of t[0 .. count) that starts at i, t strictly
   increasing (a layer's top-K, topk_in_order): there t[k] - t[i] >= k - i, equal exactly while
   the run lasts, so the end is found by doubling and then halving, O(log) tests a run where a
   walk takes one a position (the payload-less top-K is one run of thousands). */
static uint32_t run_end(const int32_t *t, uint32_t i, uint32_t count)
{
	uint32_t lo = i, step = 1, hi;

	/* lo is in the run; so is every position before it */
	while (step < count - lo && (uint32_t)(t[lo + step] - t[i]) == lo + step - i) {
		lo += step;
		step *= 2;
	}
	hi = step < count - lo ? lo + step : count; /* past the run (or the end) */
	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;

		if ((uint32_t)(t[mid] - t[i]) == mid - i)
			lo = mid;
		else
			hi = mid;
	}
	return lo + 1;
}

/* Appends the copies that lay out head h's resident set of a layer of N tokens: sink slots,
   the ring by the ring rule, then the `count` top-K positions t[] after the ring. Returns the
   number of rows laid out. */
static uint32_t emit_resident(struct kvt_manager *m, const struct kvt_seq_layer *ly, uint32_t *nx,
			      const struct row_src *src, uint32_t h, uint32_t N, const int32_t *t,
			      uint32_t count)
{
	uint32_t sink = m->cfg.sink_tokens, recent = m->cfg.recent_tokens;
	uint32_t n_sink = N < sink ? N : sink, r0 = kvt_ring0(m, N);

	emit_run(m, ly, nx, src, h, 0, 0, n_sink);
	for (uint32_t p = r0; p < N;) {
		uint32_t slot = kvt_ring_slot(p, sink, recent);
		uint32_t until_wrap = sink + recent - slot;
		uint32_t n = N - p < until_wrap ? N - p : until_wrap;

		emit_run(m, ly, nx, src, h, p, slot, n);
		p += n;
	}
	/* Consecutive positions go to consecutive slots: one run each (emit_run splits and
	   merges as it would position by position). */
	for (uint32_t i = 0, j; i < count; i = j) {
		j = run_end(t, i, count);
		emit_run(m, ly, nx, src, h, (uint32_t)t[i], m->slots_sr + i, j - i);
	}
	return n_sink + count + (N > r0 ? N - r0 : 0);
}

/* Most copy entries one layer's resident gather can need per head: every top-K position alone,
   plus sink and ring split at frame boundaries (and the ring once more where it wraps); from
   the host history the ring may also split at every block boundary. */
static uint32_t gather_entries_per_head(const struct kvt_manager *m, const struct kvt_seq *s,
					bool host)
{
	uint32_t bt = m->cfg.block_tokens;

	return s->valid_topk + DIV_UP(m->cfg.sink_tokens, bt) +
	       (host ? 2 : 1) * DIV_UP(m->cfg.recent_tokens, bt) + 4;
}

/* One prefill call (kvt_prefill_layer, kvt_prefill_chunk): its arguments, and the layer it
   builds apart from the sequence until every step has succeeded. A call prefills positions
   [pos, pos + n) of the layer; k and v hold the rows of [kv_from, pos + n). The last call of a
   layer (pos + n == L) completes it: selection, frames, metadata over the whole layer, read
   from fk and fv ([H][L][D]): the caller's tensors when kv_from == 0, else the backend's
   scratch buffer, assembled from the host history and the caller's rows. */
struct prefill {
	struct kvt_seq *s;
	uint64_t seq;
	uint32_t layer;
	uint32_t L, nb, count; /* prompt tokens, host blocks after the call, top-K per head */
	uint32_t pos, n, kv_from;
	bool last;
	const void *k, *v, *q_obs;
	uint64_t fk, fv;
	void *stream;
	struct kvt_snapkv sp;
	struct kvt_seq_layer ly; /* the layer as the call leaves it */
	uint32_t had_groups;	 /* host groups the layer held before the call */
	bool took;		 /* the call's pool ids are taken */
};

/* Positions of a layer in the host history: all its tokens once prefilled, else its shared
   prefix and prefill chunks so far. */
static uint32_t layer_filled(const struct kvt_seq *s, uint32_t layer)
{
	if (s->layers[layer].n_tokens)
		return s->layers[layer].n_tokens;
	return s->px ? s->px->fill[layer] : 0;
}

/* The caller's errors: the layer and sequence usable, not prefilled, not preempted, the chunk
   where the layer stands, the tensors present. Fills p->s and the sizes. 0 or the error,
   recorded. */
static int prefill_check(struct kvt_manager *m, struct prefill *p)
{
	int err = check_layer(m, p->layer);

	if (err)
		return err;
	p->s = kvt_seq_usable(m, p->seq, NULL, &err);
	if (!p->s)
		return err;
	if (p->s->layers[p->layer].n_tokens)
		return kvt_fail(m, -EEXIST, "sequence %llu: layer %u is already prefilled",
				(unsigned long long)p->seq, p->layer);
	if (p->s->preempted)
		return kvt_fail(m, -EINVAL, "sequence %llu is preempted (resume it first)",
				(unsigned long long)p->seq);
	p->L = p->s->prompt_tokens;
	if (p->n == UINT32_MAX) { /* kvt_prefill_layer: the rest of the layer, whole tensors */
		p->pos = layer_filled(p->s, p->layer);
		p->n = p->L - p->pos;
		p->kv_from = 0;
	}
	if (p->n == 0 || p->pos != layer_filled(p->s, p->layer) || p->n > p->L - p->pos ||
	    p->kv_from > p->pos)
		return kvt_fail(m, -EINVAL,
				"sequence %llu layer %u: chunk [%u, +%u) with rows from %u: the "
				"layer holds %u of %u positions",
				(unsigned long long)p->seq, p->layer, p->pos, p->n, p->kv_from,
				layer_filled(p->s, p->layer), p->L);
	p->last = p->pos + p->n == p->L;
	p->count = p->last ? p->s->valid_topk : 0;
	if (!p->k || !p->v || (p->count && !p->q_obs))
		return kvt_fail(m, -EINVAL, "sequence %llu layer %u: NULL %s",
				(unsigned long long)p->seq, p->layer,
				!p->k	? "k"
				: !p->v ? "v"
					: "q_obs");
	p->nb = DIV_UP(p->pos + p->n, m->cfg.block_tokens);
	p->ly = p->s->layers[p->layer];
	p->had_groups = p->ly.n_groups;
	return 0;
}

/* Rows the last chunk reads from the host history (positions [0, kv_from)) and the block the
   chunk continues, brought into the host tier and pinned; then room for the new groups (the
   disk tier makes it from other sequences: this one is stamped as in use) and the frames.
   0 or the error, recorded. */
static int prefill_room(struct kvt_manager *m, struct prefill *p)
{
	struct kvt_seq *s = p->s;
	uint32_t nb = p->nb - p->had_groups, frames = p->last ? s->n_frames : 0;
	int err;

	s->stamp = ++m->stamp;
	if (m->disk && p->had_groups) {
		if (kvt_spill_want_reserve(m, p->had_groups))
			return kvt_fail(m, -ENOMEM,
					"sequence %llu layer %u: no memory for the "
					"list of blocks",
					(unsigned long long)p->seq, p->layer);
		if (p->pos & (m->cfg.block_tokens - 1))
			kvt_spill_want(m, s, p->layer, p->had_groups - 1);
		if (p->last)
			kvt_spill_want_range(m, s, p->layer, 0, p->kv_from);
		err = kvt_spill_fetch_wanted(m, "prefill");
		if (err < 0)
			return err;
	}
	if (m->dev.n_free >= frames && m->host.n_free < nb) {
		err = kvt_spill_room(m, nb);
		if (err && err != -ENOMEM)
			return kvt_fail(m, err,
					"sequence %llu layer %u: waiting for the device "
					"before spilling: %s",
					(unsigned long long)p->seq, p->layer, m->be->err);
	}
	if (m->dev.n_free < frames || m->host.n_free < nb)
		return kvt_fail(m, -ENOMEM,
				"sequence %llu layer %u: %s tier full (%u of %u groups "
				"free, %u needed)",
				(unsigned long long)p->seq, p->layer,
				m->dev.n_free < frames ? "device" : "host",
				m->dev.n_free < frames ? m->dev.n_free : m->host.n_free,
				m->dev.n_free < frames ? m->dev.n_units : m->host.n_units,
				m->dev.n_free < frames ? frames : nb);
	return 0;
}

/* Copy entries a call needs at most: the resident gather, and per block of the layer two for
   the save, two for the assembly's load and two for its copy. */
static uint64_t prefill_entries(const struct kvt_manager *m, const struct prefill *p)
{
	uint64_t gather = (uint64_t)m->cfg.n_kv_heads * gather_entries_per_head(m, p->s, false);
	uint64_t lists = 2ull * p->nb + 2;

	return gather > lists ? gather : lists;
}

/* The layer's tables and the call's scratch (chunk state, selection, copy list, block
   metadata): nothing visible changes. 0 or -ENOMEM, recorded; what was allocated stays in
   p->ly for the caller to free. */
static int prefill_tables(struct kvt_manager *m, struct prefill *p)
{
	const struct kvt_config *c = &m->cfg;
	struct kvt_seq_layer *ly = &p->ly;
	uint32_t full = DIV_UP(p->L, c->block_tokens);
	uint64_t need = prefill_entries(m, p);
	int err = 0;

	if (!p->last && !p->s->px) {
		p->s->px = kvt_seq_px_new(m, 0);
		if (!p->s->px)
			goto nomem;
	}
	if (ly->cap_groups < full) {
		/* the layer's whole table at once; a capacity change is not visible */
		uint32_t *g = kvt_huge_realloc(ly->groups, (size_t)full * sizeof(*g));

		if (!g)
			goto nomem;
		ly->groups = p->s->layers[p->layer].groups = g;
		ly->cap_groups = p->s->layers[p->layer].cap_groups = full;
	}
	if (need > UINT32_MAX ||
	    kvt_reserve((void **)&m->xf, &m->xf_cap, (uint32_t)need, sizeof(*m->xf)))
		goto nomem;
	if (!p->last)
		return 0;
	ly->frames = kvt_malloc((size_t)p->s->n_frames * sizeof(*ly->frames));
	if (p->count)
		ly->topk = kvt_malloc((size_t)c->n_kv_heads * p->count * sizeof(*ly->topk));
	snapkv_params(m, p->L, &p->sp);
	if (p->count && m->cpu_device && kvt_snapkv_scratch_bytes(&p->sp) > m->sel_scratch_bytes) {
		size_t want = kvt_snapkv_scratch_bytes(&p->sp);
		void *q = kvt_realloc(m->sel_scratch, want);

		if (q) {
			m->sel_scratch = q;
			m->sel_scratch_bytes = want;
		} else {
			err = -ENOMEM;
		}
	}
	if (!err && m->keep_meta && !m->cpu_device)
		err = kvt_meta_reserve(m, p->s, p->layer, ly, full, p->stream);
	if (err && err != -ENOMEM)
		return kvt_fail(m, err, "sequence %llu layer %u: block metadata: %s",
				(unsigned long long)p->seq, p->layer, m->be->err);
	if (err || !ly->frames || (p->count && !ly->topk))
		goto nomem;
	return 0;
nomem:
	return kvt_fail(m, -ENOMEM, "sequence %llu layer %u: no memory for its tables",
			(unsigned long long)p->seq, p->layer);
}

/* Takes the call's host block groups and, for the last chunk, the layer's device frame
   groups, which prefill_room found free with nothing run since. 0, or -ENOMEM recorded (a
   violated invariant) with nothing taken. */
static int prefill_take(struct kvt_manager *m, struct prefill *p)
{
	uint32_t nb = p->nb - p->had_groups;
	int err = p->last ? kvt_pool_alloc(&m->dev, p->s->n_frames, p->ly.frames) : 0;

	if (!err) {
		err = kvt_pool_alloc(&m->host, nb, p->ly.groups + p->had_groups);
		if (err && p->last)
			ALWAYS(kvt_pool_free(&m->dev, p->ly.frames, p->s->n_frames) == 0);
	}
	if (NEVER(err))
		return kvt_fail(m, err, "sequence %llu layer %u: groups counted free are not",
				(unsigned long long)p->seq, p->layer);
	p->ly.n_groups = p->nb;
	p->took = true;
	return 0;
}

/* Appends the copies of the history rows of positions [pos, pos + n) of a layer into dense
   tensors at k and v ([n_kv_heads] heads head_stride bytes apart, position pos first): per
   block, all heads' K rows in one strided entry and their V rows in another. */
static void emit_history(struct kvt_manager *m, const struct kvt_seq_layer *ly, uint32_t pos,
			 uint32_t n, uint64_t k, uint64_t v, uint64_t head_stride, uint32_t *nx)
{
	uint32_t bt = m->cfg.block_tokens;

	for (uint32_t p0 = pos; p0 < pos + n;) {
		uint32_t end = (p0 / bt + 1) * bt;

		end = end < pos + n ? end : pos + n;
		struct kvt_xfer e = {
			.src = kvt_host_row(m, ly, 0, p0),
			.dst = k + (uint64_t)(p0 - pos) * m->row_bytes,
			.bytes = (end - p0) * m->row_bytes,
			.reps = m->cfg.n_kv_heads,
			.src_stride = m->block_bytes,
			.dst_stride = head_stride,
		};

		m->xf[(*nx)++] = e;
		e.src += m->v_offset;
		e.dst = v + (uint64_t)(p0 - pos) * m->row_bytes;
		m->xf[(*nx)++] = e;
		p0 = end;
	}
}

/* The whole layer for the last chunk, in fk and fv: the caller's tensors when they hold it,
   else the backend's scratch buffer, filled with the rows below kv_from from the host history
   (one gather, after their saves landed) and the caller's rows. 0 or the error, recorded. */
static int prefill_assemble(struct kvt_manager *m, struct prefill *p)
{
	const struct kvt_config *c = &m->cfg;
	uint32_t H = c->n_kv_heads, bt = c->block_tokens, rows = p->L - p->kv_from, nx = 0;
	uint64_t head = (uint64_t)p->L * m->row_bytes, base;
	int err;

	p->fk = ptr_u64(p->k);
	p->fv = ptr_u64(p->v);
	if (!p->last || p->kv_from == 0)
		return 0;
	err = KVT_XFER(m, scratch, 2 * H * head, &base);
	if (!err)
		err = m->ops->save_wait(m->be, p->s->save_ticket);
	if (err)
		return kvt_fail(m, err, "sequence %llu layer %u: prefill buffer: %s",
				(unsigned long long)p->seq, p->layer, m->be->err);
	p->fk = base;
	p->fv = base + H * head;
	emit_history(m, &p->ly, 0, p->kv_from, p->fk, p->fv, head, &nx);
	kvt_dev_queue(m);
	err = KVT_XFER(m, load_h2d, m->xf, nx, p->stream);
	nx = 0;
	for (uint32_t r0 = 0; !err && r0 < rows; r0 += bt) {
		uint32_t cnt = rows - r0 < bt ? rows - r0 : bt;
		struct kvt_xfer e = {
			.src = ptr_u64(p->k) + (uint64_t)r0 * m->row_bytes,
			.dst = p->fk + ((uint64_t)p->kv_from + r0) * m->row_bytes,
			.bytes = cnt * m->row_bytes,
			.reps = H,
			.src_stride = (uint64_t)rows * m->row_bytes,
			.dst_stride = head,
		};

		m->xf[nx++] = e;
		e.src = ptr_u64(p->v) + (uint64_t)r0 * m->row_bytes;
		e.dst = p->fv + ((uint64_t)p->kv_from + r0) * m->row_bytes;
		m->xf[nx++] = e;
	}
	if (!err)
		err = KVT_XFER(m, copy_d2d, m->xf, nx, p->stream);
	if (err)
		return kvt_fail(m, err, "sequence %llu layer %u: assembling the layer: %s",
				(unsigned long long)p->seq, p->layer, m->be->err);
	return 0; /* its rows are counted when the call commits */
}

/* End of the top-K candidates of a prompt of L tokens, min(L - recent, L - obs_window) (policy.h;
   only when it has candidates, so no difference wraps). */
static uint32_t candidates_end(const struct kvt_manager *m, uint32_t L)
{
	const struct kvt_config *c = &m->cfg;

	return L - c->recent_tokens < L - c->obs_window ? L - c->recent_tokens : L - c->obs_window;
}

/* Whether the layer's top-K positions are as the policy promises them (policy.h): per head
   ascending, among the candidates [sink, candidates_end), so between the sink and the ring
   window, where resident_slot, fully_resident and kvt_block_resident look for them. */
static bool topk_in_order(const struct kvt_manager *m, const struct prefill *p)
{
	const struct kvt_config *c = &m->cfg;
	uint32_t count = p->count, hi = candidates_end(m, p->L);

	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		const int32_t *t = p->ly.topk + (size_t)h * count;

		if (t[0] < 0 || (uint32_t)t[0] < c->sink_tokens || (uint32_t)t[count - 1] >= hi)
			return false;
		for (uint32_t i = 1; i < count; i++)
			if (t[i] <= t[i - 1])
				return false;
	}
	return true;
}

/* Select (SnapKV) over the whole layer, on the CPU where it can read the tensors, else on the
   backend's device (the layer's K never leaves it). Without payload there is no data to
   score: keep the candidates nearest the recent window, which is what a recency prior would
   keep. Then the block metadata for recall. 0 or the error, recorded. */
static int prefill_select(struct kvt_manager *m, struct prefill *p)
{
	const struct kvt_config *c = &m->cfg;
	struct kvt_seq_layer *ly = &p->ly;
	const void *fk = (const void *)(uintptr_t)p->fk;
	uint32_t L = p->L, count = p->count;
	int err;

	if (count && m->payload) {
		err = m->cpu_device
			      ? kvt_snapkv_select(&p->sp, fk, p->q_obs, ly->topk, m->sel_scratch)
		      : m->ops->select
			      ? KVT_XFER(m, select, &p->sp, fk, p->q_obs, ly->topk, p->stream)
			      : -ENOTSUP;
		if (err)
			return kvt_fail(m, err, "sequence %llu layer %u: selection failed%s%s",
					(unsigned long long)p->seq, p->layer,
					m->cpu_device ? "" : ": ", m->cpu_device ? "" : m->be->err);
	} else if (count) {
		uint32_t hi = candidates_end(m, L);

		for (uint32_t h = 0; h < c->n_kv_heads; h++)
			for (uint32_t i = 0; i < count; i++)
				ly->topk[(size_t)h * count + i] = (int32_t)(hi - count + i);
	}
	/* (the positions kept without payload are one run, in order by construction) */
	if (count && m->payload && NEVER(!topk_in_order(m, p)))
		return kvt_fail(m, -EIO, "sequence %llu layer %u: selected positions out of order",
				(unsigned long long)p->seq, p->layer);
	if (m->keep_meta && m->cpu_device && kvt_meta_prefill(m, p->s, p->layer, ly, fk, L))
		return kvt_fail(m, -ENOMEM, "sequence %llu layer %u: no memory for its tables",
				(unsigned long long)p->seq, p->layer);
	if (m->keep_meta && !m->cpu_device) {
		err = m->dev_meta ? KVT_XFER(m, meta_build, c->dtype, c->head_dim, c->n_kv_heads, L,
					     c->block_tokens, fk, ly->rc->dmeta, p->stream)
				  : KVT_XFER(m, block_meta, c->dtype, c->head_dim, c->n_kv_heads, L,
					     c->block_tokens, fk, ly->rc->meta, p->stream);
		if (err)
			return kvt_fail(m, err, "sequence %llu layer %u: block metadata: %s",
					(unsigned long long)p->seq, p->layer, m->be->err);
		ly->rc->meta_n = L;
	}
	return 0;
}

/* Gathers the sink, ring and top-K rows of the whole layer into the layer's frames. 0 or the
   error, recorded. */
static int prefill_gather(struct kvt_manager *m, struct prefill *p)
{
	const struct row_src src = {
		.k = p->fk,
		.v_minus_k = p->fv - p->fk, /* K address + this = V address */
		.head_bytes = (uint64_t)p->L * m->row_bytes,
	};
	uint32_t nx = 0;
	int err;

	for (uint32_t h = 0; h < m->cfg.n_kv_heads; h++)
		emit_resident(m, &p->ly, &nx, &src, h, p->L,
			      p->count ? p->ly.topk + (size_t)h * p->count : NULL, p->count);
	kvt_dev_queue(m);
	err = KVT_XFER(m, copy_d2d, m->xf, nx, p->stream);
	if (err)
		return kvt_fail(m, err, "sequence %llu layer %u: gather into frames: %s",
				(unsigned long long)p->seq, p->layer, m->be->err);
	return 0;
}

/* Saves the chunk's rows into the host history: per block, all heads' K rows in one strided
   entry and their V rows in another. The sources are the caller's tensors, or each head's
   rows of the chunk when the tensors hold rows before it too. 0 with the save's ticket, or
   the error, recorded, once no part of the save is still in flight. */
static int prefill_save(struct kvt_manager *m, struct prefill *p, uint64_t *ticket)
{
	const struct kvt_config *c = &m->cfg;
	uint32_t H = c->n_kv_heads, bt = c->block_tokens, nx = 0, n_src = 0;
	uint64_t chunk = (uint64_t)p->n * m->row_bytes; /* one head's rows of the chunk */
	uint64_t held = (uint64_t)(p->pos + p->n - p->kv_from) * m->row_bytes;
	struct kvt_save_src src1[2], *src = src1;
	int err;

	if (NEVER(2ull * p->nb > m->xf_cap)) /* prefill_tables reserved the list */
		return kvt_fail(m, -EIO, "sequence %llu layer %u: save list too short",
				(unsigned long long)p->seq, p->layer);
	if (p->kv_from == p->pos) {
		src1[0] = (struct kvt_save_src){ptr_u64(p->k), H * chunk};
		src1[1] = (struct kvt_save_src){ptr_u64(p->v), H * chunk};
		n_src = 2;
	} else {
		src = kvt_malloc(2 * H * sizeof(*src));
		if (!src)
			return kvt_fail(m, -ENOMEM,
					"sequence %llu layer %u: no memory for the save",
					(unsigned long long)p->seq, p->layer);
		for (uint32_t t = 0; t < 2; t++)
			for (uint32_t h = 0; h < H; h++)
				src[n_src++] = (struct kvt_save_src){
					ptr_u64(t ? p->v : p->k) + h * held +
						(uint64_t)(p->pos - p->kv_from) * m->row_bytes,
					chunk};
	}
	for (uint32_t p0 = p->pos; p0 < p->pos + p->n;) {
		uint32_t end = (p0 / bt + 1) * bt, n;

		end = end < p->pos + p->n ? end : p->pos + p->n;
		n = end - p0;
		struct kvt_xfer e = {
			.src = (uint64_t)(p0 - p->pos) * m->row_bytes,
			.dst = kvt_host_row(m, &p->ly, 0, p0),
			.bytes = n * m->row_bytes,
			.reps = H,
			.src_stride = chunk,
			.dst_stride = m->block_bytes,
		};

		m->xf[nx++] = e;
		e.src += H * chunk;
		e.dst += m->v_offset;
		m->xf[nx++] = e;
		p0 = end;
	}
	err = KVT_XFER(m, save, src, n_src, m->xf, nx, p->stream, ticket);
	if (src != src1)
		free(src);
	if (err) {
		/* A multi-chunk save may have handed chunks over: let them land before the
		   blocks return to the pool. */
		m->ops->save_wait(m->be, UINT64_MAX);
		return kvt_fail(m, err, "sequence %llu layer %u: save to host: %s",
				(unsigned long long)p->seq, p->layer, m->be->err);
	}
	return 0;
}

/* Installs the built layer in the sequence and counts the call; the last layer of a sequence
   with a chain caches its spans. */
static void prefill_commit(struct kvt_manager *m, struct prefill *p, uint64_t ticket)
{
	struct kvt_seq_layer *ly = &p->ly;
	struct kvt_seq *s = p->s;
	uint32_t L = p->L, H = m->cfg.n_kv_heads;

	s->save_ticket = ticket > s->save_ticket ? ticket : s->save_ticket;
	s->bulk_ticket = ticket > s->bulk_ticket ? ticket : s->bulk_ticket;
	m->st.saves_submitted++;
	m->st.tokens_saved += p->n;
	m->st.bytes_d2h += 2ull * H * p->n * m->row_bytes;
	if (p->last) /* the rows prefill_assemble loaded from the host history */
		m->st.bytes_h2d_history += 2ull * H * p->kv_from * m->row_bytes;
	if (s->px)
		s->px->fill[p->layer] = p->pos + p->n;
	if (!p->last) {
		s->layers[p->layer] = *ly;
		return;
	}
	uint32_t resident = (L < m->slots_sr ? L : m->slots_sr) + p->count;

	ly->n_tokens = L;
	ly->ring_slot = kvt_ring_slot(L, m->cfg.sink_tokens, m->cfg.recent_tokens);
	ly->dev_next = kvt_dev_row(m, ly, 0, ly->ring_slot);
	ly->host_next = kvt_host_cursor(m, ly);
	s->layers[p->layer] = *ly;
	s->layers_prefilled++;
	m->st.prefill_layers++;
	m->st.tokens_prompt += L;
	m->st.tokens_resident += resident;
	m->st.bytes_d2d += 2ull * resident * m->row_bytes * H;
	if (s->layers_prefilled == m->cfg.n_layers)
		kvt_prefix_register(m, s);
}

/* Undoes a failed call: the pool ids it took, the tables it built (the layer's group table
   keeps its new capacity). */
static void prefill_undo(struct kvt_manager *m, struct prefill *p)
{
	if (p->took) {
		kvt_dev_quiesce(m); /* a copy into the frames may be queued; see kvt_dev_quiesce */
		ALWAYS(kvt_pool_free(&m->host, p->ly.groups + p->had_groups,
				     p->nb - p->had_groups) == 0);
		if (p->last)
			ALWAYS(kvt_pool_free(&m->dev, p->ly.frames, p->s->n_frames) == 0);
	}
	if (p->s && p->last) {
		free(p->ly.frames);
		free(p->ly.topk);
		if (p->ly.rc != p->s->layers[p->layer].rc)
			kvt_recall_layer_free(m, p->ly.rc);
	}
}

static int prefill_run(struct kvt_manager *m, struct prefill *p)
{
	uint64_t ticket;
	int err;

	err = prefill_check(m, p);
	if (!err)
		err = prefill_room(m, p);
	if (err)
		return err;
	err = prefill_tables(m, p);
	if (!err)
		err = prefill_take(m, p);
	if (!err)
		err = prefill_assemble(m, p);
	if (!err && p->last)
		err = prefill_select(m, p);
	if (!err && p->last)
		err = prefill_gather(m, p);
	if (!err)
		err = prefill_save(m, p, &ticket);
	if (err) {
		prefill_undo(m, p);
		return err;
	}
	prefill_commit(m, p, ticket);
	return 0;
}

KVT_API int kvt_prefill_layer(struct kvt_manager *m, uint64_t seq, uint32_t layer, const void *k,
			      const void *v, const void *q_obs, void *stream)
{
	struct prefill p = {
		.seq = seq,
		.layer = layer,
		.n = UINT32_MAX, /* the rest of the layer */
		.k = k,
		.v = v,
		.q_obs = q_obs,
		.stream = stream,
	};

	if (!m)
		return -EINVAL;
	return prefill_run(m, &p);
}

KVT_API int kvt_prefill_chunk(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t pos,
			      uint32_t n, uint32_t kv_from, const void *k, const void *v,
			      const void *q_obs, void *stream)
{
	struct prefill p = {
		.seq = seq,
		.layer = layer,
		.pos = pos,
		.n = n,
		.kv_from = kv_from,
		.k = k,
		.v = v,
		.q_obs = q_obs,
		.stream = stream,
	};

	if (!m)
		return -EINVAL;
	if (n > INT32_MAX) /* prompts have at most 2^31 - 1 tokens (UINT32_MAX is internal) */
		return kvt_fail(m, -EINVAL, "prefill chunk: %u tokens (at most 2^31 - 1)", n);
	return prefill_run(m, &p);
}

/* Gives back the host groups that decode pass 2 took for the first n fresh members of the
   batch, latest first, so their tables and the pool are as before the call. */
static void decode_unfresh(struct kvt_manager *m, uint32_t layer, uint32_t n)
{
	while (n-- > 0) {
		struct kvt_seq_layer *ly = &m->batch[m->fresh[n]]->layers[layer];

		ALWAYS(kvt_pool_free(&m->host, &ly->groups[--ly->n_groups], 1) == 0);
	}
}

KVT_API int kvt_decode_append(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			      uint32_t n, const void *k, const void *v, void *stream)
{
	struct kvt_append_geom g;
	uint32_t n_fresh = 0, bt_mask;
	uint64_t ticket, stamp;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!seqs || !k || !v || n == 0)
		return kvt_fail(m, -EINVAL, "decode: %s", n == 0 ? "empty batch" : "NULL pointer");
	if (layer >= m->cfg.n_layers)
		return kvt_fail(m, -EINVAL, "decode: layer %u out of range (%u layers)", layer,
				m->cfg.n_layers);
	if (kvt_reserve((void **)&m->batch, &m->batch_cap, n, sizeof(*m->batch)) ||
	    kvt_reserve((void **)&m->ap, &m->ap_cap, n, sizeof(*m->ap)) ||
	    kvt_reserve((void **)&m->fresh, &m->fresh_cap, n, sizeof(*m->fresh)))
		return kvt_fail(m, -ENOMEM, "decode: no memory for a batch of %u", n);
	bt_mask = m->cfg.block_tokens - 1;

	/* Pass 1: validate every sequence and describe its token's two destinations from the
	   layer's cursors; tokens that open a host block are listed for allocation. Only the
	   capacity of tables changes here (invisible). */
	stamp = ++m->stamp;
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = kvt_batch_member(m, seqs, i, layer, stamp, "decode", &err);
		struct kvt_seq_layer *ly;

		if (!s)
			return err;
		ly = &s->layers[layer];
		if (ly->n_tokens >= INT32_MAX)
			return kvt_fail(m, -EOVERFLOW, "decode: sequence %llu: layer %u is full",
					(unsigned long long)seqs[i], layer);
		/* its ring slot and block table agree with its tokens */
		if (NEVER(ly->ring_slot >= m->slots_sr) ||
		    NEVER(ly->n_groups != (ly->n_tokens + bt_mask) >> m->lbt) ||
		    NEVER(ly->n_groups > ly->cap_groups))
			return kvt_fail(m, -EIO,
					"decode: sequence %llu layer %u: inconsistent state",
					(unsigned long long)seqs[i], layer);
		m->batch[i] = s;
		m->ap[i].dev = ly->dev_next;
		m->ap[i].host = ly->host_next;
		if (ly->n_tokens & bt_mask)
			continue;
		if (n_fresh == m->host.n_units)
			return kvt_fail(m, -ENOMEM,
					"decode: host tier full at sequence %llu (%u block "
					"groups in all)",
					(unsigned long long)seqs[i], m->host.n_units);
		if (ly->n_groups == ly->cap_groups) {
			uint32_t cap = ly->cap_groups;

			if (kvt_reserve_with(kvt_huge_realloc, (void **)&ly->groups, &cap,
					     ly->n_groups + 1, sizeof(*ly->groups)))
				return kvt_fail(m, -ENOMEM,
						"decode: sequence %llu: no memory for its "
						"block table",
						(unsigned long long)seqs[i]);
			ly->cap_groups = cap;
		}
		if (m->keep_meta &&
		    (err = kvt_meta_reserve(m, s, layer, ly, ly->n_groups + 1, stream)))
			return kvt_fail(m, err, "decode: sequence %llu: block metadata: %s",
					(unsigned long long)seqs[i], m->be->err);
		m->fresh[n_fresh++] = i;
	}

	/* The blocks the tokens go to come back from disk first where they were spilled (their
	   cursors move; the call pins them), then the new blocks get host room; neither is
	   visible if the call fails after. */
	if (m->disk) {
		for (uint32_t i = 0; i < n; i++) {
			struct kvt_seq_layer *ly = &m->batch[i]->layers[layer];

			if (ly->n_tokens & bt_mask)
				kvt_spill_want(m, m->batch[i], layer, ly->n_groups - 1);
		}
		err = kvt_spill_fetch_wanted(m, "decode");
		if (err < 0)
			return err;
		for (uint32_t i = 0; err > 0 && i < n; i++)
			m->ap[i].host = m->batch[i]->layers[layer].host_next;
	}
	if (n_fresh > m->host.n_free && (err = kvt_spill_room(m, n_fresh)) != 0 && err != -ENOMEM)
		return kvt_fail(m, err, "decode: waiting for the device before spilling: %s",
				m->be->err);
	if (n_fresh > m->host.n_free)
		return kvt_fail(m, -ENOMEM,
				"decode: host tier full (%u new block groups needed, %u free%s)",
				n_fresh, m->host.n_free, m->disk ? " after spilling" : "");

	/* Pass 2 (boundary tokens only): take their new host groups, counted free above. */
	for (uint32_t f = 0; f < n_fresh; f++) {
		uint32_t i = m->fresh[f];
		struct kvt_seq_layer *ly = &m->batch[i]->layers[layer];

		if (NEVER(kvt_pool_alloc(&m->host, 1, &ly->groups[ly->n_groups]) != 0)) {
			decode_unfresh(m, layer, f);
			return kvt_fail(m, -ENOMEM, "decode: layer %u: groups counted free are not",
					layer);
		}
		ly->n_groups++;
		m->ap[i].host = kvt_host_row(m, ly, 0, ly->n_tokens);
	}
	/* Each token's block metadata entry on the device, where it is kept there (the backend
	   folds the token in on the append's stream); the tables grew in pass 1. */
	for (uint32_t i = 0; i < n; i++) {
		const struct kvt_seq_layer *ly = &m->batch[i]->layers[layer];

		m->ap[i].meta =
			m->dev_meta && ly->rc && ly->rc->dmeta
				? (ly->rc->dmeta + (uint64_t)(ly->n_tokens >> m->lbt) *
							   m->cfg.n_kv_heads * m->meta_bytes) |
					  !(ly->n_tokens & bt_mask)
				: 0;
	}
	g = (struct kvt_append_geom){m->cfg.n_kv_heads, m->row_bytes, m->block_bytes,
				     m->v_offset,	m->cfg.dtype, m->cfg.head_dim};
	kvt_dev_queue(m);
	err = KVT_XFER(m, append, ptr_u64(k), ptr_u64(v), n, m->ap, &g, stream, &ticket);
	if (err) {
		/* Give the new groups back so tables and pool are as before, once the chunks of
		   a multi-chunk save that were handed over before the failure have landed. */
		m->ops->save_wait(m->be, UINT64_MAX);
		decode_unfresh(m, layer, n_fresh);
		return kvt_fail(m, err, "decode: layer %u: %s", layer, m->be->err);
	}

	/* Pass 3: commit and advance the cursors. */
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = m->batch[i];
		struct kvt_seq_layer *ly = &s->layers[layer];
		uint32_t slot = ly->ring_slot + 1;

		if (slot == m->slots_sr)
			slot = m->cfg.sink_tokens;
		ly->dev_next = (slot & bt_mask) && slot != m->cfg.sink_tokens
				       ? ly->dev_next + m->row_bytes
				       : kvt_dev_row(m, ly, 0, slot);
		ly->ring_slot = slot;
		ly->host_next = (++ly->n_tokens & bt_mask) ? m->ap[i].host + m->row_bytes : 0;
		kvt_note_append(m, s, (ly->n_tokens - 1) >> m->lbt, ticket);
	}
	m->st.decode_calls++;
	m->st.saves_submitted++;
	m->st.tokens_appended += n;
	m->st.tokens_saved += n;
	m->st.bytes_d2d += 2ull * n * m->cfg.n_kv_heads * m->row_bytes;
	m->st.bytes_d2h += 2ull * n * m->cfg.n_kv_heads * m->row_bytes;
	return 0;
}

/* Resident slot of pos in (layer, head), or -1 when pos lives only in the host history. */
static int64_t resident_slot(const struct kvt_manager *m, const struct kvt_seq *s,
			     const struct kvt_seq_layer *ly, uint32_t h, uint32_t pos)
{
	uint32_t sink = m->cfg.sink_tokens, recent = m->cfg.recent_tokens;

	if (s->preempted)
		return -1;
	if (pos < sink)
		return pos;
	if (pos >= kvt_ring0(m, ly->n_tokens))
		return kvt_ring_slot(pos, sink, recent);
	if (s->valid_topk) {
		const int32_t *t = ly->topk + (size_t)h * s->valid_topk;
		uint32_t lo = kvt_topk_lower(t, s->valid_topk, pos);

		if (lo < s->valid_topk && (uint32_t)t[lo] == pos)
			return m->slots_sr + lo;
	}
	return -1;
}

KVT_API int kvt_seq_resident_positions(struct kvt_manager *m, uint64_t seq, uint32_t layer,
				       uint32_t kv_head, int32_t *out, uint32_t cap,
				       uint32_t *n_out)
{
	const struct kvt_seq_layer *ly;
	struct kvt_seq *s;
	uint32_t sink, N, n_sink, ring0, total, w = 0;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!n_out || (cap && !out))
		return kvt_fail(m, -EINVAL, "resident positions: NULL %s",
				!n_out ? "n_out" : "out");
	ly = find_layer(m, seq, layer, &s, &err);
	if (!ly)
		return err;
	if (kv_head >= m->cfg.n_kv_heads)
		return kvt_fail(m, -EINVAL, "kv head %u out of range (%u heads)", kv_head,
				m->cfg.n_kv_heads);
	sink = m->cfg.sink_tokens;
	N = ly->n_tokens;
	n_sink = N < sink ? N : sink;
	ring0 = kvt_ring0(m, N);
	total = s->preempted ? 0 : n_sink + s->valid_topk + (N > ring0 ? N - ring0 : 0);
	*n_out = total;
	if (cap < total)
		return kvt_fail(m, -ENOSPC, "resident positions: %u needed, room for %u", total,
				cap);
	if (!total)
		return 0;
	for (uint32_t p = 0; p < n_sink; p++)
		out[w++] = (int32_t)p;
	if (s->valid_topk)
		memcpy(out + w, ly->topk + (size_t)kv_head * s->valid_topk,
		       s->valid_topk * sizeof(*out));
	w += s->valid_topk;
	for (uint32_t p = ring0; p < N; p++)
		out[w++] = (int32_t)p;
	return 0;
}

static int read_token(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t h, uint32_t pos,
		      void *k_out, void *v_out, bool force_host)
{
	const struct kvt_seq_layer *ly;
	struct kvt_seq *s;
	int64_t slot;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!k_out || !v_out)
		return kvt_fail(m, -EINVAL, "read token: NULL output");
	ly = find_layer(m, seq, layer, &s, &err);
	if (!ly)
		return err;
	if (h >= m->cfg.n_kv_heads || pos >= ly->n_tokens)
		return kvt_fail(m, -EINVAL, "read token: %s %u out of range",
				h >= m->cfg.n_kv_heads ? "kv head" : "position",
				h >= m->cfg.n_kv_heads ? h : pos);
	if (!m->payload)
		return kvt_fail(m, -ENOTSUP, "read token: backend %s holds no payload",
				m->ops->name);
	slot = force_host ? -1 : resident_slot(m, s, ly, h, pos);
	if (slot >= 0) {
		uint64_t a = kvt_dev_row(m, ly, h, (uint32_t)slot);

		err = KVT_XFER(m, read_d2h, k_out, a, m->row_bytes, NULL);
		if (!err)
			err = KVT_XFER(m, read_d2h, v_out, a + m->v_offset, m->row_bytes, NULL);
		if (err)
			return kvt_fail(m, err, "read token: device read: %s", m->be->err);
		m->st.bytes_read += 2ull * m->row_bytes;
		return 0;
	}
	if (m->disk) {
		++m->stamp;
		kvt_spill_want(m, s, layer, pos >> m->lbt);
		err = kvt_spill_fetch_wanted(m, "read token");
		if (err < 0)
			return err;
	}
	err = m->ops->save_wait(m->be, s->save_ticket);
	if (err)
		return kvt_fail(m, err, "read token: waiting for its save: %s", m->be->err);
	{
		const uint8_t *a = (const uint8_t *)(uintptr_t)kvt_host_row(m, ly, h, pos);

		memcpy(k_out, a, m->row_bytes);
		memcpy(v_out, a + m->v_offset, m->row_bytes);
	}
	return 0;
}

KVT_API int kvt_seq_read_token(struct kvt_manager *m, uint64_t seq, uint32_t layer,
			       uint32_t kv_head, uint32_t pos, void *k_out, void *v_out)
{
	return read_token(m, seq, layer, kv_head, pos, k_out, v_out, false);
}

int kvt_seq_read_token_host(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t head,
			    uint32_t pos, void *k_out, void *v_out)
{
	return read_token(m, seq, layer, head, pos, k_out, v_out, true);
}

KVT_API int kvt_seq_load_kv(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t pos,
			    uint32_t n, void *k_out, void *v_out, void *stream)
{
	uint32_t H, bt, nx = 0, filled;
	struct kvt_seq_layer *ly;
	struct kvt_seq *s;
	uint64_t head;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!k_out || !v_out || n == 0)
		return kvt_fail(m, -EINVAL, "load: %s", n ? "NULL output" : "no positions");
	err = check_layer(m, layer);
	if (err)
		return err;
	s = kvt_seq_usable(m, seq, "load", &err);
	if (!s)
		return err;
	ly = &s->layers[layer];
	filled = layer_filled(s, layer);
	if (pos > filled || n > filled - pos)
		return kvt_fail(
			m, -EINVAL,
			"load: sequence %llu layer %u: positions [%u, +%u) past the %u in its "
			"history",
			(unsigned long long)seq, layer, pos, n, filled);
	H = m->cfg.n_kv_heads;
	bt = m->cfg.block_tokens;
	if (kvt_reserve((void **)&m->xf, &m->xf_cap, 2 * (DIV_UP(n, bt) + 1), sizeof(*m->xf)))
		return kvt_fail(m, -ENOMEM, "load: no memory for the copy list");
	s->stamp = ++m->stamp;
	if (m->disk) {
		kvt_spill_want_range(m, s, layer, pos, pos + n);
		err = kvt_spill_fetch_wanted(m, "load");
		if (err < 0)
			return err;
	}
	err = m->ops->save_wait(m->be, s->save_ticket);
	if (err)
		return kvt_fail(m, err, "load: waiting for its saves: %s", m->be->err);
	head = (uint64_t)n * m->row_bytes;
	emit_history(m, ly, pos, n, ptr_u64(k_out), ptr_u64(v_out), head, &nx);
	kvt_dev_queue(m);
	err = KVT_XFER(m, load_h2d, m->xf, nx, stream);
	if (err)
		return kvt_fail(m, err, "load: sequence %llu layer %u: %s", (unsigned long long)seq,
				layer, m->be->err);
	m->st.bytes_h2d_history += 2ull * H * head;
	return 0;
}

KVT_API int kvt_seq_tokens(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t *n_out)
{
	struct kvt_seq *s;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!n_out)
		return kvt_fail(m, -EINVAL, "tokens: NULL n_out");
	err = check_layer(m, layer);
	if (err)
		return err;
	s = kvt_seq_usable(m, seq, NULL, &err);
	if (!s)
		return err;
	*n_out = s->layers[layer].n_tokens;
	return 0;
}

/* Appends segments of the rows of a recalled block that are not resident (runs of zero bits
   of `resident` below n_valid). */
static uint32_t recall_segments(const struct kvt_manager *m, uint64_t frame, uint32_t n_valid,
				uint64_t resident, struct kvt_attend_rows *seg)
{
	uint32_t nseg = 0, i = 0;

	while (i < n_valid) {
		uint32_t j;

		if ((resident >> i) & 1) {
			i++;
			continue;
		}
		for (j = i; j < n_valid && !((resident >> j) & 1); j++)
			;
		uint64_t a = frame + (uint64_t)i * m->row_bytes;

		seg[nseg++] = (struct kvt_attend_rows){
			.k = (const void *)(uintptr_t)a,
			.v = (const void *)(uintptr_t)(a + m->v_offset),
			.k_stride = m->row_bytes,
			.v_stride = m->row_bytes,
			.n = j - i,
		};
		i = j;
	}
	return nseg;
}

KVT_API int kvt_attend(struct kvt_manager *m, uint64_t seq, uint32_t layer, const float *q,
		       float *out)
{
	const struct kvt_seq_layer *ly;
	const struct kvt_recall_layer *rc;
	const struct kvt_config *c;
	struct kvt_seq *s;
	uint32_t n_valid, bt, most = 0;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!q || !out)
		return kvt_fail(m, -EINVAL, "attend: NULL %s", !q ? "q" : "out");
	ly = find_layer(m, seq, layer, &s, &err);
	if (!ly)
		return err;
	if (s->preempted)
		return kvt_fail(m, -EINVAL, "attend: sequence %llu is preempted",
				(unsigned long long)seq);
	if (!m->cpu_device && !m->ops->attend)
		return kvt_fail(m, -ENOTSUP, "attend: backend %s has no reference attention",
				m->ops->name);
	c = &m->cfg;
	bt = c->block_tokens;
	rc = ly->rc;
	err = kvt_recall_pull(m, ly->rc);
	if (err)
		return err;
	/* Every recalled frame must still hold its block. */
	for (uint32_t h = 0; rc && rc->view_n && h < c->n_kv_heads; h++) {
		if (kvt_view_stale(rc))
			return kvt_fail(m, -ESTALE, "attend: sequence %llu layer %u: %s",
					(unsigned long long)seq, layer, kvt_view_stale_why(rc));
		most = rc->view_n[h] > most ? rc->view_n[h] : most;
	}
	/* Valid slots: [0, min(N, sink + recent)) plus the top-K slots right after the ring,
	   which exist only when the prompt filled the ring (so the range is contiguous). */
	n_valid = (ly->n_tokens < m->slots_sr ? ly->n_tokens : m->slots_sr) + s->valid_topk;
	/* Every head's segments in one list (head h's from seg_off[h]), so a device backend
	   attends all heads in one go. */
	if ((uint64_t)c->n_kv_heads * (s->n_frames + most * (bt / 2 + 1)) > UINT32_MAX ||
	    kvt_reserve((void **)&m->segs, &m->segs_cap,
			c->n_kv_heads * (s->n_frames + most * (bt / 2 + 1)), sizeof(*m->segs)) ||
	    kvt_reserve((void **)&m->seg_off, &m->seg_off_cap, c->n_kv_heads + 1,
			sizeof(*m->seg_off)))
		return kvt_fail(m, -ENOMEM, "attend: no memory for %u segments", s->n_frames);
	if (m->cpu_device) {
		err = m->ops->sync(m->be, NULL);
		if (err)
			return kvt_fail(m, err, "attend: %s", m->be->err);
	}
	m->seg_off[0] = 0;
	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		uint32_t nseg = m->seg_off[h];

		for (uint32_t s0 = 0; s0 < n_valid; s0 += bt) {
			uint64_t a = kvt_dev_row(m, ly, h, s0);

			m->segs[nseg++] = (struct kvt_attend_rows){
				.k = (const void *)(uintptr_t)a,
				.v = (const void *)(uintptr_t)(a + m->v_offset),
				.k_stride = m->row_bytes,
				.v_stride = m->row_bytes,
				.n = n_valid - s0 < bt ? n_valid - s0 : bt,
			};
		}
		for (uint32_t i = 0; rc && rc->view_n && i < rc->view_n[h]; i++) {
			uint32_t id = rc->view[(size_t)h * rc->view_cap + i];
			const struct kvt_region_slot *e = &rc->rg.slot[id];
			uint64_t mask =
				kvt_block_resident(m, s, ly, h, e->key / c->n_kv_heads, e->n_valid);

			nseg += recall_segments(m, kvt_slot_frame(m, rc, id), e->n_valid, mask,
						m->segs + nseg);
		}
		m->seg_off[h + 1] = nseg;
	}
	if (!m->cpu_device) {
		err = m->ops->attend(m->be, c->dtype, c->head_dim, c->n_kv_heads, m->group_q,
				     m->segs, m->seg_off, q, out);
		return err ? kvt_fail(m, err, "attend: %s", m->be->err) : 0;
	}
	for (uint32_t h = 0; h < c->n_kv_heads; h++)
		kvt_attend_rows(c->dtype, c->head_dim, q + (size_t)h * m->group_q * c->head_dim,
				m->group_q, m->segs + m->seg_off[h],
				m->seg_off[h + 1] - m->seg_off[h],
				out + (size_t)h * m->group_q * c->head_dim);
	return 0;
}

KVT_API int kvt_seq_frames(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t kv_head,
			   uint64_t *frames, uint32_t cap, uint32_t *n_frames, uint32_t *n_slots)
{
	const struct kvt_seq_layer *ly;
	struct kvt_seq *s;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!n_frames || !n_slots || (cap && !frames))
		return kvt_fail(m, -EINVAL, "frames: NULL pointer");
	ly = find_layer(m, seq, layer, &s, &err);
	if (!ly)
		return err;
	if (kv_head >= m->cfg.n_kv_heads || s->preempted)
		return kvt_fail(m, -EINVAL, "frames: %s",
				s->preempted ? "sequence preempted" : "kv head out of range");
	*n_frames = s->n_frames;
	*n_slots = (ly->n_tokens < m->slots_sr ? ly->n_tokens : m->slots_sr) + s->valid_topk;
	if (cap < s->n_frames)
		return kvt_fail(m, -ENOSPC, "frames: %u needed, room for %u", s->n_frames, cap);
	for (uint32_t f = 0; f < s->n_frames; f++)
		frames[f] = m->dev_base + (uint64_t)ly->frames[f] * m->group_bytes +
			    kv_head * m->block_bytes;
	return 0;
}

/* Returns the device frame groups of the prefilled layers among the first `layers` of s
   (preempt, a failed resume). */
static void free_frames(struct kvt_manager *m, struct kvt_seq *s, uint32_t layers)
{
	for (uint32_t l = 0; l < layers; l++)
		if (s->layers[l].n_tokens)
			ALWAYS(kvt_pool_free(&m->dev, s->layers[l].frames, s->n_frames) == 0);
}

KVT_API int kvt_seq_preempt(struct kvt_manager *m, uint64_t seq)
{
	struct kvt_seq *s;
	int err = 0;

	if (!m)
		return -EINVAL;
	s = kvt_seq_usable(m, seq, NULL, &err);
	if (!s)
		return err;
	if (s->preempted)
		return kvt_fail(m, -EALREADY, "preempt: sequence %llu is already preempted",
				(unsigned long long)seq);
	/* Device work queued on the frames must be done before they change hands (the caller's
	   own reads of them too, which it may have queued since the manager's last wait). */
	err = m->ops->sync(m->be, NULL);
	if (err)
		return kvt_fail(m, err, "preempt: %s", m->be->err);
	m->dev_queued = false;
	kvt_recall_drop_seq(m, s);
	free_frames(m, s, m->cfg.n_layers);
	s->preempted = 1;
	m->st.preemptions++;
	return 0;
}

/* Most distinct host blocks the resident set of a layer can hold: its sink and ring blocks,
   one per top-K position of each head, and never more than the layer has. */
static uint64_t resident_blocks_bound(const struct kvt_manager *m, const struct kvt_seq *s,
				      const struct kvt_seq_layer *ly)
{
	uint32_t bt = m->cfg.block_tokens;
	uint64_t b = DIV_UP(m->cfg.sink_tokens, bt) + DIV_UP(m->cfg.recent_tokens, bt) + 1 +
		     (uint64_t)m->cfg.n_kv_heads * s->valid_topk;

	return b < ly->n_groups ? b : ly->n_groups;
}

/* Brings the host blocks of the resident sets of layers [l0, l1) of s into the host tier,
   pinned, in one read: 0 or the error, recorded. */
static int resume_fetch(struct kvt_manager *m, struct kvt_seq *s, uint32_t l0, uint32_t l1)
{
	uint32_t sink = m->cfg.sink_tokens, H = m->cfg.n_kv_heads;
	int err;

	if (!m->disk)
		return 0;
	for (uint32_t l = l0; l < l1; l++) {
		struct kvt_seq_layer *ly = &s->layers[l];
		uint32_t N = ly->n_tokens;

		if (!N)
			continue;
		kvt_spill_want_range(m, s, l, 0, N < sink ? N : sink);
		kvt_spill_want_range(m, s, l, kvt_ring0(m, N), N);
		for (size_t i = 0; i < (size_t)H * s->valid_topk; i++)
			kvt_spill_want(m, s, l, (uint32_t)ly->topk[i] >> m->lbt);
	}
	err = kvt_spill_fetch_wanted(m, "resume");
	return err < 0 ? err : 0;
}

KVT_API int kvt_seq_resume(struct kvt_manager *m, uint64_t seq, void *stream)
{
	const struct kvt_config *c;
	const struct row_src host = {.host = true};
	uint32_t layers = 0, nx = 0, chunks = 0;
	uint64_t need, entries, rows = 0, room;
	struct kvt_seq *s;
	int err = 0;

	if (!m)
		return -EINVAL;
	c = &m->cfg;
	s = kvt_seq_usable(m, seq, NULL, &err);
	if (!s)
		return err;
	if (!s->preempted)
		return kvt_fail(m, -EALREADY, "resume: sequence %llu is not preempted",
				(unsigned long long)seq);
	for (uint32_t l = 0; l < c->n_layers; l++)
		layers += s->layers[l].n_tokens != 0;
	ALWAYS(layers == s->layers_prefilled);
	need = (uint64_t)layers * s->n_frames;
	if (need > m->dev.n_free)
		return kvt_fail(m, -ENOMEM,
				"resume: sequence %llu needs %llu device frame groups, %u free",
				(unsigned long long)seq, (unsigned long long)need, m->dev.n_free);
	entries = (uint64_t)layers * c->n_kv_heads * gather_entries_per_head(m, s, true);
	if (entries > UINT32_MAX ||
	    kvt_reserve((void **)&m->xf, &m->xf_cap, (uint32_t)entries, sizeof(*m->xf)))
		return kvt_fail(m, -ENOMEM, "resume: no memory for the gather list");
	/* The history must have landed before the device reads it. */
	err = m->ops->save_wait(m->be, s->save_ticket);
	if (err)
		return kvt_fail(m, err, "resume: waiting for saves: %s", m->be->err);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		/* counted free above */
		if (s->layers[l].n_tokens &&
		    NEVER(kvt_pool_alloc(&m->dev, s->n_frames, s->layers[l].frames) != 0)) {
			free_frames(m, s, l);
			return kvt_fail(m, -ENOMEM,
					"resume: sequence %llu: groups counted free are not",
					(unsigned long long)seq);
		}
	}
	/* Layers in chunks whose resident blocks fit the host tier together (all of them,
	   unless the history is far larger than the host tier): per chunk, one read of the
	   spilled ones, then one gather. What fits is what spilling can free: not the groups
	   shared with the prefix cache, which no spill takes. */
	room = m->host.n_units - kvt_prefix_held_groups(m);
	for (uint32_t l0 = 0, l1; l0 < c->n_layers; l0 = l1) {
		uint64_t bound = 0;

		s->stamp = ++m->stamp; /* the previous chunk's pins go */
		for (l1 = l0; l1 < c->n_layers; l1++) {
			uint64_t b = resident_blocks_bound(m, s, &s->layers[l1]);

			if (l1 > l0 && bound + b > room)
				break;
			bound += b;
		}
		nx = 0;
		err = resume_fetch(m, s, l0, l1);
		if (err)
			goto fail;
		for (uint32_t l = l0; l < l1; l++) {
			struct kvt_seq_layer *ly = &s->layers[l];

			for (uint32_t h = 0; ly->n_tokens && h < c->n_kv_heads; h++)
				rows += emit_resident(
					m, ly, &nx, &host, h, ly->n_tokens,
					s->valid_topk ? ly->topk + (size_t)h * s->valid_topk : NULL,
					s->valid_topk);
		}
		err = kvt_dev_gather(m, nx, stream);
		if (err) {
			err = kvt_fail(m, err, "resume: sequence %llu: gather: %s",
				       (unsigned long long)seq, m->be->err);
			goto fail;
		}
		chunks++;
	}
	for (uint32_t l = 0; l < c->n_layers; l++) {
		struct kvt_seq_layer *ly = &s->layers[l];

		if (ly->n_tokens)
			ly->dev_next = kvt_dev_row(m, ly, 0, ly->ring_slot);
	}
	s->preempted = 0;
	m->st.resumes++;
	m->st.bytes_h2d += 2 * rows * m->row_bytes;
	return 0;

fail:
	if (chunks)
		kvt_dev_quiesce(m); /* earlier chunks' loads write the frames freed here */
	free_frames(m, s, c->n_layers);
	return err;
}

KVT_API int kvt_seq_info(struct kvt_manager *m, uint64_t seq, struct kvt_seq_info *out)
{
	struct kvt_seq_info in = {0};
	struct kvt_seq *s;
	uint32_t size, step = 0;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!out || out->size < offsetof(struct kvt_seq_info, layers_prefilled))
		return kvt_fail(m, -EINVAL, "seq info: NULL or undersized output");
	s = find_seq(m, seq, &err);
	if (!s)
		return err;
	size = out->size < sizeof(in) ? out->size : (uint32_t)sizeof(in);
	in.size = size;
	in.prompt_tokens = s->prompt_tokens;
	in.preempted = s->preempted;
	in.frames_per_layer = s->n_frames * m->cfg.n_kv_heads;
	in.filled_tokens = UINT32_MAX;
	for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
		const struct kvt_seq_layer *ly = &s->layers[l];
		uint32_t filled = layer_filled(s, l);

		in.filled_tokens = filled < in.filled_tokens ? filled : in.filled_tokens;
		in.host_blocks += (uint64_t)ly->n_groups * m->cfg.n_kv_heads;
		if (!ly->n_tokens)
			continue;
		in.layers_prefilled++;
		in.tokens = ly->n_tokens > in.tokens ? ly->n_tokens : in.tokens;
	}
	if (s->px) { /* the groups of the spans it holds, every one shared with the cache */
		in.prefix_tokens = s->px->prefix_tokens;
		in.shared_blocks = (uint64_t)s->px->n_spans * (s->px->hash_tokens >> m->lbt) *
				   m->cfg.n_layers * m->cfg.n_kv_heads;
	}
	if (!s->preempted)
		in.device_frames = (uint64_t)in.layers_prefilled * in.frames_per_layer;
	in.recall_ws_frames = kvt_ws_frames(m, s, in.tokens, &step);
	in.recall_step_frames = step;
	in.disk_blocks = (uint64_t)s->n_spilled * m->cfg.n_kv_heads;
	in.lost = s->lost;
	in.serial = s->serial;
	memcpy(out, &in, size);
	return 0;
}
