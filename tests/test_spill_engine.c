/* SPDX-License-Identifier: MIT */
/*
 * spill: the I/O engines (io_uring, pread/pwrite) and the model backend's disk tier.
 */
#include "test_spill.h"

/* KVTIER_DISK_IO for the managers created from now on (NULL: unset); the teardown puts back
   what the binary was started with. */
static void set_engine(const char *v)
{
	assert_int_equal(v ? setenv("KVTIER_DISK_IO", v, 1) : unsetenv("KVTIER_DISK_IO"), 0);
}

/* I/O requests of the manager's disk engine so far. */
static uint64_t disk_ios(struct kvt_manager *m)
{
	struct kvt_disk_stats ds;

	kvt_disk_stats(m->disk, &ds);
	return ds.ios;
}

/* Whether this process may set up an io_uring (a container's seccomp profile or
   kernel.io_uring_disabled may refuse it). */
static bool uring_allowed(void)
{
	struct io_uring r;

	if (io_uring_queue_init(2, &r, 0) < 0)
		return false;
	io_uring_queue_exit(&r);
	return true;
}

/* The I/O engine. Without KVTIER_DISK_IO, or with uring, the disk tier uses io_uring where the
   kernel allows it and pread/pwrite where it does not; with sync, pread/pwrite, which spill,
   fetch and check every CRC the same way; any other value fails create. A ring that fails
   in the middle of a batch, with I/Os in flight, hands that batch and every later one to
   pread/pwrite: the call succeeds and nothing is lost, for a write batch (spill) and for a
   read batch (fetch). */
