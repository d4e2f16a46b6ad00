/* SPDX-License-Identifier: MIT */
/*
 * Attention tables (kvtier.h, "Attention tables"): one layer's attention inputs for a decode
 * step's batch, written in one call into fixed-stride buffers an engine's kernel reads, in
 * place of one kvt_seq_frames and one kvt_seq_recall_view per (member, kv head); and the
 * batched attention over them (kvt_attend_batch).
 *
 * The device tier and the recall cache share one arena, so both kinds of frame are indices of
 * one pool of blocks (block_bytes each): frame group g's block of kv head h is block g * H + h,
 * and recall frame f is block n_dev * H + f, n_dev being the device tier's frame groups.
 *
 * A call checks every member and brings its recall view up to date first (on the CUDA
 * backend with the regions there, a read of each view the device changed), so that an error
 * writes nothing; then it writes the tables: straight into the caller's buffers where they are
 * host memory, else into a host copy that goes to the device. The batched attention builds
 * the same tables for itself (capacities: the batch's largest counts), then runs the policy's
 * reference per row on the host, or one launch for the batch on the backend's device.
 */
#include <errno.h>
#include <string.h>

#include "kvtier.h"
#include "gpu.h"
#include "policy.h"
#include "recall.h"
#include "tables.h"

KVT_API int kvt_manager_pool(const struct kvt_manager *m, struct kvt_pool_info *out)
{
	uint64_t H;

	if (!m || !out)
		return -EINVAL;
	H = m->cfg.n_kv_heads;
	*out = (struct kvt_pool_info){
		.base = m->dev_base,
		.first_recall = (uint64_t)m->dev.n_units * H,
		.n_blocks = (uint64_t)m->dev.n_units * H + m->rc.n,
		.block_bytes = m->block_bytes,
		.v_offset = m->v_offset,
		.row_bytes = m->row_bytes,
		.block_tokens = m->cfg.block_tokens,
	};
	return 0;
}

/* Where a call writes: the caller's buffers, or the host copy of them. */
struct tab_dst {
	uint32_t *n_tokens, *frames, *n_recall, *recall, *recall_tokens;
	uint64_t *recall_skip;
};

/* One entry of a row's recall part, sorted by block before it is written. */
struct tab_ref {
	uint32_t block, index, tokens;
	uint64_t skip;
};

/* Lays the host copy out at base (NULL: only counts): the 8-byte array first, so that it is
   aligned, then the count arrays' rows [0, rows), then the entry arrays' rows [0, n_rows).
   Its bytes, rounded up to 8; 0 when they would not fit a size_t. */
static size_t tab_layout(struct tab_dst *d, char *base, uint64_t rows, uint64_t n_rows, uint64_t mf,
			 uint64_t mr)
{
	uint64_t off[7], b = 0;

	if (n_rows && (mf > UINT64_MAX / 16 / n_rows || mr > UINT64_MAX / 32 / n_rows))
		return 0;
	off[0] = b, b += n_rows * mr * 8; /* recall_skip */
	off[1] = b, b += rows * 4;	  /* n_tokens */
	off[2] = b, b += rows * 4;	  /* n_recall */
	off[3] = b, b += n_rows * mf * 4; /* frames */
	off[4] = b, b += n_rows * mr * 4; /* recall */
	off[5] = b, b += n_rows * mr * 4; /* recall_tokens */
	off[6] = b = (b + 7) / 8 * 8;	  /* the end */
	if (b > SIZE_MAX / 4)
		return 0;
	if (base)
		*d = (struct tab_dst){
			.recall_skip = (uint64_t *)(void *)(base + off[0]),
			.n_tokens = (uint32_t *)(void *)(base + off[1]),
			.n_recall = (uint32_t *)(void *)(base + off[2]),
			.frames = (uint32_t *)(void *)(base + off[3]),
			.recall = (uint32_t *)(void *)(base + off[4]),
			.recall_tokens = (uint32_t *)(void *)(base + off[5]),
		};
	return (size_t)off[6];
}

