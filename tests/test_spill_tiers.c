/* SPDX-License-Identifier: MIT */
/*
 * spill: spills and fetches by hand, private files, implicit fetches, the automatic LRU spill.
 */
#include "test_spill.h"

/* ---- focused tests ------------------------------------------------------------------------ */

/* Spill, then read back every token (from the host history too); disk_blocks follows; the
   stats rise and fall; space in the file is reused. */
void test_spill_roundtrip(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 4096);
	struct kvt_manager *m;
	struct kvt_stats s0, s1, s2;
	struct kvt_seq_info in0, in1;
	struct stat fst;
	uint64_t A = 1, B = 2, C = 3, nA, nB, bad = 999, two[2] = {1, 2};
	off_t size_a;

	t_what = "roundtrip";
	m = f->m = t_mk(&c);
	prefill(m, &c, A, 100);
	prefill(m, &c, B, 37);
	decode(m, &c, A, 5);
	decode(m, &c, B, 3);
	in0 = t_info_of(m, A);
	nA = in0.host_blocks;
	nB = HOSTB(m, B);
	CHECK_EQ(nA, 2ull * 2 * DIV_UP(105, 8));
	CHECK_EQ(nB, 2ull * 2 * DIV_UP(40, 8));
	CHECK_EQ(in0.disk_blocks, 0);
	s0 = t_stats_of(m);
	CHECK_EQ(s0.disk_blocks_total, UINT64_MAX); /* disk_bytes 0: no limit */
	CHECK_EQ(s0.disk_blocks_used, 0);

	/* spill: every block of A goes to disk; its device frames stay */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	in1 = t_info_of(m, A);
	CHECK_EQ(in1.disk_blocks, nA);
	CHECK_EQ(in1.host_blocks, nA);
	CHECK_EQ(in1.device_frames, in0.device_frames);
	CHECK_EQ(in1.lost, 0);
	CHECK_EQ(DISK(m, B), 0);
	s1 = t_stats_of(m);
	CHECK_EQ(s1.disk_blocks_used, nA);
	CHECK_EQ(s1.disk_blocks_spilled, nA);
	CHECK_EQ(s1.host_blocks_used, s0.host_blocks_used - nA);
	CHECK_EQ(s1.host_blocks_free, s0.host_blocks_free + nA);
	CHECK_EQ(s1.device_frames_used, s0.device_frames_used);
	assert_true(s1.disk_bytes_written >= nA * 2 * c.block_tokens * t_rowb(&c));
	/* nothing left to spill: no I/O */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	s2 = t_stats_of(m);
	CHECK_EQ(s2.disk_blocks_spilled, s1.disk_blocks_spilled);
	CHECK_EQ(s2.disk_bytes_written, s1.disk_bytes_written);

	/* the host history read of a spilled sequence brings it back */
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_EQ(DISK(m, A), 0);
	s2 = t_stats_of(m);
	CHECK_EQ(s2.disk_blocks_used, 0);
	CHECK_EQ(s2.disk_blocks_fetched, nA);
	CHECK_EQ(s2.host_blocks_used, s0.host_blocks_used);
	assert_true(s2.disk_bytes_read >= nA * 2 * c.block_tokens * t_rowb(&c));
	CHECK_SEQ(m, &c, A);
	CHECK_SEQ(m, &c, B);
	CHECK_SEQ_HOST(m, &c, B);

	/* kvt_seq_read_token of every token (most are not resident): only the blocks of the
	   tokens read from the host history come back */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_SEQ(m, &c, A);
	if (DISK(m, A) == 0 || DISK(m, A) == nA)
		fail_at(__FILE__, __LINE__,
			"%llu of %llu blocks of A on disk after reading its tokens, expected the "
			"blocks of resident tokens only",
			(unsigned long long)DISK(m, A), (unsigned long long)nA);
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_EQ(DISK(m, A), 0);

	/* explicit fetch: each layer's last block; a second fetch and a fetch of a sequence
	   never spilled cost nothing */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	s1 = t_stats_of(m);
	CHECK_RC(kvt_seq_fetch(m, &A, 1), 0);
	CHECK_EQ(tail_blocks(m, &c, A), 2 * 2);
	CHECK_EQ(DISK(m, A), nA - tail_blocks(m, &c, A));
	s2 = t_stats_of(m);
	CHECK_EQ(s2.disk_blocks_fetched, s1.disk_blocks_fetched + tail_blocks(m, &c, A));
	CHECK_RC(kvt_seq_fetch(m, &A, 1), 0);
	CHECK_RC(kvt_seq_fetch(m, &B, 1), 0);
	s1 = t_stats_of(m);
	CHECK_EQ(s1.disk_blocks_fetched, s2.disk_blocks_fetched);
	CHECK_EQ(s1.disk_bytes_read, s2.disk_bytes_read);
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_EQ(DISK(m, A), 0);

	/* reuse: spill A, fetch A, spill B; B needs less than A, so neither the blocks in use
	   nor the file grow past what A took */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_EQ(t_stats_of(m).disk_blocks_used, nA);
	assert_int_equal(spill_fds(f->dir, &fst), 1);
	size_a = fst.st_size;
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_EQ(t_stats_of(m).disk_blocks_used, 0);
	CHECK_RC(kvt_seq_spill(m, B), 0);
	CHECK_EQ(t_stats_of(m).disk_blocks_used, nB);
	assert_int_equal(spill_fds(f->dir, &fst), 1);
	if (fst.st_size > size_a)
		fail_at(__FILE__, __LINE__,
			"spill file grew from %lld to %lld bytes for %llu blocks after holding "
			"%llu (space not reused)",
			(long long)size_a, (long long)fst.st_size, (unsigned long long)nB,
			(unsigned long long)nA);
	/* both at once, and their last blocks back in one call */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_EQ(t_stats_of(m).disk_blocks_used, nA + nB);
	s1 = t_stats_of(m);
	CHECK_RC(kvt_seq_fetch(m, two, 2), 0);
	s2 = t_stats_of(m);
	CHECK_EQ(s2.disk_blocks_used, nA + nB - tail_blocks(m, &c, A) - tail_blocks(m, &c, B));
	CHECK_EQ(s2.disk_blocks_fetched,
		 s1.disk_blocks_fetched + tail_blocks(m, &c, A) + tail_blocks(m, &c, B));
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_SEQ_HOST(m, &c, B);
	CHECK_EQ(t_stats_of(m).disk_blocks_used, 0);
	CHECK_EQ(t_stats_of(m).host_blocks_used, s0.host_blocks_used);

	/* a preempted sequence: spilled, then resumed (which fetches its resident set's
	   blocks) */
	CHECK_RC(kvt_seq_preempt(m, A), 0);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	in1 = t_info_of(m, A);
	CHECK_EQ(in1.preempted, 1);
	CHECK_EQ(in1.device_frames, 0);
	CHECK_EQ(in1.disk_blocks, nA);
	CHECK_RC(kvt_seq_resume(m, A, NULL), 0);
	assert_true(DISK(m, A) < nA);
	CHECK_SEQ(m, &c, A);
	CHECK_SEQ_HOST(m, &c, A);

	/* errors */
	CHECK_RC(kvt_seq_spill(m, bad), -ENOENT);
	CHECK_RC(kvt_seq_fetch(m, &bad, 1), -ENOENT);
	CHECK_RC(kvt_seq_fetch(m, NULL, 1), -EINVAL);
	CHECK_RC(kvt_seq_fetch(m, &A, 0), -EINVAL);
	CHECK_RC(kvt_seq_spill(NULL, A), -EINVAL);
	CHECK_RC(kvt_seq_fetch(NULL, &A, 1), -EINVAL);
	/* a sequence with no host blocks yet: nothing to do */
	CHECK_RC(kvt_seq_create(m, C, 50), 0);
	s1 = t_stats_of(m);
	CHECK_RC(kvt_seq_spill(m, C), 0);
	s2 = t_stats_of(m);
	CHECK_EQ(s2.disk_blocks_spilled, s1.disk_blocks_spilled);
	CHECK_EQ(DISK(m, C), 0);

	/* destroying a spilled sequence frees its file space; a manager goes with B on disk */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_RC(kvt_seq_destroy(m, A), 0);
	CHECK_EQ(t_stats_of(m).disk_blocks_used, 0);
	CHECK_RC(kvt_seq_spill(m, B), 0);
	CHECK_EQ(t_stats_of(m).disk_blocks_used, nB);
	CHECK_SEQ(m, &c, B);
	CHECK_RC(kvt_seq_spill(m, B), 0);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
}

