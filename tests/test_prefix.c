/* SPDX-License-Identifier: MIT */
/*
 * prefix: prefill in pieces. A chunked prefill and a prefill of the rest of a prompt after a
 * prefix shared from the cache give what a whole prefill gives, bit for bit (selection, frames,
 * history, recall views); the cache's sharing, eviction and accounting; bad chains and chunks
 * refused with nothing changed. The helpers here (test_prefix.h) serve the suite's other
 * files: test_prefix_disk.c (spans in the spill file) and test_prefix_random.c (the seeded
 * random run).
 */
#include "test_prefix.h"

#include <dirent.h>
#include <unistd.h>

struct kvt_config cfg(void)
{
	struct kvt_config c = t_small_config();

	c.n_layers = 3;
	c.recall_blocks = 2;
	c.recall_cache_bytes = t_budget(&c, 64);
	return c;
}

struct prompt mk_prompt(const struct kvt_config *c, uint64_t id, uint32_t L, uint64_t base,
			uint32_t shared)
{
	struct prompt p = {.L = L};
	size_t row = t_rowb(c);
	uint8_t *bk, *bv;

	p.lkv = (size_t)c->n_kv_heads * L * row;
	p.lq = (size_t)c->n_q_heads * c->obs_window * row;
	p.k = t_xmalloc(p.lkv * c->n_layers);
	p.v = t_xmalloc(p.lkv * c->n_layers);
	p.q = t_xmalloc(p.lq * c->n_layers);
	bk = t_xmalloc(p.lkv);
	bv = t_xmalloc(p.lkv);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		uint8_t *k = p.k + l * p.lkv, *v = p.v + l * p.lkv;

		t_fill_prefill(c, id, l, L, k, v, p.q + l * p.lq);
		t_fill_prefill(c, base, l, L, bk, bv, NULL);
		for (uint32_t h = 0; h < c->n_kv_heads; h++) {
			memcpy(k + h * L * row, bk + h * L * row, shared * row);
			memcpy(v + h * L * row, bv + h * L * row, shared * row);
		}
	}
	free(bk);
	free(bv);
	return p;
}

void free_prompt(struct prompt *p)
{
	free(p->k);
	free(p->v);
	free(p->q);
}

/* Rows [from, to) of every head of layer l of p, as [H][to - from][D], into dst. */
void rows_of(const struct kvt_config *c, const struct prompt *p, uint32_t l, uint32_t from,
	     uint32_t to, const uint8_t *src, uint8_t *dst)
{
	size_t row = t_rowb(c);

	for (uint32_t h = 0; h < c->n_kv_heads; h++)
		memcpy(dst + (size_t)h * (to - from) * row,
		       src + l * p->lkv + ((size_t)h * p->L + from) * row, (to - from) * row);
}

/* Prefills layer l of seq from position `pos` in chunks of `step` tokens (the rest at once when
   0), each chunk's tensors holding rows from `from(pos)`: 0, the chunk's start, or between. */
void prefill_pieces(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq,
		    const struct prompt *p, uint32_t l, uint32_t pos, uint32_t step, int from_mode)
{
	size_t row = t_rowb(c);
	uint8_t *k = t_xmalloc(p->lkv), *v = t_xmalloc(p->lkv);

	while (pos < p->L) {
		uint32_t n = step && p->L - pos > step ? step : p->L - pos;
		uint32_t from = from_mode == 0 ? 0 : from_mode == 1 ? pos : pos / 2;

		rows_of(c, p, l, from, pos + n, p->k, k);
		rows_of(c, p, l, from, pos + n, p->v, v);
		CHECK_RC(t_prefill_chunk(m, seq, l, pos, n, from, k, v,
					 pos + n == p->L ? p->q + l * p->lq : NULL, NULL),
			 0);
		pos += n;
	}
	(void)row;
	free(k);
	free(v);
}

void prefill_whole(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq,
		   const struct prompt *p)
{
	for (uint32_t l = 0; l < c->n_layers; l++)
		CHECK_RC(t_prefill_layer(m, seq, l, p->k + l * p->lkv, p->v + l * p->lkv,
					 p->q + l * p->lq, NULL),
			 0);
}

/* Everything visible of (a, layer l) equals (b, l): resident positions, the frames' rows, the
   whole history, and the recall views after one recall with the same queries. */
