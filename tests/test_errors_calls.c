/* SPDX-License-Identifier: MIT */
/*
 * errors: manager-level calls, sequence create and destroy, and the reads (resident positions,
 * tokens, attention), each failing on bad arguments without changing anything; and the
 * logging's own calls, from inside a callback and from several threads at once.
 */
#include "test_errors.h"

#include <pthread.h>
#include <semaphore.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

/* ---- manager-level calls ---------------------------------------------------------------- */

void test_destroy_null(void **state)
{
	(void)state;
	kvt_manager_destroy(NULL);
	kvt_manager_destroy(NULL);
}

/* Every code a call of the library returns (kvtier.h names each one, below), by name. */
static const struct {
	const char *name;
	int code;
} api_codes[] = {
	{"EINVAL", EINVAL},	{"ENOENT", ENOENT},
	{"EEXIST", EEXIST},	{"ENOSPC", ENOSPC},
	{"ENOMEM", ENOMEM},	{"EOVERFLOW", EOVERFLOW},
	{"ENODEV", ENODEV},	{"ENOTSUP", ENOTSUP},
	{"EIO", EIO},		{"EAGAIN", EAGAIN},
	{"EBUSY", EBUSY},	{"EBADMSG", EBADMSG},
	{"EALREADY", EALREADY}, {"ESTALE", ESTALE},
	{"E2BIG", E2BIG},	{"ENOTDIR", ENOTDIR},
	{"EACCES", EACCES},	{"EPERM", EPERM},
	{"EROFS", EROFS},	{"ENAMETOOLONG", ENAMETOOLONG},
	{"ELOOP", ELOOP},	{"EMFILE", EMFILE},
};

/* Every -E... that kvtier.h names is in api_codes (so has its own text, checked below). */
static void check_header_codes(void)
{
	FILE *f = fopen(KVT_SOURCE_ROOT "/include/kvtier.h", "r");
	char line[512];
	uint32_t seen = 0;

	if (!f)
		fail_msg("cannot open %s", KVT_SOURCE_ROOT "/include/kvtier.h");
	while (fgets(line, sizeof(line), f)) {
		for (const char *p = strstr(line, "-E"); p; p = strstr(p + 2, "-E")) {
			char name[32];
			size_t n = 0;
			bool known = false;

			while (n + 1 < sizeof(name) && ((p[1 + n] >= 'A' && p[1 + n] <= 'Z') ||
							(p[1 + n] >= '0' && p[1 + n] <= '9')))
				name[n] = p[1 + n], n++;
			name[n] = 0;
			for (size_t i = 0; i < sizeof(api_codes) / sizeof(api_codes[0]); i++)
				known = known || !strcmp(name, api_codes[i].name);
			if (!known)
				fail_msg(
					"kvtier.h names -%s, which this test (and kvt_strerror?) does "
					"not know",
					name);
			seen++;
		}
	}
	fclose(f);
	assert_true(seen > 50);
}

void test_strerror(void **state)
{
	const char *unknown = kvt_strerror(12345);

	(void)state;
	assert_non_null(unknown);
	assert_true(strlen(unknown) > 0);
	check_header_codes();
	for (size_t i = 0; i < sizeof(api_codes) / sizeof(api_codes[0]); i++) {
		const int code = api_codes[i].code;
		const char *neg = kvt_strerror(-code), *pos = kvt_strerror(code);

		assert_non_null(neg);
		assert_non_null(pos);
		assert_true(strlen(neg) > 0);
		/* Sign does not matter; every code the API returns has its own text. */
		assert_string_equal(neg, pos);
		if (!strcmp(neg, unknown))
			fail_msg("kvt_strerror(-%s) is \"%s\"", api_codes[i].name, neg);
		for (size_t j = 0; j < i; j++)
			assert_string_not_equal(neg, kvt_strerror(-api_codes[j].code));
	}
	/* Texts right for every call that returns the code: -ENOENT is also a spill directory
	   that does not exist (create), not only a sequence; -ENOSPC also a full file system
	   (create, spilling); -ENOTSUP also a manager without a disk tier (kvt_seq_spill). */
	assert_non_null(strstr(kvt_strerror(-ENOENT), "sequence"));
	assert_non_null(strstr(kvt_strerror(-ENOENT), "spill directory"));
	assert_non_null(strstr(kvt_strerror(-ENOSPC), "file system"));
	assert_non_null(strstr(kvt_strerror(-ENOTSUP), "disk tier"));
	/* Unknown and extreme codes: some text, never NULL. */
	const int odd[] = {-12345, 12345, 0, 1 << 20, -(1 << 20), INT_MAX, INT_MIN, INT_MIN + 1};

	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
		const char *s = kvt_strerror(odd[i]);

		assert_non_null(s);
		assert_true(strlen(s) > 0);
	}
	assert_string_equal(kvt_strerror(-12345), unknown);
	assert_string_equal(kvt_strerror(INT_MAX), unknown);
	assert_string_equal(kvt_strerror(INT_MIN), unknown);
}