/* The checks of every member (the errors the call can have before it writes), against the
   capacities of t (max_batch is checked by the caller); brings each member's view up to date.
   The batch's most frames and most recalled blocks of one row in *most_f, *most_r. */
static int tables_check(struct kvt_manager *m, uint32_t layer, const uint64_t *ids, uint32_t n,
			const struct kvt_attn_tables *t, uint32_t *most_f, uint32_t *most_r,
			const char *what)
{
	uint64_t stamp = ++m->stamp;
	struct kvt_recall_layer **rcs = NULL;
	int err = 0;

	*most_f = *most_r = 0;
	if (m->dev_regions && !(rcs = kvt_malloc((size_t)n * sizeof(*rcs))))
		return kvt_fail(m, -ENOMEM, "%s: no memory for a batch of %u", what, n);
	for (uint32_t i = 0; i < n && !err; i++) {
		struct kvt_seq *s = kvt_batch_member(m, ids, i, layer, stamp, what, &err);

		if (!s)
			break;
		if (s->n_frames > t->max_frames)
			err = kvt_fail(m, -ENOSPC, "%s: sequence %llu has %u frames, room for %u",
				       what, (unsigned long long)ids[i], s->n_frames,
				       t->max_frames);
		*most_f = s->n_frames > *most_f ? s->n_frames : *most_f;
		if (rcs)
			rcs[i] = s->layers[layer].rc;
	}
	/* the views the device changed, read back together: one wait for the batch */
	if (!err && rcs)
		err = kvt_recall_pull_many(m, rcs, n);
	free(rcs);
	for (uint32_t i = 0; i < n && !err; i++) {
		const struct kvt_recall_layer *rc = kvt_member(m, ids, i)->layers[layer].rc;

		if (kvt_view_stale(rc))
			return kvt_fail(m, -ESTALE, "%s: sequence %llu layer %u: %s", what,
					(unsigned long long)ids[i], layer, kvt_view_stale_why(rc));
		for (uint32_t h = 0; rc && rc->view_n && h < m->cfg.n_kv_heads; h++) {
			if (rc->view_n[h] > t->max_recall)
				return kvt_fail(m, -ENOSPC,
						"%s: sequence %llu layer %u head %u recalled %u "
						"blocks, room for %u",
						what, (unsigned long long)ids[i], layer, h,
						rc->view_n[h], t->max_recall);
			*most_r = rc->view_n[h] > *most_r ? rc->view_n[h] : *most_r;
		}
	}
	return err;
}

/* Row (i, h)'s recall part, ascending by block, into ref[0 .. count). */
static uint32_t row_recall(const struct kvt_manager *m, const struct kvt_seq *s, uint32_t layer,
			   uint32_t h, struct tab_ref *ref)
{
	const struct kvt_seq_layer *ly = &s->layers[layer];
	const struct kvt_recall_layer *rc = ly->rc;
	uint32_t H = m->cfg.n_kv_heads, cnt = rc && rc->view_n ? rc->view_n[h] : 0;
	uint64_t frame0 = (uint64_t)m->dev.n_units * H;

	for (uint32_t j = 0; j < cnt; j++) {
		uint32_t id = rc->view[(size_t)h * rc->view_cap + j];
		const struct kvt_region_slot *e = &rc->rg.slot[id];
		struct tab_ref x = {
			.block = e->key / H,
			.index = (uint32_t)(frame0 + rc->frame[id]),
			.tokens = e->n_valid,
			.skip = kvt_block_resident(m, s, ly, h, e->key / H, e->n_valid),
		};
		uint32_t k = j;

		while (k > 0 && ref[k - 1].block > x.block) {
			ref[k] = ref[k - 1];
			k--;
		}
		ref[k] = x;
	}
	return cnt;
}

/* Writes the tables into d, rows laid out with t's capacities: the counts of rows [0,
   max_batch), the entries of the batch's rows. */
static void tables_fill(const struct kvt_manager *m, uint32_t layer, const uint64_t *ids,
			uint32_t n, const struct kvt_attn_tables *t, const struct tab_dst *d,
			struct tab_ref *ref)
{
	const uint32_t H = m->cfg.n_kv_heads, mf = t->max_frames, mr = t->max_recall;