/* The spill file is private: nothing appears in spill_dir (the file is unlinked, mode 0600),
   nothing is left after destroy, and spill_dir is copied at create. */
void test_spill_private(void **state)
{
	struct fix *f = *state;
	char dir[PATH_MAX] = "";
	struct kvt_config c = spill_config(dir, 4096);
	struct kvt_manager *m;
	struct kvt_stats st;
	struct statfs sfs;
	struct stat fst;
	uint32_t n;

	t_what = "private";
	snprintf(dir, sizeof(dir), "%s", f->dir);
	m = f->m = t_mk(&c);
	memset(dir, 'x', sizeof(dir) - 1); /* the manager keeps its own copy */
	dir[sizeof(dir) - 1] = 0;
	{
		struct kvt_config got;

		CHECK_RC(kvt_manager_config(m, &got), 0);
		assert_non_null(got.spill_dir);
		assert_string_equal(got.spill_dir, f->dir);
	}
	CHECK_DIR_EMPTY(f->dir);
	prefill(m, &c, 7, 90);
	prefill(m, &c, 8, 20);
	CHECK_RC(kvt_seq_spill(m, 7), 0);
	CHECK_RC(kvt_seq_spill(m, 8), 0);
	CHECK_DIR_EMPTY(f->dir);
	n = spill_fds(f->dir, &fst);
	if (n != 1)
		fail_at(__FILE__, __LINE__, "%u open files in the spill directory, expected 1", n);
	CHECK_EQ(fst.st_nlink, 0);
	if ((fst.st_mode & 07777) != 0600)
		fail_at(__FILE__, __LINE__, "spill file mode %o, expected 0600",
			(unsigned)(fst.st_mode & 07777));
	st = t_stats_of(m);
	/* ext4, xfs and btrfs take O_DIRECT */
	if (!statfs(f->dir, &sfs) &&
	    (sfs.f_type == 0xEF53 || sfs.f_type == 0x58465342 || sfs.f_type == 0x9123683E))
		CHECK_EQ(st.disk_direct, 1);
	print_message("# spill file on fs 0x%lx, O_DIRECT %u, %lld bytes for %llu blocks\n",
		      (unsigned long)sfs.f_type, st.disk_direct, (long long)fst.st_size,
		      (unsigned long long)st.disk_blocks_used);
	CHECK_SEQ(m, &c, 7);
	CHECK_SEQ_HOST(m, &c, 8);
	CHECK_DIR_EMPTY(f->dir);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
	CHECK_EQ(spill_fds(f->dir, NULL), 0);
}