void test_spill_engine(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 4096), cs = c;
	struct kvt_manager *m;
	struct kvt_stats st;
	uint64_t A = 51, B = 52, C = 53, D = 54, two[2] = {51, 52}, nA, nB, ios, errs;
	bool ring = uring_allowed();

	t_what = "engine";
	print_message("# engine: io_uring %s here\n", ring ? "allowed" : "refused");
	c.disk_queue_depth = 2; /* batches of many units keep I/Os in flight between submits */

	/* the default, and uring, take io_uring where allowed */
	set_engine(NULL);
	m = f->m = t_mk(&c);
	CHECK_EQ(t_stats_of(m).disk_uring, ring);
	fdestroy(f);
	set_engine("uring");
	m = f->m = t_mk(&c);
	CHECK_EQ(t_stats_of(m).disk_uring, ring);
	fdestroy(f);

	/* anything else fails create and writes nothing */
	set_engine("io_uring");
	m = (struct kvt_manager *)&m;
	CHECK_RC(t_manager_create(&c, &m), -EINVAL);
	assert_ptr_equal(m, (struct kvt_manager *)&m);
	f->m = NULL;

	/* sync: the whole round trip, checksums included, with no ring; the units of a batch
	   whose slots are consecutive go as one I/O, rising (fresh slots) or falling (reused ones
	   come off the free stack); the buffers of two runs of 64 units, one run's I/O on the I/O
	   thread while the next is copied in or the last copied out */
	set_engine("sync");
	cs.disk_queue_depth = 2 * 64;
	m = f->m = t_mk(&cs);
	st = t_stats_of(m);
	CHECK_EQ(st.disk_uring, 0);
	CHECK_RC(kvt_disk_break_ring(m->disk, 1, -EIO), -ENOTSUP);
	prefill(m, &cs, A, 100);
	prefill(m, &cs, B, 37);
	decode(m, &cs, A, 3);
	nA = HOSTB(m, A);
	nB = HOSTB(m, B);
	ios = disk_ios(m);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_EQ(disk_ios(m) - ios, 1);
	ios = disk_ios(m);
	CHECK_RC(kvt_seq_spill(m, B), 0);
	CHECK_EQ(disk_ios(m) - ios, 1);
	st = t_stats_of(m);
	CHECK_EQ(st.disk_blocks_used, nA + nB);
	CHECK_EQ(DISK(m, A), nA);
	/* each layer's last block of both, in one batch */
	ios = disk_ios(m);
	CHECK_RC(kvt_seq_fetch(m, two, 2), 0);
	assert_true(disk_ios(m) - ios >= 1);
	assert_true(disk_ios(m) - ios <=
		    (tail_blocks(m, &cs, A) + tail_blocks(m, &cs, B)) / cs.n_kv_heads);
	CHECK_EQ(t_stats_of(m).disk_blocks_used,
		 nA + nB - tail_blocks(m, &cs, A) - tail_blocks(m, &cs, B));
	CHECK_SEQ(m, &cs, A);
	CHECK_SEQ_HOST(m, &cs, A);
	CHECK_SEQ_HOST(m, &cs, B);
	/* A came back a block at a time, so its slots came free out of order: its write is
	   several runs */
	ios = disk_ios(m);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	assert_true(disk_ios(m) - ios >= 1 && disk_ios(m) - ios <= nA / cs.n_kv_heads);
	CHECK_SEQ_HOST(m, &cs, A);
	/* a resume reads its resident set's blocks in one batch: those of a short sequence
	   (every token resident) come back in as many I/Os as they went out */
	{
		uint64_t w;

		prefill(m, &cs, D, 30);
		CHECK_RC(kvt_seq_preempt(m, D), 0);
		ios = disk_ios(m);
		CHECK_RC(kvt_seq_spill(m, D), 0);
		w = disk_ios(m) - ios;
		assert_true(w >= 1 && w <= 2);
		ios = disk_ios(m);
		CHECK_RC(kvt_seq_resume(m, D, NULL), 0);
		CHECK_EQ(disk_ios(m) - ios, w);
		CHECK_EQ(DISK(m, D), 0);
		CHECK_SEQ(m, &cs, D);
		CHECK_RC(kvt_seq_destroy(m, D), 0);
	}

	/* a merged write that comes short (at the file size limit here, as on a full file
	   system) is redone a unit at a time: the units below the limit are written, the others
	   stay in DRAM and the call fails with -ENOSPC (the file cannot grow: no disk I/O error,
	   none counted); nothing is lost. Then again with the limit inside a unit, whose write
	   comes short itself. */
	for (uint32_t straddle = 0; straddle < 2; straddle++) {
		struct kvt_disk_stats ds;
		struct rlimit old, lim;
		void (*old_xfsz)(int) = signal(SIGXFSZ, SIG_IGN);

		errs = t_stats_of(m).disk_io_errors;
		uint64_t nC, gC, X = straddle ? C + 100 : C;
		int rc;

		/* A and B (and the first round's C) take every slot the file has */
		CHECK_RC(kvt_seq_spill(m, A), 0);
		CHECK_RC(kvt_seq_spill(m, B), 0);
		if (straddle)
			CHECK_RC(kvt_seq_spill(m, C), 0);
		prefill(m, &cs, X, 60);
		nC = HOSTB(m, X);
		gC = nC / cs.n_kv_heads;
		assert_true(gC > 4);
		kvt_disk_stats(m->disk, &ds);
		CHECK_EQ(ds.slots_used, ds.slots_high);
		assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
		lim = old;
		lim.rlim_cur = (ds.slots_high + 3) * ds.slot_bytes + straddle * ds.slot_bytes / 2;
		assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
		ios = disk_ios(m);
		rc = kvt_seq_spill(m, X);
		setrlimit(RLIMIT_FSIZE, &old);
		signal(SIGXFSZ, old_xfsz);
		CHECK_RC(rc, -ENOSPC);
		/* the merged write, then one per unit (and the rest of the one that came short) */
		CHECK_EQ(disk_ios(m) - ios, 1 + gC + straddle);
		CHECK_EQ(DISK(m, X), 3ull * cs.n_kv_heads);
		CHECK_EQ(t_stats_of(m).disk_io_errors, errs);
		CHECK_SEQ_HOST(m, &cs, X);
		CHECK_EQ(DISK(m, X), 0);
		CHECK_RC(kvt_seq_spill(m, X), 0);
		CHECK_EQ(DISK(m, X), nC);
		CHECK_SEQ_HOST(m, &cs, X);
		CHECK_SEQ_HOST(m, &cs, B);
		CHECK_SEQ_HOST(m, &cs, A);
	}
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_RC(kvt_disk_corrupt_block(m, A, 1, (t_tokens_of(m, A, 1) - 1) / cs.block_tokens), 0);
	CHECK_RC(kvt_seq_fetch(m, &A, 1), -EBADMSG);
	st = t_stats_of(m);
	CHECK_EQ(st.disk_checksum_errors, 1);
	CHECK_EQ(st.seqs_lost, 1);
	CHECK_EQ(st.disk_io_errors, errs);
	CHECK_SEQ(m, &cs, B);
	{
		struct kvt_disk_stats ds;

		uint32_t n;

		kvt_disk_stats(m->disk, &ds);
		assert_true(ds.io_thread);
		/* it blocks every signal, as the save threads do */
		assert_true(t_kvt_threads_block_signals(&n));
		assert_true(n >= 1);
	}
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);

	/* sync with one bounce buffer: no I/O thread, one unit per I/O, the same round trip */
	cs.disk_queue_depth = 1;
	m = f->m = t_mk(&cs);
	prefill(m, &cs, A, 100);
	prefill(m, &cs, B, 37);
	nA = HOSTB(m, A);
	nB = HOSTB(m, B);
	ios = disk_ios(m);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_RC(kvt_seq_spill(m, B), 0);
	CHECK_EQ(disk_ios(m) - ios, (nA + nB) / cs.n_kv_heads);
	ios = disk_ios(m);
	CHECK_RC(kvt_seq_fetch(m, two, 2), 0);
	CHECK_EQ(disk_ios(m) - ios,
		 (tail_blocks(m, &cs, A) + tail_blocks(m, &cs, B)) / cs.n_kv_heads);
	CHECK_SEQ_HOST(m, &cs, A);
	CHECK_SEQ_HOST(m, &cs, B);
	CHECK_EQ(disk_ios(m) - ios, (nA + nB) / cs.n_kv_heads);
	{
		struct kvt_disk_stats ds;

		kvt_disk_stats(m->disk, &ds);
		assert_false(ds.io_thread);
		CHECK_EQ(ds.units_read, (nA + nB) / cs.n_kv_heads);
	}
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
	if (!ring) {
		print_message("# engine: the ring-failure cases need io_uring: not run\n");
		return;
	}

	CHECK_RC(kvt_disk_break_ring(NULL, 1, -EIO), -EINVAL);
	/* the ring fails in a write batch, in the submission of writes as they are filled (2nd) or
	   in the wait for a completion (3rd): A's spill still succeeds */
	for (uint32_t nth = 2; nth <= 3; nth++) {
		set_engine(NULL);
		m = f->m = t_mk(&c);
		CHECK_RC(kvt_disk_break_ring(m->disk, 1, 0), -EINVAL);
		prefill(m, &c, A, 100);
		prefill(m, &c, B, 37);
		nA = HOSTB(m, A);
		nB = HOSTB(m, B);
		assert_true(nA / c.n_kv_heads > 3 * c.disk_queue_depth);
		CHECK_RC(kvt_seq_spill(m, B), 0); /* through the ring */
		CHECK_EQ(t_stats_of(m).disk_uring, 1);
		CHECK_RC(kvt_disk_break_ring(m->disk, nth, -EBADF), 0);
		CHECK_RC(kvt_seq_spill(m, A), 0);
		st = t_stats_of(m);
		CHECK_EQ(st.disk_uring, 0);
		CHECK_EQ(st.disk_io_errors, 0);
		CHECK_EQ(st.disk_blocks_used, nA + nB); /* the abandoned slots are not counted */
		CHECK_EQ(st.disk_blocks_spilled, nA + nB);
		{
			struct kvt_disk_stats ds;

			/* the break found writes in flight, whose slots were set aside */
			kvt_disk_stats(m->disk, &ds);
			assert_true(ds.slots_abandoned >= 1 &&
				    ds.slots_abandoned <= c.disk_queue_depth);
			CHECK_EQ(ds.slots_high, ds.slots_used + ds.slots_abandoned);
		}
		CHECK_EQ(DISK(m, A), nA);
		CHECK_RC(kvt_disk_break_ring(m->disk, 1, -EIO), -ENOTSUP);
		/* B went through the ring, A partly; both come back through pread */
		CHECK_SEQ_HOST(m, &c, A);
		CHECK_SEQ_HOST(m, &c, B);
		CHECK_EQ(t_stats_of(m).disk_blocks_used, 0);
		CHECK_RC(kvt_seq_spill(m, A), 0);
		CHECK_SEQ(m, &c, A);
		fdestroy(f);
		CHECK_DIR_EMPTY(f->dir);
	}

	/* the ring fails in a read batch, in the wait for a completion (1st) or in the submission
	   of a buffer read into again (2nd, 3rd): the resume that reads still succeeds */
	for (uint32_t nth = 1; nth <= 3; nth++) {
		m = f->m = t_mk(&c);
		prefill(m, &c, A, 100);
		prefill(m, &c, B, 37);
		nA = HOSTB(m, A);
		CHECK_RC(kvt_seq_preempt(m, A), 0);
		CHECK_RC(kvt_seq_spill(m, A), 0);
		CHECK_RC(kvt_seq_spill(m, B), 0);
		CHECK_RC(kvt_disk_break_ring(m->disk, nth, -ENOMEM), 0);
		CHECK_RC(kvt_seq_resume(m, A, NULL), 0); /* its resident set's blocks, one batch */
		st = t_stats_of(m);
		CHECK_EQ(st.disk_uring, 0);
		assert_true(nA - DISK(m, A) > 3 * c.n_kv_heads * c.disk_queue_depth);
		CHECK_EQ(st.disk_io_errors, 0);
		CHECK_SEQ_HOST(m, &c, A);
		CHECK_SEQ_HOST(m, &c, B);
		/* the slots the reads used are reused */
		CHECK_RC(kvt_seq_spill(m, A), 0);
		CHECK_RC(kvt_seq_spill(m, B), 0);
		CHECK_EQ(t_stats_of(m).disk_blocks_used, HOSTB(m, A) + HOSTB(m, B));
		CHECK_SEQ(m, &c, A);
		CHECK_SEQ(m, &c, B);
		fdestroy(f);
		CHECK_DIR_EMPTY(f->dir);
	}

	/* a completion that never comes: the wait gives up (-ETIME, here after 20 ms), the ring is
	   failed and the batch finishes synchronously, in a write batch (spill) and in a read batch
	   (fetch); the later batches too */
	for (int rd = 0; rd <= 1; rd++) {
		struct kvt_disk_stats ds;
		int e;

		m = f->m = t_mk(&c);
		CHECK_RC(kvt_disk_stall_ring(NULL, 1, 20), -EINVAL);
		CHECK_RC(kvt_disk_stall_ring(m->disk, 1, 0), -EINVAL);
		prefill(m, &c, A, 100);
		prefill(m, &c, B, 37);
		nA = HOSTB(m, A);
		nB = HOSTB(m, B);
		if (rd)
			CHECK_RC(kvt_seq_spill(m, A), 0);
		e = kvt_disk_stall_ring(m->disk, 1, 20);
		if (e == -ENOTSUP) {
			print_message("# engine: the kernel cannot bound a wait: stall not run\n");
			fdestroy(f);
			break;
		}
		CHECK_RC(e, 0);
		if (rd)
			CHECK_RC(kvt_seq_fetch(m, two, 1), 0);
		else
			CHECK_RC(kvt_seq_spill(m, A), 0);
		kvt_disk_stats(m->disk, &ds);
		CHECK_EQ(ds.uring, 0);
		CHECK_EQ(ds.uring_err, -ETIME);
		st = t_stats_of(m);
		CHECK_EQ(st.disk_io_errors, 0);
		CHECK_EQ(st.disk_blocks_used, rd ? nA - tail_blocks(m, &c, A) : nA);
		CHECK_RC(kvt_disk_stall_ring(m->disk, 1, 20), -ENOTSUP);
		CHECK_SEQ_HOST(m, &c, A);
		CHECK_RC(kvt_seq_spill(m, B), 0); /* through pwritev */
		CHECK_EQ(t_stats_of(m).disk_blocks_used, nB);
		CHECK_SEQ_HOST(m, &c, B);
		CHECK_SEQ(m, &c, A);
		fdestroy(f);
		CHECK_DIR_EMPTY(f->dir);
	}
}

