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
#include "policy.h"
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

KVT_API int kvt_seq_create(struct kvt_manager *m, uint64_t seq, uint32_t prompt_tokens)
{
	struct kvt_snapkv sp;
	struct kvt_seq *s;
	uint32_t count;
	int err;

	if (!m)
		return -EINVAL;
	if (prompt_tokens == 0 || prompt_tokens > INT32_MAX)
		return kvt_fail(m, -EINVAL, "sequence %llu: prompt of %u tokens (1..2^31-1)",
				(unsigned long long)seq, prompt_tokens);
	if (kvt_seqmap_get(&m->seqs, seq))
		return kvt_fail(m, -EEXIST, "sequence %llu is already live",
				(unsigned long long)seq);
	snapkv_params(m, prompt_tokens, &sp);
	count = kvt_snapkv_count(&sp);
	size_t bytes = sizeof(*s) + (size_t)m->cfg.n_layers * sizeof(s->layers[0]);

	s = kvt_aligned_alloc(_Alignof(struct kvt_seq), bytes);
	if (s)
		memset(s, 0, bytes);
	if (!s)
		return kvt_fail(m, -ENOMEM, "sequence %llu: no memory for its state",
				(unsigned long long)seq);
	s->id = seq;
	s->rc_head = KVT_NO_ENTRY;
	s->prompt_tokens = prompt_tokens;
	s->valid_topk = count;
	s->n_frames = DIV_UP(m->slots_sr + count, m->cfg.block_tokens);
	err = kvt_idmap_put(&m->seqs, seq, s);
	if (err) {
		free(s);
		return kvt_fail(m, err, "sequence %llu: cannot grow the sequence table",
				(unsigned long long)seq);
	}
	return 0;
}

/* Returns a layer's tier memory to the pools and frees its tables. */
static void release_layer(struct kvt_manager *m, struct kvt_seq *s, struct kvt_seq_layer *ly)
{
	if (ly->frames && !s->preempted)
		ALWAYS(kvt_pool_free(&m->dev, ly->frames, s->n_frames) == 0);
	if (ly->groups && s->n_spilled)
		kvt_spill_release_layer(m, s, ly);
	else if (ly->groups)
		ALWAYS(kvt_pool_free(&m->host, ly->groups, ly->n_groups) == 0);
	free(ly->frames);
	free(ly->groups);
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
	kvt_recall_free_seq(s, m->cfg.n_layers);
	for (uint32_t l = 0; l < m->cfg.n_layers; l++)
		release_layer(m, s, &s->layers[l]);
	ALWAYS(s->n_spilled == 0); /* every spilled group was in a table */
	kvt_idmap_del(&m->seqs, seq);
	free(s);
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
	for (uint32_t i = 0; i < count; i++)
		emit_run(m, ly, nx, src, h, (uint32_t)t[i], m->slots_sr + i, 1);
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

/* One kvt_prefill_layer call: its arguments, and the layer it builds apart from the sequence
   until every step has succeeded. */
struct prefill {
	struct kvt_seq *s;
	uint64_t seq;
	uint32_t layer;
	uint32_t L, nb, count; /* prompt tokens, host blocks, top-K positions per head */
	const void *k, *v, *q_obs;
	void *stream;
	struct kvt_snapkv sp;
	struct kvt_seq_layer ly; /* n_groups != 0 once its pool ids are taken */
};

/* The caller's errors: the layer and sequence usable, not prefilled, not preempted, the
   tensors present. Fills p->s and the sizes. 0 or the error, recorded. */
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
	p->count = p->s->valid_topk;
	if (!p->k || !p->v || (p->count && !p->q_obs))
		return kvt_fail(m, -EINVAL, "sequence %llu layer %u: NULL %s",
				(unsigned long long)p->seq, p->layer,
				!p->k	? "k"
				: !p->v ? "v"
					: "q_obs");
	p->L = p->s->prompt_tokens;
	p->nb = DIV_UP(p->L, m->cfg.block_tokens);
	return 0;
}

/* Capacity first, so an oversized prompt costs no allocation. The disk tier makes host room
   from other sequences (this one is stamped as in use). 0 or the error, recorded. */
