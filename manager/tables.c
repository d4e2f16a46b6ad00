/* SPDX-License-Identifier: MIT */
/*
 * Attention tables (kvtier.h, "Attention tables"): one layer's attention inputs for a decode
 * step's batch, written in one call into fixed-stride buffers an engine's kernel reads, in
 * place of one kvt_seq_frames and one kvt_seq_recall_view per (member, kv head).
 *
 * The device tier and the recall cache share one arena, so both kinds of frame are indices of
 * one pool of blocks (block_bytes each): frame group g's block of kv head h is block g * H + h,
 * and recall frame f is block n_dev * H + f, n_dev being the device tier's frame groups.
 *
 * A call checks every member and brings its recall view up to date first (on the CUDA
 * backend with the regions there, a read of each view the device changed), so that an error
 * writes nothing; then it writes the tables: straight into the caller's buffers where they are
 * host memory, else into a host copy that goes to the device in one copy per array, queued on
 * the caller's stream.
 */
#include <errno.h>
#include <string.h>

#include "kvtier.h"
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

/* Bytes of the host copy: the count arrays' rows [0, max_batch), the entry arrays' rows of
   the batch. 0 when it would not fit a size_t. */
static size_t copy_bytes(uint64_t rows, uint64_t n_rows, uint64_t mf, uint64_t mr)
{
	uint64_t b = 2 * rows * sizeof(uint32_t);

	if (n_rows && (mf > UINT64_MAX / 8 / n_rows || mr > UINT64_MAX / 32 / n_rows))
		return 0;
	b += n_rows * mf * sizeof(uint32_t) + n_rows * mr * (2 * sizeof(uint32_t) + 8);
	return b > SIZE_MAX / 2 ? 0 : (size_t)b;
}

/* The checks of every member (the errors the call can have before it writes); brings each
   member's view up to date. */
static int tables_check(struct kvt_manager *m, uint32_t layer, const uint64_t *ids, uint32_t n,
			const struct kvt_attn_tables *t, uint32_t *most)
{
	uint64_t stamp = ++m->stamp;
	int err = 0;

	*most = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = kvt_batch_member(m, ids, i, layer, stamp, "tables", &err);
		struct kvt_recall_layer *rc;

		if (!s)
			return err;
		if (s->n_frames > t->max_frames)
			return kvt_fail(m, -ENOSPC,
					"tables: sequence %llu has %u frames, room for %u",
					(unsigned long long)ids[i], s->n_frames, t->max_frames);
		rc = s->layers[layer].rc;
		err = kvt_recall_pull(m, rc);
		if (err)
			return err;
		if (kvt_view_stale(rc))
			return kvt_fail(
				m, -ESTALE,
				"tables: sequence %llu layer %u: a recalled block was evicted "
				"since (recall again)",
				(unsigned long long)ids[i], layer);
		for (uint32_t h = 0; rc && rc->view_n && h < m->cfg.n_kv_heads; h++) {
			if (rc->view_n[h] > t->max_recall)
				return kvt_fail(m, -ENOSPC,
						"tables: sequence %llu layer %u head %u recalled "
						"%u blocks, room for %u",
						(unsigned long long)ids[i], layer, h, rc->view_n[h],
						t->max_recall);
			*most = rc->view_n[h] > *most ? rc->view_n[h] : *most;
		}
	}
	return 0;
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

/* Writes the tables into d (rows laid out as in t). */
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