void check_same(struct kvt_manager *ma, uint64_t a, struct kvt_manager *mb, uint64_t b,
		const struct kvt_config *c, const struct prompt *p)
{
	size_t row = t_rowb(c);
	uint32_t L = p->L;
	uint8_t *ka = t_xmalloc(p->lkv), *va = t_xmalloc(p->lkv), *kb = t_xmalloc(p->lkv),
		*vb = t_xmalloc(p->lkv);
	uint8_t *q = t_xmalloc((size_t)c->n_q_heads * row);

	for (uint32_t l = 0; l < c->n_layers; l++) {
		/* the history: what was written, bit for bit, through either sequence */
		CHECK_RC(t_load_kv(ma, a, l, 0, L, ka, va, NULL), 0);
		CHECK_RC(t_load_kv(mb, b, l, 0, L, kb, vb, NULL), 0);
		assert_memory_equal(ka, p->k + l * p->lkv, p->lkv);
		assert_memory_equal(va, p->v + l * p->lkv, p->lkv);
		assert_memory_equal(kb, ka, p->lkv);
		assert_memory_equal(vb, va, p->lkv);
		for (uint32_t h = 0; h < c->n_kv_heads; h++) {
			int32_t pa[256], pb[256];
			uint64_t fa[64], fb[64];
			uint32_t na, nb, sa, sb, fna, fnb;

			CHECK_RC(kvt_seq_resident_positions(ma, a, l, h, pa, 256, &na), 0);
			CHECK_RC(kvt_seq_resident_positions(mb, b, l, h, pb, 256, &nb), 0);
			assert_int_equal(na, nb);
			assert_memory_equal(pa, pb, na * sizeof(*pa));
			CHECK_RC(kvt_seq_frames(ma, a, l, h, fa, 64, &fna, &sa), 0);
			CHECK_RC(kvt_seq_frames(mb, b, l, h, fb, 64, &fnb, &sb), 0);
			assert_int_equal(fna, fnb);
			assert_int_equal(sa, sb);
			for (uint32_t s = 0; s < sa; s++) {
				uint8_t ra[2][128] = {{0}}, rb[2][128] = {{0}};
				uint64_t off = (uint64_t)(s % c->block_tokens) * row;
				uint64_t vo = (uint64_t)c->block_tokens * row;

				t_dev_read(ra[0], fa[s / c->block_tokens] + off, row);
				t_dev_read(ra[1], fa[s / c->block_tokens] + off + vo, row);
				t_dev_read(rb[0], fb[s / c->block_tokens] + off, row);
				t_dev_read(rb[1], fb[s / c->block_tokens] + off + vo, row);
				assert_memory_equal(ra, rb, sizeof(ra));
			}
		}
		/* block metadata: the same queries recall the same blocks */
		for (uint32_t g = 0; g < c->n_q_heads; g++)
			t_fill_row(c->dtype, c->head_dim, q + g * row, 77, l, 1000 + g, L, 0);
		CHECK_RC(t_decode_recall(ma, l, &a, 1, q, NULL), 0);
		CHECK_RC(t_decode_recall(mb, l, &b, 1, q, NULL), 0);
		for (uint32_t h = 0; h < c->n_kv_heads; h++) {
			struct kvt_recall_ref ra[8], rb[8];
			uint32_t na, nb;

			CHECK_RC(kvt_seq_recall_view(ma, a, l, h, ra, 8, &na), 0);
			CHECK_RC(kvt_seq_recall_view(mb, b, l, h, rb, 8, &nb), 0);
			assert_int_equal(na, nb);
			for (uint32_t i = 0; i < na; i++) {
				assert_int_equal(ra[i].block, rb[i].block);
				assert_int_equal(ra[i].n_valid, rb[i].n_valid);
				assert_int_equal(ra[i].resident, rb[i].resident);
			}
		}
	}
	free(ka);
	free(va);
	free(kb);
	free(vb);
	free(q);
}

/* ---- chunked prefill ---------------------------------------------------------------------- */