	for (uint64_t x = (uint64_t)n * H; x < (uint64_t)t->max_batch * H; x++)
		d->n_tokens[x] = d->n_recall[x] = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct kvt_seq *s = kvt_member(m, ids, i);
		const struct kvt_seq_layer *ly = &s->layers[layer];
		uint32_t nt =
			(ly->n_tokens < m->slots_sr ? ly->n_tokens : m->slots_sr) + s->valid_topk;

		for (uint32_t h = 0; h < H; h++) {
			size_t row = (size_t)i * H + h;
			uint32_t *fr = d->frames + row * mf, cnt = row_recall(m, s, layer, h, ref);
			uint32_t *rx = d->recall + row * mr, *rt = d->recall_tokens + row * mr;
			uint64_t *rs = d->recall_skip + row * mr;

			d->n_tokens[row] = nt;
			for (uint32_t f = 0; f < mf; f++)
				fr[f] = f < s->n_frames ? ly->frames[f] * H + h : UINT32_MAX;
			d->n_recall[row] = cnt;
			for (uint32_t j = 0; j < mr; j++) {
				rx[j] = j < cnt ? ref[j].index : UINT32_MAX;
				rt[j] = j < cnt ? ref[j].tokens : 0;
				rs[j] = j < cnt ? ref[j].skip : 0;
			}
		}
	}
}

/* Room in m->tab for a host copy of `bytes` (a multiple of 8) and, after it, the sort scratch
   of `most` refs and `floats` floats. */
static int tab_reserve(struct kvt_manager *m, size_t bytes, uint32_t most, uint64_t floats)
{
	uint64_t words = bytes / 8 + ((uint64_t)most * sizeof(struct tab_ref) + 7) / 8 +
			 (floats + 1) / 2 + 1;

	if (words > UINT32_MAX || kvt_reserve((void **)&m->tab, &m->tab_cap, (uint32_t)words, 8))
		return -ENOMEM;
	return 0;
}

/* One array of a host copy for the caller's device buffer. */
struct tab_copy {
	void *dst;
	const void *src;
	uint64_t bytes;
};

/* Queues the n copies on stream (empty ones skipped): 0, or the first copy's error, recorded
   (the arrays copied before it are written). */
static int copy_out(struct kvt_manager *m, const struct tab_copy *cp, size_t n, void *stream,
		    const char *what)
{
	for (size_t k = 0; k < n; k++) {
		int err;

		if (!cp[k].bytes)
			continue;
		err = KVT_XFER(m, dmem_copy, (uint64_t)(uintptr_t)cp[k].dst, 0, cp[k].src,
			       cp[k].bytes, stream);
		if (err)
			return kvt_fail(m, err, "%s: copy to the device: %s", what, m->be->err);
	}
	return 0;
}

/* The checks the calls writing into the caller's buffers share: the layer, the batch against
   max_batch, and a device the library can write (unless the buffers are host memory). */
static int out_check(struct kvt_manager *m, uint32_t layer, uint32_t n, uint32_t max_batch,
		     bool direct, const char *what)
{
	if (layer >= m->cfg.n_layers)
		return kvt_fail(m, -EINVAL, "%s: layer %u out of range", what, layer);
	if (n > max_batch)
		return kvt_fail(m, -ENOSPC, "%s: a batch of %u, room for %u", what, n, max_batch);
	if (!direct && !m->ops->dmem_copy)
		return kvt_fail(m, -ENOTSUP, "%s: backend %s cannot write device memory", what,
				m->ops->name);
	return 0;
}

/* The batch's own tables, for the calls that read them themselves (the paged form, the
   batched attention): checks every member, sets t's capacities to the batch's largest counts,
   lays the tables out at the start of m->tab (*bytes of them) with `extra` bytes after them
   (a multiple of 8), then the sort scratch and `floats` floats, and fills them into *d. 0 or
   the error, recorded. */
