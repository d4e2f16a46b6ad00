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
#include "test_spill.h"

/* ---- the spill directory (fixture) ----------------------------------------------------- */

/* Failure messages name t_ops.h's t_seed, t_op and t_what: the seed and operation of the no-loss
   runs, the step of the others. */

struct rrun *g_run;    /* the no-loss run under way, freed by the teardown if it failed */
static char *g_engine; /* KVTIER_DISK_IO as the test binary found it (NULL: unset) */

/* Destroys the test's manager (the test goes on, or ends). */
void fdestroy(struct fix *f)
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
void spill_recall(struct kvt_config *c, uint32_t frames)
{
	c->recall_blocks = 2;
	c->recall_cache_bytes = frames * t_block_bytes(c);
	c->device_bytes += c->recall_cache_bytes;
}

uint64_t tail_blocks(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq)
{
	uint64_t n = 0;

	for (uint32_t l = 0; l < c->n_layers; l++)
		if (t_tokens_of(m, seq, l) % c->block_tokens)
			n += c->n_kv_heads;
	return n;
}

/* Open descriptors of this process on files in dir (an unlinked file still shows there, as
   "dir/name (deleted)"); the stat of the last one in *st. */
uint32_t spill_fds(const char *dir, struct stat *st)
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

/* ---- deterministic sequences for the focused tests (lib/t_data.h's t_value data) ----------- */

/* t_small_config (2 layers, 2 kv heads, 4 q heads, d 16 f16, 8-token blocks: 512-byte blocks,
   1 KiB block groups; sink 8, recent 16, top-K 16, obs 4) with a disk tier in dir and a host
   tier of host_groups block groups. */
struct kvt_config spill_config(const char *dir, uint32_t host_groups)
{
	struct kvt_config c = t_small_config();

	c.host_bytes = t_budget(&c, host_groups);
	c.spill_dir = dir;
	return c;
}

/* Prefills layers [0, layers) of seq (created here unless it is live) with t_fill_prefill's
   data; each layer must return want. */
void prefill_n(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t L,
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

void prefill(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t L)
{
	prefill_n(m, c, seq, L, c->n_layers, 0);
}

/* One decode step of the n sequences on `layer` (positions from their token counts). */
int decode_layer(struct kvt_manager *m, const struct kvt_config *c, const uint64_t *seqs,
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
void decode(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t steps)
{
	for (uint32_t t = 0; t < steps; t++)
		for (uint32_t l = 0; l < c->n_layers; l++)
			CHECK_RC(decode_layer(m, c, &seq, 1, l), 0);
}

/* Reads every token of every layer and head of seq back (kvt_seq_read_token, or the internal
   kvt_seq_read_token_host when host is set) and compares it with the data written. */
void check_seq_at(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, bool host,
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

/* The recall view of (seq, layer) must hold the bytes of the blocks it names. Returns the
   number of blocks checked. */
uint32_t check_view(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t layer)
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

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, fix_setup, fix_teardown)
	const struct CMUnitTest tests[] = {
		T(test_spill_roundtrip),   T(test_spill_private),      T(test_spill_implicit_fetch),
		T(test_spill_auto_lru),	   T(test_spill_pinned_full),  T(test_spill_big_history),
		T(test_spill_disk_limit),  T(test_spill_bad_config),   T(test_spill_io_errors),
		T(test_spill_checksum),	   T(test_spill_alloc_faults), T(test_spill_model),
		T(test_spill_engine),	   T(test_spill_noloss),       T(test_spill_noloss_limited),
		T(test_spill_noloss_tiny),
	};
#undef T

	check_context = t_run_context;
	if (getenv("KVTIER_DISK_IO"))
		g_engine = strdup(getenv("KVTIER_DISK_IO"));
	t_seed = t_pick_seed();
	print_message("# spill: seed %llu\n", (unsigned long long)t_seed);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
