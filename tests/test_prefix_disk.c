/* SPDX-License-Identifier: MIT */
/*
 * prefix: cached spans and the disk tier. Idle spans go to the spill file when the host tier
 * needs their room and come back, bit for bit, for a later sequence created on them; a span
 * whose spill-file block fails its checksum is dropped and the match ends before it; a full
 * spill file gives up the spans it holds before a live sequence's spill fails; the groups
 * shared with the cache (which no spill can free) do not make a resume fail that the host tier
 * has room for, nor do the groups an earlier call needed a restore.
 */
#include "test_prefix.h"

#include "prefix.h"

/* Blocks of one span of HT tokens, every layer and kv head. */
static uint64_t span_blocks(const struct kvt_config *c)
{
	return (uint64_t)(HT / c->block_tokens) * c->n_layers * c->n_kv_heads;
}

/* What the stats must say of the spill file and the host tier: the file holds the live
   sequences' spilled blocks and the cached spans' blocks on disk; the host tier their blocks
   that are not shared with the cache (shared ones are counted once, with the spans). */
static void check_tiers(struct kvt_manager *m, const uint64_t *seqs, uint32_t n, int line)
{
	struct kvt_stats st = t_stats_of(m);
	uint64_t disk = st.prefix_blocks_disk, host = st.prefix_blocks - st.prefix_blocks_disk;

	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq_info in = t_info_of(m, seqs[i]);

		disk += in.disk_blocks;
		host += in.host_blocks - in.disk_blocks - in.shared_blocks;
	}
	if (st.disk_blocks_used != disk || st.host_blocks_used != host ||
	    st.prefix_blocks_shared + st.prefix_blocks_idle != st.prefix_blocks ||
	    st.prefix_blocks_disk > st.prefix_blocks_idle)
		fail_at(__FILE__, line,
			"disk blocks used %llu (expected %llu), host blocks used %llu (expected "
			"%llu), prefix blocks %llu = shared %llu + idle %llu, of those on disk %llu",
			(unsigned long long)st.disk_blocks_used, (unsigned long long)disk,
			(unsigned long long)st.host_blocks_used, (unsigned long long)host,
			(unsigned long long)st.prefix_blocks,
			(unsigned long long)st.prefix_blocks_shared,
			(unsigned long long)st.prefix_blocks_idle,
			(unsigned long long)st.prefix_blocks_disk);
}

