/* SPDX-License-Identifier: MIT */
/*
 * spill: the disk tier (kvt_seq_spill, kvt_seq_fetch, automatic spilling when the host tier is
 * full), checked against the contract in kvtier.h.
 *
 * The main test is a long seeded run on the host backend whose host tier is far too small for
 * the live sequences, so blocks go to the spill file and come back all the time, racing with
 * the save threads, now and then with one of the I/Os failing (fault hook): every token
 * written keeps a 64-bit checksum of its K and V rows (all kv heads), and every token of every
 * live sequence is read back and compared, for a few sequences every few hundred operations
 * and for all of them at the end. A call may fail with -ENOMEM only when even spilling every
 * other sequence could not make room (or -EIO when an injected I/O failure hit it), and a
 * failed call must change no token. The focused tests cover read-back after a spill, the
 * private spill file, implicit fetches, the choice of victims, the disk_bytes limit, bad
 * configurations, I/O failures, checksum mismatches (a corrupted block), allocation failures
 * and the model backend.
 *
 * The seed is printed; KVT_TEST_SEED=<n> repeats a run, KVT_TEST_OPS=<n> changes its length.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "t_ops.h"
#include "fault.h"
#include "internal.h"
#include "policy.h"
#include "util.h"

/* ---- context for failure messages ------------------------------------------------------- */

/* t_ops.h's t_seed, t_op and t_what: the seed and operation of the no-loss runs, the step of
   the others. */

/* ---- the spill directory (fixture) ----------------------------------------------------- */

struct fix {
	char dir[PATH_MAX];    /* canonical path of a fresh mkdtemp directory */
	struct kvt_manager *m; /* the test's manager, destroyed by the teardown if it failed */
};

struct rrun;
static struct rrun *g_run; /* the no-loss run under way, freed by the teardown if it failed */
static char *g_engine;	   /* KVTIER_DISK_IO as the test binary found it (NULL: unset) */
static void rrun_free(struct rrun *r);

/* Destroys the test's manager (the test goes on, or ends). */
static void fdestroy(struct fix *f)
{
	kvt_manager_destroy(f->m);
	f->m = NULL;
}

static int fix_setup(void **state)
{
	struct fix *f = t_xmalloc(sizeof(*f));
	const char *tmp = getenv("TMPDIR");
	char tmpl[PATH_MAX];

	snprintf(tmpl, sizeof(tmpl), "%s/kvt-spill-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(tmpl) || !realpath(tmpl, f->dir)) {
		fprintf(stderr, "spill: mkdtemp %s: %s\n", tmpl, strerror(errno));
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

/* Removes the directory (and anything a failed test left in it). */
static int fix_teardown(void **state)
{
	struct fix *f = *state;
	DIR *d = opendir(f->dir);
	struct dirent *e;
	char p[PATH_MAX + 256];

	kvt_fault_disarm();
	t_op = -1;
	fdestroy(f);
	if (g_engine)
		setenv("KVTIER_DISK_IO", g_engine, 1);
	else
		unsetenv("KVTIER_DISK_IO");
	if (g_run) {
		rrun_free(g_run);
		g_run = NULL;
	}
	while (d && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", f->dir, e->d_name);
		unlink(p);
	}
	if (d)
		closedir(d);
	rmdir(f->dir);
	free(f);
	return 0;
}

/* Names in dir other than . and .. */
static uint32_t dir_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	uint32_t n = 0;

	assert_non_null(d);
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

#define CHECK_DIR_EMPTY(dir)                                                                     \
	do {                                                                                     \
		uint32_t n_ = dir_entries(dir);                                                  \
		if (n_)                                                                          \
			fail_at(__FILE__, __LINE__, "%u file(s) left in the spill directory %s", \
				n_, dir);                                                        \
	} while (0)

/* Open descriptors of this process on files in dir (an unlinked file still shows there, as
   "dir/name (deleted)"); the stat of the last one in *st. */
static uint32_t spill_fds(const char *dir, struct stat *st)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	size_t dl = strlen(dir);
	uint32_t n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d))) {
		char p[300], link[PATH_MAX];
		ssize_t r;

		if (e->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "/proc/self/fd/%s", e->d_name);
		r = readlink(p, link, sizeof(link) - 1);
		if (r < 0)
			continue;
		link[r] = 0;
		if (strncmp(link, dir, dl) || link[dl] != '/')
			continue;
		n++;
		if (st && stat(p, st))
			memset(st, 0, sizeof(*st));
	}
	closedir(d);
	return n;
}

/* ---- small helpers ------------------------------------------------------------------------ */

/* ---- deterministic sequences for the focused tests (common.h's t_value data) --------------- */

/* t_small_config (2 layers, 2 kv heads, 4 q heads, d 16 f16, 8-token blocks: 512-byte blocks,
   1 KiB block groups; sink 8, recent 16, top-K 16, obs 4) with a disk tier in dir and a host
   tier of host_groups block groups. */
static struct kvt_config spill_config(const char *dir, uint32_t host_groups)
{
	struct kvt_config c = t_small_config();

	c.host_bytes = t_budget(&c, host_groups);
	c.spill_dir = dir;
	return c;
}

/* Prefills layers [0, layers) of seq (created here unless it is live) with t_fill_prefill's
   data; each layer must return want. */
static void prefill_n(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t L,
		      uint32_t layers, int want)
{
	size_t row = t_rowb(c);
	void *k = t_xmalloc((size_t)c->n_kv_heads * L * row);
	void *v = t_xmalloc((size_t)c->n_kv_heads * L * row);
	void *q = t_xmalloc((size_t)c->n_q_heads * c->obs_window * row);
	struct kvt_seq_info in = {.size = sizeof(in)};

	if (kvt_seq_info(m, seq, &in) == -ENOENT)
		CHECK_RC(kvt_seq_create(m, seq, L), 0);
	for (uint32_t l = 0; l < layers; l++) {
		if (t_tokens_of(m, seq, l))
			continue;
		t_fill_prefill(c, seq, l, L, k, v, q);
		CHECK_RC(t_prefill_layer(m, seq, l, k, v, q, NULL), want);
	}
	free(k);
	free(v);
	free(q);
}

static void prefill(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t L)
{
	prefill_n(m, c, seq, L, c->n_layers, 0);
}

/* One decode step of the n sequences on `layer` (positions from their token counts). */
static int decode_layer(struct kvt_manager *m, const struct kvt_config *c, const uint64_t *seqs,
			uint32_t n, uint32_t layer)
{
	size_t row = t_rowb(c);
	void *k = t_xmalloc((size_t)n * c->n_kv_heads * row);
	void *v = t_xmalloc((size_t)n * c->n_kv_heads * row);
	uint32_t pos[16];
	int rc;

	assert_true(n <= 16);
	for (uint32_t i = 0; i < n; i++)
		pos[i] = t_tokens_of(m, seqs[i], layer);
	t_fill_decode(c, seqs, pos, n, layer, k, v);
	rc = t_decode_append(m, layer, seqs, n, k, v, NULL);
	free(k);
	free(v);
	return rc;
}

/* `steps` decode steps of seq on every layer. */
static void decode(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t steps)
{
	for (uint32_t t = 0; t < steps; t++)
		for (uint32_t l = 0; l < c->n_layers; l++)
			CHECK_RC(decode_layer(m, c, &seq, 1, l), 0);
}

/* Reads every token of every layer and head of seq back (kvt_seq_read_token, or the internal
   kvt_seq_read_token_host when host is set) and compares it with the data written. */
static void check_seq_at(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, bool host,
			 const char *file, int line)
{
	uint8_t wk[256], wv[256], gk[256], gv[256];
	size_t row = t_rowb(c);

	assert_true(row <= sizeof(wk));
	for (uint32_t l = 0; l < c->n_layers; l++) {
		uint32_t n = t_tokens_of(m, seq, l);

		for (uint32_t h = 0; h < c->n_kv_heads; h++)
			for (uint32_t p = 0; p < n; p++) {
				int rc = host ? kvt_seq_read_token_host(m, seq, l, h, p, gk, gv)
					      : kvt_seq_read_token(m, seq, l, h, p, gk, gv);

				if (rc)
					fail_at(file, line,
						"%s of seq %llu layer %u head %u pos %u returned "
						"%d (%s)",
						host ? "read_token_host" : "read_token",
						(unsigned long long)seq, l, h, p, rc,
						kvt_strerror(rc));
				t_fill_row(c->dtype, c->head_dim, wk, seq, l, h, p, 0);
				t_fill_row(c->dtype, c->head_dim, wv, seq, l, h, p, 1);
				if (memcmp(gk, wk, row) || memcmp(gv, wv, row))
					fail_at(file, line,
						"%s of seq %llu layer %u head %u pos %u (of %u): "
						"bytes differ",
						host ? "read_token_host" : "read_token",
						(unsigned long long)seq, l, h, p, n);
			}
	}
}
#define CHECK_SEQ(m, c, seq) check_seq_at((m), (c), (seq), false, __FILE__, __LINE__)
#define CHECK_SEQ_HOST(m, c, seq) check_seq_at((m), (c), (seq), true, __FILE__, __LINE__)

/* Host blocks of seq that are on disk, and all of its host blocks. */
#define DISK(m, seq) (t_info_of((m), (seq)).disk_blocks)
#define HOSTB(m, seq) (t_info_of((m), (seq)).host_blocks)

/* The recall view of (seq, layer) must hold the bytes of the blocks it names. Returns the
   number of blocks checked. */
