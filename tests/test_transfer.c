/* SPDX-License-Identifier: MIT */
/*
 * transfer: the host backend (the reference every other backend is checked against), the save
 * thread pool it shares with the CUDA backend, the null backend and backend lookup.
 *
 * Every copy list is checked against a naive loop written from backend.h's definition of
 * struct kvt_xfer (piece r of an entry goes from src + r * src_stride to dst + r * dst_stride;
 * for saves src is an offset into the concatenated sources), on destinations pre-filled with a
 * pattern so that bytes written where they should not be are caught as well as bytes missed.
 * Saves run with 0, 1 and 4 save threads and with staging buffers far smaller than the job, so
 * chunking, entries straddling chunk boundaries and strided pieces spanning several chunks are
 * all exercised.
 */
#include "test_transfer.h"

const uint32_t thread_counts[N_THREAD_COUNTS] = {0, 1, 4};

/* ---- helpers ---------------------------------------------------------------------------- */

uint64_t rng_state;

uint64_t rnd64(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static uint32_t rnd(uint32_t bound)
{
	return (uint32_t)(rnd64() % bound);
}

void fill_random(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(rnd64() >> 24);
}

uint64_t a64(const void *p)
{
	return (uint64_t)(uintptr_t)p;
}

/* Reference of a copy list whose src are addresses. */
void naive_copy(const struct kvt_xfer *x, uint32_t n)
{
	for (uint32_t e = 0; e < n; e++)
		for (uint32_t r = 0; r < x[e].reps; r++)
			for (uint32_t i = 0; i < x[e].bytes; i++)
				((uint8_t *)(uintptr_t)(x[e].dst + r * x[e].dst_stride))[i] =
					((const uint8_t *)(uintptr_t)(x[e].src +
								      r * x[e].src_stride))[i];
}

/* Reference of a save list: src are offsets into concat. dst are addresses in dst_real; the
   copy goes to the same offset of dst_ref instead. */
void naive_save(const uint8_t *concat, const struct kvt_xfer *x, uint32_t n,
		const uint8_t *dst_real, uint8_t *dst_ref)
{
	for (uint32_t e = 0; e < n; e++)
		for (uint32_t r = 0; r < x[e].reps; r++) {
			uint64_t d = x[e].dst + r * x[e].dst_stride - a64(dst_real);

			for (uint32_t i = 0; i < x[e].bytes; i++)
				dst_ref[d + i] = concat[x[e].src + r * x[e].src_stride + i];
		}
}

/* Asserts two buffers are equal, reporting the first differing offset. */
void check_bytes(const uint8_t *got, const uint8_t *want, size_t n, const char *what,
		 const char *file, int line)
{
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i]) {
			print_error("%s: first difference at byte %zu of %zu: got 0x%02x, want "
				    "0x%02x\n",
				    what, i, n, got[i], want[i]);
			_fail(file, line);
		}
}

struct kvt_be *host_create(uint32_t threads, uint64_t staging)
{
	struct kvt_backend_params bp = {threads, staging};
	struct kvt_be *b = NULL;

	assert_int_equal(kvt_backend_host_ops.create(&bp, &b), 0);
	assert_non_null(b);
	return b;
}

/* Builds n entries with random sizes, reps (1..max_reps, some 0), strides and source offsets;
   destinations never overlap. src are offsets in [0, src_bytes); dst are offsets too. */
uint32_t build_list(struct kvt_xfer *x, uint32_t n, uint64_t src_bytes, uint32_t max_bytes,
		    uint32_t max_reps, uint64_t *dst_bytes)
{
	uint64_t d = 0;

	for (uint32_t e = 0; e < n; e++) {
		uint32_t bytes = 1 + rnd(max_bytes);
		uint32_t reps = rnd(8) == 0 ? 0 : 1 + rnd(max_reps);
		uint64_t src_stride = bytes + rnd(3 * bytes + 1); /* >= bytes: disjoint pieces */
		uint64_t dst_stride = bytes + rnd(64);
		uint64_t span = reps ? (uint64_t)(reps - 1) * src_stride + bytes : bytes;

		if (rnd(6) == 0) /* stride 0 on the source: the same piece repeated */
			src_stride = 0, span = bytes;
		if (span > src_bytes) {
			reps = 1;
			span = bytes;
		}
		x[e] = (struct kvt_xfer){
			.src = rnd64() % (src_bytes - span + 1),
			.dst = d + rnd(16),
			.bytes = bytes,
			.reps = reps,
			.src_stride = src_stride,
			.dst_stride = dst_stride,
		};
		d = x[e].dst + (reps ? (uint64_t)(reps - 1) * dst_stride : 0) + bytes;
	}
	*dst_bytes = d + 16;
	return n;
}

void offsets_to_addrs(struct kvt_xfer *x, uint32_t n, const void *src, const void *dst)
{
	for (uint32_t e = 0; e < n; e++) {
		if (src)
			x[e].src += a64(src);
		x[e].dst += a64(dst);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_host_create),
		cmocka_unit_test(test_host_arena),
		cmocka_unit_test(test_host_arena_reuse),
		cmocka_unit_test(test_host_copy_d2d),
		cmocka_unit_test(test_host_gather_h2d),
		cmocka_unit_test(test_host_save_multi_source),
		cmocka_unit_test(test_host_save_chunked),
		cmocka_unit_test(test_host_save_chunk_edges),
		cmocka_unit_test(test_host_append),
		cmocka_unit_test(test_host_read_d2h),
		cmocka_unit_test(test_host_many_saves),
		cmocka_unit_test(test_host_save_overlapping_dst),
		cmocka_unit_test(test_savepool_create_validation),
		cmocka_unit_test(test_savepool_copy_fails),
		cmocka_unit_test(test_savepool_destroy_waits),
		cmocka_unit_test(test_savepool_wait_ticket),
		cmocka_unit_test(test_savepool_wait_fails),
		cmocka_unit_test(test_savepool_zero_and_invalid_jobs),
		cmocka_unit_test(test_null_backend),
		cmocka_unit_test(test_backend_find),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