static int tables_own(struct kvt_manager *m, uint32_t layer, const uint64_t *ids, uint32_t n,
		      struct kvt_attn_tables *t, struct tab_dst *d, size_t extra, uint64_t floats,
		      size_t *bytes, const char *what)
{
	uint64_t rows = (uint64_t)n * m->cfg.n_kv_heads;
	uint32_t most_f, most_r;
	int err;

	*t = (struct kvt_attn_tables){.size = sizeof(*t),
				      .max_batch = n,
				      .max_frames = UINT32_MAX,
				      .max_recall = UINT32_MAX};
	err = tables_check(m, layer, ids, n, t, &most_f, &most_r, what);
	if (err)
		return err;
	t->max_frames = most_f ? most_f : 1;
	t->max_recall = most_r ? most_r : 1;
	*bytes = tab_layout(d, NULL, rows, rows, t->max_frames, t->max_recall);
	if (!*bytes || tab_reserve(m, *bytes + extra, t->max_recall, floats))
		return kvt_fail(m, -ENOMEM, "%s: no memory for the tables of %u sequences", what,
				n);
	tab_layout(d, (char *)m->tab, rows, rows, t->max_frames, t->max_recall);
	tables_fill(m, layer, ids, n, t, d,
		    (struct tab_ref *)(void *)((char *)m->tab + *bytes + extra));
	return 0;
}

/* The checks of a caller's struct kvt_attn_tables every call taking one makes: not NULL, its
   size, no NULL buffer. 0 or -EINVAL, recorded. */
static int tables_args(struct kvt_manager *m, const struct kvt_attn_tables *t, const char *what)
{
	if (!t)
		return kvt_fail(m, -EINVAL, "%s: NULL tables", what);
	if (t->size < sizeof(*t))
		return kvt_fail(m, -EINVAL, "%s: size %u, want at least %zu", what, t->size,
				sizeof(*t));
	if (!t->n_batch || !t->n_tokens || !t->frames || !t->n_recall || !t->recall ||
	    !t->recall_tokens || !t->recall_skip)
		return kvt_fail(m, -EINVAL, "%s: NULL buffer", what);
	return 0;
}

int kvt_tables_write(struct kvt_manager *m, uint32_t layer, const uint64_t *ids, uint32_t n,
		     const struct kvt_attn_tables *t, void *stream)
{
	const uint32_t H = m->cfg.n_kv_heads;
	bool direct = m->cpu_device || !m->payload;
	uint64_t rows, n_rows;
	uint32_t most_f, most_r;
	struct tab_dst d;
	size_t bytes;
	int err;

	err = tables_args(m, t, "tables");
	if (err)
		return err;
	err = out_check(m, layer, n, t->max_batch, direct, "tables");
	if (err)
		return err;
	rows = (uint64_t)t->max_batch * H;
	n_rows = (uint64_t)n * H;
	bytes = tab_layout(&d, NULL, rows, n_rows, t->max_frames, t->max_recall);
	if (!bytes)
		return kvt_fail(m, -ENOMEM, "tables: %u rows of %u + %u entries do not fit memory",
				t->max_batch, t->max_frames, t->max_recall);
	err = tables_check(m, layer, ids, n, t, &most_f, &most_r, "tables");
	if (err)
		return err;
	if (direct) {
		d = (struct tab_dst){t->n_tokens, t->frames,	    t->n_recall,
				     t->recall,	  t->recall_tokens, t->recall_skip};
		bytes = 0; /* only the refs */
	}
	if (tab_reserve(m, bytes, most_r, 0))
		return kvt_fail(m, -ENOMEM, "tables: no memory for a copy of %zu bytes", bytes);
	if (!direct)
		tab_layout(&d, (char *)m->tab, rows, n_rows, t->max_frames, t->max_recall);
	tables_fill(m, layer, ids, n, t, &d, (struct tab_ref *)(void *)((char *)m->tab + bytes));
	if (direct) {
		*t->n_batch = n;
		return 0;
	}
	{
		const struct tab_copy cp[] = {
			{t->n_batch, &n, sizeof(n)},
			{t->n_tokens, d.n_tokens, rows * 4},
			{t->n_recall, d.n_recall, rows * 4},
			{t->frames, d.frames, n_rows * t->max_frames * 4},
			{t->recall, d.recall, n_rows * t->max_recall * 4},
			{t->recall_tokens, d.recall_tokens, n_rows * t->max_recall * 4},
			{t->recall_skip, d.recall_skip, n_rows * t->max_recall * 8},
		};

		return copy_out(m, cp, sizeof(cp) / sizeof(cp[0]), stream, "tables");
	}
}