static uint32_t check_view(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq,
			   uint32_t layer)
{
	struct kvt_recall_ref refs[64];
	uint8_t want[256], *fr = t_xmalloc(2 * (size_t)c->block_tokens * t_rowb(c));
	size_t row = t_rowb(c);
	uint32_t total = 0;

	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		uint32_t nv = 0;

		CHECK_RC(kvt_seq_recall_view(m, seq, layer, h, refs, 64, &nv), 0);
		for (uint32_t i = 0; i < nv; i++) {
			t_dev_read(fr, refs[i].frame, 2 * (size_t)c->block_tokens * row);
			for (uint32_t j = 0; j < refs[i].n_valid; j++) {
				uint32_t p = refs[i].block * c->block_tokens + j;

				t_fill_row(c->dtype, c->head_dim, want, seq, layer, h, p, 0);
				if (memcmp(fr + j * row, want, row))
					fail_at(__FILE__, __LINE__,
						"recalled K of seq %llu layer %u head %u pos %u "
						"differs",
						(unsigned long long)seq, layer, h, p);
				t_fill_row(c->dtype, c->head_dim, want, seq, layer, h, p, 1);
				if (memcmp(fr + (c->block_tokens + j) * row, want, row))
					fail_at(__FILE__, __LINE__,
						"recalled V of seq %llu layer %u head %u pos %u "
						"differs",
						(unsigned long long)seq, layer, h, p);
			}
		}
		total += nv;
	}
	free(fr);
	return total;
}

/* ---- focused tests ------------------------------------------------------------------------ */

/* Spill, then read back every token (from the host history too); disk_blocks follows; the
   stats rise and fall; space in the file is reused. */
static void test_spill_roundtrip(void **state)
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

	/* kvt_seq_read_token of every token (most are not resident) */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_SEQ(m, &c, A);
	CHECK_EQ(DISK(m, A), 0);
	CHECK_SEQ_HOST(m, &c, A);

	/* explicit fetch; a second fetch and a fetch of a sequence never spilled cost nothing */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	s1 = t_stats_of(m);
	CHECK_RC(kvt_seq_fetch(m, &A, 1), 0);
	CHECK_EQ(DISK(m, A), 0);
	s2 = t_stats_of(m);
	CHECK_EQ(s2.disk_blocks_fetched, s1.disk_blocks_fetched + nA);
	CHECK_RC(kvt_seq_fetch(m, &A, 1), 0);
	CHECK_RC(kvt_seq_fetch(m, &B, 1), 0);
	s1 = t_stats_of(m);
	CHECK_EQ(s1.disk_blocks_fetched, s2.disk_blocks_fetched);
	CHECK_EQ(s1.disk_bytes_read, s2.disk_bytes_read);
	CHECK_SEQ_HOST(m, &c, A);

	/* reuse: spill A, fetch A, spill B; B needs less than A, so neither the blocks in use
	   nor the file grow past what A took */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_EQ(t_stats_of(m).disk_blocks_used, nA);
	assert_int_equal(spill_fds(f->dir, &fst), 1);
	size_a = fst.st_size;
	CHECK_RC(kvt_seq_fetch(m, &A, 1), 0);
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
	/* both at once, and back in one call */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_EQ(t_stats_of(m).disk_blocks_used, nA + nB);
	s1 = t_stats_of(m);
	CHECK_RC(kvt_seq_fetch(m, two, 2), 0);
	s2 = t_stats_of(m);
	CHECK_EQ(s2.disk_blocks_used, 0);
	CHECK_EQ(s2.disk_blocks_fetched, s1.disk_blocks_fetched + nA + nB);
	CHECK_EQ(s2.host_blocks_used, s0.host_blocks_used);
	CHECK_SEQ_HOST(m, &c, A);
	CHECK_SEQ_HOST(m, &c, B);

	/* a preempted sequence: spilled, then resumed (which fetches it) */
	CHECK_RC(kvt_seq_preempt(m, A), 0);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	in1 = t_info_of(m, A);
	CHECK_EQ(in1.preempted, 1);
	CHECK_EQ(in1.device_frames, 0);
	CHECK_EQ(in1.disk_blocks, nA);
	CHECK_RC(kvt_seq_resume(m, A, NULL), 0);
	CHECK_EQ(DISK(m, A), 0);
	CHECK_SEQ(m, &c, A);

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
static void test_spill_private(void **state)
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
static void test_spill_implicit_fetch(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 4096);
	struct kvt_manager *m;
	uint64_t A = 11, B = 12, both[2] = {12, 11};
	size_t row;
	uint8_t *q;
	uint32_t blocks[2 * 2], n_res = 0, np = 0;
	int32_t res[128];
	float qa[4 * 16], out0[4 * 16], out1[4 * 16];
	uint8_t gk[64], gv[64], wk[64], wv[64];
	struct kvt_stats st;

	t_what = "implicit fetch";
	c.recall_blocks = 2;
	c.recall_cache_bytes = 64 * 2 * c.block_tokens * t_rowb(&c);
	c.device_bytes += c.recall_cache_bytes;
	row = t_rowb(&c);
	m = f->m = t_mk(&c);
	prefill(m, &c, A, 100);
	prefill(m, &c, B, 60);
	decode(m, &c, A, 3);
	decode(m, &c, B, 3);

	/* decode: a batch with a spilled member */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_RC(decode_layer(m, &c, both, 2, 0), 0);
	CHECK_EQ(DISK(m, A), 0);
	CHECK_RC(decode_layer(m, &c, both, 2, 1), 0);
	CHECK_SEQ(m, &c, A);
	CHECK_SEQ(m, &c, B);

	/* scored recall */
	q = t_xmalloc((size_t)c.n_q_heads * row);
	for (uint32_t g = 0; g < c.n_q_heads; g++)
		t_fill_row(c.dtype, c.head_dim, q + g * row, A, 1, 2000 + g, 7, 0);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_RC(t_decode_recall(m, 1, &A, 1, q, NULL), 0);
	CHECK_EQ(DISK(m, A), 0);
	assert_true(check_view(m, &c, A, 1) > 0);

	/* explicit recall; then spilling does not touch the device: attention is the same */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	blocks[0] = 1;
	blocks[1] = 5;
	blocks[2] = 2;
	blocks[3] = 6;
	CHECK_RC(kvt_recall_blocks(m, 0, &A, 1, blocks, 2, NULL), 0);
	CHECK_EQ(DISK(m, A), 0);
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
	CHECK_EQ(DISK(m, A), 0);
	CHECK_SEQ(m, &c, A);

	/* one token that is not resident */
	CHECK_RC(kvt_seq_resident_positions(m, A, 0, 0, res, 128, &n_res), 0);
	for (uint32_t i = 0; i < n_res && (uint32_t)res[i] == np; i++)
		np++; /* np: the first position not resident */
	assert_true(np < t_tokens_of(m, A, 0));
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_RC(kvt_seq_read_token(m, A, 0, 0, np, gk, gv), 0);
	t_fill_row(c.dtype, c.head_dim, wk, A, 0, 0, np, 0);
	t_fill_row(c.dtype, c.head_dim, wv, A, 0, 0, np, 1);
	assert_memory_equal(gk, wk, row);
	assert_memory_equal(gv, wv, row);
	CHECK_EQ(DISK(m, A), 0);

	/* destroy while spilled */
	CHECK_RC(kvt_seq_spill(m, B), 0);
	CHECK_RC(kvt_seq_destroy(m, B), 0);
	st = t_stats_of(m);
	CHECK_EQ(st.disk_blocks_used, 0);
	CHECK_EQ(st.disk_io_errors, 0);
	CHECK_EQ(st.seqs_lost, 0);
	CHECK_SEQ_HOST(m, &c, A);
	free(q);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
}

/* A full host tier spills the least recently used sequences that the call does not name; a
   call whose own sequences fill the host tier fails with -ENOMEM and changes nothing. */
static void test_spill_auto_lru(void **state)
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

	/* only the batch's own sequences are in the host tier: -ENOMEM, nothing changes */
	CHECK_RC(kvt_seq_spill(m, C), 0);
	prefill_n(m, &c, E, 24, 1, 0); /* the last 3 free groups */
	s0 = t_stats_of(m);
	CHECK_EQ(s0.host_blocks_free, 0);
	for (uint32_t i = 0; i < 3; i++)
		tok[i] = t_tokens_of(m, ade[i], 0);
	CHECK_RC(decode_layer(m, &c, ade, 3, 0), -ENOMEM);
	s1 = t_stats_of(m);
	CHECK_EQ(s1.host_blocks_used, s0.host_blocks_used);
	CHECK_EQ(s1.disk_blocks_used, s0.disk_blocks_used);
	CHECK_EQ(s1.disk_blocks_spilled, s0.disk_blocks_spilled);
	CHECK_EQ(s1.disk_blocks_fetched, s0.disk_blocks_fetched);
	CHECK_EQ(s1.tokens_appended, s0.tokens_appended);
	CHECK_EQ(s1.decode_calls, s0.decode_calls);
	for (uint32_t i = 0; i < 3; i++) {
		CHECK_EQ(t_tokens_of(m, ade[i], 0), tok[i]);
		CHECK_EQ(DISK(m, ade[i]), 0);
	}
	assert_true(strlen(kvt_manager_last_error(m)) > 0);

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

/* Appends a contract deviation to buf (the test goes on, and fails at its end listing them). */
static void soft_fail(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void soft_fail(char *buf, size_t len, const char *fmt, ...)
{
	size_t at = strlen(buf);
	va_list ap;

	if (at + 3 >= len)
		return;
	if (at)
		buf[at++] = ';';
	buf[at++] = ' ';
	buf[at] = 0;
	va_start(ap, fmt);
	vsnprintf(buf + at, len - at, fmt, ap);
	va_end(ap);
}

/* Fetches back every sequence of ids[0..n) that has part (not all) of its blocks on disk, after
   a failed call spilled part of what it needed; the room is the room that call freed. */
static void undo_partial(struct kvt_manager *m, const uint64_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq_info in = t_info_of(m, ids[i]);

		if (in.disk_blocks && in.disk_blocks < in.host_blocks)
			CHECK_RC(kvt_seq_fetch(m, &ids[i], 1), 0);
	}
}