/* Decode, recall (scored and explicit), resume and reading a token that is not resident fetch a
   spilled sequence themselves and see the right bytes; spilling leaves the device as it was. */
void test_spill_implicit_fetch(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 4096);
	struct kvt_manager *m;
	uint64_t A = 11, B = 12, both[2] = {12, 11};
	size_t row;
	uint8_t *q;
	uint32_t blocks[2 * 2], n_res = 0, np = 0;
	uint64_t nA, d;
	int32_t res[128];
	float qa[4 * 16], out0[4 * 16], out1[4 * 16];
	uint8_t gk[64], gv[64], wk[64], wv[64];
	struct kvt_stats st;

	t_what = "implicit fetch";
	spill_recall(&c, 64);
	row = t_rowb(&c);
	m = f->m = t_mk(&c);
	prefill(m, &c, A, 100);
	prefill(m, &c, B, 60);
	decode(m, &c, A, 3);
	decode(m, &c, B, 3);

	/* decode: a batch with a spilled member fetches the block each token goes to */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	nA = DISK(m, A);
	CHECK_EQ(t_tokens_of(m, A, 0) % c.block_tokens, 7);
	CHECK_RC(decode_layer(m, &c, both, 2, 0), 0);
	CHECK_EQ(DISK(m, A), nA - c.n_kv_heads);
	CHECK_RC(decode_layer(m, &c, both, 2, 1), 0);
	CHECK_EQ(DISK(m, A), nA - 2 * c.n_kv_heads);
	CHECK_SEQ(m, &c, A);
	CHECK_SEQ(m, &c, B);

	/* scored recall; a batch naming A twice fails before anything comes back (the scoring
	   on the host built A's block metadata from its spilled history first until 2026-12-06,
	   found by fuzz_api_cuda) */
	q = t_xmalloc(2 * (size_t)c.n_q_heads * row);
	for (uint32_t g = 0; g < 2 * c.n_q_heads; g++)
		t_fill_row(c.dtype, c.head_dim, q + g * row, A, 1, 2000 + g % c.n_q_heads, 7, 0);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	d = DISK(m, A);
	CHECK_RC(t_decode_recall(m, 1, (uint64_t[]){A, A}, 2, q, NULL), -EINVAL);
	CHECK_EQ(DISK(m, A), d);
	CHECK_RC(t_decode_recall(m, 1, &A, 1, q, NULL), 0);
	d = DISK(m, A);
	assert_true(d > 0 && d < nA);
	assert_true(check_view(m, &c, A, 1) > 0);

	/* explicit recall; then spilling does not touch the device: attention is the same */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	blocks[0] = 1;
	blocks[1] = 5;
	blocks[2] = 2;
	blocks[3] = 6;
	CHECK_RC(kvt_recall_blocks(m, 0, &A, 1, blocks, 2, NULL), 0);
	d = DISK(m, A);
	assert_true(d > 0 && d < nA);
	assert_true(check_view(m, &c, A, 0) > 0);
	for (uint32_t i = 0; i < c.n_q_heads * c.head_dim; i++)
		qa[i] = (float)((int)(t_mix(i) % 256) - 128) / 128.0f;
	CHECK_RC(kvt_attend(m, A, 0, qa, out0), 0);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_RC(kvt_attend(m, A, 0, qa, out1), 0);
	if (memcmp(out0, out1, sizeof(out0)))
		fail_at(__FILE__, __LINE__, "attention of seq %llu changed when it was spilled",
			(unsigned long long)A);
	assert_true(check_view(m, &c, A, 0) > 0);

	/* resume */
	CHECK_RC(kvt_seq_fetch(m, &A, 1), 0);
	CHECK_RC(kvt_seq_preempt(m, A), 0);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_RC(kvt_seq_resume(m, A, NULL), 0);
	d = DISK(m, A);
	assert_true(d > 0 && d < nA);
	CHECK_SEQ(m, &c, A);

	/* one token that is not resident: its block alone */
	CHECK_RC(kvt_seq_resident_positions(m, A, 0, 0, res, 128, &n_res), 0);
	for (uint32_t i = 0; i < n_res && (uint32_t)res[i] == np; i++)
		np++; /* np: the first position not resident */
	assert_true(np < t_tokens_of(m, A, 0));
	CHECK_RC(kvt_seq_spill(m, A), 0);
	d = DISK(m, A);
	CHECK_RC(kvt_seq_read_token(m, A, 0, 0, np, gk, gv), 0);
	CHECK_EQ(DISK(m, A), d - c.n_kv_heads);
	t_fill_row(c.dtype, c.head_dim, wk, A, 0, 0, np, 0);
	t_fill_row(c.dtype, c.head_dim, wv, A, 0, 0, np, 1);
	assert_memory_equal(gk, wk, row);
	assert_memory_equal(gv, wv, row);

	/* destroy while spilled */
	CHECK_RC(kvt_seq_spill(m, B), 0);
	CHECK_RC(kvt_seq_destroy(m, B), 0);
	st = t_stats_of(m);
	CHECK_EQ(st.disk_blocks_used, DISK(m, A));
	CHECK_EQ(st.disk_io_errors, 0);
	CHECK_EQ(st.seqs_lost, 0);
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_EQ(t_stats_of(m).disk_blocks_used, 0);
	free(q);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
}