/* The model backend with a disk tier: spilling and fetching are accounted and timed, no file is
   written. */
static uint8_t dummy[256];

void test_spill_model(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = t_small_config();
	struct kvt_manager *m;
	struct kvt_stats s0, s1;
	uint64_t ids[6];

	t_what = "model backend";
	c.backend = KVT_BACKEND_MODEL;
	c.spill_dir = f->dir;
	c.host_bytes = t_budget(&c, 20);
	m = f->m = t_mk(&c);
	for (uint32_t i = 0; i < 6; i++) {
		ids[i] = 60 + i;
		CHECK_RC(kvt_seq_create(m, ids[i], 32), 0); /* 8 groups per sequence */
		for (uint32_t l = 0; l < c.n_layers; l++)
			CHECK_RC(
				t_prefill_layer(m, ids[i], l, dummy, dummy + 64, dummy + 128, NULL),
				0);
	}
	s0 = t_stats_of(m);
	assert_true(s0.disk_blocks_spilled > 0);
	assert_true(s0.model_ns_disk > 0);
	CHECK_EQ(s0.host_blocks_used + s0.disk_blocks_used, 6 * 16);
	CHECK_EQ(spill_fds(f->dir, NULL), 0);
	CHECK_DIR_EMPTY(f->dir);

	CHECK_RC(kvt_seq_spill(m, ids[5]), 0);
	CHECK_EQ(DISK(m, ids[5]), 16);
	CHECK_RC(kvt_seq_spill(m, ids[1]), 0);
	CHECK_RC(kvt_seq_fetch(m, &ids[5], 1), 0); /* 32 tokens: no last block to append to */
	CHECK_EQ(DISK(m, ids[5]), 16);
	CHECK_RC(t_decode_append(m, 0, &ids[1], 1, dummy, dummy + 64, NULL), 0);
	CHECK_RC(t_decode_append(m, 0, &ids[1], 1, dummy, dummy + 64, NULL), 0);
	CHECK_RC(kvt_seq_spill(m, ids[1]), 0);
	CHECK_RC(t_decode_append(m, 0, &ids[1], 1, dummy, dummy + 64, NULL), 0);
	CHECK_EQ(DISK(m, ids[1]), 16); /* of 18: its last block came back to take the token */
	CHECK_RC(kvt_seq_fetch(m, &ids[1], 1), 0);
	CHECK_EQ(DISK(m, ids[1]), 16); /* layer 1's last block is full */
	s1 = t_stats_of(m);
	assert_true(s1.disk_blocks_fetched > 0);
	assert_true(s1.model_ns_disk >= s0.model_ns_disk + 2ull * c.model_disk_ns);
	CHECK_EQ(s1.disk_io_errors, 0);
	CHECK_EQ(spill_fds(f->dir, NULL), 0);

	/* modelled I/Os fail through the fault hook as real ones do */
	CHECK_RC(kvt_seq_fetch(m, &ids[1], 1), 0);
	arm_io();
	CHECK_RC(kvt_seq_spill(m, ids[1]), -EIO);
	DISARM_IO();
	CHECK_EQ(DISK(m, ids[1]), 16);
	CHECK_RC(kvt_seq_spill(m, ids[1]), 0);
	CHECK_EQ(DISK(m, ids[1]), 18);
	arm_io();
	CHECK_RC(kvt_seq_fetch(m, &ids[1], 1), -EIO);
	DISARM_IO();
	CHECK_EQ(DISK(m, ids[1]), 18);
	CHECK_RC(kvt_seq_fetch(m, &ids[1], 1), 0);
	CHECK_EQ(DISK(m, ids[1]), 16);
	s1 = t_stats_of(m);
	CHECK_EQ(s1.disk_io_errors, 2);
	CHECK_EQ(s1.seqs_lost, 0);
	print_message("# model disk: %llu blocks spilled, %llu fetched, %.1f us modelled\n",
		      (unsigned long long)s1.disk_blocks_spilled,
		      (unsigned long long)s1.disk_blocks_fetched, (double)s1.model_ns_disk * 1e-3);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
}