/* One disk_bytes case of test_spill_disk_limit; returns disk_blocks_total. */
static uint64_t disk_limit_case(struct fix *f, uint64_t disk_bytes)
{
	struct kvt_config c = spill_config(f->dir, 64);
	struct kvt_manager *m;
	struct kvt_stats s0, s1;
	uint64_t T, used = 0, rem, U = 500, ids[64];
	uint32_t hg, n_s, k = 0, L, n_ids = 0;
	char dev[1024] = "";
	int rc = 0;

	c.disk_bytes = disk_bytes;
	m = f->m = t_mk(&c);
	T = t_stats_of(m).disk_blocks_total;
	fdestroy(f);
	if (T == 0 || T == UINT64_MAX || T < 8)
		fail_at(__FILE__, __LINE__, "disk_bytes %llu gives disk_blocks_total %llu",
			(unsigned long long)c.disk_bytes, (unsigned long long)T);
	assert_true(T <= disk_bytes / 512);
	/* a host tier of sequences of 8 blocks (16 tokens, 2 layers) holding more than the file */
	hg = (uint32_t)(DIV_UP(T, 8) + 2) * 4;
	n_s = hg / 4;
	assert_true(2 * n_s + 1 <= 64);
	c.host_bytes = t_budget(&c, hg);
	m = f->m = t_mk(&c);
	CHECK_EQ(t_stats_of(m).disk_blocks_total, T);
	for (uint32_t i = 0; i < n_s; i++) {
		prefill(m, &c, 100 + i, 16);
		ids[n_ids++] = 100 + i;
	}
	s0 = t_stats_of(m);
	CHECK_EQ(s0.host_blocks_free, 0);
	CHECK_EQ(s0.disk_blocks_spilled, 0);

	s1 = t_stats_of(m);
	for (k = 0; k < n_s; k++) {
		s0 = t_stats_of(m);
		rc = kvt_seq_spill(m, 100 + k);
		s1 = t_stats_of(m);
		if (rc)
			break;
		used += 8;
		CHECK_EQ(s1.disk_blocks_used, used);
		assert_true(used <= T);
	}
	if (rc != -ENOSPC)
		fail_at(__FILE__, __LINE__,
			"spill %u of %u (8 blocks each, %llu allowed) returned %d, expected -ENOSPC",
			k, n_s, (unsigned long long)T, rc);
	assert_true(k >= 1);
	if (used + 8 <= T)
		fail_at(__FILE__, __LINE__, "-ENOSPC with %llu of %llu blocks used",
			(unsigned long long)used, (unsigned long long)T);
	CHECK_EQ(s1.host_blocks_used + s1.disk_blocks_used,
		 s0.host_blocks_used + s0.disk_blocks_used);
	if (s1.disk_blocks_used != s0.disk_blocks_used || DISK(m, 100 + k))
		soft_fail(
			dev, sizeof(dev),
			"kvt_seq_spill returned -ENOSPC after writing %llu of the 8 blocks of its "
			"sequence (disk_blocks_used %llu -> %llu of %llu)",
			(unsigned long long)DISK(m, 100 + k),
			(unsigned long long)s0.disk_blocks_used,
			(unsigned long long)s1.disk_blocks_used, (unsigned long long)T);
	undo_partial(m, ids, n_ids);
	CHECK_EQ(t_stats_of(m).disk_blocks_used, used);
	rem = T - used;

	/* refill the host tier: no spilling needed */
	s0 = t_stats_of(m);
	for (uint32_t i = 0; i < k; i++) {
		prefill(m, &c, 200 + i, 16);
		ids[n_ids++] = 200 + i;
	}
	s1 = t_stats_of(m);
	CHECK_EQ(s1.disk_blocks_spilled, s0.disk_blocks_spilled);
	s0 = s1;
	CHECK_EQ(s0.host_blocks_free, 0);
	CHECK_EQ(s0.disk_blocks_used, used);

	/* a layer of more blocks than the file has left: -ENOMEM, nothing changes */
	L = 8 * (uint32_t)(rem / 2 + 1);
	CHECK_RC(kvt_seq_create(m, U, L), 0);
	prefill_n(m, &c, U, L, 1, -ENOMEM);
	s1 = t_stats_of(m);
	CHECK_EQ(s1.tokens_prompt, s0.tokens_prompt);
	CHECK_EQ(s1.prefill_layers, s0.prefill_layers);
	CHECK_EQ(t_tokens_of(m, U, 0), 0);
	if (s1.disk_blocks_used != s0.disk_blocks_used ||
	    s1.host_blocks_used != s0.host_blocks_used)
		soft_fail(
			dev, sizeof(dev),
			"a prefill that failed with -ENOMEM (it needs %u blocks, the file has "
			"%llu left) spilled other sequences first (disk_blocks_used %llu -> %llu)",
			2 * (L / 8), (unsigned long long)rem,
			(unsigned long long)s0.disk_blocks_used,
			(unsigned long long)s1.disk_blocks_used);
	undo_partial(m, ids, n_ids);
	s1 = t_stats_of(m);
	CHECK_EQ(s1.disk_blocks_used, s0.disk_blocks_used);
	CHECK_EQ(s1.host_blocks_used, s0.host_blocks_used);

	CHECK_RC(kvt_seq_spill(m, 200), -ENOSPC);
	s1 = t_stats_of(m);
	if (s1.disk_blocks_used != s0.disk_blocks_used || DISK(m, 200))
		soft_fail(
			dev, sizeof(dev),
			"kvt_seq_spill returned -ENOSPC after writing %llu of the 8 blocks of its "
			"sequence (full file)",
			(unsigned long long)DISK(m, 200));
	undo_partial(m, ids, n_ids);
	s1 = t_stats_of(m);
	CHECK_EQ(s1.disk_blocks_used, s0.disk_blocks_used);
	CHECK_EQ(s1.host_blocks_used, s0.host_blocks_used);

	/* a decode that needs a block: either room is made or nothing changes */
	rc = decode_layer(m, &c, (uint64_t[]){201}, 1, 0);
	if (rc) {
		CHECK_RC(rc, -ENOMEM);
		CHECK_EQ(t_tokens_of(m, 201, 0), 16);
		if (t_stats_of(m).disk_blocks_used != s0.disk_blocks_used)
			soft_fail(
				dev, sizeof(dev),
				"a decode that failed with -ENOMEM spilled other sequences first");
		undo_partial(m, ids, n_ids);
	}

	/* destroying a spilled sequence gives its file space back */
	CHECK_RC(kvt_seq_destroy(m, 100), 0);
	ids[0] = ids[--n_ids];
	assert_true(t_stats_of(m).disk_blocks_used <= T - 8);
	prefill_n(m, &c, U, L, 1, 0);
	CHECK_EQ(DISK(m, U), 0);
	assert_true(t_stats_of(m).disk_blocks_used <= T);
	for (uint32_t i = 1; i < n_s; i++)
		CHECK_SEQ(m, &c, 100 + i);
	for (uint32_t i = 0; i < k; i++)
		CHECK_SEQ(m, &c, 200 + i);
	CHECK_SEQ(m, &c, U);
	s1 = t_stats_of(m);
	assert_true(s1.disk_blocks_used <= T);
	CHECK_EQ(s1.disk_io_errors, 0);
	print_message("# disk_bytes %llu: %llu blocks; %u sequences of 8 blocks spilled before "
		      "-ENOSPC, %llu blocks left\n",
		      (unsigned long long)c.disk_bytes, (unsigned long long)T, k,
		      (unsigned long long)rem);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
	if (dev[0])
		print_message("# placement left by failed calls (allowed: kvtier.h, which tier "
			      "holds a block is not visible):%s\n",
			      dev);
	return T;
}

/* disk_bytes: a full spill file makes kvt_seq_spill -ENOSPC and a call that needs host room
   -ENOMEM, and neither changes anything; space freed in the file is used again. First with a
   file that holds whole sequences exactly, then with one that has room for part of one more
   (a call must not spill part of what it needs and then fail). */
static void test_spill_disk_limit(void **state)
{
	struct fix *f = *state;
	uint64_t bytes = 48 << 10, T, unit;

	t_what = "disk limit";
	T = disk_limit_case(f, bytes);
	unit = bytes / (T / 2); /* file bytes of one block group (2 kv heads) */
	t_what = "disk limit, partly free";
	disk_limit_case(f, bytes - unit);
}

/* Bad disk configurations fail kvt_manager_create; without a disk tier kvt_seq_spill is
   -ENOTSUP and kvt_seq_fetch only validates. */