static void test_chunked_equals_whole(void **state)
{
	struct kvt_config c = cfg();
	struct kvt_manager *m = t_mk(&c);
	const uint32_t Ls[] = {5, 24, 61, 100, 137};

	(void)state;
	for (uint32_t i = 0; i < sizeof(Ls) / sizeof(Ls[0]); i++) {
		struct prompt p = mk_prompt(&c, 10 + i, Ls[i], 10 + i, 0);
		const uint32_t steps[] = {1, 7, 8, 33, 0};

		CHECK_RC(kvt_seq_create(m, 1, p.L), 0);
		prefill_whole(m, &c, 1, &p);
		for (uint32_t s = 0; s < 5; s++)
			for (int mode = 0; mode < 3; mode++) {
				CHECK_RC(kvt_seq_create(m, 2, p.L), 0);
				for (uint32_t l = 0; l < c.n_layers; l++)
					prefill_pieces(m, &c, 2, &p, l, 0, steps[s], mode);
				check_same(m, 1, m, 2, &c, &p);
				CHECK_RC(kvt_seq_destroy(m, 2), 0);
			}
		CHECK_RC(kvt_seq_destroy(m, 1), 0);
		free_prompt(&p);
	}
	assert_int_equal(t_stats_of(m).host_blocks_used, 0);
	assert_int_equal(t_stats_of(m).device_frames_used, 0);
	kvt_manager_destroy(m);
}

/* A layer in chunks is not prefilled until its last chunk: decode refuses it, the history
   reads back, info counts what is written. */
static void test_chunk_state(void **state)
{
	struct kvt_config c = cfg();
	struct kvt_manager *m = t_mk(&c);
	struct prompt p = mk_prompt(&c, 3, 50, 3, 0);
	uint8_t *k = t_xmalloc(p.lkv), *v = t_xmalloc(p.lkv), *kk = t_xmalloc(p.lkv),
		*vv = t_xmalloc(p.lkv);
	struct kvt_seq_info si;

	(void)state;
	CHECK_RC(kvt_seq_create(m, 1, p.L), 0);
	rows_of(&c, &p, 0, 0, 20, p.k, k);
	rows_of(&c, &p, 0, 0, 20, p.v, v);
	CHECK_RC(t_prefill_chunk(m, 1, 0, 0, 20, 0, k, v, NULL, NULL), 0);
	si = t_info_of(m, 1);
	assert_int_equal(si.layers_prefilled, 0);
	assert_int_equal(si.filled_tokens, 0); /* layers 1, 2 hold nothing yet */
	assert_int_equal(si.host_blocks, 3 * c.n_kv_heads);
	assert_int_equal(t_tokens_of(m, 1, 0), 0);
	CHECK_RC(t_load_kv(m, 1, 0, 3, 17, kk, vv, NULL), 0);
	rows_of(&c, &p, 0, 3, 20, p.k, k);
	rows_of(&c, &p, 0, 3, 20, p.v, v);
	assert_memory_equal(kk, k, (size_t)c.n_kv_heads * 17 * t_rowb(&c));
	assert_memory_equal(vv, v, (size_t)c.n_kv_heads * 17 * t_rowb(&c));
	CHECK_RC(t_load_kv(m, 1, 0, 3, 18, kk, vv, NULL), -EINVAL); /* past what is written */
	CHECK_RC(t_load_kv(m, 1, 1, 0, 1, kk, vv, NULL), -EINVAL);
	CHECK_RC(t_decode_append(m, 0, &(uint64_t){1}, 1, k, v, NULL), -EINVAL);
	CHECK_RC(t_prefill_layer(m, 1, 0, p.k, p.v, p.q, NULL), 0); /* the rest, whole tensors */
	assert_int_equal(t_tokens_of(m, 1, 0), p.L);
	CHECK_RC(kvt_seq_destroy(m, 1), 0);
	free(k);
	free(v);
	free(kk);
	free(vv);
	free_prompt(&p);
	kvt_manager_destroy(m);
}