void test_last_error(void **state)
{
	struct fx *f = *state;
	const char *e = kvt_manager_last_error(NULL);

	assert_non_null(e);
	assert_true(strlen(e) > 0);
	/* The fixture ran only successful calls: no detail yet (checked in setup), and
	   successful calls after a failure keep the detail until the next failure. */
	EXPECT_FAIL(f, kvt_seq_destroy(f->m, SEQ_NONE), -ENOENT);
	char saved[256];

	snprintf(saved, sizeof(saved), "%s", kvt_manager_last_error(f->m));
	assert_true(strlen(saved) > 0);
	uint32_t n;

	assert_int_equal(kvt_seq_tokens(f->m, SEQ_A, 0, &n), 0);
	assert_string_equal(kvt_manager_last_error(f->m), saved);
}

void test_version_and_log(void **state)
{
	char want[32];

	(void)state;
	snprintf(want, sizeof(want), "%d.%d.%d", KVT_VERSION_MAJOR, KVT_VERSION_MINOR,
		 KVT_VERSION_PATCH);
	assert_non_null(kvt_version());
	assert_string_equal(kvt_version(), want);
	/* No error paths: NULL resets to stderr, any level is accepted. */
	kvt_log_set(NULL, NULL);
	kvt_log_set_level(KVT_LOG_ERROR);
	kvt_log_set(capture_log, NULL);
	kvt_log_set_level(KVT_LOG_WARN);
}

/* ---- logging from several threads: no library lock held while a callback runs ----------- */

/* Waits up to `seconds` for s; false when it was not posted in time. */
static bool log_timed_wait(sem_t *s, int seconds)
{
	struct timespec t;
	int rc;

	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_sec += seconds;
	while ((rc = sem_timedwait(s, &t)) != 0 && errno == EINTR)
		;
	return rc == 0;
}

static void log_sem_wait(sem_t *s)
{
	while (sem_wait(s) != 0 && errno == EINTR)
		;
}

/* A thread stuck in the library's logging cannot be brought back (a lock it holds would stall
   every later message, the group teardown's kvt_log_set included), so this watchdog ends the
   process: the suite fails instead of hanging. */
static void log_wait_or_exit(sem_t *s, const char *what)
{
	if (!log_timed_wait(s, 10)) {
		print_error("%s: no progress in 10 s (a deadlock in the logging)\n", what);
		_exit(1);
	}
}

struct reenter {
	sem_t done;
	int first, second; /* messages each callback received */
};

static void log_second(void *user, enum kvt_log_level level, const char *msg)
{
	struct reenter *r = user;

	(void)level;
	(void)msg;
	r->second++;
}

/* Reconfigures the logging from inside itself, as an application may on its first message. */
static void log_reenter(void *user, enum kvt_log_level level, const char *msg)
{
	struct reenter *r = user;

	(void)level;
	(void)msg;
	r->first++;
	kvt_log_set_level(KVT_LOG_INFO);
	kvt_log_set(log_second, r);
}

static void *log_reenter_main(void *arg)
{
	struct reenter *r = arg;

	kvt_log(KVT_LOG_DEBUG, "to log_reenter");
	kvt_log(KVT_LOG_DEBUG, "below the level log_reenter set");
	kvt_log(KVT_LOG_INFO, "to log_second");
	sem_post(&r->done);
	return NULL;
}