static void test_spill_bad_config(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 32);
	struct kvt_manager *m = NULL;
	struct kvt_stats st;
	char path[PATH_MAX + 32];
	uint64_t A = 1, bad = 2;
	FILE *fp;
	int rc;

	t_what = "bad config";
	snprintf(path, sizeof(path), "%s/no-such-dir", f->dir);
	c.spill_dir = path;
	rc = t_manager_create(&c, &m);
	if (rc >= 0 || m)
		fail_at(__FILE__, __LINE__, "spill_dir %s (missing): create returned %d", path, rc);
	print_message("# missing spill_dir: %d (%s)\n", rc, kvt_strerror(rc));

	snprintf(path, sizeof(path), "%s/a-file", f->dir);
	fp = fopen(path, "w");
	assert_non_null(fp);
	fclose(fp);
	rc = t_manager_create(&c, &m);
	unlink(path);
	if (rc >= 0 || m)
		fail_at(__FILE__, __LINE__, "spill_dir %s (a file): create returned %d", path, rc);
	print_message("# spill_dir a file: %d (%s)\n", rc, kvt_strerror(rc));

	c.spill_dir = "";
	rc = t_manager_create(&c, &m);
	if (rc >= 0 || m)
		fail_at(__FILE__, __LINE__, "spill_dir \"\": create returned %d", rc);

	c.spill_dir = f->dir;
	c.disk_queue_depth = 0;
	CHECK_RC(t_manager_create(&c, &m), -EINVAL);
	c.disk_queue_depth = 4097;
	CHECK_RC(t_manager_create(&c, &m), -EINVAL);
	assert_null(m);
	c.disk_queue_depth = 1; /* the least allowed works */
	m = f->m = t_mk(&c);
	prefill(m, &c, A, 70);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_SEQ(m, &c, A);
	fdestroy(f);
	m = NULL;
	CHECK_DIR_EMPTY(f->dir);

	/* no disk tier */
	c.spill_dir = NULL;
	c.disk_queue_depth = 64;
	m = f->m = t_mk(&c);
	prefill(m, &c, A, 70);
	CHECK_RC(kvt_seq_spill(m, A), -ENOTSUP);
	CHECK_RC(kvt_seq_spill(m, bad), -ENOENT);
	CHECK_RC(kvt_seq_fetch(m, &A, 1), 0);
	CHECK_RC(kvt_seq_fetch(m, &bad, 1), -ENOENT);
	CHECK_RC(kvt_seq_fetch(m, NULL, 1), -EINVAL);
	CHECK_RC(kvt_seq_fetch(m, &A, 0), -EINVAL);
	st = t_stats_of(m);
	CHECK_EQ(st.disk_blocks_total, 0);
	CHECK_EQ(st.disk_blocks_used, 0);
	CHECK_EQ(st.disk_direct, 0);
	CHECK_EQ(DISK(m, A), 0);
	/* and a full host tier is -ENOMEM (32 groups; A holds 2 x 9, this layer needs 15) */
	prefill_n(m, &c, 3, 120, 1, -ENOMEM);
	CHECK_SEQ(m, &c, A);
	fdestroy(f);
}

static void arm_io(void)
{
	kvt_fault_arm(1u << KVT_FAULT_IO, 1);
}

static void disarm_io(const char *file, int line)
{
	bool fired = kvt_fault_fired();

	kvt_fault_disarm();
	if (!fired)
		fail_at(file, line, "the armed I/O fault did not fire");
}
#define DISARM_IO() disarm_io(__FILE__, __LINE__)

/* A failed write leaves the blocks in the host tier; a failed read leaves the sequence on disk
   and a retry succeeds; each counts in disk_io_errors and nothing else is affected. */
static void test_spill_io_errors(void **state)
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

	/* read: A stays on disk, B and C are unaffected, a retry works */
	arm_io();
	rc = kvt_seq_fetch(m, &A, 1);
	DISARM_IO();
	CHECK_RC(rc, -EIO);
	in = t_info_of(m, A);
	CHECK_EQ(in.disk_blocks, nA);
	CHECK_EQ(in.lost, 0);
	st = t_stats_of(m);
	CHECK_EQ(st.disk_io_errors, 2);
	CHECK_EQ(st.seqs_lost, 0);
	CHECK_EQ(st.disk_blocks_used, nA + nB);
	CHECK_EQ(DISK(m, B), nB);
	CHECK_SEQ(m, &c, C);
	CHECK_RC(kvt_seq_fetch(m, &A, 1), 0);
	CHECK_EQ(DISK(m, A), 0);
	CHECK_SEQ_HOST(m, &c, A);

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
	CHECK_EQ(DISK(m, A), 0);

	/* a batched fetch with one failed read: each sequence whole or not at all */
	CHECK_RC(kvt_seq_spill(m, A), 0);
	nA = HOSTB(m, A);
	arm_io();
	rc = kvt_seq_fetch(m, ab, 2);
	DISARM_IO();
	CHECK_RC(rc, -EIO);
	{
		uint64_t da = DISK(m, A), db = DISK(m, B);

		if ((da != 0 && da != nA) || (db != 0 && db != nB) || (da == 0 && db == 0))
			fail_at(__FILE__, __LINE__,
				"after a failed batched fetch: A %llu of %llu blocks on disk, B %llu "
				"of %llu (each must be whole, one must have stayed)",
				(unsigned long long)da, (unsigned long long)nA,
				(unsigned long long)db, (unsigned long long)nB);
	}
	CHECK_EQ(t_stats_of(m).disk_io_errors, 4);
	CHECK_RC(kvt_seq_fetch(m, ab, 2), 0);
	CHECK_EQ(DISK(m, A), 0);
	CHECK_EQ(DISK(m, B), 0);
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
static void test_spill_checksum(void **state)
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
	c.recall_blocks = 2;
	c.recall_cache_bytes = 16 * 2 * c.block_tokens * t_rowb(&c);
	c.device_bytes += c.recall_cache_bytes;
	m = f->m = t_mk(&c);
	prefill(m, &c, A, 80);
	prefill(m, &c, B, 40);
	prefill(m, &c, C, 90);
	decode(m, &c, A, 2);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_RC(kvt_seq_spill(m, B), 0);
	CHECK_RC(kvt_disk_corrupt_block(m, C, 0, 0), -ENOENT); /* not on disk */
	CHECK_RC(kvt_disk_corrupt_block(m, A, 1, 3), 0);

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
	CHECK_RC(kvt_disk_corrupt_block(m, C, 1, 2), 0);
	CHECK_RC(kvt_seq_resident_positions(m, C, 1, 0, res, 128, &n), 0);
	for (pos_c = 0; pos_c < n && (uint32_t)res[pos_c] == pos_c; pos_c++)
		;
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
static void test_spill_engine(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 4096), cs = c;
	struct kvt_manager *m;
	struct kvt_stats st;
	uint64_t A = 51, B = 52, C = 53, two[2] = {51, 52}, nA, nB, ios, errs;
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
	ios = disk_ios(m);
	CHECK_RC(kvt_seq_fetch(m, two, 2), 0);
	CHECK_EQ(disk_ios(m) - ios, 1);
	CHECK_EQ(t_stats_of(m).disk_blocks_used, 0);
	CHECK_SEQ(m, &cs, A);
	CHECK_SEQ_HOST(m, &cs, A);
	CHECK_SEQ_HOST(m, &cs, B);
	ios = disk_ios(m);
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_EQ(disk_ios(m) - ios, 1);
	ios = disk_ios(m);
	CHECK_RC(kvt_seq_fetch(m, &A, 1), 0);
	CHECK_EQ(disk_ios(m) - ios, 1);
	CHECK_SEQ_HOST(m, &cs, A);

	/* a merged write that comes short (at the file size limit here, as on a full file
	   system) is redone a unit at a time: the units below the limit are written, the others
	   fail with -EIO and stay in DRAM; nothing is lost */
	{
		struct kvt_disk_stats ds;
		struct rlimit old, lim;
		void (*old_xfsz)(int) = signal(SIGXFSZ, SIG_IGN);

		errs = t_stats_of(m).disk_io_errors;
		uint64_t nC, gC;
		int rc;

		CHECK_RC(kvt_seq_spill(m, A), 0); /* A and B take every slot the file has */
		CHECK_RC(kvt_seq_spill(m, B), 0);
		prefill(m, &cs, C, 60);
		nC = HOSTB(m, C);
		gC = nC / cs.n_kv_heads;
		assert_true(gC > 4);
		kvt_disk_stats(m->disk, &ds);
		CHECK_EQ(ds.slots_used, ds.slots_high);
		assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
		lim = old;
		lim.rlim_cur = (ds.slots_high + 3) * ds.slot_bytes;
		assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
		ios = disk_ios(m);
		rc = kvt_seq_spill(m, C);
		setrlimit(RLIMIT_FSIZE, &old);
		signal(SIGXFSZ, old_xfsz);
		CHECK_RC(rc, -EIO);
		CHECK_EQ(disk_ios(m) - ios, 1 + gC); /* the merged write, then one per unit */
		CHECK_EQ(DISK(m, C), 3ull * cs.n_kv_heads);
		CHECK_EQ(t_stats_of(m).disk_io_errors, errs + gC - 3);
		errs += gC - 3;
		CHECK_SEQ_HOST(m, &cs, C);
		CHECK_EQ(DISK(m, C), 0);
		CHECK_RC(kvt_seq_spill(m, C), 0);
		CHECK_EQ(DISK(m, C), nC);
		CHECK_SEQ_HOST(m, &cs, C);
		CHECK_SEQ_HOST(m, &cs, B);
		CHECK_SEQ_HOST(m, &cs, A);
	}
	CHECK_RC(kvt_seq_spill(m, A), 0);
	CHECK_RC(kvt_disk_corrupt_block(m, A, 1, 2), 0);
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
	CHECK_RC(kvt_seq_fetch(m, two, 2), 0);
	CHECK_EQ(disk_ios(m) - ios, 2 * (nA + nB) / cs.n_kv_heads);
	CHECK_SEQ_HOST(m, &cs, A);
	CHECK_SEQ_HOST(m, &cs, B);
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
	   of a buffer read into again (2nd, 3rd): the fetch still succeeds */
	for (uint32_t nth = 1; nth <= 3; nth++) {
		m = f->m = t_mk(&c);
		prefill(m, &c, A, 100);
		prefill(m, &c, B, 37);
		CHECK_RC(kvt_seq_spill(m, A), 0);
		CHECK_RC(kvt_seq_spill(m, B), 0);
		CHECK_RC(kvt_disk_break_ring(m->disk, nth, -ENOMEM), 0);
		CHECK_RC(kvt_seq_fetch(m, two, 2), 0);
		st = t_stats_of(m);
		CHECK_EQ(st.disk_uring, 0);
		CHECK_EQ(st.disk_blocks_used, 0);
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
}

