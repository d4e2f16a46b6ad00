/* SPDX-License-Identifier: MIT */
/*
 * spill: a limited spill file (disk_bytes) and disk configurations that must fail.
 */
#include "test_spill.h"

void soft_fail(char *buf, size_t len, const char *fmt, ...)
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
static void undo_partial(struct kvt_manager *m, const struct kvt_config *c, const uint64_t *ids,
			 uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq_info in = t_info_of(m, ids[i]);

		if (in.disk_blocks && in.disk_blocks < in.host_blocks)
			CHECK_SEQ_HOST(m, c, ids[i]); /* reads every block back */
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
	undo_partial(m, &c, ids, n_ids);
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
	undo_partial(m, &c, ids, n_ids);
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
	undo_partial(m, &c, ids, n_ids);
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
		undo_partial(m, &c, ids, n_ids);
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
void test_spill_disk_limit(void **state)
{
	struct fix *f = *state;
	uint64_t bytes = 48 << 10, T, unit;

	t_what = "disk limit";
	T = disk_limit_case(f, bytes);
	unit = bytes / (T / 2); /* file bytes of one block group (2 kv heads) */
	t_what = "disk limit, partly free";
	disk_limit_case(f, bytes - unit);
}

/* kvt_manager_create with c and spill_dir = dir fails with want (*out untouched), an error
   kvt_strerror names. */
static void expect_dir_error(struct kvt_config c, const char *dir, int want, const char *what,
			     int line)
{
	struct kvt_manager *m = NULL;
	int rc;

	c.spill_dir = dir;
	rc = t_manager_create(&c, &m);
	if (rc != want || m)
		fail_at(__FILE__, line,
			"spill_dir %.200s (%s): create returned %d (%s), expected %d", dir, what,
			rc, kvt_strerror(rc), want);
	if (!strcmp(kvt_strerror(rc), kvt_strerror(12345)))
		fail_at(__FILE__, line, "spill_dir (%s): kvt_strerror(%d) is \"%s\"", what, rc,
			kvt_strerror(rc));
}
#define EXPECT_DIR_ERROR(c, dir, want, what) expect_dir_error((c), (dir), (want), (what), __LINE__)

/* A spill directory on a read-only file system: -EROFS. A child process mounts a read-only
   tmpfs on dir in a mount namespace of its own (as root, or in a user namespace), private so
   that nothing propagates out, and exits with create's error. Skipped (a message) where
   namespaces or mounts are refused. The child creates its manager on c's own backend (host),
   not through t_manager_create: CUDA cannot start in the child of a process that started it
   (cudaErrorInitializationError, seen on an H200), and the check is the disk tier's. */
static void expect_rofs(const struct kvt_config *c, const char *dir)
{
	int status = 0;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct kvt_config cc = *c;
		struct kvt_manager *m = NULL;
		int rc;

		if (unshare(geteuid() ? CLONE_NEWUSER | CLONE_NEWNS : CLONE_NEWNS) ||
		    mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) ||
		    mount("kvtier-ro", dir, "tmpfs", MS_RDONLY, NULL))
			_exit(200);
		cc.spill_dir = dir;
		rc = kvt_manager_create(&cc, &m);
		_exit(rc < 0 && rc > -200 ? -rc : 201);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) == 200) {
		print_message("# read-only spill_dir: skipped (no mount namespace here)\n");
		return;
	}
	if (WEXITSTATUS(status) != EROFS)
		fail_at(__FILE__, __LINE__,
			"spill_dir on a read-only file system: create returned "
			"-%d, expected -EROFS",
			WEXITSTATUS(status));
}

/* Bad disk configurations fail kvt_manager_create, each spill directory that cannot be used
   with the error that says why; without a disk tier kvt_seq_spill is -ENOTSUP and
   kvt_seq_fetch only validates. */
void test_spill_bad_config(void **state)
{
	struct fix *f = *state;
	struct kvt_config c = spill_config(f->dir, 32);
	struct kvt_manager *m = NULL;
	struct kvt_stats st;
	char path[PATH_MAX + 32], *longp;
	uint64_t A = 1, bad = 2;
	FILE *fp;
	int rc;

	t_what = "bad config";
	snprintf(path, sizeof(path), "%s/no-such-dir", f->dir);
	EXPECT_DIR_ERROR(c, path, -ENOENT, "missing");
	snprintf(path, sizeof(path), "%s/no-such-dir/below", f->dir);
	EXPECT_DIR_ERROR(c, path, -ENOENT, "below a missing directory");

	snprintf(path, sizeof(path), "%s/a-file", f->dir);
	fp = fopen(path, "w");
	assert_non_null(fp);
	fclose(fp);
	EXPECT_DIR_ERROR(c, path, -ENOTDIR, "a file");
	snprintf(path, sizeof(path), "%s/a-file/below", f->dir);
	EXPECT_DIR_ERROR(c, path, -ENOTDIR, "below a file");
	snprintf(path, sizeof(path), "%s/a-file", f->dir);
	unlink(path);

	snprintf(path, sizeof(path), "%s/loop", f->dir);
	assert_int_equal(symlink("loop", path), 0);
	EXPECT_DIR_ERROR(c, path, -ELOOP, "a symbolic link to itself");
	unlink(path);

	longp = t_xmalloc(PATH_MAX + 64);
	snprintf(longp, PATH_MAX + 64, "%s/", f->dir);
	memset(longp + strlen(longp), 'a', PATH_MAX + 62 - strlen(longp));
	longp[PATH_MAX + 62] = 0;
	EXPECT_DIR_ERROR(c, longp, -ENAMETOOLONG, "a path longer than PATH_MAX");
	free(longp);

	snprintf(path, sizeof(path), "%s/read-only", f->dir);
	assert_int_equal(mkdir(path, 0500), 0);
	if (geteuid() != 0) /* root may write anywhere */
		EXPECT_DIR_ERROR(c, path, -EACCES, "not writable");
	chmod(path, 0700);
	expect_rofs(&c, path);
	rmdir(path);

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