/* The policy's view of tables laid out at d (capacities of t) over the manager's pool. */
static struct kvt_attn_desc attn_desc(const struct kvt_manager *m, const struct tab_dst *d,
				      uint32_t n, const struct kvt_attn_tables *t)
{
	struct kvt_pool_info p;

	kvt_manager_pool(m, &p);
	return (struct kvt_attn_desc){
		.n_tokens = d->n_tokens,
		.frames = d->frames,
		.n_recall = d->n_recall,
		.recall = d->recall,
		.recall_tokens = d->recall_tokens,
		.recall_skip = d->recall_skip,
		.pool = p.base,
		.pool_blocks = p.n_blocks,
		.block_bytes = p.block_bytes,
		.v_offset = p.v_offset,
		.row_bytes = p.row_bytes,
		.block_tokens = p.block_tokens,
		.n = n,
		.n_kv_heads = m->cfg.n_kv_heads,
		.g_count = m->group_q,
		.head_dim = m->cfg.head_dim,
		.max_frames = t->max_frames,
		.max_recall = t->max_recall,
	};
}

/* The device buffer of the batched attention (tables, then the kernel's scratch) holds at
   least bytes: grown (the old one given back once the device's queued work is done). */
static int att_dev_reserve(struct kvt_manager *m, uint64_t bytes, void *stream)
{
	uint64_t addr = 0;
	int err;

	if (bytes <= m->att_dev_bytes)
		return 0;
	bytes = bytes < 2 * m->att_dev_bytes ? 2 * m->att_dev_bytes : bytes;
	err = m->ops->dmem_alloc(m->be, bytes, stream, &addr);
	if (err)
		return err;
	if (m->att_dev)
		m->ops->dmem_free(m->be, m->att_dev);
	m->att_dev = addr;
	m->att_dev_bytes = bytes;
	return 0;
}

/* The batched attention of desc's first n members, for kvt_attend_run and kvt_attend_tables:
   where the device tier is CPU memory, the policy's reference per row once the frames'
   writers are done (f: kvt_attend_table_scratch floats); else one launch on the backend's
   device over every row of desc (its padding rows skipped there), `splits` parts per row,
   the kernel's scratch at dscratch. 0 or the error, recorded under `what`. */
static int attend_launch(struct kvt_manager *m, const struct kvt_attn_desc *desc, uint32_t n,
			 const void *q, void *out, float *lse, float *f, uint64_t dscratch,
			 uint32_t splits, void *stream, const char *what)
{
	const uint32_t G = m->group_q;
	const size_t qrow = (size_t)G * m->cfg.head_dim * m->esize;
	int err;

	if (m->cpu_device) {
		err = m->ops->sync(m->be, NULL); /* the frames' writers */
		if (err)
			return kvt_fail(m, err, "%s: %s", what, m->be->err);
		for (uint64_t r = 0; r < (uint64_t)n * m->cfg.n_kv_heads; r++)
			kvt_attend_table(m->cfg.dtype, desc, (uint32_t)r,
					 (const char *)q + r * qrow, (char *)out + r * qrow,
					 lse ? lse + r * G : NULL, f);
		return 0;
	}
	m->dev_queued = true; /* it reads frames */
	err = m->ops->attend_batch(m->be, m->cfg.dtype, desc, q, out, lse, dscratch, splits,
				   stream);
	return err ? kvt_fail(m, err, "%s: %s", what, m->be->err) : 0;
}