/* An allocation that fails inside kvt_seq_spill, kvt_seq_fetch or a prefill that has to spill
   (every allocation in turn, through the fault hook) fails the call with -ENOMEM; no token is
   lost or changed, and the sequence's blocks are where they were, or all where they belong. */
static void test_spill_alloc_faults(void **state)
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

/* The model backend with a disk tier: spilling and fetching are accounted and timed, no file is
   written. */
static uint8_t dummy[256];

static void test_spill_model(void **state)
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
	CHECK_RC(kvt_seq_fetch(m, &ids[0], 1), 0);
	CHECK_EQ(DISK(m, ids[0]), 0);
	CHECK_RC(t_decode_append(m, 0, &ids[1], 1, dummy, dummy + 64, NULL), 0);
	CHECK_EQ(DISK(m, ids[1]), 0);
	s1 = t_stats_of(m);
	assert_true(s1.disk_blocks_fetched > 0);
	assert_true(s1.model_ns_disk >= s0.model_ns_disk + 2ull * c.model_disk_ns);
	CHECK_EQ(s1.disk_io_errors, 0);
	CHECK_EQ(spill_fds(f->dir, NULL), 0);

	/* modelled I/Os fail through the fault hook as real ones do */
	CHECK_RC(kvt_seq_fetch(m, &ids[5], 1), 0);
	arm_io();
	CHECK_RC(kvt_seq_spill(m, ids[5]), -EIO);
	DISARM_IO();
	assert_true(DISK(m, ids[5]) < 16);
	CHECK_RC(kvt_seq_spill(m, ids[5]), 0);
	arm_io();
	CHECK_RC(kvt_seq_fetch(m, &ids[5], 1), -EIO);
	DISARM_IO();
	CHECK_EQ(DISK(m, ids[5]), 16);
	CHECK_RC(kvt_seq_fetch(m, &ids[5], 1), 0);
	CHECK_EQ(DISK(m, ids[5]), 0);
	s1 = t_stats_of(m);
	CHECK_EQ(s1.disk_io_errors, 2);
	CHECK_EQ(s1.seqs_lost, 0);
	print_message("# model disk: %llu blocks spilled, %llu fetched, %.1f us modelled\n",
		      (unsigned long long)s1.disk_blocks_spilled,
		      (unsigned long long)s1.disk_blocks_fetched, (double)s1.model_ns_disk * 1e-3);
	fdestroy(f);
	CHECK_DIR_EMPTY(f->dir);
}

/* ---- the no-loss run ----------------------------------------------------------------------- */

#define NL 3
#define R_LIVE 100
#define R_BATCH 8

/* What the run keeps of a live sequence beyond t_ops.h's struct t_seq (its priv). */
struct sums {
	uint32_t cap[NL];
	uint64_t *sum[NL]; /* checksum of each token written, per layer (t_seq.n[l] of them) */
	uint32_t spills;   /* explicit spills, for failure messages */
};

static struct sums *sums_of(const struct t_seq *s)
{
	return s->priv;
}

static void sums_free(void *priv)
{
	struct sums *x = priv;

	for (int l = 0; l < NL; l++)
		free(x->sum[l]);
}

/* The run (live sequences, manager, configuration) and what the manager's counters must say. */
struct rrun {
	struct t_run run; /* first: the ops get the run */
	const char *dir;
	uint64_t host_total, dev_frames_per_seq_max, max_live;
	/* what the manager's counters must say */
	uint64_t tokens_prompt, tokens_appended, prefill_layers, decode_calls;
	/* buffers */
	uint8_t *k, *v, *q;
	float *f;
	size_t cap_tok; /* tokens the k/v buffers hold (all heads) */
	/* figures */
	uint64_t prefills, decodes, decoded, recalls, preempts, resumes;
	uint64_t spills, fetches, fetched_seqs;
	bool fault_ok;	   /* an I/O fault is armed: -EIO is a right answer too */
	bool disk_limited; /* disk_bytes set: -ENOMEM (-ENOSPC) may come whenever the file is full
			    */
	uint64_t enospc, unread; /* spills refused; read-backs refused for want of room */
	uint64_t io_faults;	 /* injected I/O failures that fired (disk_io_errors) */
	uint64_t eio;		 /* calls that failed with -EIO */
	uint64_t nomem_prefill, nomem_decode, nomem_resume, nomem_fetch, nomem_recall;
	uint64_t seqs_checked, tokens_checked, mismatches;
};

static uint64_t hash_bytes(uint64_t h, const uint8_t *p, size_t n)
{
	while (n >= 8) {
		uint64_t w;

		memcpy(&w, p, 8);
		h = t_mix(h ^ w);
		p += 8;
		n -= 8;
	}
	if (n) {
		uint64_t w = 0;

		memcpy(&w, p, n);
		h = t_mix(h ^ w ^ ((uint64_t)n << 56));
	}
	return h;
}

/* Checksum of one token: K then V row of each kv head in turn; head h's rows at k + h * stride. */
static uint64_t tok_sum(const struct rrun *r, const uint8_t *k, const uint8_t *v, size_t stride)
{
	uint64_t h = 0x6b7674696572ull;

	for (uint32_t hd = 0; hd < r->run.c.n_kv_heads; hd++) {
		h = hash_bytes(h, k + hd * stride, r->run.rb);
		h = hash_bytes(h, v + hd * stride, r->run.rb);
	}
	return h;
}

/* n random values (multiples of 1/128 in [-1, 1)) of the run's dtype into dst. */
static void fill_random(struct rrun *r, void *dst, size_t n)
{
	for (size_t i = 0; i < n; i++)
		r->f[i] = (float)((int)t_rng_below(256) - 128) / 128.0f;
	kvt_from_f32(r->run.c.dtype, r->f, dst, n);
}

static void reserve_tok(struct rrun *r, size_t tokens)
{
	size_t q_elems = (size_t)R_BATCH * r->run.c.n_q_heads * r->run.c.head_dim;

	if (tokens <= r->cap_tok)
		return;
	free(r->k);
	free(r->v);
	free(r->q);
	free(r->f);
	r->k = t_xmalloc(tokens * r->run.c.n_kv_heads * r->run.rb);
	r->v = t_xmalloc(tokens * r->run.c.n_kv_heads * r->run.rb);
	r->q = t_xmalloc(
		(q_elems + (size_t)r->run.c.n_q_heads * r->run.c.obs_window * r->run.c.head_dim) *
		4);
	r->f = t_xmalloc((tokens * r->run.c.n_kv_heads * r->run.c.head_dim + q_elems +
			  (size_t)r->run.c.n_q_heads * r->run.c.obs_window * r->run.c.head_dim) *
			 sizeof(float));
	r->cap_tok = tokens;
}

static void push_sum(struct t_seq *s, uint32_t l, uint64_t h)
{
	struct sums *x = sums_of(s);

	if (s->n[l] == x->cap[l]) {
		uint32_t cap = x->cap[l] ? 2 * x->cap[l] : 64;
		uint64_t *p = realloc(x->sum[l], cap * sizeof(uint64_t));

		assert_non_null(p);
		x->sum[l] = p;
		x->cap[l] = cap;
	}
	x->sum[l][s->n[l]++] = h;
}

static struct rrun *rr_of(struct t_run *run)
{
	return (struct rrun *)run;
}

/* Frees what the run allocated (not its manager). */
static void rrun_free(struct rrun *r)
{
	t_run_fini(&r->run);
	free(r->k);
	free(r->v);
	free(r->q);
	free(r->f);
	free(r);
}

/* Whether rc is an acceptable failure of a call that needs `need` host blocks for its own
   sequences: -ENOMEM when they could not all fit in the host tier (or the spill file is
   limited and may be full), -EIO when an I/O failure was injected. */
static bool may_fail(const struct rrun *r, int rc, uint64_t need)
{
	return (rc == -ENOMEM && (need > r->host_total || r->disk_limited)) ||
	       (rc == -EIO && r->fault_ok);
}

/* All host blocks of s (on disk or not), from the model. */
static uint64_t blocks_of(const struct rrun *r, const struct t_seq *s)
{
	uint64_t b = 0;

	for (uint32_t l = 0; l < r->run.c.n_layers; l++)
		b += (uint64_t)r->run.c.n_kv_heads * DIV_UP(s->n[l], r->run.c.block_tokens);
	return b;
}

static uint64_t dev_need(const struct rrun *r, const struct t_seq *s)
{
	uint64_t f = 0;

	for (uint32_t l = 0; l < r->run.c.n_layers; l++)
		f += s->n[l] ? (uint64_t)r->run.c.n_kv_heads * s->fph : 0;
	return f;
}

