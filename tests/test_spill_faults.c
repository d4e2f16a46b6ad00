/* SPDX-License-Identifier: MIT */
/*
 * spill: injected I/O errors, checksum errors and allocation failures on the disk tier.
 */
#include "test_spill.h"

void arm_io(void)
{
	kvt_fault_arm(1u << KVT_FAULT_IO, 1);
}

void disarm_io(const char *file, int line)
{
	bool fired = kvt_fault_fired();

	kvt_fault_disarm();
	if (!fired)
		fail_at(file, line, "the armed I/O fault did not fire");
}

/* A failed write leaves the blocks in the host tier; a failed read leaves the sequence on disk
   and a retry succeeds; each counts in disk_io_errors and nothing else is affected. */
void test_spill_io_errors(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 4096);
	struct kvt_manager *m;
	struct kvt_stats st;
	struct kvt_seq_info in;
	uint64_t A = 31, B = 32, C = 33, ab[2] = {31, 32};
	uint64_t nA, nB;
	uint32_t nt;
	int rc;

	t_what = "I/O errors";
	m = f->m = t_mk(&c);
	prefill(m, &c, A, 90);
	prefill(m, &c, B, 50);
	prefill(m, &c, C, 30);
	decode(m, &c, A, 2);
	nA = HOSTB(m, A);
	nB = HOSTB(m, B);

	/* write */
	arm_io();
	rc = kvt_seq_spill(m, A);
	DISARM_IO();
	CHECK_RC(rc, -EIO);
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	in = t_info_of(m, A);
	assert_true(in.disk_blocks < nA);
	CHECK_EQ(in.lost, 0);
	st = t_stats_of(m);
	CHECK_EQ(st.disk_io_errors, 1);
	CHECK_EQ(st.disk_blocks_used, in.disk_blocks);
	CHECK_EQ(st.seqs_lost, 0);
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_SEQ(m, &c, B);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_EQ(DISK(m, A), nA);
	CHECK_RC(kvt_seq_spill(m, B), 0);
	CHECK_EQ(DISK(m, B), nB);

	/* read: the block that failed stays on disk (those read are placed), B and C are
	   unaffected, a retry works */
	arm_io();
	rc = kvt_seq_fetch(m, &A, 1);
	DISARM_IO();
	CHECK_RC(rc, -EIO);
	in = t_info_of(m, A);
	assert_true(tail_blocks(m, &c, A) > 0);
	assert_true(in.disk_blocks > nA - tail_blocks(m, &c, A) && in.disk_blocks <= nA);
	CHECK_EQ(in.lost, 0);
	st = t_stats_of(m);
	CHECK_EQ(st.disk_io_errors, 2);
	CHECK_EQ(st.seqs_lost, 0);
	CHECK_EQ(st.disk_blocks_used, in.disk_blocks + nB);
	CHECK_EQ(DISK(m, B), nB);
	CHECK_SEQ(m, &c, C);
	CHECK_RC(kvt_seq_fetch(m, &A, 1), 0);
	CHECK_EQ(DISK(m, A), nA - tail_blocks(m, &c, A));
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_EQ(DISK(m, A), 0);

	/* an implicit fetch that fails fails its call, which changes nothing */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	nt = t_tokens_of(m, A, 0);
	arm_io();
	rc = decode_layer(m, &c, &A, 1, 0);
	DISARM_IO();
	CHECK_RC(rc, -EIO);
	CHECK_EQ(t_tokens_of(m, A, 0), nt);
	CHECK_EQ(DISK(m, A), nA);
	CHECK_EQ(t_stats_of(m).disk_io_errors, 3);
	CHECK_RC(decode_layer(m, &c, &A, 1, 0), 0);
	CHECK_EQ(DISK(m, A), nA - c.n_kv_heads);

	/* a batched fetch with one failed read: the blocks read are placed, the one that
	   failed stays on disk */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	nA = HOSTB(m, A);
	arm_io();
	rc = kvt_seq_fetch(m, ab, 2);
	DISARM_IO();
	CHECK_RC(rc, -EIO);
	{
		uint64_t da = DISK(m, A), db = DISK(m, B);
		uint64_t ta = tail_blocks(m, &c, A), tb = tail_blocks(m, &c, B);

		/* one group (n_kv_heads blocks) failed */
		if (da + db != nA + nB - ta - tb + c.n_kv_heads || da < nA - ta || db < nB - tb)
			fail_at(__FILE__, __LINE__,
				"after a failed batched fetch: A %llu of %llu blocks on disk, B %llu "
				"of %llu (all last blocks back but one group)",
				(unsigned long long)da, (unsigned long long)nA,
				(unsigned long long)db, (unsigned long long)nB);
	}
	CHECK_EQ(t_stats_of(m).disk_io_errors, 4);
	CHECK_RC(kvt_seq_fetch(m, ab, 2), 0);
	CHECK_EQ(DISK(m, A), nA - tail_blocks(m, &c, A));
	CHECK_EQ(DISK(m, B), nB - tail_blocks(m, &c, B));
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_SEQ_HOST(m, &c, B);
	CHECK_SEQ_HOST(m, &c, C);
	st = t_stats_of(m);
	CHECK_EQ(st.seqs_lost, 0);
	CHECK_EQ(st.disk_checksum_errors, 0);
	CHECK_EQ(st.disk_blocks_used, 0);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);

	/* a write that fails while a full host tier makes room: nothing is lost, and the call
	   either found room elsewhere or failed changing nothing */
	c = spill_config(f->dir, 24);
	m = f->m = t_mk(&c);
	prefill(m, &c, A, 32);
	prefill(m, &c, B, 32);
	prefill(m, &c, C, 32);
	CHECK_RC(kvt_seq_create(m, 34, 32), 0);
	{
		void *k = t_xmalloc(2 * 32 * t_rowb(&c)), *v = t_xmalloc(2 * 32 * t_rowb(&c));
		void *q = t_xmalloc(4 * 4 * t_rowb(&c));

		t_fill_prefill(&c, 34, 0, 32, k, v, q);
		arm_io();
		rc = t_prefill_layer(m, 34, 0, k, v, q, NULL);
		DISARM_IO();
		free(k);
		free(v);
		free(q);
	}
	if (rc != 0 && rc != -ENOMEM && rc != -EIO)
		fail_at(__FILE__, __LINE__, "prefill with a failed spill write returned %d", rc);
	CHECK_EQ(t_tokens_of(m, 34, 0), rc ? 0 : 32);
	st = t_stats_of(m);
	CHECK_EQ(st.disk_io_errors, 1);
	CHECK_EQ(st.seqs_lost, 0);
	print_message("# prefill with a failed spill write: %d, %llu blocks spilled\n", rc,
		      (unsigned long long)st.disk_blocks_spilled);
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_SEQ_HOST(m, &c, B);
	CHECK_SEQ_HOST(m, &c, C);
	if (!rc)
		CHECK_SEQ_HOST(m, &c, 34);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
}