int kvt_tables_write(struct kvt_manager *m, uint32_t layer, const uint64_t *ids, uint32_t n,
		     const struct kvt_attn_tables *t, void *stream)
{
	const uint32_t H = m->cfg.n_kv_heads;
	bool direct = m->cpu_device || !m->payload;
	uint64_t rows, n_rows;
	struct tab_dst d;
	uint32_t most;
	size_t bytes;
	char *p;
	int err;

	if (!t)
		return kvt_fail(m, -EINVAL, "tables: NULL tables");
	if (t->size < sizeof(*t))
		return kvt_fail(m, -EINVAL, "tables: size %u, want at least %zu", t->size,
				sizeof(*t));
	if (!t->n_batch || !t->n_tokens || !t->frames || !t->n_recall || !t->recall ||
	    !t->recall_tokens || !t->recall_skip)
		return kvt_fail(m, -EINVAL, "tables: NULL buffer");
	if (layer >= m->cfg.n_layers)
		return kvt_fail(m, -EINVAL, "tables: layer %u out of range", layer);
	if (n > t->max_batch)
		return kvt_fail(m, -ENOSPC, "tables: a batch of %u, room for %u", n, t->max_batch);
	if (!direct && !m->ops->dmem_copy)
		return kvt_fail(m, -ENOTSUP, "tables: backend %s cannot write device memory",
				m->ops->name);
	rows = (uint64_t)t->max_batch * H;
	n_rows = (uint64_t)n * H;
	bytes = copy_bytes(rows, n_rows, t->max_frames, t->max_recall);
	if (!bytes)
		return kvt_fail(m, -ENOMEM, "tables: %u rows of %u + %u entries do not fit memory",
				t->max_batch, t->max_frames, t->max_recall);
	err = tables_check(m, layer, ids, n, t, &most);
	if (err)
		return err;
	if (direct) {
		d = (struct tab_dst){t->n_tokens, t->frames,	    t->n_recall,
				     t->recall,	  t->recall_tokens, t->recall_skip};
		bytes = 0; /* only the refs */
	}
	bytes = (bytes + 7) / 8 * 8; /* the refs after it, aligned */
	if ((bytes + (uint64_t)most * sizeof(struct tab_ref)) / 8 + 1 > UINT32_MAX ||
	    kvt_reserve((void **)&m->tab, &m->tab_cap,
			(uint32_t)((bytes + (uint64_t)most * sizeof(struct tab_ref)) / 8 + 1), 8))
		return kvt_fail(m, -ENOMEM, "tables: no memory for a copy of %zu bytes", bytes);
	p = (char *)m->tab;
	if (!direct) { /* the 8-byte array first, so that it is aligned */
		d.recall_skip = (uint64_t *)(void *)p;
		p += n_rows * t->max_recall * 8;
		d.n_tokens = (uint32_t *)(void *)p;
		p += rows * 4;
		d.n_recall = (uint32_t *)(void *)p;
		p += rows * 4;
		d.frames = (uint32_t *)(void *)p;
		p += n_rows * t->max_frames * 4;
		d.recall = (uint32_t *)(void *)p;
		p += n_rows * t->max_recall * 4;
		d.recall_tokens = (uint32_t *)(void *)p;
		p += n_rows * t->max_recall * 4;
	}
	tables_fill(m, layer, ids, n, t, &d, (struct tab_ref *)(void *)((char *)m->tab + bytes));
	if (direct) {
		*t->n_batch = n;
		return 0;
	}
	{
		const struct {
			void *dst;
			const void *src;
			uint64_t bytes;
		} cp[] = {
			{t->n_batch, &n, sizeof(n)},
			{t->n_tokens, d.n_tokens, rows * 4},
			{t->n_recall, d.n_recall, rows * 4},
			{t->frames, d.frames, n_rows * t->max_frames * 4},
			{t->recall, d.recall, n_rows * t->max_recall * 4},
			{t->recall_tokens, d.recall_tokens, n_rows * t->max_recall * 4},
			{t->recall_skip, d.recall_skip, n_rows * t->max_recall * 8},
		};

		for (size_t k = 0; k < sizeof(cp) / sizeof(cp[0]); k++) {
			if (!cp[k].bytes)
				continue;
			err = KVT_XFER(m, dmem_copy, (uint64_t)(uintptr_t)cp[k].dst, 0, cp[k].src,
				       cp[k].bytes, stream);
			if (err)
				return kvt_fail(m, err, "tables: copy to the device: %s",
						m->be->err);
		}
	}
	return 0;
}