void test_log_set_from_callback(void **state)
{
	struct reenter r = {.first = 0};
	pthread_t t;

	(void)state;
	assert_int_equal(sem_init(&r.done, 0, 0), 0);
	kvt_log_set(log_reenter, &r);
	kvt_log_set_level(KVT_LOG_DEBUG);
	/* On a thread of its own, so that a deadlock trips the watchdog. */
	assert_int_equal(pthread_create(&t, NULL, log_reenter_main, &r), 0);
	log_wait_or_exit(&r.done, "kvt_log_set from inside a log callback");
	assert_int_equal(pthread_join(t, NULL), 0);
	kvt_log_set(capture_log, NULL);
	kvt_log_set_level(KVT_LOG_WARN);
	/* Each setting took effect from the next message on. */
	assert_int_equal(r.first, 1);
	assert_int_equal(r.second, 1);
	sem_destroy(&r.done);
}

/* Two managers on two threads; the callback blocks the first message of the thread marked
   slow until the test releases it. */
struct blocker {
	struct kvt_manager *m[2];
	sem_t entered, release, fast_done, set_done;
	int rc[2];
	int fast_calls;	     /* messages from threads other than the slow one */
	bool slow_returned;  /* the slow thread's blocked callback returned */
	bool set_saw_return; /* slow_returned, read when kvt_log_set returned */
};

static _Thread_local bool log_thread_is_slow;

static void log_block(void *user, enum kvt_log_level level, const char *msg)
{
	struct blocker *b = user;

	(void)level;
	(void)msg;
	if (!log_thread_is_slow) {
		__atomic_add_fetch(&b->fast_calls, 1, __ATOMIC_SEQ_CST);
		return;
	}
	log_thread_is_slow = false; /* block once */
	sem_post(&b->entered);
	log_sem_wait(&b->release);
	__atomic_store_n(&b->slow_returned, true, __ATOMIC_SEQ_CST);
}

static void log_quiet(void *user, enum kvt_log_level level, const char *msg)
{
	(void)user;
	(void)level;
	(void)msg;
}

static void *log_slow_main(void *arg)
{
	struct blocker *b = arg;

	log_thread_is_slow = true;
	b->rc[0] = kvt_seq_destroy(b->m[0], SEQ_NONE); /* fails, logs at debug */
	return NULL;
}

static void *log_fast_main(void *arg)
{
	struct blocker *b = arg;

	b->rc[1] = kvt_seq_destroy(b->m[1], SEQ_NONE);
	sem_post(&b->fast_done);
	return NULL;
}

static void *log_set_main(void *arg)
{
	struct blocker *b = arg;

	kvt_log_set(log_quiet, NULL);
	b->set_saw_return = __atomic_load_n(&b->slow_returned, __ATOMIC_SEQ_CST);
	sem_post(&b->set_done);
	return NULL;
}

static void blocker_init(struct blocker *b)
{
	struct kvt_config c = t_small_config();

	memset(b, 0, sizeof(*b));
	assert_int_equal(sem_init(&b->entered, 0, 0), 0);
	assert_int_equal(sem_init(&b->release, 0, 0), 0);
	assert_int_equal(sem_init(&b->fast_done, 0, 0), 0);
	assert_int_equal(sem_init(&b->set_done, 0, 0), 0);
	b->m[0] = t_mk(&c);
	b->m[1] = t_mk(&c);
	kvt_log_set(log_block, b);
	kvt_log_set_level(KVT_LOG_DEBUG);
}

static void blocker_fini(struct blocker *b)
{
	kvt_log_set(capture_log, NULL);
	kvt_log_set_level(KVT_LOG_WARN);
	kvt_manager_destroy(b->m[0]);
	kvt_manager_destroy(b->m[1]);
	sem_destroy(&b->entered);
	sem_destroy(&b->release);
	sem_destroy(&b->fast_done);
	sem_destroy(&b->set_done);
}

void test_log_callback_blocks_no_other(void **state)
{
	struct blocker b;
	pthread_t slow, fast;
	bool fast_in_time, slow_still_blocked;

	(void)state;
	blocker_init(&b);
	assert_int_equal(pthread_create(&slow, NULL, log_slow_main, &b), 0);
	log_wait_or_exit(&b.entered, "the slow thread's log callback");
	/* While the slow callback blocks, a failing call on the other manager (which logs, so
	   runs the callback too) completes. */
	assert_int_equal(pthread_create(&fast, NULL, log_fast_main, &b), 0);
	fast_in_time = log_timed_wait(&b.fast_done, 10);
	slow_still_blocked = !__atomic_load_n(&b.slow_returned, __ATOMIC_SEQ_CST);
	sem_post(&b.release);
	assert_int_equal(pthread_join(slow, NULL), 0);
	assert_int_equal(pthread_join(fast, NULL), 0);
	blocker_fini(&b);
	assert_true(fast_in_time);
	assert_true(slow_still_blocked);
	assert_true(b.fast_calls >= 1);
	assert_int_equal(b.rc[0], -ENOENT);
	assert_int_equal(b.rc[1], -ENOENT);
}