/* One call on a lost sequence; it must return -EBADMSG. Failures are collected so that every
   call that does not is named. */
static void lost_call(char *bad, size_t len, const char *name, int rc)
{
	size_t at = strlen(bad);

	if (rc != -EBADMSG && at + 64 < len)
		snprintf(bad + at, len - at, " %s=%d", name, rc);
}

/* A block read back with a CRC-32C mismatch loses its sequence: -EBADMSG, counted, and every
   later call on it but info and destroy fails so; other sequences are intact. */
void test_spill_checksum(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 4096);
	struct kvt_manager *m;
	struct kvt_stats st;
	struct kvt_seq_info in;
	uint64_t A = 41, B = 42, C = 43, ba[2] = {42, 41}, x;
	char bad[1024] = "";
	uint8_t *k, *v, *q; /* of the shapes the calls on A take (its prompt is 80 tokens) */
	size_t kv_bytes, q_bytes;
	float qf[64], out[64];
	int32_t res[128];
	struct kvt_recall_ref refs[8];
	uint64_t frames[8];
	uint32_t n, ns, blk[4] = {0, 1, 0, 1};
	uint32_t pos_c;

	t_what = "checksum";
	spill_recall(&c, 16);
	m = f->m = t_mk(&c);
	prefill(m, &c, A, 80);
	prefill(m, &c, B, 40);
	prefill(m, &c, C, 90);
	decode(m, &c, A, 2);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_RC(kvt_seq_spill(m, B), 0);
	CHECK_RC(kvt_disk_corrupt_block(m, C, 0, 0), -ENOENT); /* not on disk */
	CHECK_RC(kvt_disk_corrupt_block(m, A, 1, 3), 0);
	CHECK_RC(kvt_seq_fetch(m, &A, 1), 0); /* not that block */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_RC(kvt_disk_corrupt_block(m, A, 1, 82 / c.block_tokens), 0);

	CHECK_RC(kvt_seq_fetch(m, &A, 1), -EBADMSG);
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	st = t_stats_of(m);
	print_message("# corrupted block: disk_checksum_errors %llu, seqs_lost %llu\n",
		      (unsigned long long)st.disk_checksum_errors,
		      (unsigned long long)st.seqs_lost);
	assert_true(st.disk_checksum_errors >= 1);
	CHECK_EQ(st.seqs_lost, 1);
	CHECK_EQ(st.disk_io_errors, 0);
	in = t_info_of(m, A);
	CHECK_EQ(in.lost, -EBADMSG);

	/* every call on A but info and destroy */
	kv_bytes = (size_t)c.n_kv_heads * 80 * t_rowb(&c);
	q_bytes = (size_t)c.n_q_heads * (c.obs_window > 2 ? c.obs_window : 2) * t_rowb(&c);
	k = t_xmalloc(kv_bytes);
	v = t_xmalloc(kv_bytes);
	q = t_xmalloc(q_bytes);
	memset(qf, 0, sizeof(qf));
	lost_call(bad, sizeof(bad), "fetch", kvt_seq_fetch(m, &A, 1));
	lost_call(bad, sizeof(bad), "spill", kvt_seq_spill(m, A));
	lost_call(bad, sizeof(bad), "read_token(resident)",
		  kvt_seq_read_token(m, A, 0, 0, 0, k, v));
	lost_call(bad, sizeof(bad), "read_token(history)",
		  kvt_seq_read_token(m, A, 0, 0, 30, k, v));
	lost_call(bad, sizeof(bad), "read_token_host",
		  kvt_seq_read_token_host(m, A, 0, 0, 0, k, v));
	lost_call(bad, sizeof(bad), "tokens", kvt_seq_tokens(m, A, 0, &n));
	lost_call(bad, sizeof(bad), "resident_positions",
		  kvt_seq_resident_positions(m, A, 0, 0, res, 128, &n));
	lost_call(bad, sizeof(bad), "frames", kvt_seq_frames(m, A, 0, 0, frames, 8, &n, &ns));
	lost_call(bad, sizeof(bad), "recall_view", kvt_seq_recall_view(m, A, 0, 0, refs, 8, &n));
	lost_call(bad, sizeof(bad), "attend", kvt_attend(m, A, 0, qf, out));
	lost_call(bad, sizeof(bad), "decode_append", t_decode_append(m, 0, &A, 1, k, v, NULL));
	lost_call(bad, sizeof(bad), "decode_recall", t_decode_recall(m, 0, &A, 1, q, NULL));
	lost_call(bad, sizeof(bad), "recall_blocks", kvt_recall_blocks(m, 0, &A, 1, blk, 2, NULL));
	lost_call(bad, sizeof(bad), "prefill_layer", t_prefill_layer(m, A, 0, k, v, q, NULL));
	lost_call(bad, sizeof(bad), "preempt", kvt_seq_preempt(m, A));
	lost_call(bad, sizeof(bad), "resume", kvt_seq_resume(m, A, NULL));
	x = t_tokens_of(m, B, 0);
	lost_call(bad, sizeof(bad), "decode_append(B, A)",
		  t_decode_append(m, 0, ba, 2, k, v, NULL));
	CHECK_EQ(t_tokens_of(m, B, 0), x); /* all or nothing */
	st = t_stats_of(m);
	CHECK_EQ(st.seqs_lost, 1);

	/* the others are intact */
	CHECK_SEQ(m, &c, B);
	CHECK_SEQ_HOST(m, &c, B);
	CHECK_SEQ_HOST(m, &c, C);
	CHECK_EQ(DISK(m, B), 0);

	/* an implicit fetch (a token that is not resident) finds a corrupted block too */
	CHECK_RC(kvt_seq_spill(m, C), 0);
	CHECK_RC(kvt_seq_resident_positions(m, C, 1, 0, res, 128, &n), 0);
	for (pos_c = 0; pos_c < n && (uint32_t)res[pos_c] == pos_c; pos_c++)
		;
	CHECK_RC(kvt_disk_corrupt_block(m, C, 1, pos_c / c.block_tokens), 0);
	CHECK_RC(kvt_seq_read_token(m, C, 1, 0, pos_c, k, v), -EBADMSG);
	CHECK_EQ(t_info_of(m, C).lost, -EBADMSG);
	st = t_stats_of(m);
	CHECK_EQ(st.seqs_lost, 2);

	/* destroy works and frees the file space */
	CHECK_RC(kvt_seq_destroy(m, A), 0);
	CHECK_RC(kvt_seq_destroy(m, C), 0);
	st = t_stats_of(m);
	CHECK_EQ(st.disk_blocks_used, 0);
	CHECK_EQ(st.live_seqs, 1);
	CHECK_EQ(st.seqs_lost, 2);
	CHECK_SEQ(m, &c, B);
	/* the id can be used again */
	prefill(m, &c, A, 33);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_SEQ(m, &c, A);
	CHECK_EQ(t_info_of(m, A).lost, 0);
	free(k);
	free(v);
	free(q);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
	if (bad[0])
		fail_at(__FILE__, __LINE__,
			"calls on a lost sequence that did not fail with -EBADMSG:%s", bad);
}