/* After every operation: token counts, blocks on host and on disk, frames, counters. */
static void check_cheap(struct rrun *r)
{
	const struct kvt_config *c = &r->run.c;
	struct kvt_stats st = t_stats_of(r->run.m);
	uint64_t on_host = 0, on_disk = 0, frames = 0;

	for (uint32_t i = 0; i < r->run.n_live; i++) {
		const struct t_seq *s = &r->run.live[i];
		struct kvt_seq_info in = t_info_of(r->run.m, s->id);
		uint64_t hb = blocks_of(r, s);

		for (uint32_t l = 0; l < c->n_layers; l++) {
			uint32_t n = t_tokens_of(r->run.m, s->id, l);

			if (n != s->n[l])
				fail_at(__FILE__, __LINE__,
					"seq %llu layer %u: %u tokens, model %u",
					(unsigned long long)s->id, l, n, s->n[l]);
		}
		if (in.host_blocks != hb || in.disk_blocks > hb || in.lost ||
		    in.preempted != s->pre || in.device_frames != (s->pre ? 0 : dev_need(r, s)))
			fail_at(__FILE__, __LINE__,
				"seq %llu info: host blocks %llu (model %llu), disk %llu, lost %d, "
				"preempted %u (model %d), frames %llu (model %llu)",
				(unsigned long long)s->id, (unsigned long long)in.host_blocks,
				(unsigned long long)hb, (unsigned long long)in.disk_blocks, in.lost,
				in.preempted, s->pre, (unsigned long long)in.device_frames,
				(unsigned long long)(s->pre ? 0 : dev_need(r, s)));
		on_host += hb - in.disk_blocks;
		on_disk += in.disk_blocks;
		frames += in.device_frames;
	}
	CHECK_EQ(st.live_seqs, r->run.n_live);
	CHECK_EQ(st.host_blocks_used, on_host);
	CHECK_EQ(st.disk_blocks_used, on_disk);
	CHECK_EQ(st.device_frames_used, frames);
	CHECK_EQ(st.host_blocks_used + st.host_blocks_free, st.host_blocks_total);
	CHECK_EQ(st.device_frames_used + st.device_frames_free, st.device_frames_total);
	CHECK_EQ(st.tokens_prompt, r->tokens_prompt);
	CHECK_EQ(st.tokens_appended, r->tokens_appended);
	CHECK_EQ(st.tokens_saved, r->tokens_prompt + r->tokens_appended);
	CHECK_EQ(st.prefill_layers, r->prefill_layers);
	CHECK_EQ(st.decode_calls, r->decode_calls);
	CHECK_EQ(st.disk_io_errors, r->io_faults);
	assert_true(st.disk_blocks_used <= st.disk_blocks_total);
	CHECK_EQ(st.disk_checksum_errors, 0);
	CHECK_EQ(st.seqs_lost, 0);
}

/* Reads every token of s back (every head; also from the host history when host is set) and
   compares its checksum; mismatches are counted (the first few printed). 0, or -ENOMEM when
   the spill file is limited and full, so s could not be fetched. */
static int readback(struct rrun *r, const struct t_seq *s, bool host)
{
	const struct kvt_config *c = &r->run.c;
	uint8_t k[8 * 256], v[8 * 256];

	assert_true(c->n_kv_heads * r->run.rb <= sizeof(k));
	for (uint32_t l = 0; l < c->n_layers; l++)
		for (uint32_t p = 0; p < s->n[l]; p++)
			for (int pass = 0; pass < (host ? 2 : 1); pass++) {
				for (uint32_t h = 0; h < c->n_kv_heads; h++) {
					int rc = pass ? kvt_seq_read_token_host(r->run.m, s->id, l,
										h, p,
										k + h * r->run.rb,
										v + h * r->run.rb)
						      : kvt_seq_read_token(r->run.m, s->id, l, h, p,
									   k + h * r->run.rb,
									   v + h * r->run.rb);

					if (rc == -ENOMEM && r->disk_limited) {
						r->unread++;
						return rc; /* no room to fetch it now */
					}
					if (rc)
						fail_at(__FILE__, __LINE__,
							"%s seq %llu layer %u head %u pos %u: %d (%s)",
							pass ? "read_token_host" : "read_token",
							(unsigned long long)s->id, l, h, p, rc,
							kvt_strerror(rc));
				}
				if (tok_sum(r, k, v, r->run.rb) != sums_of(s)->sum[l][p]) {
					if (r->mismatches < 10)
						print_error(
							"# MISMATCH (%s) seq %llu layer %u pos %u "
							"of %u (prompt %u, %u explicit spills, "
							"%s)\n",
							pass ? "host history" : "read_token",
							(unsigned long long)s->id, l, p, s->n[l],
							s->L, sums_of(s)->spills,
							s->pre ? "preempted" : "resident");
					r->mismatches++;
				}
				r->tokens_checked += !pass;
			}
	/* reading the host history brought it all back */
	if (host && blocks_of(r, s))
		CHECK_EQ(DISK(r->run.m, s->id), 0);
	r->seqs_checked++;
	return 0;
}

/* Prefills layer l of s (not preempted, l not prefilled) with random data. Must succeed when
   the device has the frames and the host tier could hold every block of s plus the layer
   (everything else spilled); -ENOMEM when the device is short; otherwise either. */
static void do_prefill(struct rrun *r, struct t_seq *s, uint32_t l)
{
	const struct kvt_config *c = &r->run.c;
	struct kvt_stats st = t_stats_of(r->run.m);
	uint64_t need = (uint64_t)c->n_kv_heads * DIV_UP(s->L, c->block_tokens);
	bool dev_short = (uint64_t)c->n_kv_heads * s->fph > st.device_frames_free;
	size_t nq = (size_t)c->n_q_heads * c->obs_window * c->head_dim;
	uint64_t disk0;
	int rc;

	t_what = "prefill";
	disk0 = DISK(r->run.m, s->id);
	reserve_tok(r, s->L);
	fill_random(r, r->k, (size_t)c->n_kv_heads * s->L * c->head_dim);
	fill_random(r, r->v, (size_t)c->n_kv_heads * s->L * c->head_dim);
	fill_random(r, r->q, nq);
	rc = t_prefill_layer(r->run.m, s->id, l, r->k, r->v, r->q, NULL);
	if (dev_short ? rc != -ENOMEM : rc != 0 && !may_fail(r, rc, need + blocks_of(r, s)))
		fail_at(__FILE__, __LINE__,
			"prefill seq %llu layer %u (L %u: %llu blocks; seq holds %llu; host %llu; "
			"%s) returned %d (%s)",
			(unsigned long long)s->id, l, s->L, (unsigned long long)need,
			(unsigned long long)blocks_of(r, s), (unsigned long long)r->host_total,
			dev_short ? "device short" : "device has room", rc, kvt_strerror(rc));
	if (DISK(r->run.m, s->id) > disk0)
		fail_at(__FILE__, __LINE__,
			"prefill of seq %llu layer %u (returned %d) spilled its own blocks: %llu on "
			"disk, %llu before",
			(unsigned long long)s->id, l, rc, (unsigned long long)DISK(r->run.m, s->id),
			(unsigned long long)disk0);
	if (rc) {
		if (rc == -EIO)
			r->eio++;
		else
			r->nomem_prefill++;
		return;
	}
	for (uint32_t p = 0; p < s->L; p++)
		push_sum(s, l,
			 tok_sum(r, r->k + p * r->run.rb, r->v + p * r->run.rb, s->L * r->run.rb));
	/* the library must not read the caller's tensors after the call */
	memset(r->k, 0x5a, (size_t)c->n_kv_heads * s->L * r->run.rb);
	memset(r->v, 0xa5, (size_t)c->n_kv_heads * s->L * r->run.rb);
	r->tokens_prompt += s->L;
	r->prefill_layers++;
	r->prefills++;
}

/* Creates a sequence (t_run_create) while there is room for it, else destroys one; half of
   those created are prefilled at once, every layer. */
static void op_create(struct t_run *run)
{
	struct t_seq *s;

	if (run->n_live >= R_LIVE) {
		t_run_destroy(run);
		return;
	}
	s = t_run_create(run);
	if (s && t_rng_below(2))
		for (uint32_t l = 0; l < run->c.n_layers; l++) {
			do_prefill(rr_of(run), s, l);
			if (!s->n[l])
				break;
		}
}

/* Destroys a sequence while more than 10 live, else creates one. */
static void op_destroy(struct t_run *run)
{
	if (run->n_live > 10)
		t_run_destroy(run);
	else
		op_create(run);
}

/* One layer, or every layer left, of a sequence that is not preempted. */
static void op_prefill(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	const struct kvt_config *c = &r->run.c;
	struct t_seq *s = NULL;

	for (int tries = 0; tries < 8 && !s && r->run.n_live; tries++) {
		struct t_seq *t = &r->run.live[t_rng_below(r->run.n_live)];

		for (uint32_t l = 0; l < c->n_layers && !s; l++)
			if (!t->n[l] && !t->pre)
				s = t;
	}
	if (!s)
		return;
	if (t_rng_below(2)) {
		for (uint32_t l = 0; l < c->n_layers; l++)
			if (!s->n[l]) {
				do_prefill(r, s, l);
				if (!s->n[l])
					break;
			}
	} else {
		uint32_t l = t_rng_below(c->n_layers);

		while (s->n[l])
			l = (l + 1) % c->n_layers;
		do_prefill(r, s, l);
	}
}

/* One token for a random batch on a random layer. Must succeed when the host tier could hold
   every block of the batch plus the new ones (everything else spilled). */