static int prefill_room(struct kvt_manager *m, struct prefill *p)
{
	struct kvt_seq *s = p->s;
	uint32_t nb = p->nb;
	int err;

	s->stamp = ++m->stamp;
	if (m->dev.n_free >= s->n_frames && m->host.n_free < nb) {
		err = kvt_spill_room(m, nb);
		if (err && err != -ENOMEM)
			return kvt_fail(m, err,
					"sequence %llu layer %u: waiting for the device "
					"before spilling: %s",
					(unsigned long long)p->seq, p->layer, m->be->err);
	}
	if (m->dev.n_free < s->n_frames || m->host.n_free < nb)
		return kvt_fail(m, -ENOMEM,
				"sequence %llu layer %u: %s tier full (%u of %u groups "
				"free, %u needed)",
				(unsigned long long)p->seq, p->layer,
				m->dev.n_free < s->n_frames ? "device" : "host",
				m->dev.n_free < s->n_frames ? m->dev.n_free : m->host.n_free,
				m->dev.n_free < s->n_frames ? m->dev.n_units : m->host.n_units,
				m->dev.n_free < s->n_frames ? s->n_frames : nb);
	return 0;
}

/* The layer's tables and the call's scratch (selection, copy list, block metadata): nothing
   visible changes. 0 or -ENOMEM, recorded; what was allocated stays in p->ly for the caller
   to free. */
static int prefill_tables(struct kvt_manager *m, struct prefill *p)
{
	const struct kvt_config *c = &m->cfg;
	struct kvt_seq_layer *ly = &p->ly;
	int err = 0;

	ly->frames = kvt_malloc((size_t)p->s->n_frames * sizeof(*ly->frames));
	ly->groups = kvt_malloc((size_t)p->nb * sizeof(*ly->groups));
	ly->cap_groups = p->nb;
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
	if (!err) {
		uint64_t need = (uint64_t)c->n_kv_heads * gather_entries_per_head(m, p->s, false);
		uint64_t save_entries = 2ull * p->nb;

		need = need > save_entries ? need : save_entries;
		if (need > UINT32_MAX)
			err = -ENOMEM;
		else
			err = kvt_reserve((void **)&m->xf, &m->xf_cap, (uint32_t)need,
					  sizeof(*m->xf));
	}
	if (!err && m->keep_meta)
		err = m->cpu_device ? kvt_meta_prefill(m, ly, p->k, p->L)
				    : kvt_meta_reserve(m, ly, DIV_UP(p->L, c->block_tokens));
	if (err || !ly->frames || !ly->groups || (p->count && !ly->topk))
		return kvt_fail(m, -ENOMEM, "sequence %llu layer %u: no memory for its tables",
				(unsigned long long)p->seq, p->layer);
	return 0;
}

/* Takes the layer's device frame groups and host block groups, which prefill_room found free
   with nothing run since. 0, or -ENOMEM recorded (a violated invariant) with nothing taken. */