/* An allocation that fails inside kvt_seq_spill, kvt_seq_fetch or a prefill that has to spill
   (every allocation in turn, through the fault hook) fails the call with -ENOMEM; no token is
   lost or changed, the sequence's blocks are where they were, or all where they belong, and no
   disk I/O error is counted. */
void test_spill_alloc_faults(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 40);
	struct kvt_manager *m;
	uint64_t A = 51, B = 52, C = 53, ab[2] = {51, 52};
	uint32_t fired[3] = {0}, n_dev = 0;
	char dev[1024] = "";
	size_t rb = t_rowb(&c);
	void *k = t_xmalloc(2 * 60 * rb), *v = t_xmalloc(2 * 60 * rb), *q = t_xmalloc(4 * 4 * rb);

	t_what = "allocation faults";
	m = f->m = t_mk(&c);
	prefill(m, &c, A, 60); /* 16 groups each */
	prefill(m, &c, B, 60);
	for (uint32_t op = 0; op < 3; op++)
		for (uint64_t nth = 1; nth < 500; nth++) {
			uint64_t da;
			bool hit;
			int rc;

			/* the state each attempt starts from */
			CHECK_RC(kvt_seq_fetch(m, ab, 2), 0);
			if (op == 1)
				CHECK_RC(kvt_seq_spill(m, A), 0);
			if (op == 2 && kvt_seq_destroy(m, C) == 0)
				CHECK_EQ(t_stats_of(m).live_seqs, 2);
			if (op == 2) {
				CHECK_RC(kvt_seq_create(m, C, 60), 0);
				prefill_n(m, &c, C, 60, 1, 0); /* 8 free groups left */
			}
			da = DISK(m, A);
			t_fill_prefill(&c, C, 1, 60, k, v, q);
			kvt_fault_arm(1u << KVT_FAULT_ALLOC, nth);
			if (op == 0)
				rc = kvt_seq_spill(m, A);
			else if (op == 1)
				rc = kvt_seq_fetch(m, &A, 1);
			else
				rc = t_prefill_layer(m, C, 1, k, v, q, NULL);
			hit = kvt_fault_fired();
			kvt_fault_disarm();
			if (!hit) {
				CHECK_RC(rc, 0);
				break;
			}
			fired[op]++;
			if (rc != 0 && rc != -ENOMEM)
				fail_at(__FILE__, __LINE__,
					"op %u with allocation %llu failing returned %d", op,
					(unsigned long long)nth, rc);
			if (rc && op < 2 && DISK(m, A) != da && n_dev++ < 4)
				soft_fail(
					dev, sizeof(dev),
					"%s returned %d with allocation %llu failing, leaving %llu "
					"of %llu blocks on disk (%llu before)",
					op ? "kvt_seq_fetch" : "kvt_seq_spill", rc,
					(unsigned long long)nth, (unsigned long long)DISK(m, A),
					(unsigned long long)HOSTB(m, A), (unsigned long long)da);
			if (op == 2)
				CHECK_EQ(t_tokens_of(m, C, 1), rc ? 0 : 60);
			CHECK_EQ(t_stats_of(m).seqs_lost, 0);
			CHECK_EQ(t_stats_of(m).disk_io_errors, 0); /* no I/O failed */
			CHECK_SEQ(m, &c, A);
			CHECK_SEQ(m, &c, B);
		}
	free(k);
	free(v);
	free(q);
	print_message("# allocation faults: spill %u, fetch %u, prefill with spilling %u\n",
		      fired[0], fired[1], fired[2]);
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_SEQ_HOST(m, &c, B);
	CHECK_SEQ_HOST(m, &c, C);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
	if (dev[0])
		print_message("# placement left by failed calls (allowed: kvtier.h, which tier "
			      "holds a block is not visible; %u times):%s\n",
			      n_dev, dev);
}