/* A full host tier spills the least recently used sequences first, the call's own last (never
   a block the call touches). */
void test_spill_auto_lru(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 24);
	struct kvt_manager *m;
	struct kvt_stats s0, s1;
	uint64_t A = 21, B = 22, C = 23, D = 24, E = 25, ade[3] = {21, 24, 25};
	uint32_t tok[3];

	t_what = "automatic spill";
	m = f->m = t_mk(&c);
	/* 32-token prompts: 4 groups per layer, 8 per sequence; three fill the host tier */
	prefill(m, &c, A, 32);
	prefill(m, &c, B, 32);
	prefill(m, &c, C, 32);
	s0 = t_stats_of(m);
	CHECK_EQ(s0.host_blocks_total, 48);
	CHECK_EQ(s0.host_blocks_free, 0);
	CHECK_EQ(s0.disk_blocks_spilled, 0);

	/* A needs a block: B is the least recently used sequence not in the call */
	CHECK_RC(decode_layer(m, &c, &A, 1, 0), 0);
	if (!DISK(m, B) || DISK(m, A) || DISK(m, C))
		fail_at(__FILE__, __LINE__,
			"decode of A (B least recently used, then C): disk blocks A %llu, B %llu, "
			"C %llu; expected only B's",
			(unsigned long long)DISK(m, A), (unsigned long long)DISK(m, B),
			(unsigned long long)DISK(m, C));
	CHECK_RC(kvt_seq_spill(m, B), 0);
	CHECK_EQ(DISK(m, B), 16);

	/* D (6 groups per layer) fits one layer in the 7 free groups; its second layer makes
	   room from C (last used before A) */
	prefill(m, &c, D, 48);
	if (!DISK(m, C) || DISK(m, A) || DISK(m, D))
		fail_at(__FILE__, __LINE__,
			"prefill of D (C least recently used, then A): disk blocks A %llu, C %llu, "
			"D %llu; expected only C's",
			(unsigned long long)DISK(m, A), (unsigned long long)DISK(m, C),
			(unsigned long long)DISK(m, D));

	/* only the batch's own sequences are in the host tier: their blocks that this call
	   does not touch make room (the other layer's, and those before each last block) */
	CHECK_RC(kvt_seq_spill(m, C), 0);
	prefill_n(m, &c, E, 24, 1, 0); /* the last 3 free groups */
	s0 = t_stats_of(m);
	CHECK_EQ(s0.host_blocks_free, 0);
	for (uint32_t i = 0; i < 3; i++)
		tok[i] = t_tokens_of(m, ade[i], 0);
	CHECK_RC(decode_layer(m, &c, ade, 3, 0), 0);
	s1 = t_stats_of(m);
	assert_true(s1.disk_blocks_spilled > s0.disk_blocks_spilled);
	CHECK_EQ(s1.disk_blocks_fetched, s0.disk_blocks_fetched);
	for (uint32_t i = 0; i < 3; i++)
		CHECK_EQ(t_tokens_of(m, ade[i], 0), tok[i] + 1);
	assert_true(DISK(m, A) + DISK(m, D) + DISK(m, E) > 0);

	/* D alone: A or E makes room, never D */
	CHECK_RC(decode_layer(m, &c, &D, 1, 0), 0);
	CHECK_EQ(DISK(m, D), 0);
	assert_true(DISK(m, A) + DISK(m, E) > 0);

	CHECK_RC(kvt_manager_sync(m, NULL), 0);
	CHECK_SEQ(m, &c, A);
	CHECK_SEQ(m, &c, B);
	CHECK_SEQ(m, &c, C);
	CHECK_SEQ(m, &c, D);
	CHECK_SEQ(m, &c, E);
	/* the host history too (these short prompts are all resident, so only this fetches) */
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_SEQ_HOST(m, &c, B);
	CHECK_SEQ_HOST(m, &c, C);
	CHECK_SEQ_HOST(m, &c, D);
	CHECK_SEQ_HOST(m, &c, E);
	s1 = t_stats_of(m);
	assert_true(s1.disk_blocks_fetched > 0);
	CHECK_EQ(s1.host_blocks_used + s1.host_blocks_free, s1.host_blocks_total);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
}

