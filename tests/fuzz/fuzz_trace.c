/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the input is a trace file, read by sim_trace_read (sim/trace.c) in every
 * format (auto-detection, mooncake, azure, burstgpt, vidur), strict and with skip_bad_lines,
 * with and without a context limit. Every successful read is checked against the contract of
 * trace.h (arrivals finite, first at 0, non-decreasing; counters in range), then re-timed and
 * summarised. The reader takes a path, so the input goes into a memfd opened through
 * /proc/self/fd (no file on disk; one per process, so -jobs/-workers need no care).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "trace.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fd = -1;
static char path[64];

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "fuzz_trace: %s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #cond);                                          \
			abort();                                                           \
		}                                                                          \
	} while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fd = memfd_create("fuzz_trace", 0);
	if (fd < 0) {
		perror("fuzz_trace: memfd_create");
		abort();
	}
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return 0;
}

static void put_input(const uint8_t *data, size_t size)
{
	size_t off = 0;

	CHECK(ftruncate(fd, 0) == 0);
	while (off < size) {
		ssize_t w = pwrite(fd, data + off, size - off, (off_t)off);

		CHECK(w > 0);
		off += (size_t)w;
	}
}

static void check_trace(const struct sim_trace *t, enum sim_trace_format asked,
			const struct sim_trace_opts *o)
{
	CHECK(t->count > 0 && t->reqs);
	CHECK(t->format != SIM_TRACE_AUTO && (unsigned)t->format <= SIM_TRACE_VIDUR);
	CHECK(asked == SIM_TRACE_AUTO || t->format == asked);
	CHECK(t->n_bad <= SIM_TRACE_BAD_KEPT && t->n_bad <= t->skipped);
	CHECK(o->skip_bad_lines || t->skipped == 0);
	CHECK(t->over_context <= t->count);
	CHECK(o->max_context || t->over_context == 0);
	CHECK(t->out_of_order < t->count);
	CHECK(t->format == SIM_TRACE_BURSTGPT || t->failed_in_trace == 0);
	CHECK(t->reqs[0].arrival_s == 0.0);
	for (size_t i = 0; i < t->count; i++) {
		const struct sim_trace_req *q = &t->reqs[i];

		CHECK(isfinite(q->arrival_s) && q->arrival_s >= 0.0);
		CHECK(q->line >= 1);
		CHECK(t->format != SIM_TRACE_BURSTGPT || q->output_tokens > 0);
		/* prefix hash ids: whole 512-token spans of the prompt, inside the array */
		CHECK(q->n_hash == 0 || t->format == SIM_TRACE_MOONCAKE);
		CHECK((uint64_t)q->n_hash * SIM_TRACE_HASH_TOKENS <= q->input_tokens);
		CHECK(q->n_hash == 0 ||
		      (t->hash_ids && q->hash_first + q->n_hash <= t->n_hash_ids));
		/* By arrival. Equal times keep file order only where the file's times are equal:
		   times that differ in the file may round to one double once made relative to
		   the first (azure's absolute times centuries apart), and then they keep the
		   order of the file's times. */
		if (i)
			CHECK(q->arrival_s >= q[-1].arrival_s && q->line != q[-1].line);
	}
	CHECK(t->duration_s == t->reqs[t->count - 1].arrival_s);
	CHECK((t->n_hash_ids == 0) == (t->hash_ids == NULL));
	for (size_t i = 0; i < t->n_bad; i++)
		CHECK(memchr(t->bad[i], '\0', SIM_TRACE_MSG_MAX) != NULL);
}

static void check_stats(const struct sim_trace *t)
{
	struct sim_trace_stats st;

	CHECK(sim_trace_stats(t, &st) == 0);
	CHECK(st.count == t->count && st.duration_s == t->duration_s);
	CHECK(st.input_p50 <= st.input_p99 && st.input_p99 <= st.input_max);
	CHECK(st.output_p50 <= st.output_p99 && st.output_p99 <= st.output_max);
	CHECK(st.input_mean <= st.input_max && st.output_mean <= st.output_max);
	CHECK(st.rate_rps >= 0.0);
	CHECK(st.prefix_seen_tokens <= st.total_input_tokens);
}

static void retime(struct sim_trace *t, double rate, double burstiness, uint64_t seed)
{
	CHECK(sim_trace_retime(t, rate, burstiness, seed) == 0);
	CHECK(t->reqs[0].arrival_s == 0.0);
	for (size_t i = 1; i < t->count; i++)
		CHECK(t->reqs[i].arrival_s >= t->reqs[i - 1].arrival_s);
	CHECK(t->duration_s == t->reqs[t->count - 1].arrival_s);
	check_stats(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const enum sim_trace_format fmts[] = {SIM_TRACE_AUTO, SIM_TRACE_MOONCAKE,
						     SIM_TRACE_AZURE, SIM_TRACE_BURSTGPT,
						     SIM_TRACE_VIDUR};
	uint64_t seed = size;

	put_input(data, size);
	for (size_t i = 0; i < size && i < 8; i++)
		seed = seed * 131 + data[i];
	for (size_t f = 0; f < sizeof(fmts) / sizeof(fmts[0]); f++) {
		for (int v = 0; v < 3; v++) {
			struct sim_trace_opts o = SIM_TRACE_OPTS_INIT;
			struct sim_trace t, keep;
			char err[160];
			int rc;

			o.skip_bad_lines = v > 0;
			o.max_context = v == 2 ? 4096 : 0;
			memset(&t, 0xa5, sizeof(t));
			keep = t;
			/* odd sizes of the message buffer, 0 included: it must stay in bounds */
			rc = sim_trace_read(path, fmts[f], &o, &t, err, v == 1 ? 0 : sizeof(err));
			if (rc) {
				CHECK(rc < 0 && rc > -4096);
				CHECK(memcmp(&t, &keep, sizeof(t)) == 0); /* *out untouched */
				if (v != 1)
					CHECK(memchr(err, '\0', sizeof(err)) != NULL);
				continue;
			}
			check_trace(&t, fmts[f], &o);
			check_stats(&t);
			retime(&t, 0.0, 1.0, seed);
			retime(&t, 3.5, 0.25 + (double)(seed % 8), seed);
			retime(&t, INFINITY, 1.0, seed);
			CHECK(t.duration_s == 0.0);
			sim_trace_free(&t);
			CHECK(t.reqs == NULL && t.count == 0 && t.hash_ids == NULL);
		}
	}
	return 0;
}
