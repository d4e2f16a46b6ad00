/* SPDX-License-Identifier: MIT */
/*
 * What the files of the errors suite share (test_errors.c: log capture, the fixture of three
 * sequences and its state checks, main; test_errors_*.c: the tests by call).
 */

#ifndef TEST_ERRORS_H
#define TEST_ERRORS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "seq.h"
#include "kvtier.h"

#define SEQ_A 101u
#define SEQ_B 202u
#define SEQ_C 303u
#define SEQ_NONE 999u
#define N_SEQ 3
#define MAX_POS 64

struct fx {
	struct kvt_config c;
	struct kvt_manager *m;
	size_t row; /* bytes of one row */
	uint64_t id[N_SEQ];
	uint32_t prompt[N_SEQ];
	uint32_t ntok[N_SEQ][2];	   /* expected tokens per layer (0 = not prefilled) */
	int32_t pos[N_SEQ][2][2][MAX_POS]; /* resident positions snapshot */
	uint32_t npos[N_SEQ][2][2];
};

void fx_snapshot_positions(struct fx *f);
void fx_check_state(struct fx *f, const char *file, int line);

#define DECODE_ROUNDS(f, r) fx_decode_rounds((f), (r), __FILE__, __LINE__)

#define CHECK_STATE(f) fx_check_state((f), __FILE__, __LINE__)

/* Runs a call expected to fail on the fixture's manager: right code, a detail in last_error
   (cleared beforehand, so a stale message from an earlier failure does not count), stats
   byte-identical, sequences unchanged. */
#define EXPECT_FAIL(f, call, code)                                                  \
	do {                                                                        \
		struct kvt_stats before_ = t_stats_of((f)->m), after_;              \
		int rc_;                                                            \
		(f)->m->err[0] = '\0';                                              \
		rc_ = (call);                                                       \
		assert_int_equal(rc_, (code));                                      \
		assert_non_null(kvt_manager_last_error((f)->m));                    \
		if (kvt_manager_last_error((f)->m)[0] == '\0')                      \
			fail_msg("%s: no detail in kvt_manager_last_error", #call); \
		after_ = t_stats_of((f)->m);                                        \
		assert_memory_equal(&before_, &after_, sizeof(before_));            \
		CHECK_STATE(f);                                                     \
	} while (0)

/* A call on a const manager (config, stats): cannot record a detail, must change nothing. */
#define EXPECT_FAIL_CONST(f, call, code)                                 \
	do {                                                             \
		struct kvt_stats before_ = t_stats_of((f)->m), after_;   \
		assert_int_equal((call), (code));                        \
		after_ = t_stats_of((f)->m);                             \
		assert_memory_equal(&before_, &after_, sizeof(before_)); \
		CHECK_STATE(f);                                          \
	} while (0)

#define FX(t) cmocka_unit_test_setup_teardown(t, fx_setup, fx_teardown)

/* test_errors.c */
void capture_log(void *user, enum kvt_log_level level, const char *msg);
void fx_decode(struct fx *f, uint32_t layer, const int *which, uint32_t n);
void fx_decode_rounds(struct fx *f, int rounds, const char *file, int line);
int fx_setup(void **state);
int fx_teardown(void **state);

/* test_errors_create.c */
void test_create_null_args(void **state);
void test_create_size_version(void **state);
void test_create_geometry(void **state);
void test_create_snapstream(void **state);
void test_create_budgets(void **state);
void test_create_threads_staging(void **state);
void test_create_backends(void **state);
void test_create_older_caller(void **state);

/* test_errors_calls.c */
void test_destroy_null(void **state);
void test_strerror(void **state);
void test_last_error(void **state);
void test_version_and_log(void **state);
void test_log_set_from_callback(void **state);
void test_log_callback_blocks_no_other(void **state);
void test_log_set_waits_for_callbacks(void **state);
void test_config_errors(void **state);
void test_stats_errors(void **state);
void test_sync_errors(void **state);
void test_seq_create_errors(void **state);
void test_seq_destroy_errors(void **state);
void test_resident_errors(void **state);
void test_read_token_errors(void **state);
void test_tokens_errors(void **state);
void test_attend_errors(void **state);
void test_null_manager(void **state);
int group_setup(void **state);
int group_teardown(void **state);

/* test_errors_tensors.c */
void test_prefill_errors(void **state);
void test_prefill_q_obs_optional(void **state);
void test_prefill_tier_full(void **state);
void test_decode_errors(void **state);
void test_decode_last_bad(void **state);
void test_decode_overflow(void **state);
void test_decode_host_full(void **state);

#endif /* TEST_ERRORS_H */
