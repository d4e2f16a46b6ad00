/* SPDX-License-Identifier: MIT */
/*
 * What the files of the transfer suite share (test_transfer.c: helpers, main;
 * test_transfer_*.c: the tests by topic).
 */

#ifndef TEST_TRANSFER_H
#define TEST_TRANSFER_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "plugin.h"
#include "savepool.h"
#include "t_backend.h"
#include "t_manager.h"

#define N_THREAD_COUNTS 3

#define CHECK_BYTES(got, want, n, what) check_bytes((got), (want), (n), (what), __FILE__, __LINE__)

/* test_transfer.c */
extern const uint32_t thread_counts[N_THREAD_COUNTS];
extern uint64_t rng_state;
uint64_t rnd64(void);
void fill_random(uint8_t *p, size_t n);
uint64_t a64(const void *p);
void naive_copy(const struct kvt_xfer *x, uint32_t n);
void naive_save(const uint8_t *concat, const struct kvt_xfer *x, uint32_t n,
		const uint8_t *dst_real, uint8_t *dst_ref);
void check_bytes(const uint8_t *got, const uint8_t *want, size_t n, const char *what,
		 const char *file, int line);
struct kvt_be *host_create(uint32_t threads, uint64_t staging);
uint32_t build_list(struct kvt_xfer *x, uint32_t n, uint64_t src_bytes, uint32_t max_bytes,
		    uint32_t max_reps, uint64_t *dst_bytes);
void offsets_to_addrs(struct kvt_xfer *x, uint32_t n, const void *src, const void *dst);

/* test_transfer_host.c */
void test_host_create(void **state);
void test_host_arena(void **state);
void test_host_arena_reuse(void **state);
void test_host_copy_d2d(void **state);
void test_host_gather_h2d(void **state);
void test_host_save_multi_source(void **state);
void test_host_save_chunked(void **state);
void test_host_save_chunk_edges(void **state);
void test_host_append(void **state);
void test_host_read_d2h(void **state);
void test_host_many_saves(void **state);
void test_host_save_overlapping_dst(void **state);

/* test_transfer_savepool.c */
void test_savepool_create_validation(void **state);
void test_savepool_copy_fails(void **state);
void test_savepool_wait_fails(void **state);
void test_savepool_destroy_waits(void **state);
void test_savepool_wait_ticket(void **state);
void test_savepool_zero_and_invalid_jobs(void **state);

/* test_transfer_backends.c */
void test_null_backend(void **state);
void test_backend_find(void **state);

#endif /* TEST_TRANSFER_H */