int kvt_attend_run(struct kvt_manager *m, uint32_t layer, const uint64_t *ids, uint32_t n,
		   const void *q, void *out, float *lse, void *stream)
{
	const uint32_t H = m->cfg.n_kv_heads, D = m->cfg.head_dim, G = m->group_q;
	struct kvt_attn_tables t;
	struct kvt_attn_desc desc;
	struct tab_dst d;
	uint64_t sbytes, off, most_t = 0;
	uint32_t splits;
	size_t bytes;
	int err;

	if (!q || !out)
		return kvt_fail(m, -EINVAL, "attend: NULL %s", !q ? "q" : "out");
	if (layer >= m->cfg.n_layers)
		return kvt_fail(m, -EINVAL, "attend: layer %u out of range", layer);
	if (!m->payload || (!m->cpu_device && (!m->ops->attend_batch || !m->ops->dmem_alloc)))
		return kvt_fail(m, -ENOTSUP, "attend: backend %s has no batched attention",
				m->ops->name);
	err = tables_own(m, layer, ids, n, &t, &d, 0, kvt_attend_table_scratch(G, D), &bytes,
			 "attend");
	if (err)
		return err;
	if (m->cpu_device) {
		/* the rows' scratch after the refs */
		float *f = (float *)(void *)((char *)m->tab + bytes +
					     ((uint64_t)t.max_recall * sizeof(struct tab_ref) + 7) /
						     8 * 8);

		desc = attn_desc(m, &d, n, &t);
		return attend_launch(m, &desc, n, q, out, lse, f, 0, 0, stream, "attend");
	}
	/* the tables go to the device in one copy, the kernel's scratch after them; the rows'
	   longest token list sets how finely the kernel splits them */
	for (uint64_t r = 0; r < (uint64_t)n * H; r++) {
		uint64_t tk = d.n_tokens[r] + (uint64_t)d.n_recall[r] * m->cfg.block_tokens;

		most_t = tk > most_t ? tk : most_t;
	}
	splits = kvt_gpu_attend_splits((uint64_t)n * H, G, most_t);
	off = (bytes + 255) / 256 * 256;
	sbytes = kvt_gpu_attend_batch_scratch((uint64_t)n * H, G, D, splits);
	err = att_dev_reserve(m, off + sbytes, stream);
	if (!err)
		err = KVT_XFER(m, dmem_copy, m->att_dev, 0, m->tab, bytes, stream);
	if (err)
		return kvt_fail(m, err, "attend: the tables to the device: %s", m->be->err);
	tab_layout(&d, (char *)(uintptr_t)m->att_dev, (uint64_t)n * H, (uint64_t)n * H,
		   t.max_frames, t.max_recall);
	desc = attn_desc(m, &d, n, &t);
	return attend_launch(m, &desc, n, q, out, lse, NULL, m->att_dev + off, splits, stream,
			     "attend");
}

KVT_API int kvt_attend_batch(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			     uint32_t n, const void *q, void *out, float *lse, void *stream)
{
	if (!m)
		return -EINVAL;
	if (!seqs || n == 0)
		return kvt_fail(m, -EINVAL, "attend: %s", n == 0 ? "empty batch" : "NULL seqs");
	return kvt_attend_run(m, layer, seqs, n, q, out, lse, stream);
}

/* The checks kvt_attend_tables and its scratch query share; *splits and *bytes: the kernel's
   split count and scratch of t's capacities (0 bytes where the host runs it). */