/* A call whose own blocks do not fit the host tier together fails with -ENOMEM and changes
   nothing; a smaller batch of the same sequences runs. */
void test_spill_pinned_full(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 4);
	struct kvt_manager *m;
	struct kvt_stats s0, s1;
	uint64_t ids[5] = {31, 32, 33, 34, 35};
	uint32_t tok[5];

	t_what = "pinned full";
	m = f->m = t_mk(&c);
	/* 12-token prompts: 2 groups per layer, the second one part full */
	for (uint32_t i = 0; i < 5; i++)
		prefill(m, &c, ids[i], 12);
	for (uint32_t i = 0; i < 5; i++) {
		CHECK_RC(kvt_seq_spill(m, ids[i]), 0);
		tok[i] = t_tokens_of(m, ids[i], 0);
	}
	/* five last blocks to append to, four host groups */
	s0 = t_stats_of(m);
	CHECK_EQ(s0.host_blocks_free, s0.host_blocks_total);
	CHECK_RC(decode_layer(m, &c, ids, 5, 0), -ENOMEM);
	assert_non_null(strstr(kvt_manager_last_error(m), "host tier"));
	s1 = t_stats_of(m);
	CHECK_EQ(s1.disk_blocks_fetched, s0.disk_blocks_fetched);
	CHECK_EQ(s1.disk_blocks_used, s0.disk_blocks_used);
	CHECK_EQ(s1.tokens_appended, s0.tokens_appended);
	for (uint32_t i = 0; i < 5; i++)
		CHECK_EQ(t_tokens_of(m, ids[i], 0), tok[i]);
	/* four fit; then the fifth alone, spilling what the others no longer need */
	CHECK_RC(decode_layer(m, &c, ids, 4, 0), 0);
	CHECK_RC(decode_layer(m, &c, ids + 4, 1, 0), 0);
	for (uint32_t i = 0; i < 5; i++) {
		CHECK_EQ(t_tokens_of(m, ids[i], 0), tok[i] + 1);
		CHECK_SEQ_HOST(m, &c, ids[i]);
	}
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
}