void test_log_set_waits_for_callbacks(void **state)
{
	struct blocker b;
	pthread_t slow, set;
	bool set_early;

	(void)state;
	blocker_init(&b);
	assert_int_equal(pthread_create(&slow, NULL, log_slow_main, &b), 0);
	log_wait_or_exit(&b.entered, "the slow thread's log callback");
	/* kvt_log_set from outside any callback returns only once the callbacks it replaced
	   have returned: the caller may then free what they use. Given a moment to run, it must
	   still be waiting. */
	assert_int_equal(pthread_create(&set, NULL, log_set_main, &b), 0);
	usleep(100 * 1000);
	set_early = sem_trywait(&b.set_done) == 0;
	sem_post(&b.release);
	assert_int_equal(pthread_join(slow, NULL), 0);
	assert_int_equal(pthread_join(set, NULL), 0);
	blocker_fini(&b);
	assert_false(set_early);
	assert_true(b.set_saw_return);
	assert_int_equal(b.rc[0], -ENOENT);
}

void test_config_errors(void **state)
{
	struct fx *f = *state;
	struct kvt_config out, keep;

	memset(&out, 0x3c, sizeof(out));
	keep = out;
	assert_int_equal(kvt_manager_config(NULL, &out), -EINVAL);
	assert_memory_equal(&out, &keep, sizeof(out));
	EXPECT_FAIL_CONST(f, kvt_manager_config(f->m, NULL), -EINVAL);
	assert_int_equal(kvt_manager_config(f->m, &out), 0);
	assert_int_equal(out.n_layers, 2);
	assert_int_equal(out.backend, t_be->kind);
}

void test_stats_errors(void **state)
{
	struct fx *f = *state;
	const size_t full = sizeof(struct kvt_stats);
	uint8_t buf[sizeof(struct kvt_stats) + 64];
	struct kvt_stats ref = t_stats_of(f->m);

	assert_int_equal(kvt_manager_stats(NULL, &ref), -EINVAL);
	EXPECT_FAIL_CONST(f, kvt_manager_stats(f->m, NULL), -EINVAL);

	/* .size smaller than the two header fields: -EINVAL, nothing written. */
	const uint32_t too_small[] = {0, 1, 4, 7};

	for (size_t i = 0; i < sizeof(too_small) / sizeof(too_small[0]); i++) {
		memset(buf, 0xab, sizeof(buf));
		memcpy(buf, &too_small[i], sizeof(uint32_t));
		EXPECT_FAIL_CONST(f, kvt_manager_stats(f->m, (struct kvt_stats *)(void *)buf),
				  -EINVAL);
		assert_memory_equal(buf, &too_small[i], sizeof(uint32_t));
		for (size_t b = 4; b < sizeof(buf); b++)
			assert_int_equal(buf[b], 0xab);
	}
	/* A version other than KVT_STATS_VERSION (a caller's struct of another layout, or one
	   that set only .size): -EINVAL, nothing written. */
	const uint32_t bad_versions[] = {0, KVT_STATS_VERSION + 1, 0xabababab, UINT32_MAX};

	for (size_t i = 0; i < sizeof(bad_versions) / sizeof(bad_versions[0]); i++) {
		const uint32_t sz = (uint32_t)full;

		memset(buf, 0xab, sizeof(buf));
		memcpy(buf, &sz, sizeof(sz));
		memcpy(buf + 4, &bad_versions[i], sizeof(uint32_t));
		EXPECT_FAIL_CONST(f, kvt_manager_stats(f->m, (struct kvt_stats *)(void *)buf),
				  -EINVAL);
		assert_memory_equal(buf, &sz, sizeof(sz));
		assert_memory_equal(buf + 4, &bad_versions[i], sizeof(uint32_t));
		for (size_t b = 8; b < sizeof(buf); b++)
			assert_int_equal(buf[b], 0xab);
	}
	/* A size covering part of the struct: exactly that many bytes written, matching the
	   full struct; the rest untouched. Larger than the struct: the struct, no more. (Only
	   kvt_manager_stats runs from here on, so the counters stay as in ref.) */
	ref = t_stats_of(f->m);
	const uint32_t sizes[] = {8,
				  12,
				  16,
				  (uint32_t)offsetof(struct kvt_stats, bytes_h2d),
				  (uint32_t)offsetof(struct kvt_stats, live_seqs),
				  (uint32_t)full - 4,
				  (uint32_t)full,
				  (uint32_t)full + 64};

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint32_t sz = sizes[i], written = sz < full ? sz : (uint32_t)full;
		const uint32_t version = KVT_STATS_VERSION;

		memset(buf, 0xab, sizeof(buf));
		memcpy(buf, &sz, sizeof(sz));
		memcpy(buf + 4, &version, sizeof(version));
		assert_int_equal(kvt_manager_stats(f->m, (struct kvt_stats *)(void *)buf), 0);
		/* Header: size says what was written, version is current. */
		uint32_t hdr[2];

		memcpy(hdr, buf, sizeof(hdr));
		assert_int_equal(hdr[0], written);
		assert_int_equal(hdr[1], KVT_STATS_VERSION);
		assert_memory_equal(buf + 8, (const uint8_t *)&ref + 8, written - 8);
		for (size_t b = written; b < sizeof(buf); b++)
			if (buf[b] != 0xab)
				fail_msg("stats with size %u wrote byte %zu", sz, b);
	}
	CHECK_STATE(f);
}