static int attend_tables_check(struct kvt_manager *m, const struct kvt_attn_tables *t,
			       uint32_t *splits, uint64_t *bytes)
{
	const uint32_t H = m->cfg.n_kv_heads, G = m->group_q, D = m->cfg.head_dim;
	uint64_t rows, most;
	int err;

	*splits = 1;
	*bytes = 0;
	err = tables_args(m, t, "attend tables");
	if (err)
		return err;
	if (!t->max_batch || !t->max_frames || !t->max_recall)
		return kvt_fail(m, -EINVAL, "attend tables: a capacity of 0");
	if (!m->payload || (!m->cpu_device && !m->ops->attend_batch))
		return kvt_fail(m, -ENOTSUP, "attend tables: backend %s has no batched attention",
				m->ops->name);
	rows = (uint64_t)t->max_batch * H;
	most = ((uint64_t)t->max_frames + t->max_recall) * m->cfg.block_tokens;
	*splits = kvt_gpu_attend_splits(rows, G, most);
	*bytes = m->cpu_device ? 0 : kvt_gpu_attend_batch_scratch(rows, G, D, *splits);
	if (rows * *splits > INT32_MAX || rows * G > INT32_MAX)
		return kvt_fail(m, -E2BIG, "attend tables: %u rows of %u kv heads, too many",
				t->max_batch, H);
	return 0;
}

KVT_API int kvt_attend_tables_scratch(struct kvt_manager *m, const struct kvt_attn_tables *t,
				      uint64_t *bytes)
{
	uint32_t splits = 1;
	uint64_t b = 0;
	int err;

	if (!m)
		return -EINVAL;
	if (!bytes)
		return kvt_fail(m, -EINVAL, "attend tables: NULL bytes");
	err = attend_tables_check(m, t, &splits, &b);
	if (!err)
		*bytes = b;
	return err;
}

KVT_API int kvt_attend_tables(struct kvt_manager *m, const struct kvt_attn_tables *t, const void *q,
			      void *out, float *lse, void *scratch, uint64_t scratch_bytes,
			      void *stream)
{
	struct kvt_attn_desc desc;
	struct tab_dst d;
	uint32_t splits = 1, n;
	uint64_t need = 0;
	int err;

	if (!m)
		return -EINVAL;
	err = attend_tables_check(m, t, &splits, &need);
	if (err)
		return err;
	if (!q || !out)
		return kvt_fail(m, -EINVAL, "attend tables: NULL %s", !q ? "q" : "out");
	if (!m->cpu_device && (!scratch || scratch_bytes < need))
		return kvt_fail(m, -ENOSPC, "attend tables: scratch of %llu bytes, want %llu",
				(unsigned long long)scratch_bytes, (unsigned long long)need);
	d = (struct tab_dst){t->n_tokens, t->frames,	    t->n_recall,
			     t->recall,	  t->recall_tokens, t->recall_skip};
	desc = attn_desc(m, &d, t->max_batch, t);
	desc.n_batch = t->n_batch;
	if (m->cpu_device) {
		if (tab_reserve(m, 0, 0, kvt_attend_table_scratch(m->group_q, m->cfg.head_dim)))
			return kvt_fail(m, -ENOMEM, "attend tables: no memory for the scratch");
		n = *t->n_batch < t->max_batch ? *t->n_batch : t->max_batch;
		return attend_launch(m, &desc, n, q, out, lse, (float *)(void *)m->tab, 0, 0,
				     stream, "attend tables");
	}
	return attend_launch(m, &desc, t->max_batch, q, out, lse, NULL,
			     (uint64_t)(uintptr_t)scratch, splits, stream, "attend tables");
}

/* Counts the paged form of tables d (n members, capacities of t): resident pages and
   recalled tokens of all rows; with out, writes them there (host memory). */
static void paged_fill(const struct kvt_manager *m, const struct tab_dst *d, uint32_t n,
		       const struct kvt_attn_tables *t, uint64_t *pages, uint64_t *tokens,
		       const struct kvt_paged_tables *out, uint32_t max_batch)
{
	uint32_t H = m->cfg.n_kv_heads, bt = m->cfg.block_tokens;
	uint64_t np = 0, nt = 0, rows = (uint64_t)n * H;

	if (out)
		out->indptr[0] = out->r_indptr[0] = 0;
	for (uint64_t r = 0; r < (uint64_t)max_batch * H; r++) {
		uint32_t tk = r < rows ? d->n_tokens[r] : 0, pg = (tk + bt - 1) / bt;

		for (uint32_t p = 0; out && p < pg; p++)
			out->indices[np + p] = (int32_t)d->frames[r * t->max_frames + p];
		np += pg;
		for (uint32_t j = 0; r < rows && j < d->n_recall[r]; j++) {
			size_t x = r * t->max_recall + j;

			for (uint32_t w = 0; w < d->recall_tokens[x]; w++) {
				if (d->recall_skip[x] >> w & 1)
					continue;
				if (out)
					out->r_indices[nt] =
						(int32_t)((uint64_t)d->recall[x] * 2 * bt + w);
				nt++;
			}
		}
		if (out) {
			out->indptr[r + 1] = (int32_t)np;
			out->last_page_len[r] = (int32_t)(pg ? tk - (pg - 1) * bt : 0);
			out->r_indptr[r + 1] = (int32_t)nt;
		}
	}
	*pages = np;
	*tokens = nt;
}

