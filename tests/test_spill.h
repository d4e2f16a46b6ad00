/* SPDX-License-Identifier: MIT */
/*
 * What the files of the spill suite share (test_spill.c: the spill directory fixture, the
 * helpers of the focused tests, main; test_spill_*.c: the tests by topic).
 */

#ifndef TEST_SPILL_H
#define TEST_SPILL_H

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
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "t_ops.h"
#include "fault.h"
#include "seq.h"
#include "spill.h"
#include "policy.h"
#include "util.h"

struct fix {
	char dir[PATH_MAX];    /* canonical path of a fresh mkdtemp directory */
	struct kvt_manager *m; /* the test's manager, destroyed by the teardown if it failed */
};

struct rrun;

void rrun_free(struct rrun *r);

#define CHECK_DIR_EMPTY(dir)                                                                     \
	do {                                                                                     \
		uint32_t n_ = t_dir_entries(dir);                                                \
		if (n_)                                                                          \
			fail_at(__FILE__, __LINE__, "%u file(s) left in the spill directory %s", \
				n_, dir);                                                        \
	} while (0)

#define CHECK_SEQ(m, c, seq) check_seq_at((m), (c), (seq), false, __FILE__, __LINE__)
#define CHECK_SEQ_HOST(m, c, seq) check_seq_at((m), (c), (seq), true, __FILE__, __LINE__)

/* Host blocks of seq that are on disk, and all of its host blocks. */
#define DISK(m, seq) (t_info_of((m), (seq)).disk_blocks)
#define HOSTB(m, seq) (t_info_of((m), (seq)).host_blocks)

/* Appends a contract deviation to buf (the test goes on, and fails at its end listing them). */
void soft_fail(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define DISARM_IO() disarm_io(__FILE__, __LINE__)

/* test_spill.c */
/* the no-loss run under way, freed by the teardown if it failed */
extern struct rrun *g_run;
void fdestroy(struct fix *f);
/* Recall of 2 blocks per (layer, kv head) into a cache of `frames` frames, added to the
   device tier. */
void spill_recall(struct kvt_config *c, uint32_t frames);
/* Blocks of seq that kvt_seq_fetch brings back when all are on disk: each layer's last block
   when the next token goes into it. */
uint64_t tail_blocks(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq);
uint32_t spill_fds(const char *dir, struct stat *st);
struct kvt_config spill_config(const char *dir, uint32_t host_groups);
void prefill_n(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t L,
	       uint32_t layers, int want);
void prefill(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t L);
int decode_layer(struct kvt_manager *m, const struct kvt_config *c, const uint64_t *seqs,
		 uint32_t n, uint32_t layer);
void decode(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t steps);
void check_seq_at(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, bool host,
		  const char *file, int line);
uint32_t check_view(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq,
		    uint32_t layer);

/* test_spill_tiers.c */
void test_spill_roundtrip(void **state);
void test_spill_private(void **state);
void test_spill_implicit_fetch(void **state);
void test_spill_auto_lru(void **state);
void test_spill_pinned_full(void **state);
void test_spill_big_history(void **state);

/* test_spill_limits.c */
void test_spill_disk_limit(void **state);
void test_spill_bad_config(void **state);

/* test_spill_faults.c */
void arm_io(void);
void disarm_io(const char *file, int line);
void test_spill_io_errors(void **state);
void test_spill_checksum(void **state);
void test_spill_alloc_faults(void **state);

/* test_spill_engine.c */
void test_spill_engine(void **state);
void test_spill_model(void **state);

/* test_spill_noloss.c */
void test_spill_noloss(void **state);
void test_spill_noloss_limited(void **state);
void test_spill_noloss_tiny(void **state);

#endif /* TEST_SPILL_H */