/* Bad chunks change nothing. */
static void test_chunk_errors(void **state)
{
	struct kvt_config c = cfg();
	struct kvt_manager *m = t_mk(&c);
	struct prompt p = mk_prompt(&c, 4, 40, 4, 0);
	struct kvt_stats st0;
	struct kvt_seq_info si0, si1;

	(void)state;
	CHECK_RC(kvt_seq_create(m, 1, p.L), 0);
	CHECK_RC(t_prefill_chunk(m, 1, 0, 0, 16, 0, p.k, p.v, NULL, NULL), 0);
	st0 = t_stats_of(m);
	si0 = t_info_of(m, 1);
	CHECK_RC(t_prefill_chunk(m, 1, 0, 15, 4, 15, p.k, p.v, NULL, NULL), -EINVAL);  /* pos */
	CHECK_RC(t_prefill_chunk(m, 1, 0, 17, 4, 17, p.k, p.v, NULL, NULL), -EINVAL);  /* pos */
	CHECK_RC(t_prefill_chunk(m, 1, 0, 16, 0, 16, p.k, p.v, NULL, NULL), -EINVAL);  /* n */
	CHECK_RC(t_prefill_chunk(m, 1, 0, 16, 25, 16, p.k, p.v, NULL, NULL), -EINVAL); /* past */
	CHECK_RC(t_prefill_chunk(m, 1, 0, 16, 4, 17, p.k, p.v, NULL, NULL), -EINVAL);  /* from */
	CHECK_RC(t_prefill_chunk(m, 1, 0, 16, 4, 16, NULL, p.v, NULL, NULL), -EINVAL);
	CHECK_RC(t_prefill_chunk(m, 1, 0, 16, 24, 16, p.k, p.v, NULL, NULL), -EINVAL); /* q_obs */
	CHECK_RC(t_prefill_chunk(m, 1, 9, 0, 4, 0, p.k, p.v, NULL, NULL), -EINVAL);    /* layer */
	CHECK_RC(t_prefill_chunk(m, 2, 0, 0, 4, 0, p.k, p.v, NULL, NULL), -ENOENT);
	CHECK_RC(kvt_prefill_chunk(m, 1, 0, 16, UINT32_MAX, 16, p.k, p.v, p.q, NULL), -EINVAL);
	CHECK_RC(kvt_prefill_chunk(NULL, 1, 0, 16, 4, 16, p.k, p.v, NULL, NULL), -EINVAL);
	{
		struct kvt_stats st1 = t_stats_of(m);

		CHECK_STATS_EQUAL(&st0, &st1);
	}
	si1 = t_info_of(m, 1);
	assert_memory_equal(&si0, &si1, sizeof(si0));
	CHECK_RC(kvt_seq_destroy(m, 1), 0);
	free_prompt(&p);
	kvt_manager_destroy(m);
}

/* ---- prefix reuse ------------------------------------------------------------------------- */

void chain_of(uint64_t base, uint32_t n, uint64_t *h)
{
	for (uint32_t i = 0; i < n; i++)
		h[i] = base * 1000 + i;
}

void check_history(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq,
		   const struct prompt *p, uint32_t from, uint32_t to)
{
	size_t bytes = (size_t)c->n_kv_heads * (to - from) * t_rowb(c);
	uint8_t *k = t_xmalloc(bytes), *v = t_xmalloc(bytes), *ek = t_xmalloc(bytes),
		*ev = t_xmalloc(bytes);

	for (uint32_t l = 0; l < c->n_layers; l++) {
		CHECK_RC(t_load_kv(m, seq, l, from, to - from, k, v, NULL), 0);
		rows_of(c, p, l, from, to, p->k, ek);
		rows_of(c, p, l, from, to, p->v, ev);
		if (memcmp(k, ek, bytes) || memcmp(v, ev, bytes))
			fail_at(__FILE__, __LINE__, "seq %llu layer %u: history [%u, %u) differs",
				(unsigned long long)seq, l, from, to);
	}
	free(k);
	free(v);
	free(ek);
	free(ev);
}