int kvt_paged_write(struct kvt_manager *m, uint32_t layer, const uint64_t *ids, uint32_t n,
		    const struct kvt_paged_tables *p, void *stream)
{
	const uint32_t H = m->cfg.n_kv_heads;
	bool direct = m->cpu_device || !m->payload;
	struct kvt_attn_tables t;
	struct kvt_paged_tables h;
	struct kvt_pool_info pool;
	uint64_t rows, pages, tokens;
	struct tab_dst d;
	size_t bytes, cb;
	int err;

	if (!p)
		return kvt_fail(m, -EINVAL, "paged: NULL tables");
	if (p->size < sizeof(*p))
		return kvt_fail(m, -EINVAL, "paged: size %u, want at least %zu", p->size,
				sizeof(*p));
	if (!p->indptr || !p->indices || !p->last_page_len || !p->r_indptr || !p->r_indices)
		return kvt_fail(m, -EINVAL, "paged: NULL buffer");
	err = out_check(m, layer, n, p->max_batch, direct, "paged");
	if (err)
		return err;
	rows = (uint64_t)p->max_batch * H;
	/* every pool block's rows must have int32 token indices */
	kvt_manager_pool(m, &pool);
	if (pool.n_blocks * 2 * pool.block_tokens > INT32_MAX || rows + 1 > INT32_MAX)
		return kvt_fail(m, -ENOTSUP, "paged: %llu pool rows do not fit int32 indices",
				(unsigned long long)(pool.n_blocks * 2 * pool.block_tokens));
	/* on a device, the host copy of the paged arrays goes after the tables: as large as the
	   caller's buffers */
	cb = direct ? 0
		    : ((size_t)(3 * rows + 2) + p->max_pages + (size_t)p->max_tokens + 1) / 2 * 8;
	err = tables_own(m, layer, ids, n, &t, &d, cb, 0, &bytes, "paged");
	if (err)
		return err;
	paged_fill(m, &d, n, &t, &pages, &tokens, NULL, p->max_batch);
	if (pages > p->max_pages || tokens > p->max_tokens)
		return kvt_fail(m, -ENOSPC,
				"paged: %llu pages and %llu recalled tokens, room for %u and %u",
				(unsigned long long)pages, (unsigned long long)tokens, p->max_pages,
				p->max_tokens);
	h = *p;
	if (!direct) { /* the host copy, then one copy per array */
		int32_t *c = (int32_t *)(void *)((char *)m->tab + bytes);

		h.indptr = c;
		h.r_indptr = c + rows + 1;
		h.last_page_len = c + 2 * (rows + 1);
		h.indices = h.last_page_len + rows;
		h.r_indices = h.indices + pages;
	}
	paged_fill(m, &d, n, &t, &pages, &tokens, &h, p->max_batch);
	if (direct)
		return 0;
	{
		const struct tab_copy cp[] = {
			{p->indptr, h.indptr, (rows + 1) * 4},
			{p->r_indptr, h.r_indptr, (rows + 1) * 4},
			{p->last_page_len, h.last_page_len, rows * 4},
			{p->indices, h.indices, pages * 4},
			{p->r_indices, h.r_indices, tokens * 4},
		};

		return copy_out(m, cp, sizeof(cp) / sizeof(cp[0]), stream, "paged");
	}
}