/* A sequence whose history is several times the host tier: every call fetches only the blocks
   it touches, and every token reads back bit-exact, also after preemption and resumption. */
void test_spill_big_history(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 32);
	struct kvt_manager *m;
	struct kvt_stats st;
	uint64_t A = 41, B = 42, both[2] = {41, 42};
	uint32_t blocks[2 * 2];
	size_t row;
	uint8_t *q;

	t_what = "big history";
	c.n_layers = 4;
	spill_recall(&c, 64);
	row = t_rowb(&c);
	m = f->m = t_mk(&c);
	/* 200 tokens: 25 groups a layer, 100 for the sequence, over three times the 32 */
	prefill(m, &c, A, 200);
	prefill(m, &c, B, 60);
	CHECK_EQ(t_stats_of(m).host_blocks_total, 64);
	assert_true(HOSTB(m, A) >= 3 * 64);
	assert_true(DISK(m, A) >= HOSTB(m, A) - 64);
	/* decode 20 tokens on every layer, A alone and with B */
	for (uint32_t t = 0; t < 20; t++)
		for (uint32_t l = 0; l < c.n_layers; l++)
			CHECK_RC(decode_layer(m, &c, t % 2 ? both : &A, t % 2 ? 2 : 1, l), 0);
	assert_true(HOSTB(m, A) >= 3 * 64 && DISK(m, A) >= HOSTB(m, A) - 64);
	/* recall, explicit and scored, on every layer */
	q = t_xmalloc((size_t)c.n_q_heads * row);
	for (uint32_t g = 0; g < c.n_q_heads; g++)
		t_fill_row(c.dtype, c.head_dim, q + g * row, A, 1, 3000 + g, 11, 0);
	for (uint32_t l = 0; l < c.n_layers; l++) {
		blocks[0] = 1 + l;
		blocks[1] = 9 + l;
		blocks[2] = 5 + l;
		blocks[3] = 13;
		CHECK_RC(kvt_recall_blocks(m, l, &A, 1, blocks, 2, NULL), 0);
		assert_true(check_view(m, &c, A, l) > 0);
		CHECK_RC(t_decode_recall(m, l, &A, 1, q, NULL), 0);
		assert_true(check_view(m, &c, A, l) > 0);
	}
	/* preempted, spilled whole, resumed: the resident set comes back from disk */
	CHECK_RC(kvt_seq_preempt(m, A), 0);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_EQ(DISK(m, A), HOSTB(m, A));
	CHECK_RC(kvt_seq_resume(m, A, NULL), 0);
	CHECK_RC(decode_layer(m, &c, both, 2, 0), 0);
	/* every token, through the device where resident and from the history */
	CHECK_SEQ(m, &c, A);
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_SEQ(m, &c, B);
	CHECK_SEQ_HOST(m, &c, B);
	st = t_stats_of(m);
	CHECK_EQ(st.seqs_lost, 0);
	CHECK_EQ(st.disk_io_errors, 0);
	CHECK_EQ(st.host_blocks_used + st.host_blocks_free, st.host_blocks_total);
	print_message("# big history: %llu blocks of A (host tier %llu), %llu spilled, %llu "
		      "fetched\n",
		      (unsigned long long)HOSTB(m, A), (unsigned long long)st.host_blocks_total,
		      (unsigned long long)st.disk_blocks_spilled,
		      (unsigned long long)st.disk_blocks_fetched);
	free(q);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
}