void test_sync_errors(void **state)
{
	struct fx *f = *state;

	assert_int_equal(kvt_manager_sync(NULL, NULL), -EINVAL);
	assert_int_equal(kvt_manager_sync(f->m, NULL), 0);
	CHECK_STATE(f);
}

/* ---- sequences -------------------------------------------------------------------------- */

void test_seq_create_errors(void **state)
{
	struct fx *f = *state;

	assert_int_equal(kvt_seq_create(NULL, 7, 10), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_create(f->m, 7, 0), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_create(f->m, 7, (uint32_t)INT32_MAX + 1), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_create(f->m, 7, UINT32_MAX), -EINVAL);
	/* Live ids, whatever their state; a different prompt length changes nothing. */
	EXPECT_FAIL(f, kvt_seq_create(f->m, SEQ_A, 40), -EEXIST);
	EXPECT_FAIL(f, kvt_seq_create(f->m, SEQ_A, 100), -EEXIST);
	EXPECT_FAIL(f, kvt_seq_create(f->m, SEQ_B, 1), -EEXIST);
	EXPECT_FAIL(f, kvt_seq_create(f->m, SEQ_C, 30), -EEXIST);
	/* Edges accepted: 1 and INT32_MAX tokens (no tier memory until prefill); ids 0 and
	   UINT64_MAX are ordinary ids. */
	struct kvt_stats st0 = t_stats_of(f->m), st1;

	assert_int_equal(kvt_seq_create(f->m, 7, INT32_MAX), 0);
	assert_int_equal(kvt_seq_create(f->m, 0, 1), 0);
	assert_int_equal(kvt_seq_create(f->m, UINT64_MAX, 1), 0);
	st1 = t_stats_of(f->m);
	assert_int_equal(st1.live_seqs, st0.live_seqs + 3);
	assert_int_equal(st1.device_frames_used, st0.device_frames_used);
	assert_int_equal(st1.host_blocks_used, st0.host_blocks_used);
	EXPECT_FAIL(f, kvt_seq_create(f->m, UINT64_MAX, 5), -EEXIST);
	EXPECT_FAIL(f, kvt_seq_create(f->m, 0, 5), -EEXIST);
	assert_int_equal(kvt_seq_destroy(f->m, 7), 0);
	assert_int_equal(kvt_seq_destroy(f->m, 0), 0);
	assert_int_equal(kvt_seq_destroy(f->m, UINT64_MAX), 0);
	st1 = t_stats_of(f->m);
	assert_int_equal(st1.live_seqs, st0.live_seqs);
	CHECK_STATE(f);
}