#define CHECK_TIERS(m, ...)                               \
	check_tiers((m), (const uint64_t[]){__VA_ARGS__}, \
		    sizeof((const uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t), __LINE__)
#define CHECK_TIERS_NONE(m) check_tiers((m), NULL, 0, __LINE__)

/* A plain sequence seq of prompt p, every layer prefilled whole. */
static void plain_seq(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq,
		      const struct prompt *p)
{
	CHECK_RC(kvt_seq_create(m, seq, p->L), 0);
	prefill_whole(m, c, seq, p);
}

/* Sequence 1 of prompt pa with the chain chain_of(1, 4) is prefilled and destroyed: its four
   spans (64 tokens) stay cached, idle, in the host tier. */
static void cache_spans(struct kvt_manager *m, const struct kvt_config *c, const struct prompt *pa,
			uint64_t *h)
{
	uint32_t got = 99;

	chain_of(1, 4, h);
	CHECK_RC(kvt_seq_create_prefix(m, 1, pa->L, h, 4, HT, &got), 0);
	CHECK_EQ(got, 0);
	prefill_whole(m, c, 1, pa);
	CHECK_RC(kvt_seq_destroy(m, 1), 0);
	CHECK_EQ(t_stats_of(m).prefix_spans, 4);
	CHECK_EQ(t_stats_of(m).prefix_blocks_idle, 4 * span_blocks(c));
}

/* Idle spans go to the spill file when a prefill needs their room (and still match there); a
   sequence created on them reads them back (making room by spilling a live sequence) and its
   history is the first prompt's, bit for bit; finished, it equals a plain prefill of the same
   prompt in everything visible. */
void test_prefix_disk_restore(void **state)
{
	const char *dir = *state;
	struct kvt_config c = cfg();
	struct kvt_manager *m;
	struct kvt_stats st, st0;
	uint64_t h[4];
	uint32_t got = 0;

	t_what = "spans to disk and back";
	c.spill_dir = dir;
	c.host_bytes = t_budget(&c, 40);
	m = t_mk(&c);
	struct prompt pa = mk_prompt(&c, 1, 70, 1, 0), pb = mk_prompt(&c, 2, 100, 2, 0);

	cache_spans(m, &c, &pa, h);
	/* B takes 39 of the 40 groups: the spans (24 groups) must make room, to the file */
	plain_seq(m, &c, 2, &pb);
	st = t_stats_of(m);
	CHECK_EQ(st.prefix_spans, 4);
	CHECK_EQ(st.prefix_spans_spilled, 4);
	CHECK_EQ(st.prefix_spans_evicted, 0);
	CHECK_EQ(st.prefix_blocks_disk, 4 * span_blocks(&c));
	CHECK_EQ(st.disk_blocks_spilled, 4 * span_blocks(&c));
	CHECK_EQ(t_info_of(m, 2).disk_blocks, 0);
	CHECK_TIERS(m, 2);
	CHECK_RC(kvt_prefix_match(m, h, 4, HT, &got), 0);
	CHECK_EQ(got, 64); /* spans in the file match */
	CHECK_RC(kvt_prefix_corrupt_span(m, h[0], 4 * (uint32_t)span_blocks(&c)), -ENOENT);
	CHECK_RC(kvt_prefix_corrupt_span(m, 12345, 0), -ENOENT);

	/* C on the chain: the four spans come back (B's blocks go to the file for the room) */
	st0 = t_stats_of(m);
	CHECK_RC(kvt_seq_create_prefix(m, 3, pa.L, h, 4, HT, &got), 0);
	CHECK_EQ(got, 64);
	st = t_stats_of(m);
	CHECK_EQ(st.prefix_spans_restored, 4);
	CHECK_EQ(st.prefix_blocks_disk, 0);
	CHECK_EQ(st.prefix_blocks_shared, 4 * span_blocks(&c));
	CHECK_EQ(st.disk_blocks_fetched - st0.disk_blocks_fetched, 4 * span_blocks(&c));
	assert_true(t_info_of(m, 2).disk_blocks > 0);
	CHECK_EQ(t_info_of(m, 3).shared_blocks, 4 * span_blocks(&c));
	CHECK_TIERS(m, 2, 3);
	check_history(m, &c, 3, &pa, 0, 64);
	for (uint32_t l = 0; l < c.n_layers; l++)
		prefill_pieces(m, &c, 3, &pa, l, 64, 0, 1);
	CHECK_TIERS(m, 2, 3);

	/* D: the same prompt prefilled whole, without the cache */
	plain_seq(m, &c, 4, &pa);
	check_same(m, 3, m, 4, &c, &pa);
	check_history(m, &c, 2, &pb, 0, pb.L); /* B's spilled blocks came back intact */
	CHECK_TIERS(m, 2, 3, 4);
	CHECK_EQ(t_stats_of(m).seqs_lost, 0);
	CHECK_EQ(t_stats_of(m).disk_checksum_errors, 0);
	for (uint64_t s = 2; s <= 4; s++)
		CHECK_RC(kvt_seq_destroy(m, s), 0);
	CHECK_TIERS_NONE(m);
	kvt_manager_destroy(m);
	CHECK_EQ(t_dir_entries(dir), 0);
	free_prompt(&pa);
	free_prompt(&pb);
}

/* A span whose block in the spill file fails its checksum is dropped when a match reads it:
   the sequence shares the spans before it and the call succeeds; the spans after it that
   read back stay cached, and the sequence's own prefill caches the dropped one again. */
void test_prefix_disk_checksum(void **state)
{
	const char *dir = *state;
	struct kvt_config c = cfg();
	struct kvt_manager *m;
	struct kvt_stats st, st0;
	struct kvt_seq_info in;
	uint64_t h[4];
	uint32_t got = 0;

	t_what = "span checksum";
	c.spill_dir = dir;
	c.host_bytes = t_budget(&c, 40);
	m = t_mk(&c);
	struct prompt pa = mk_prompt(&c, 1, 70, 1, 0), pb = mk_prompt(&c, 2, 100, 2, 0);

	cache_spans(m, &c, &pa, h);
	plain_seq(m, &c, 2, &pb);
	CHECK_EQ(t_stats_of(m).prefix_blocks_disk, 4 * span_blocks(&c));
	/* the third span's block of layer 1 */
	CHECK_RC(kvt_prefix_corrupt_span(m, h[2], HT / c.block_tokens), 0);
	st0 = t_stats_of(m);
	CHECK_RC(kvt_seq_create_prefix(m, 3, pa.L, h, 4, HT, &got), 0);
	CHECK_EQ(got, 32);
	st = t_stats_of(m);
	CHECK_EQ(st.disk_checksum_errors - st0.disk_checksum_errors, 1);
	CHECK_EQ(st.seqs_lost, 0);
	CHECK_EQ(st.prefix_spans, 3);
	CHECK_EQ(st.prefix_spans_evicted - st0.prefix_spans_evicted, 1);
	CHECK_EQ(st.prefix_spans_restored - st0.prefix_spans_restored, 3); /* 0, 1 and 3 */
	CHECK_EQ(st.prefix_blocks_disk, 0);
	CHECK_EQ(st.prefix_blocks_shared, 2 * span_blocks(&c));
	CHECK_EQ(st.prefix_tokens_hit - st0.prefix_tokens_hit, 32);
	in = t_info_of(m, 3);
	CHECK_EQ(in.prefix_tokens, 32);
	CHECK_EQ(in.filled_tokens, 32);
	CHECK_EQ(in.shared_blocks, 2 * span_blocks(&c));
	CHECK_EQ(in.lost, 0);
	CHECK_RC(kvt_prefix_match(m, h, 4, HT, &got), 0);
	CHECK_EQ(got, 32);
	CHECK_TIERS(m, 2, 3);
	check_history(m, &c, 3, &pa, 0, 32);

	/* C's prefill of the rest caches the third span again (the fourth is cached) */
	for (uint32_t l = 0; l < c.n_layers; l++)
		prefill_pieces(m, &c, 3, &pa, l, 32, 8, 0);
	CHECK_EQ(t_info_of(m, 3).shared_blocks, 3 * span_blocks(&c));
	CHECK_RC(kvt_prefix_match(m, h, 4, HT, &got), 0);
	CHECK_EQ(got, 64);
	CHECK_TIERS(m, 2, 3);
	/* E on the whole chain: the restored fourth span and the re-cached third are the
	   prompt's */
	CHECK_RC(kvt_seq_create_prefix(m, 5, pa.L, h, 4, HT, &got), 0);
	CHECK_EQ(got, 64);
	check_history(m, &c, 5, &pa, 0, 64);
	for (uint32_t l = 0; l < c.n_layers; l++)
		prefill_pieces(m, &c, 5, &pa, l, 64, 0, 1);
	CHECK_RC(kvt_seq_destroy(m, 2), 0);
	plain_seq(m, &c, 4, &pa);
	check_same(m, 3, m, 4, &c, &pa);
	check_same(m, 5, m, 4, &c, &pa);
	CHECK_TIERS(m, 3, 4, 5);
	CHECK_EQ(t_stats_of(m).seqs_lost, 0);
	for (uint64_t s = 3; s <= 5; s++)
		CHECK_RC(kvt_seq_destroy(m, s), 0);
	CHECK_TIERS_NONE(m);
	kvt_manager_destroy(m);
	CHECK_EQ(t_dir_entries(dir), 0);
	free_prompt(&pa);
	free_prompt(&pb);
}

/* A manager whose spill file (24 groups) is full of the four idle spans of chain_of(1, 4),
   with two live plain sequences (2 and 3, 48 tokens, 18 groups each) in a host tier of 40
   groups, 4 free. */
static struct kvt_manager *full_file(struct kvt_config *c, const char *dir, const struct prompt *pa,
				     const struct prompt *pb, const struct prompt *pc, uint64_t *h)
{
	struct kvt_manager *m;
	struct kvt_stats st;
	uint64_t slot;

	c->spill_dir = dir;
	c->host_bytes = t_budget(c, 40);
	c->disk_bytes = 1 << 20;
	m = t_mk(c);
	slot = c->disk_bytes / (t_stats_of(m).disk_blocks_total / c->n_kv_heads);
	kvt_manager_destroy(m);
	c->disk_bytes = 24 * slot;
	m = t_mk(c);
	CHECK_EQ(t_stats_of(m).disk_blocks_total, 24 * c->n_kv_heads);
	cache_spans(m, c, pa, h);
	plain_seq(m, c, 2, pb);
	plain_seq(m, c, 3, pc);
	st = t_stats_of(m);
	CHECK_EQ(st.prefix_spans, 4);
	CHECK_EQ(st.prefix_blocks_disk, 4 * span_blocks(c));
	CHECK_EQ(st.disk_blocks_used, st.disk_blocks_total);
	CHECK_EQ(st.host_blocks_free, 4 * c->n_kv_heads);
	CHECK_TIERS(m, 2, 3);
	return m;
}

/* A full spill file drops the spans it holds before a live sequence's spill fails: for room a
   prefill needs, and for kvt_seq_spill. */
void test_prefix_disk_full(void **state)
{
	const char *dir = *state;
	struct kvt_config c = cfg();
	struct kvt_manager *m;
	struct kvt_stats st;
	struct kvt_seq_info in;
	uint64_t h[4];
	uint32_t got = 0;

	struct prompt pa = mk_prompt(&c, 1, 64, 1, 0), pb = mk_prompt(&c, 2, 48, 2, 0),
		      pc = mk_prompt(&c, 3, 48, 3, 0), pd = mk_prompt(&c, 4, 48, 4, 0);

	/* a prefill that needs room: sequence 2's blocks must go to the file */
	t_what = "full file, prefill";
	m = full_file(&c, dir, &pa, &pb, &pc, h);
	plain_seq(m, &c, 4, &pd);
	st = t_stats_of(m);
	CHECK_EQ(st.prefix_spans, 0);
	CHECK_EQ(st.prefix_spans_evicted, 4);
	assert_true(t_info_of(m, 2).disk_blocks > 0);
	CHECK_RC(kvt_prefix_match(m, h, 4, HT, &got), 0);
	CHECK_EQ(got, 0);
	CHECK_TIERS(m, 2, 3, 4);
	check_history(m, &c, 2, &pb, 0, pb.L);
	check_history(m, &c, 3, &pc, 0, pc.L);
	check_history(m, &c, 4, &pd, 0, pd.L);
	kvt_manager_destroy(m);

	/* an explicit spill of sequence 2 (18 groups) */
	t_what = "full file, kvt_seq_spill";
	m = full_file(&c, dir, &pa, &pb, &pc, h);
	CHECK_RC(kvt_seq_spill(m, 2), 0);
	in = t_info_of(m, 2);
	CHECK_EQ(in.disk_blocks, in.host_blocks);
	st = t_stats_of(m);
	CHECK_EQ(st.prefix_spans, 0);
	CHECK_EQ(st.prefix_spans_evicted, 4);
	CHECK_TIERS(m, 2, 3);
	/* and with nothing left to drop, the file's limit holds: 18 + 18 > 24 */
	CHECK_RC(kvt_seq_spill(m, 3), -ENOSPC);
	CHECK_TIERS(m, 2, 3);
	check_history(m, &c, 2, &pb, 0, pb.L);
	check_history(m, &c, 3, &pc, 0, pc.L);
	kvt_manager_destroy(m);
	CHECK_EQ(t_dir_entries(dir), 0);
	free_prompt(&pa);
	free_prompt(&pb);
	free_prompt(&pc);
	free_prompt(&pd);
}

/* Groups shared with the cache stay in the host tier, so the room spilling can make is what
   they leave: a resume whose resident blocks fit that room one layer at a time succeeds.
   S (40 tokens: 5 groups a layer) is preempted and spilled; H caches 5 spans (30 groups),
   which it holds, in a host tier of 40: 10 groups are left to S's resume, enough for one
   layer's resident blocks at a time, not for all three. */
void test_prefix_resume_shared(void **state)
{
	const char *dir = *state;
	struct kvt_config c = cfg();
	struct kvt_manager *m;
	uint64_t h[8];
	uint32_t got = 0;

	t_what = "resume beside shared groups";
	c.spill_dir = dir;
	c.host_bytes = t_budget(&c, 40);
	m = t_mk(&c);
	struct prompt ps = mk_prompt(&c, 10, 40, 10, 0), ph = mk_prompt(&c, 11, 81, 11, 0);

	plain_seq(m, &c, 10, &ps);
	CHECK_RC(kvt_seq_preempt(m, 10), 0);
	CHECK_RC(kvt_seq_spill(m, 10), 0);
	chain_of(11, 5, h);
	CHECK_RC(kvt_seq_create_prefix(m, 11, ph.L, h, 5, HT, &got), 0);
	prefill_whole(m, &c, 11, &ph);
	CHECK_EQ(t_stats_of(m).prefix_blocks_shared, 5 * span_blocks(&c));
	CHECK_RC(kvt_seq_resume(m, 10, NULL), 0);
	CHECK_TIERS(m, 10, 11);
	check_history(m, &c, 10, &ps, 0, ps.L);
	check_history(m, &c, 11, &ph, 0, ph.L);
	kvt_manager_destroy(m);
	CHECK_EQ(t_dir_entries(dir), 0);
	free_prompt(&ps);
	free_prompt(&ph);
}

/* A sequence created right after a call that used most of the host tier still reads its spans
   back: that call's blocks are not in use any more, so they may go to the file. One layer: X
   (120 tokens, 15 of the 20 groups) pushes two of A's four spans to the file, then a load
   reads all of X's history; C on A's chain needs 4 groups back, which only X's blocks can
   give. */
void test_prefix_restore_after_pins(void **state)
{
	const char *dir = *state;
	struct kvt_config c = cfg();
	struct kvt_manager *m;
	uint64_t h[4];
	uint32_t got = 0;

	t_what = "restore after a call that pinned the host tier";
	c.spill_dir = dir;
	c.n_layers = 1;
	c.host_bytes = t_budget(&c, 20);
	m = t_mk(&c);
	struct prompt pa = mk_prompt(&c, 1, 70, 1, 0), px = mk_prompt(&c, 12, 120, 12, 0);
	size_t bytes = (size_t)c.n_kv_heads * px.L * t_rowb(&c);
	uint8_t *k = t_xmalloc(bytes), *v = t_xmalloc(bytes);

	cache_spans(m, &c, &pa, h);
	plain_seq(m, &c, 12, &px);
	CHECK_EQ(t_stats_of(m).prefix_blocks_disk, 2 * span_blocks(&c));
	CHECK_RC(t_load_kv(m, 12, 0, 0, px.L, k, v, NULL), 0);
	CHECK_RC(kvt_prefix_match(m, h, 4, HT, &got), 0);
	CHECK_EQ(got, 64);
	CHECK_RC(kvt_seq_create_prefix(m, 3, pa.L, h, 4, HT, &got), 0);
	CHECK_EQ(got, 64);
	CHECK_EQ(t_stats_of(m).prefix_blocks_disk, 0);
	CHECK_TIERS(m, 3, 12);
	check_history(m, &c, 3, &pa, 0, 64);
	/* X in halves: the 8 groups C shares stay, 12 are left */
	check_history(m, &c, 12, &px, 0, px.L / 2);
	check_history(m, &c, 12, &px, px.L / 2, px.L);
	kvt_manager_destroy(m);
	CHECK_EQ(t_dir_entries(dir), 0);
	free(k);
	free(v);
	free_prompt(&pa);
	free_prompt(&px);
}