static void op_decode(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	const struct kvt_config *c = &r->run.c;
	struct t_seq *b[R_BATCH];
	uint64_t ids[R_BATCH], need = 0;
	uint32_t l = t_rng_below(c->n_layers), n = t_run_pick_batch(&r->run, l, b, R_BATCH);
	int rc;

	t_what = "decode";
	if (!n)
		return;
	for (uint32_t i = 0; i < n; i++) {
		ids[i] = b[i]->id;
		need += blocks_of(r, b[i]) +
			(b[i]->n[l] % c->block_tokens == 0 ? c->n_kv_heads : 0);
	}
	reserve_tok(r, R_BATCH);
	fill_random(r, r->k, (size_t)n * c->n_kv_heads * c->head_dim);
	fill_random(r, r->v, (size_t)n * c->n_kv_heads * c->head_dim);
	rc = t_decode_append(r->run.m, l, ids, n, r->k, r->v, NULL);
	if (rc != 0 && !may_fail(r, rc, need))
		fail_at(__FILE__, __LINE__,
			"decode of %u sequences on layer %u (%llu blocks with the new ones; host "
			"%llu) returned %d (%s)",
			n, l, (unsigned long long)need, (unsigned long long)r->host_total, rc,
			kvt_strerror(rc));
	if (rc) {
		if (rc == -EIO)
			r->eio++;
		else
			r->nomem_decode++;
		return;
	}
	for (uint32_t i = 0; i < n; i++)
		if (DISK(r->run.m, ids[i]))
			fail_at(__FILE__, __LINE__,
				"seq %llu of a decode batch of %u has %llu blocks on disk after it",
				(unsigned long long)ids[i], n,
				(unsigned long long)DISK(r->run.m, ids[i]));
	for (uint32_t i = 0; i < n; i++)
		push_sum(b[i], l,
			 tok_sum(r, r->k + (size_t)i * c->n_kv_heads * r->run.rb,
				 r->v + (size_t)i * c->n_kv_heads * r->run.rb, r->run.rb));
	memset(r->k, 0x77, (size_t)n * c->n_kv_heads * r->run.rb);
	memset(r->v, 0x88, (size_t)n * c->n_kv_heads * r->run.rb);
	r->tokens_appended += n;
	r->decode_calls++;
	r->decodes++;
	r->decoded += n;
}

/* Scored (kvt_decode_recall) or explicit (kvt_recall_blocks) recall for a batch of up to 4.
   The cache holds every block either can ask for, so only -ENOMEM (host) may fail it. */
static void op_recall(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	const struct kvt_config *c = &r->run.c;
	struct t_seq *b[4];
	uint64_t ids[4], need = 0;
	uint32_t l = t_rng_below(c->n_layers), n = t_run_pick_batch(&r->run, l, b, 4);
	uint32_t sel[4 * 8 * 3], rr = 1 + t_rng_below(3);
	int rc;

	t_what = "recall";
	if (!n)
		return;
	assert_true(c->n_kv_heads <= 8);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t nb = DIV_UP(b[i]->n[l], c->block_tokens);

		ids[i] = b[i]->id;
		need += blocks_of(r, b[i]);
		for (uint32_t x = 0; x < c->n_kv_heads * rr; x++)
			sel[i * c->n_kv_heads * rr + x] =
				t_rng_below(8) ? t_rng_below(nb) : UINT32_MAX;
	}
	if (t_rng_below(2)) {
		reserve_tok(r, R_BATCH);
		fill_random(r, r->q, (size_t)n * c->n_q_heads * c->head_dim);
		rc = t_decode_recall(r->run.m, l, ids, n, r->q, NULL);
	} else {
		rc = kvt_recall_blocks(r->run.m, l, ids, n, sel, rr, NULL);
	}
	if (rc != 0 && !may_fail(r, rc, need))
		fail_at(__FILE__, __LINE__,
			"recall of %u sequences on layer %u (%llu blocks; host %llu) returned %d "
			"(%s)",
			n, l, (unsigned long long)need, (unsigned long long)r->host_total, rc,
			kvt_strerror(rc));
	if (rc) {
		if (rc == -EIO)
			r->eio++;
		else
			r->nomem_recall++;
		return;
	}
	for (uint32_t i = 0; i < n; i++)
		if (DISK(r->run.m, ids[i]))
			fail_at(__FILE__, __LINE__,
				"seq %llu of a recall batch of %u has %llu blocks on disk after it",
				(unsigned long long)ids[i], n,
				(unsigned long long)DISK(r->run.m, ids[i]));
	r->recalls++;
}

/* Preempts a resident sequence or resumes a preempted one (which fetches it). */
static void op_preempt(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	struct kvt_stats st = t_stats_of(r->run.m);
	struct t_seq *s;
	bool resume = t_rng_below(3) != 0;
	uint64_t dn;
	int rc;

	t_what = "preempt/resume";
	if (!r->run.n_live)
		return;
	s = t_run_pick(run, resume);
	if (!s->pre) {
		CHECK_RC(kvt_seq_preempt(r->run.m, s->id), 0);
		s->pre = true;
		r->preempts++;
		return;
	}
	dn = dev_need(r, s);
	rc = kvt_seq_resume(r->run.m, s->id, NULL);
	if (dn > st.device_frames_free ? rc != -ENOMEM
				       : rc != 0 && !may_fail(r, rc, blocks_of(r, s)))
		fail_at(__FILE__, __LINE__,
			"resume of seq %llu (%llu frames, %llu free; %llu blocks) returned %d (%s)",
			(unsigned long long)s->id, (unsigned long long)dn,
			(unsigned long long)st.device_frames_free,
			(unsigned long long)blocks_of(r, s), rc, kvt_strerror(rc));
	if (rc) {
		if (rc == -EIO)
			r->eio++;
		else
			r->nomem_resume++;
		return;
	}
	CHECK_EQ(DISK(r->run.m, s->id), 0);
	s->pre = false;
	r->resumes++;
}

/* Spills a sequence that has blocks in the host tier (the disk is unlimited: must succeed). */
static void op_spill(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	struct t_seq *s = NULL;
	struct kvt_seq_info a, b;
	int rc;

	t_what = "spill";
	for (int tries = 0; tries < 8 && r->run.n_live; tries++) {
		struct t_seq *t = &r->run.live[t_rng_below(r->run.n_live)];

		a = t_info_of(r->run.m, t->id);
		s = t;
		if (a.host_blocks > a.disk_blocks)
			break;
	}
	if (!s)
		return;
	a = t_info_of(r->run.m, s->id);
	rc = kvt_seq_spill(r->run.m, s->id);
	b = t_info_of(r->run.m, s->id);
	if (r->fault_ok && rc == -EIO) {
		assert_true(b.disk_blocks < b.host_blocks); /* the failed blocks stay */
		return;
	}
	if (r->disk_limited && rc == -ENOSPC) {
		r->enospc++;
		return;
	}
	CHECK_RC(rc, 0);
	CHECK_EQ(b.disk_blocks, b.host_blocks);
	CHECK_EQ(b.device_frames, a.device_frames);
	sums_of(s)->spills++;
	r->spills++;
}

/* Fetches 1..4 sequences in one call. Must succeed when the host tier could hold all of them;
   otherwise -ENOMEM, and each is then back whole or as it was. */
static void op_fetch(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	struct t_seq *b[4];
	uint64_t ids[4], disk[4], need = 0;
	uint32_t n;
	int rc;

	t_what = "fetch";
	if (!r->run.n_live)
		return;
	n = 1 + t_rng_below(r->run.n_live < 4 ? r->run.n_live : 4);
	for (uint32_t i = 0; i < n; i++) {
		struct t_seq *t;
		bool dup;

		do {
			t = &r->run.live[t_rng_below(r->run.n_live)];
			dup = false;
			for (uint32_t j = 0; j < i; j++)
				dup |= b[j] == t;
		} while (dup);
		b[i] = t;
		ids[i] = t->id;
		disk[i] = DISK(r->run.m, t->id);
		need += blocks_of(r, t);
	}
	rc = kvt_seq_fetch(r->run.m, ids, n);
	if (rc != 0 && !may_fail(r, rc, need))
		fail_at(__FILE__, __LINE__,
			"fetch of %u sequences (%llu blocks; host %llu) returned %d (%s)", n,
			(unsigned long long)need, (unsigned long long)r->host_total, rc,
			kvt_strerror(rc));
	for (uint32_t i = 0; i < n; i++) {
		uint64_t d = DISK(r->run.m, ids[i]);

		if (rc ? d != 0 && d != disk[i] : d != 0)
			fail_at(__FILE__, __LINE__,
				"fetch returned %d: seq %llu has %llu blocks on disk (%llu before)",
				rc, (unsigned long long)ids[i], (unsigned long long)d,
				(unsigned long long)disk[i]);
	}
	if (rc) {
		if (rc == -EIO)
			r->eio++;
		else
			r->nomem_fetch++;
		return;
	}
	r->fetches++;
	r->fetched_seqs += n;
}

/* A spill, fetch, decode, recall or resume with one of its next few I/Os failing (fault hook):
   it may fail with -EIO, and must change nothing else than the failed call's blocks'
   whereabouts; every later check counts the failure in disk_io_errors. */
static void op_faulty(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	uint32_t which = t_rng_below(5);

	kvt_fault_arm(1u << KVT_FAULT_IO, 1 + t_rng_below(6));
	r->fault_ok = true;
	if (which == 0)
		op_spill(run);
	else if (which == 1)
		op_fetch(run);
	else if (which == 2)
		op_decode(run);
	else if (which == 3)
		op_recall(run);
	else
		op_preempt(run);
	r->fault_ok = false;
	r->io_faults += kvt_fault_fired();
	kvt_fault_disarm();
	t_what = "after an I/O fault";
}

/* After every operation: the cheap checks; every 300, four sequences read back. */
static void after_op(struct t_run *run)
{
	struct rrun *r = rr_of(run);

	check_cheap(r);
	r->max_live = run->n_live > r->max_live ? run->n_live : r->max_live;
	if (t_op % 300 == 299 && run->n_live) {
		t_what = "read back (subset)";
		for (int i = 0; i < 4; i++)
			readback(r, &run->live[t_rng_below(run->n_live)], i == 0);
		if (r->mismatches)
			fail_at(__FILE__, __LINE__, "%llu tokens read back differ",
				(unsigned long long)r->mismatches);
	}
}