void test_seq_destroy_errors(void **state)
{
	struct fx *f = *state;

	assert_int_equal(kvt_seq_destroy(NULL, SEQ_A), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_destroy(f->m, SEQ_NONE), -ENOENT);
	EXPECT_FAIL(f, kvt_seq_destroy(f->m, 0), -ENOENT);
	assert_int_equal(kvt_seq_create(f->m, 77, 12), 0);
	assert_int_equal(kvt_seq_destroy(f->m, 77), 0);
	EXPECT_FAIL(f, kvt_seq_destroy(f->m, 77), -ENOENT);
}

/* ---- reads ------------------------------------------------------------------------------ */

void test_resident_errors(void **state)
{
	struct fx *f = *state;
	int32_t out[MAX_POS];
	uint32_t n;

	for (int i = 0; i < MAX_POS; i++)
		out[i] = -7;
	n = 12345;
	assert_int_equal(kvt_seq_resident_positions(NULL, SEQ_A, 0, 0, out, MAX_POS, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 0, 0, out, MAX_POS, NULL), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 0, 0, NULL, MAX_POS, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_NONE, 0, 0, out, MAX_POS, &n), -ENOENT);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 2, 0, out, MAX_POS, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 0, 2, out, MAX_POS, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 0, UINT32_MAX, out, MAX_POS, &n),
		    -EINVAL);
	/* Layer not prefilled. */
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 1, 0, out, MAX_POS, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_C, 0, 0, out, MAX_POS, &n), -EINVAL);
	for (int i = 0; i < MAX_POS; i++)
		assert_int_equal(out[i], -7);
	assert_int_equal(n, 12345);
	/* Short output: -ENOSPC, the count reported, nothing written. */
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_A, 0, 1, out, 39, &n), -ENOSPC);
	assert_int_equal(n, 40);
	for (int i = 0; i < MAX_POS; i++)
		assert_int_equal(out[i], -7);
	n = 0;
	EXPECT_FAIL(f, kvt_seq_resident_positions(f->m, SEQ_B, 0, 0, NULL, 0, &n), -ENOSPC);
	assert_int_equal(n, 24);
	/* Exactly enough room. */
	assert_int_equal(kvt_seq_resident_positions(f->m, SEQ_A, 0, 1, out, 40, &n), 0);
	assert_int_equal(n, 40);
	assert_memory_equal(out, f->pos[0][0][1], 40 * sizeof(out[0]));
	assert_int_equal(out[40], -7);
}

void test_read_token_errors(void **state)
{
	struct fx *f = *state;
	uint8_t k[64], v[64];

	memset(k, 0x11, sizeof(k));
	memset(v, 0x22, sizeof(v));
	assert_int_equal(kvt_seq_read_token(NULL, SEQ_A, 0, 0, 0, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 0, 0, 0, NULL, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 0, 0, 0, k, NULL), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_NONE, 0, 0, 0, k, v), -ENOENT);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 2, 0, 0, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, UINT32_MAX, 0, 0, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 0, 2, 0, k, v), -EINVAL);
	/* pos >= tokens of that layer (A layer 0 has 45, B layer 1 has 20). */
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 0, 0, 45, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 0, 1, UINT32_MAX, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_B, 1, 0, 20, k, v), -EINVAL);
	/* Layer not prefilled: no tokens at all. */
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_A, 1, 0, 0, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token(f->m, SEQ_C, 0, 0, 0, k, v), -EINVAL);
	for (size_t i = 0; i < sizeof(k); i++) {
		assert_int_equal(k[i], 0x11);
		assert_int_equal(v[i], 0x22);
	}
	/* The internal host-history read has the same checks. */
	EXPECT_FAIL(f, kvt_seq_read_token_host(f->m, SEQ_A, 0, 0, 45, k, v), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_read_token_host(f->m, SEQ_NONE, 0, 0, 0, k, v), -ENOENT);
	/* The last valid position reads. */
	assert_int_equal(kvt_seq_read_token(f->m, SEQ_A, 0, 0, 44, k, v), 0);
}