/* A fresh directory under $TMPDIR (or /tmp) into dir (PATH_MAX bytes). */
static void tmpdir_make(char *dir)
{
	const char *tmp = getenv("TMPDIR");
	char tmpl[PATH_MAX];

	snprintf(tmpl, sizeof(tmpl), "%s/kvt-prefix-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(tmpl) || !realpath(tmpl, dir))
		fail_at(__FILE__, __LINE__, "mkdtemp %s: %s", tmpl, strerror(errno));
}

/* Removes dir with anything a failed test left in it. */
static void tmpdir_remove(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[PATH_MAX + 256];

	while (d && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		unlink(p);
	}
	if (d)
		closedir(d);
	rmdir(dir);
}

int tmpdir_setup(void **state)
{
	char *dir = t_xmalloc(PATH_MAX);

	tmpdir_make(dir);
	*state = dir;
	return 0;
}

int tmpdir_teardown(void **state)
{
	tmpdir_remove(*state);
	free(*state);
	return 0;
}

/* A sequence created on a cached prefix and prefilled from there (the rest alone, the rest in
   chunks, the whole layer's tensors) equals a plain whole prefill of the same prompt. */
static void test_prefix_equals_whole(void **state)
{
	struct kvt_config c = cfg();
	struct kvt_manager *m = t_mk(&c);
	uint64_t hp[8], hs[8];
	uint32_t got;

	(void)state;
	/* P: 70 tokens, chain of 4 spans (64 tokens) */
	struct prompt pp = mk_prompt(&c, 100, 70, 100, 0);

	chain_of(1, 4, hp);
	CHECK_RC(kvt_prefix_match(m, hp, 4, HT, &got), 0);
	assert_int_equal(got, 0);
	CHECK_RC(kvt_seq_create_prefix(m, 100, pp.L, hp, 4, HT, &got), 0);
	assert_int_equal(got, 0);
	prefill_whole(m, &c, 100, &pp);
	assert_int_equal(t_stats_of(m).prefix_spans, 4);
	CHECK_RC(kvt_prefix_match(m, hp, 4, HT, &got), 0);
	assert_int_equal(got, 64);
	CHECK_RC(kvt_prefix_match(m, hp, 4, 2 * HT, &got), 0); /* another granularity */
	assert_int_equal(got, 0);

	for (int variant = 0; variant < 4; variant++) {
		/* S: shares P's first 3 spans (48 tokens), then its own tokens: 90 tokens */
		struct prompt ps = mk_prompt(&c, 200 + variant, 90, 100, 48);
		struct kvt_seq_info si;

		chain_of(1, 3, hs);
		chain_of(9 + variant, 2, hs + 3); /* its own 4th and 5th spans */
		CHECK_RC(kvt_seq_create(m, 1, ps.L), 0);
		prefill_whole(m, &c, 1, &ps);
		CHECK_RC(kvt_seq_create_prefix(m, 2, ps.L, hs, 5, HT, &got), 0);
		assert_int_equal(got, 48);
		si = t_info_of(m, 2);
		assert_int_equal(si.prefix_tokens, 48);
		assert_int_equal(si.filled_tokens, 48);
		assert_int_equal(si.shared_blocks, 3ull * 2 * c.n_layers * c.n_kv_heads);
		for (uint32_t l = 0; l < c.n_layers; l++) {
			if (variant == 0) /* the rest alone */
				prefill_pieces(m, &c, 2, &ps, l, 48, 0, 1);
			else if (variant == 1) /* the rest in chunks of 5, rows from the start */
				prefill_pieces(m, &c, 2, &ps, l, 48, 5, 0);
			else if (variant == 2) /* chunks of 8, rows from between */
				prefill_pieces(m, &c, 2, &ps, l, 48, 8, 2);
			else /* kvt_prefill_layer with the whole layer */
				CHECK_RC(t_prefill_layer(m, 2, l, ps.k + l * ps.lkv,
							 ps.v + l * ps.lkv, ps.q + l * ps.lq, NULL),
					 0);
		}
		check_same(m, 1, m, 2, &c, &ps);
		si = t_info_of(m, 2);
		/* its own two spans are cached now, shared with it */
		assert_int_equal(si.shared_blocks, 5ull * 2 * c.n_layers * c.n_kv_heads);
		CHECK_RC(kvt_seq_destroy(m, 1), 0);
		CHECK_RC(kvt_seq_destroy(m, 2), 0);
		free_prompt(&ps);
	}
	CHECK_RC(kvt_seq_destroy(m, 100), 0);
	{
		struct kvt_stats st = t_stats_of(m);

		/* 4 of P, 2 of each variant: all idle, all in the host tier */
		assert_int_equal(st.prefix_spans, 4 + 4 * 2);
		assert_int_equal(st.prefix_blocks, st.prefix_spans * 2 * c.n_layers * c.n_kv_heads);
		assert_int_equal(st.prefix_blocks_idle, st.prefix_blocks);
		assert_int_equal(st.prefix_blocks_shared, 0);
		assert_int_equal(st.host_blocks_used, st.prefix_blocks);
		assert_int_equal(st.prefix_tokens_hit, 4 * 48);
		assert_int_equal(st.prefix_tokens_asked, 70 + 4 * 90);
	}
	free_prompt(&pp);
	kvt_manager_destroy(m);
}

/* The whole prompt is never shared; a chain whose spans are cached under another position or
   granularity does not match; bad chains change nothing. */
static void test_prefix_rules_and_errors(void **state)
{
	struct kvt_config c = cfg();
	struct kvt_manager *m = t_mk(&c);
	struct prompt p = mk_prompt(&c, 5, 64, 5, 0);
	uint64_t h[8];
	uint32_t got = 99;
	struct kvt_stats st0, st1;

	(void)state;
	chain_of(5, 4, h);
	CHECK_RC(kvt_seq_create_prefix(m, 1, 64, h, 4, HT, &got), 0);
	prefill_whole(m, &c, 1, &p);
	CHECK_RC(kvt_prefix_match(m, h, 4, HT, &got), 0);
	assert_int_equal(got, 64);
	/* the same 64-token prompt again: 48 shared, the last span recomputed */
	CHECK_RC(kvt_seq_create_prefix(m, 2, 64, h, 4, HT, &got), 0);
	assert_int_equal(got, 48);
	/* the observation window (4 tokens) stays to prefill: 66 tokens share 48, not 64 */
	CHECK_RC(kvt_seq_create_prefix(m, 4, 66, h, 4, HT, &got), 0);
	assert_int_equal(got, 48);
	CHECK_RC(kvt_seq_destroy(m, 4), 0);
	/* a prompt that selects nothing (sink + recent = 24 tokens or fewer) leaves one token */
	CHECK_RC(kvt_seq_create_prefix(m, 4, 17, h, 1, HT, &got), 0);
	assert_int_equal(got, 16);
	CHECK_RC(kvt_seq_destroy(m, 4), 0);
	/* a chain starting with a later span matches nothing */
	CHECK_RC(kvt_prefix_match(m, h + 1, 3, HT, &got), 0);
	assert_int_equal(got, 0);
	/* an empty chain (NULL hashes too) shares nothing: a plain sequence (it computed
	   NULL + 0 until 2026-12-06, which clang's UBSan reports; found by fuzz_api) */
	CHECK_RC(kvt_seq_create_prefix(m, 4, 40, NULL, 0, HT, &got), 0);
	assert_int_equal(got, 0);
	CHECK_RC(kvt_seq_destroy(m, 4), 0);

	st0 = t_stats_of(m);
	CHECK_RC(kvt_prefix_match(m, h, 4, 0, &got), -EINVAL);
	CHECK_RC(kvt_prefix_match(m, h, 4, 12, &got), -EINVAL); /* not a multiple of 8 */
	CHECK_RC(kvt_prefix_match(m, NULL, 4, HT, &got), -EINVAL);
	CHECK_RC(kvt_prefix_match(m, h, 4, HT, NULL), -EINVAL);
	CHECK_RC(kvt_prefix_match(NULL, h, 4, HT, &got), -EINVAL);
	CHECK_RC(kvt_seq_create_prefix(m, 3, 63, h, 4, HT, &got), -EINVAL); /* chain too long */
	CHECK_RC(kvt_seq_create_prefix(m, 3, 64, h, 4, 12, &got), -EINVAL);
	CHECK_RC(kvt_seq_create_prefix(m, 3, 64, NULL, 4, HT, &got), -EINVAL);
	CHECK_RC(kvt_seq_create_prefix(m, 3, 64, h, 4, HT, NULL), -EINVAL);
	CHECK_RC(kvt_seq_create_prefix(m, 2, 64, h, 4, HT, &got), -EEXIST);
	CHECK_RC(kvt_seq_create_prefix(m, 3, 0, h, 0, HT, &got), -EINVAL);
	CHECK_RC(kvt_seq_create_prefix(m, 3, 64, h, UINT32_MAX, HT, &got), -EINVAL);
	st1 = t_stats_of(m);
	CHECK_STATS_EQUAL(&st0, &st1);
	assert_int_equal(
		kvt_seq_info(m, 3, &(struct kvt_seq_info){.size = sizeof(struct kvt_seq_info)}),
		-ENOENT);
	CHECK_RC(kvt_seq_destroy(m, 1), 0);
	CHECK_RC(kvt_seq_destroy(m, 2), 0);
	free_prompt(&p);
	kvt_manager_destroy(m);
}

/* Without a disk tier, idle spans are dropped when the host tier needs room, least recently
   used first and a chain's latest span first; a span a live sequence shares never is. */
static void test_prefix_eviction(void **state)
{
	struct kvt_config c = cfg();
	struct kvt_manager *m;
	uint64_t ha[4], hb[4];
	uint32_t got;
	struct kvt_stats st;

	(void)state;
	c.n_layers = 1;
	c.host_bytes = t_budget(&c, 24); /* 24 groups: 3 prompts of 64 tokens */
	m = t_mk(&c);
	struct prompt pa = mk_prompt(&c, 1, 64, 1, 0), pb = mk_prompt(&c, 2, 64, 2, 0),
		      pc = mk_prompt(&c, 3, 64, 3, 0);

	chain_of(1, 4, ha);
	chain_of(2, 4, hb);
	CHECK_RC(kvt_seq_create_prefix(m, 1, 64, ha, 4, HT, &got), 0);
	prefill_whole(m, &c, 1, &pa);
	CHECK_RC(kvt_seq_create_prefix(m, 2, 64, hb, 4, HT, &got), 0);
	prefill_whole(m, &c, 2, &pb);
	CHECK_RC(kvt_seq_destroy(m, 1), 0); /* A idle first, then B */
	CHECK_RC(kvt_seq_destroy(m, 2), 0);
	st = t_stats_of(m);
	assert_int_equal(st.prefix_spans, 8);
	assert_int_equal(st.host_blocks_used, 16 * c.n_kv_heads);
	/* a sequence shares A's first span: it is held */
	CHECK_RC(kvt_seq_create_prefix(m, 3, 64, ha, 1, HT, &got), 0);
	assert_int_equal(got, 16);
	/* 17 new groups: 8 free, so 9 must come from idle spans (2 groups each), least recently
	   used first: A's three idle ones (the latest first; its first is held), then B's two
	   latest */
	CHECK_RC(kvt_seq_create(m, 4, 136), 0);
	CHECK_RC(t_prefill_layer(m, 4, 0, NULL, NULL, NULL, NULL), -EINVAL);
	{
		struct prompt p4 = mk_prompt(&c, 4, 136, 4, 0);

		CHECK_RC(t_prefill_layer(m, 4, 0, p4.k, p4.v, p4.q, NULL), 0);
		free_prompt(&p4);
	}
	CHECK_RC(kvt_prefix_match(m, hb, 4, HT, &got), 0);
	assert_int_equal(got, 32);
	CHECK_RC(kvt_prefix_match(m, ha, 4, HT, &got), 0);
	assert_int_equal(got, 16);
	st = t_stats_of(m);
	assert_int_equal(st.prefix_spans_evicted, 5);
	assert_int_equal(st.prefix_blocks_shared, 2 * c.n_kv_heads);
	/* nothing left to evict but the held span: a prompt that needs it fails */
	CHECK_RC(kvt_seq_create(m, 5, 64), 0);
	CHECK_RC(t_prefill_layer(m, 5, 0, pc.k, pc.v, pc.q, NULL), -ENOMEM);
	CHECK_RC(kvt_prefix_match(m, ha, 1, HT, &got), 0);
	assert_int_equal(got, 16);
	CHECK_RC(kvt_prefix_match(m, hb, 4, HT, &got), 0);
	assert_int_equal(got, 0); /* B went for the failed call's room */
	/* the held span's bytes are intact */
	{
		uint8_t *k = t_xmalloc(pa.lkv), *v = t_xmalloc(pa.lkv), *ek = t_xmalloc(pa.lkv),
			*ev = t_xmalloc(pa.lkv);

		CHECK_RC(t_load_kv(m, 3, 0, 0, 16, k, v, NULL), 0);
		rows_of(&c, &pa, 0, 0, 16, pa.k, ek);
		rows_of(&c, &pa, 0, 0, 16, pa.v, ev);
		assert_memory_equal(k, ek, (size_t)c.n_kv_heads * 16 * t_rowb(&c));
		assert_memory_equal(v, ev, (size_t)c.n_kv_heads * 16 * t_rowb(&c));
		free(k);
		free(v);
		free(ek);
		free(ev);
	}
	CHECK_RC(kvt_seq_destroy(m, 3), 0);
	CHECK_RC(kvt_seq_destroy(m, 4), 0);
	CHECK_RC(kvt_seq_destroy(m, 5), 0);
	st = t_stats_of(m);
	assert_int_equal(st.host_blocks_used, st.prefix_blocks);
	free_prompt(&pa);
	free_prompt(&pb);
	free_prompt(&pc);
	kvt_manager_destroy(m);
}

/* The scheduler counts a prefill's work past the shared prefix only. */
static void test_sched_counts_the_rest(void **state)
{
	struct kvt_config c = cfg();
	struct kvt_sched_config sc = KVT_SCHED_CONFIG_INIT;
	struct kvt_manager *m = t_mk(&c);
	struct prompt p = mk_prompt(&c, 7, 70, 7, 0);
	struct kvt_sched_batch b;
	struct kvt_sched *s;
	uint64_t h[4];
	uint32_t got;

	(void)state;
	chain_of(7, 4, h);
	CHECK_RC(kvt_seq_create_prefix(m, 1, p.L, h, 4, HT, &got), 0);
	prefill_whole(m, &c, 1, &p);
	CHECK_RC(kvt_seq_create_prefix(m, 2, p.L, h, 4, HT, &got), 0);
	assert_int_equal(got, 64);
	CHECK_RC(kvt_sched_create(m, &sc, &s), 0);
	CHECK_RC(kvt_sched_submit(s, 2, 2), 0);
	CHECK_RC(kvt_sched_step(s, &b), 0);
	assert_int_equal(b.n_items, 1);
	assert_int_equal(b.items[0].layer_end - b.items[0].layer_begin, c.n_layers);
	assert_int_equal(b.it.prefill_token_layers, (uint64_t)(p.L - 64) * c.n_layers);
	prefill_whole(m, &c, 2, &p);
	CHECK_RC(kvt_sched_commit(s), 0);
	kvt_sched_destroy(s);
	check_same(m, 1, m, 2, &c, &p);
	CHECK_RC(kvt_seq_destroy(m, 1), 0);
	CHECK_RC(kvt_seq_destroy(m, 2), 0);
	free_prompt(&p);
	kvt_manager_destroy(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chunked_equals_whole),
		cmocka_unit_test(test_chunk_state),
		cmocka_unit_test(test_chunk_errors),
		cmocka_unit_test(test_prefix_equals_whole),
		cmocka_unit_test(test_prefix_rules_and_errors),
		cmocka_unit_test(test_prefix_eviction),
		cmocka_unit_test(test_sched_counts_the_rest),
		cmocka_unit_test_setup_teardown(test_prefix_disk_restore, tmpdir_setup,
						tmpdir_teardown),
		cmocka_unit_test_setup_teardown(test_prefix_disk_checksum, tmpdir_setup,
						tmpdir_teardown),
		cmocka_unit_test_setup_teardown(test_prefix_disk_full, tmpdir_setup,
						tmpdir_teardown),
		cmocka_unit_test_setup_teardown(test_prefix_resume_shared, tmpdir_setup,
						tmpdir_teardown),
		cmocka_unit_test_setup_teardown(test_prefix_restore_after_pins, tmpdir_setup,
						tmpdir_teardown),
		cmocka_unit_test(test_prefix_random_host),
		cmocka_unit_test_setup_teardown(test_prefix_random_disk, tmpdir_setup,
						tmpdir_teardown),
		cmocka_unit_test_setup_teardown(test_prefix_random_disk_limited, tmpdir_setup,
						tmpdir_teardown),
	};

	/* failure messages of the random runs name the seed and the operation (t_ops.h) */
	check_context = t_run_context;
	t_seed = t_pick_seed();
	print_message("# prefix: seed %llu\n", (unsigned long long)t_seed);
	return cmocka_run_group_tests_name("prefix", tests, NULL, NULL);
}