/* Phases of 500 operations, the last one filling (up to 100 live): create, prefill, decode,
   recall, preempt/resume, spill, fetch, one of those with an I/O failing; the rest destroys. */
static const struct t_mix noloss_mix = {
	.n = 9,
	.op = {op_create, op_prefill, op_decode, op_recall, op_preempt, op_spill, op_fetch,
	       op_faulty, op_destroy},
	.fill = {20, 38, 63, 70, 77, 83, 89, 92},
	.drain = {10, 26, 51, 58, 65, 71, 76, 79},
	.phase_ops = 500,
	.ends_filling = true,
};

/* The no-loss invariant: `ops` operations on a host tier that holds a small part of the live
   sequences' blocks. */
static void run_noloss(struct fix *fx, uint64_t seed, long ops, uint64_t disk_blocks)
{
	const char *dir = fx->dir;
	struct kvt_config c = t_small_config();
	struct rrun *r = g_run = t_xmalloc(sizeof(*r));
	struct kvt_stats st;
	uint64_t spilled, fetched;
	double t0 = t_now_s();

	c.n_layers = NL;
	c.n_kv_heads = 2;
	c.n_q_heads = 4;
	c.head_dim = 8;
	c.block_tokens = 8;
	c.sink_tokens = 4;
	c.recent_tokens = 12;
	c.topk_tokens = 10;
	c.obs_window = 4;
	c.pool_kernel = 3;
	c.save_threads = 2;
	c.staging_bytes = 16u << 10;
	c.host_bytes = t_budget(&c, 600);
	c.device_bytes = t_budget(&c, 700); /* resident sets: up to 12 groups a sequence */
	c.recall_blocks = 2;
	c.recall_cache_bytes = 24 * 2 * c.block_tokens * t_rowb(&c); /* 24 frames */
	c.device_bytes += c.recall_cache_bytes;
	c.spill_dir = dir;
	c.disk_queue_depth = 64;
	if (disk_blocks) {
		/* disk_bytes for about disk_blocks blocks, from what 1 MiB holds */
		uint64_t t;

		c.disk_bytes = 1 << 20;
		fx->m = t_mk(&c);
		t = t_stats_of(fx->m).disk_blocks_total;
		fdestroy(fx);
		c.disk_bytes = (c.disk_bytes / t) * disk_blocks;
		r->disk_limited = true;
	}
	t_run_init(&r->run, &c, R_LIVE, sizeof(struct sums), sums_free);
	r->run.id_small = 2000;
	r->run.prompt_span = 120;
	r->dir = dir;
	t_rng_seed(seed);
	r->run.m = fx->m = t_mk(&c);
	st = t_stats_of(r->run.m);
	r->host_total = st.host_blocks_total;
	CHECK_EQ(r->host_total, 1200);
	if (disk_blocks)
		print_message("# disk_bytes %llu: %llu blocks\n", (unsigned long long)c.disk_bytes,
			      (unsigned long long)st.disk_blocks_total);
	reserve_tok(r, 512);
	check_cheap(r);
	t_run_loop(&r->run, ops, &noloss_mix, after_op);
	t_what = "final read back";
	CHECK_RC(kvt_manager_sync(r->run.m, NULL), 0);
	CHECK_DIR_EMPTY(dir);
	st = t_stats_of(r->run.m);
	spilled = st.disk_blocks_spilled;
	fetched = st.disk_blocks_fetched;
	{
		uint64_t before = r->seqs_checked;

		uint64_t checked_ids[R_LIVE];
		uint32_t n_checked = 0, n = r->run.n_live, order[R_LIVE], n_order = 0;

		/* Every live sequence once, those all in the host tier first. With a limited
		   file, one that cannot come back for want of room (host and file full) gets it
		   from sequences already checked, which go. */
		for (int pass = 0; pass < 2; pass++)
			for (uint32_t i = 0; i < n; i++)
				if ((DISK(r->run.m, r->run.live[i].id) == 0) == (pass == 0))
					order[n_order++] = i;
		CHECK_EQ(n_order, n);
		for (uint32_t i = 0; i < n; i++) {
			struct t_seq *s = &r->run.live[order[i]];

			while (readback(r, s, true) == -ENOMEM) {
				struct t_seq *t;

				if (!n_checked)
					fail_at(__FILE__, __LINE__,
						"seq %llu cannot be read back: no room",
						(unsigned long long)s->id);
				t = t_run_find(&r->run, checked_ids[--n_checked]);
				CHECK_RC(kvt_seq_destroy(r->run.m, t->id), 0);
				t->n[0] = UINT32_MAX; /* marks it gone (removed below) */
			}
			checked_ids[n_checked++] = s->id;
		}
		for (uint32_t i = 0; i < r->run.n_live;) {
			if (r->run.live[i].n[0] != UINT32_MAX) {
				i++;
				continue;
			}
			t_run_remove(&r->run, i);
		}
		check_cheap(r);
		st = t_stats_of(r->run.m);
		print_message("# no-loss: %llu sequences created, %llu live checked, %llu tokens "
			      "checked, %llu blocks spilled, %llu fetched, %llu lost\n",
			      (unsigned long long)r->run.created,
			      (unsigned long long)(r->seqs_checked - before),
			      (unsigned long long)r->tokens_checked,
			      (unsigned long long)st.disk_blocks_spilled,
			      (unsigned long long)st.disk_blocks_fetched,
			      (unsigned long long)(r->mismatches + st.seqs_lost));
	}
	print_message("# %ld ops in %.1f s: %llu prefills (-ENOMEM %llu), %llu decode calls "
		      "(%llu tokens, -ENOMEM %llu), %llu recalls (-ENOMEM %llu), %llu preempts, "
		      "%llu resumes (-ENOMEM %llu), %llu spills, %llu fetches of %llu sequences "
		      "(-ENOMEM %llu), %llu destroyed, at most %llu live; before the final read "
		      "back %llu blocks spilled, %llu fetched; %llu I/O failures injected, %llu "
		      "calls -EIO; %llu spills -ENOSPC, %llu read-backs put off; O_DIRECT %u\n",
		      ops, t_now_s() - t0, (unsigned long long)r->prefills,
		      (unsigned long long)r->nomem_prefill, (unsigned long long)r->decodes,
		      (unsigned long long)r->decoded, (unsigned long long)r->nomem_decode,
		      (unsigned long long)r->recalls, (unsigned long long)r->nomem_recall,
		      (unsigned long long)r->preempts, (unsigned long long)r->resumes,
		      (unsigned long long)r->nomem_resume, (unsigned long long)r->spills,
		      (unsigned long long)r->fetches, (unsigned long long)r->fetched_seqs,
		      (unsigned long long)r->nomem_fetch, (unsigned long long)r->run.destroyed,
		      (unsigned long long)r->max_live, (unsigned long long)spilled,
		      (unsigned long long)fetched, (unsigned long long)r->io_faults,
		      (unsigned long long)r->eio, (unsigned long long)r->enospc,
		      (unsigned long long)r->unread, st.disk_direct);
	CHECK_EQ(r->mismatches, 0);
	CHECK_EQ(st.seqs_lost, 0);
	if (ops >= 2000) {
		assert_true(spilled > 0 && fetched > 0);
		assert_true(r->spills > 0 && r->fetches > 0 && r->recalls > 0);
		assert_true(r->resumes > 0 && r->preempts > 0);
		assert_true(r->io_faults > 0 && r->eio > 0);
	}
	t_what = "teardown";
	while (r->run.n_live) {
		t_run_destroy(&r->run);
		if (r->run.n_live % 16 == 0)
			check_cheap(r);
	}
	st = t_stats_of(r->run.m);
	CHECK_EQ(st.host_blocks_used, 0);
	CHECK_EQ(st.disk_blocks_used, 0);
	CHECK_EQ(st.device_frames_used, 0);
	fdestroy(fx);
	CHECK_DIR_EMPTY(dir);
	rrun_free(r);
	g_run = NULL;
	t_op = -1;
	t_what = "setup";
}

static void test_spill_noloss(void **state)
{
	struct fix *f = *state;

	t_what = "no-loss";
	print_message("# seed %llu (KVT_TEST_SEED=%llu repeats this run)\n",
		      (unsigned long long)t_seed, (unsigned long long)t_seed);
	run_noloss(f, t_seed, t_pick_ops(24000), 0);
}

/* The same with a spill file that holds about a third of what the host tier cannot: -ENOSPC
   and -ENOMEM come often, and nothing may be lost either. */
static void test_spill_noloss_limited(void **state)
{
	struct fix *f = *state;

	t_what = "no-loss, limited file";
	print_message("# seed %llu (KVT_TEST_SEED=%llu repeats this run)\n",
		      (unsigned long long)t_seed, (unsigned long long)t_seed);
	run_noloss(f, t_mix(t_seed ^ 1), t_pick_ops(24000) / 3, 1000);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, fix_setup, fix_teardown)
	const struct CMUnitTest tests[] = {
		T(test_spill_roundtrip),      T(test_spill_private),
		T(test_spill_implicit_fetch), T(test_spill_auto_lru),
		T(test_spill_disk_limit),     T(test_spill_bad_config),
		T(test_spill_io_errors),      T(test_spill_checksum),
		T(test_spill_alloc_faults),   T(test_spill_model),
		T(test_spill_engine),	      T(test_spill_noloss),
		T(test_spill_noloss_limited),
	};
#undef T

	check_context = t_run_context;
	if (getenv("KVTIER_DISK_IO"))
		g_engine = strdup(getenv("KVTIER_DISK_IO"));
	t_seed = t_pick_seed();
	print_message("# spill: seed %llu\n", (unsigned long long)t_seed);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
