/* SPDX-License-Identifier: MIT */
/*
 * What the files of the policy suite share (test_policy.c: helpers, SnapKV straight from
 * docs/design.md in double, main; test_policy_*.c: the tests by topic).
 */

#ifndef TEST_POLICY_H
#define TEST_POLICY_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "t_data.h"
#include "policy.h"

/* A tensor of n random values m/128, |m| <= 255, both as f32 (for the naive code) and as
   dtype (for the library). Exactness of the dtype copy is asserted, not assumed. */
struct tensor {
	float *f;
	void *raw;
};

/* Runs kvt_snapkv_select on random inputs and compares every head with the naive selection.
   The sets must be equal, except that positions whose naive scores lie within 1e-6 (relative)
   of the cutoff may trade places: f32 and double can order such near-ties differently. */
#define check_vs_naive(dt, p) check_vs_naive_at(__FILE__, __LINE__, dt, p)

/* test_policy.c */
extern const enum kvt_dtype all_dtypes[];
extern const char *const dtype_name[];
uint32_t bits_of(float f);
float float_of(uint32_t u);
float to_f32_one(enum kvt_dtype dt, uint16_t h);
uint16_t from_f32_one(enum kvt_dtype dt, float f);
bool f16_is_nan(uint16_t h);
bool bf16_is_nan(uint16_t h);
void tensor_make(struct tensor *t, enum kvt_dtype dt, size_t n);
void tensor_free(struct tensor *t);
void *raw_of(enum kvt_dtype dt, const float *f, size_t n);
void *scratch_for(const struct kvt_snapkv *p);
void naive_pooled(const struct kvt_snapkv *p, uint32_t h, const float *k, const float *q,
		  double *pooled);
/* largest relative score gap of an accepted near-tie swap */
extern double max_swap_gap;
void check_vs_naive_at(const char *file, int line, enum kvt_dtype dt, struct kvt_snapkv p);

/* test_policy_dtype.c */
void test_f16_every_pattern(void **state);
void test_bf16_every_pattern(void **state);
void test_known_values(void **state);
void test_rounding(void **state);
void test_rounding_random(void **state);
void test_ring_slot(void **state);
struct kvt_snapkv params(uint32_t L, uint32_t Lobs, uint32_t sink, uint32_t recent, uint32_t topk,
			 uint32_t kernel);
void test_count(void **state);
void test_invalid(void **state);

/* test_policy_select.c */
void test_hand_tie(void **state);
void test_hand_pool(void **state);
void test_hand_causal_gqa(void **state);
void test_uniform_ties(void **state);
void test_nan_scores(void **state);
void test_random_vs_naive(void **state);
void test_scores_vs_naive(void **state);

/* test_policy_attend.c */
void test_attend_vs_naive(void **state);
void test_attend_exact(void **state);
void test_attend_no_rows(void **state);

#endif /* TEST_POLICY_H */