void test_tokens_errors(void **state)
{
	struct fx *f = *state;
	uint32_t n = 777;

	assert_int_equal(kvt_seq_tokens(NULL, SEQ_A, 0, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_tokens(f->m, SEQ_A, 0, NULL), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_tokens(f->m, SEQ_A, 2, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_tokens(f->m, SEQ_A, UINT32_MAX, &n), -EINVAL);
	EXPECT_FAIL(f, kvt_seq_tokens(f->m, SEQ_NONE, 0, &n), -ENOENT);
	assert_int_equal(n, 777);
	/* Not prefilled is not an error: 0 tokens. */
	assert_int_equal(kvt_seq_tokens(f->m, SEQ_C, 1, &n), 0);
	assert_int_equal(n, 0);
}

void test_attend_errors(void **state)
{
	struct fx *f = *state;
	float q[4 * 16], out[4 * 16];

	for (int i = 0; i < 64; i++) {
		q[i] = (float)(i % 7) / 8.0f;
		out[i] = -3.5f;
	}
	assert_int_equal(kvt_attend(NULL, SEQ_A, 0, q, out), -EINVAL);
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_A, 0, NULL, out), -EINVAL);
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_A, 0, q, NULL), -EINVAL);
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_NONE, 0, q, out), -ENOENT);
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_A, 2, q, out), -EINVAL);
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_A, UINT32_MAX, q, out), -EINVAL);
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_A, 1, q, out), -EINVAL); /* not prefilled */
	EXPECT_FAIL(f, kvt_attend(f->m, SEQ_C, 0, q, out), -EINVAL);
	for (int i = 0; i < 64; i++)
		assert_true(out[i] == -3.5f);
	/* And it works on the same sequence once the arguments are right. */
	assert_int_equal(kvt_attend(f->m, SEQ_A, 0, q, out), 0);
	for (int i = 0; i < 64; i++)
		assert_true(out[i] >= -1.0f && out[i] <= 1.0f);
}

/* NULL manager everywhere: -EINVAL (or nothing, for the void and const-char calls). */
void test_null_manager(void **state)
{
	struct kvt_config c;
	struct kvt_stats st = KVT_STATS_INIT;
	uint64_t id = 1;
	uint8_t buf[64];
	uint32_t n;
	int32_t pos[4];
	float q[64], out[64];

	(void)state;
	memset(q, 0, sizeof(q));
	kvt_manager_destroy(NULL);
	assert_non_null(kvt_manager_last_error(NULL));
	assert_int_equal(kvt_manager_config(NULL, &c), -EINVAL);
	assert_int_equal(kvt_manager_stats(NULL, &st), -EINVAL);
	assert_int_equal(kvt_manager_sync(NULL, NULL), -EINVAL);
	assert_int_equal(kvt_seq_create(NULL, 1, 1), -EINVAL);
	assert_int_equal(kvt_seq_destroy(NULL, 1), -EINVAL);
	assert_int_equal(t_prefill_layer(NULL, 1, 0, buf, buf, buf, NULL), -EINVAL);
	assert_int_equal(t_decode_append(NULL, 0, &id, 1, buf, buf, NULL), -EINVAL);
	assert_int_equal(kvt_seq_resident_positions(NULL, 1, 0, 0, pos, 4, &n), -EINVAL);
	assert_int_equal(kvt_seq_read_token(NULL, 1, 0, 0, 0, buf, buf), -EINVAL);
	assert_int_equal(kvt_seq_tokens(NULL, 1, 0, &n), -EINVAL);
	assert_int_equal(kvt_attend(NULL, 1, 0, q, out), -EINVAL);
	/* Every pointer NULL at once. */
	assert_int_equal(kvt_manager_config(NULL, NULL), -EINVAL);
	assert_int_equal(kvt_manager_stats(NULL, NULL), -EINVAL);
	assert_int_equal(t_prefill_layer(NULL, 1, 0, NULL, NULL, NULL, NULL), -EINVAL);
	assert_int_equal(t_decode_append(NULL, 0, NULL, 0, NULL, NULL, NULL), -EINVAL);
	assert_int_equal(kvt_seq_resident_positions(NULL, 1, 0, 0, NULL, 0, NULL), -EINVAL);
	assert_int_equal(kvt_seq_read_token(NULL, 1, 0, 0, 0, NULL, NULL), -EINVAL);
	assert_int_equal(kvt_seq_tokens(NULL, 1, 0, NULL), -EINVAL);
	assert_int_equal(kvt_attend(NULL, 1, 0, NULL, NULL), -EINVAL);
}

int group_setup(void **state)
{
	(void)state;
	kvt_log_set(capture_log, NULL);
	return 0;
}

int group_teardown(void **state)
{
	(void)state;
	kvt_log_set(NULL, NULL);
	return 0;
}