static int prefill_take(struct kvt_manager *m, struct prefill *p)
{
	int err = kvt_pool_alloc(&m->dev, p->s->n_frames, p->ly.frames);

	if (!err) {
		err = kvt_pool_alloc(&m->host, p->nb, p->ly.groups);
		if (err)
			ALWAYS(kvt_pool_free(&m->dev, p->ly.frames, p->s->n_frames) == 0);
	}
	if (NEVER(err))
		return kvt_fail(m, err, "sequence %llu layer %u: groups counted free are not",
				(unsigned long long)p->seq, p->layer);
	p->ly.n_groups = p->nb;
	return 0;
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

/* Select (SnapKV), on the CPU where it can read the tensors, else on the backend's device
   (the layer's K never leaves it). Without payload there is no data to score: keep the
   candidates nearest the recent window, which is what a recency prior would keep. Then the
   block metadata for recall where the device builds it from the layer's K. 0 or the error,
   recorded. */
static int prefill_select(struct kvt_manager *m, struct prefill *p)
{
	const struct kvt_config *c = &m->cfg;
	struct kvt_seq_layer *ly = &p->ly;
	uint32_t L = p->L, count = p->count;
	int err;

	if (count && m->payload) {
		err = m->cpu_device
			      ? kvt_snapkv_select(&p->sp, p->k, p->q_obs, ly->topk, m->sel_scratch)
		      : m->ops->select
			      ? KVT_XFER(m, select, &p->sp, p->k, p->q_obs, ly->topk, p->stream)
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
	if (count && NEVER(!topk_in_order(m, p)))
		return kvt_fail(m, -EIO, "sequence %llu layer %u: selected positions out of order",
				(unsigned long long)p->seq, p->layer);
	if (m->keep_meta && !m->cpu_device) {
		err = KVT_XFER(m, block_meta, c->dtype, c->head_dim, c->n_kv_heads, L,
			       c->block_tokens, p->k, ly->rc->meta, p->stream);
		if (err)
			return kvt_fail(m, err, "sequence %llu layer %u: block metadata: %s",
					(unsigned long long)p->seq, p->layer, m->be->err);
		ly->rc->meta_n = L;
	}
	return 0;
}

/* Gathers the sink, ring and top-K rows of the caller's tensors into the layer's frames. 0
   or the error, recorded. */
static int prefill_gather(struct kvt_manager *m, struct prefill *p)
{
	const struct row_src src = {
		.k = ptr_u64(p->k),
		.v_minus_k = ptr_u64(p->v) - ptr_u64(p->k), /* K address + this = V address */
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

/* Saves the whole layer into the host history: per block index, all heads' K rows in one
   strided entry and their V rows in another. 0 with the save's ticket, or the error,
   recorded, once no part of the save is still in flight. */
static int prefill_save(struct kvt_manager *m, struct prefill *p, uint64_t *ticket)
{
	const struct kvt_config *c = &m->cfg;
	uint64_t layer_bytes = (uint64_t)p->L * m->row_bytes;
	uint32_t nx = 0;
	int err;

	if (NEVER(2ull * p->nb > m->xf_cap)) /* prefill_tables reserved the list */
		return kvt_fail(m, -EIO, "sequence %llu layer %u: save list too short",
				(unsigned long long)p->seq, p->layer);
	for (uint32_t b = 0; b < p->nb; b++) {
		uint32_t p0 = b * c->block_tokens;
		uint32_t n = p->L - p0 < c->block_tokens ? p->L - p0 : c->block_tokens;
		struct kvt_xfer e = {
			.src = (uint64_t)p0 * m->row_bytes,
			.dst = kvt_host_row(m, &p->ly, 0, p0),
			.bytes = n * m->row_bytes,
			.reps = c->n_kv_heads,
			.src_stride = layer_bytes,
			.dst_stride = m->block_bytes,
		};

		m->xf[nx++] = e;
		e.src += c->n_kv_heads * layer_bytes;
		e.dst += m->v_offset;
		m->xf[nx++] = e;
	}
	struct kvt_save_src src[2] = {
		{ptr_u64(p->k), c->n_kv_heads * layer_bytes},
		{ptr_u64(p->v), c->n_kv_heads * layer_bytes},
	};
	err = KVT_XFER(m, save, src, 2, m->xf, nx, p->stream, ticket);
	if (err) {
		/* A multi-chunk save may have handed chunks over: let them land before the
		   blocks return to the pool. */
		m->ops->save_wait(m->be, UINT64_MAX);
		return kvt_fail(m, err, "sequence %llu layer %u: save to host: %s",
				(unsigned long long)p->seq, p->layer, m->be->err);
	}
	return 0;
}

/* Installs the built layer in the sequence and counts the call. */
static void prefill_commit(struct kvt_manager *m, struct prefill *p, uint64_t ticket)
{
	struct kvt_seq_layer *ly = &p->ly;
	uint32_t L = p->L, resident = (L < m->slots_sr ? L : m->slots_sr) + p->count;
	uint32_t H = m->cfg.n_kv_heads;

	ly->n_tokens = L;
	ly->ring_slot = kvt_ring_slot(L, m->cfg.sink_tokens, m->cfg.recent_tokens);
	ly->dev_next = kvt_dev_row(m, ly, 0, ly->ring_slot);
	ly->host_next = kvt_host_cursor(m, ly);
	p->s->layers[p->layer] = *ly;
	p->s->layers_prefilled++;
	p->s->save_ticket = ticket;
	m->st.prefill_layers++;
	m->st.saves_submitted++;
	m->st.tokens_prompt += L;
	m->st.tokens_saved += L;
	m->st.tokens_resident += resident;
	m->st.bytes_d2d += 2ull * resident * m->row_bytes * H;
	m->st.bytes_d2h += 2ull * H * L * m->row_bytes;
}

KVT_API int kvt_prefill_layer(struct kvt_manager *m, uint64_t seq, uint32_t layer, const void *k,
			      const void *v, const void *q_obs, void *stream)
{
	struct prefill p = {
		.seq = seq,
		.layer = layer,
		.k = k,
		.v = v,
		.q_obs = q_obs,
		.stream = stream,
	};
	uint64_t ticket;
	int err;

	if (!m)
		return -EINVAL;
	err = prefill_check(m, &p);
	if (!err)
		err = prefill_room(m, &p);
	if (err)
		return err;
	err = prefill_tables(m, &p);
	if (!err)
		err = prefill_take(m, &p);
	if (!err)
		err = prefill_select(m, &p);
	if (!err)
		err = prefill_gather(m, &p);
	if (!err)
		err = prefill_save(m, &p, &ticket);
	if (err)
		goto fail;
	prefill_commit(m, &p, ticket);
	return 0;

fail:
	if (p.ly.n_groups) {
		kvt_dev_quiesce(m); /* a copy into the frames may be queued; see kvt_dev_quiesce */
		ALWAYS(kvt_pool_free(&m->host, p.ly.groups, p.ly.n_groups) == 0);
		ALWAYS(kvt_pool_free(&m->dev, p.ly.frames, p.s->n_frames) == 0);
	}
	free(p.ly.frames);
	free(p.ly.groups);
	free(p.ly.topk);
	kvt_recall_layer_free(p.ly.rc);
	return err;
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
		struct kvt_seq *s = kvt_batch_member(m, seqs[i], layer, stamp, "decode", &err);
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

			if (kvt_reserve((void **)&ly->groups, &cap, ly->n_groups + 1,
					sizeof(*ly->groups)))
				return kvt_fail(m, -ENOMEM,
						"decode: sequence %llu: no memory for its "
						"block table",
						(unsigned long long)seqs[i]);
			ly->cap_groups = cap;
		}
		if (m->keep_meta && kvt_meta_reserve(m, ly, ly->n_groups + 1))
			return kvt_fail(m, -ENOMEM,
					"decode: sequence %llu: no memory for block metadata",
					(unsigned long long)seqs[i]);
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
	g = (struct kvt_append_geom){m->cfg.n_kv_heads, m->row_bytes, m->block_bytes, m->v_offset};
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
		s->save_ticket = ticket;
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
	/* Every recalled frame must still hold its block. */
	for (uint32_t h = 0; rc && rc->view_n && h < c->n_kv_heads; h++) {
		if (kvt_view_stale(m, rc, h))
			return kvt_fail(m, -ESTALE,
					"attend: sequence %llu layer %u: a recalled block was "
					"evicted since (recall again)",
					(unsigned long long)seq, layer);
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
			uint32_t id = rc->view_ent[(size_t)h * rc->view_cap + i];
			const struct kvt_rc_entry *e = &m->rc.e[id];
			uint64_t mask = kvt_block_resident(m, s, ly, h, e->block, e->n_valid);

			nseg += recall_segments(m, m->rc.base + (uint64_t)id * m->block_bytes,
						e->n_valid, mask, m->segs + nseg);
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
	uint64_t need, entries, rows = 0;
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
	   spilled ones, then one gather. */
	for (uint32_t l0 = 0, l1; l0 < c->n_layers; l0 = l1) {
		uint64_t bound = 0;

		s->stamp = ++m->stamp; /* the previous chunk's pins go */
		for (l1 = l0; l1 < c->n_layers; l1++) {
			uint64_t b = resident_blocks_bound(m, s, &s->layers[l1]);

			if (l1 > l0 && bound + b > m->host.n_units)
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
	for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
		const struct kvt_seq_layer *ly = &s->layers[l];

		if (!ly->n_tokens)
			continue;
		in.layers_prefilled++;
		in.tokens = ly->n_tokens > in.tokens ? ly->n_tokens : in.tokens;
		in.host_blocks += (uint64_t)ly->n_groups * m->cfg.n_kv_heads;
	}
	if (!s->preempted)
		in.device_frames = (uint64_t)in.layers_prefilled * in.frames_per_layer;
	in.recall_ws_frames = kvt_ws_frames(m, s, in.tokens, &step);
	in.recall_step_frames = step;
	in.disk_blocks = (uint64_t)s->n_spilled * m->cfg.n_kv_heads;
	in.lost = s->lost;
	memcpy(out, &in, size);
	return 0;
}
