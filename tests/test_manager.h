/* SPDX-License-Identifier: MIT */
/*
 * What the files of the manager suite share (test_manager.c: the sequences the tests know of, the
 * prefill, decode and checks of resident sets, read-back and attention, main; test_manager_*.c:
 * the tests by topic).
 */

#ifndef TEST_MANAGER_H
#define TEST_MANAGER_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "seq.h"
#include "policy.h"
#include "util.h"

#define MAX_LAYERS 4

/* What the test knows of one sequence. */
struct tseq {
	uint64_t id;
	uint32_t L, count;
	uint32_t n[MAX_LAYERS];	   /* tokens per layer; 0 = not prefilled */
	int32_t *topk[MAX_LAYERS]; /* [n_kv_heads][count]: kvt_snapkv_select on the same data */
};

#define CHECK_RESIDENT(m, c, t, layer) check_resident_at((m), (c), (t), (layer), __FILE__, __LINE__)

#define CHECK_READBACK(m, c, t, layer) check_readback_at((m), (c), (t), (layer), __FILE__, __LINE__)

#define CHECK_ATTEND(m, c, t, layer, salt) \
	check_attend_at((m), (c), (t), (layer), (salt), __FILE__, __LINE__)

/* test_manager.c */
void tseq_init(struct tseq *t, uint64_t id, uint32_t L);
void tseq_fini(struct tseq *t);
int prefill_raw(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t layer,
		uint32_t L, int32_t *topk, bool null_q);
void tseq_prefill(struct kvt_manager *m, const struct kvt_config *c, struct tseq *t,
		  uint32_t layer);
void check_resident_at(struct kvt_manager *m, const struct kvt_config *c, const struct tseq *t,
		       uint32_t layer, const char *file, int line);
void check_readback_at(struct kvt_manager *m, const struct kvt_config *c, const struct tseq *t,
		       uint32_t layer, const char *file, int line);
void check_resident_rows(struct kvt_manager *m, const struct kvt_config *c, const struct tseq *t,
			 uint32_t layer);
void check_attend_at(struct kvt_manager *m, const struct kvt_config *c, const struct tseq *t,
		     uint32_t layer, uint64_t salt, const char *file, int line);
int decode_step(struct kvt_manager *m, const struct kvt_config *c, uint32_t layer, struct tseq **ts,
		uint32_t n);
void check_tokens(struct kvt_manager *m, const struct kvt_config *c, const struct tseq *t);
void check_usage(struct kvt_manager *m, const struct kvt_config *c, struct tseq *ts, uint32_t n);

/* test_manager_layout.c */
void test_config_and_geometry(void **state);
void test_stats_counters(void **state);
void test_layout_small_config(void **state);
void test_layout_other_windows(void **state);
void test_topk_known(void **state);
void test_resident_enospc(void **state);

/* test_manager_decode.c */
void test_ring_wrap_long(void **state);
void test_dtypes_groups_windows(void **state);
void test_save_threads_staging(void **state);
void test_save_visibility(void **state);
void test_batched_interleaved(void **state);

/* test_manager_capacity.c */
void test_device_capacity(void **state);
void test_host_capacity_prefill(void **state);
void test_host_capacity_decode(void **state);
void test_sync_tokens_errors(void **state);

#endif /* TEST_MANAGER_H */
