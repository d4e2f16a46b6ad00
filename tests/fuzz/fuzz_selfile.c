/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the input is a recorded-selection file (sim/selfile.c, the replay's
 * --selections). A successful read is checked against selfile.h: records sorted by key and
 * unique, one per record line (counted here independently), block ranges inside the block
 * array; then it is used the way kvt-replay uses it, over a small synthetic trace (4 requests,
 * 2 layers, 2 kv heads, r = 3): every record is validated against the trace as the replay
 * does, sim_selfile_find and sim_selfile_has_req answer for every key of the grid and agree
 * with a linear scan, and the blocks of each found record are read into a selection row.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "selfile.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                          \
	do {                                                                                 \
		if (!(cond)) {                                                               \
			fprintf(stderr, "fuzz_selfile: %s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #cond);                                            \
			abort();                                                             \
		}                                                                            \
	} while (0)

/* The synthetic replay: requests (input tokens, output tokens), geometry, r. */
#define N_REQ 4
#define N_LAYERS 2
#define N_HEADS 2
#define BLOCK_TOKENS 8
#define R 3
static const uint32_t req_in[N_REQ] = {40, 8, 100, 17};
static const uint32_t req_out[N_REQ] = {6, 2, 9, 1};

static int fd = -1;
static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fd = memfd_create("fuzz_selfile", 0);
	if (fd < 0) {
		perror("fuzz_selfile: memfd_create");
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

/* Record lines of the input as selfile.h defines them: lines (getline's: split after '\n'),
   read up to a NUL byte, that are neither blank nor start with '#' after spaces and tabs; a
   UTF-8 byte order mark that starts the input is skipped. */
static size_t count_records(const uint8_t *data, size_t size)
{
	size_t n = 0, i = size >= 3 && !memcmp(data, "\xef\xbb\xbf", 3) ? 3 : 0;

	while (i < size) {
		size_t end = i;
		bool text = false, seen = false;

		while (end < size && data[end] != '\n')
			end++;
		for (size_t j = i; j < end && data[j]; j++) {
			char c = (char)data[j];

			if (!seen && (c == ' ' || c == '\t'))
				continue;
			if (!seen && c == '#')
				break;
			seen = true;
			if (c != ' ' && c != '\t' && c != '\r')
				text = true;
		}
		n += text;
		i = end + 1;
	}
	return n;
}

static int cmp_key(const struct sim_selrec *a, uint32_t req, uint32_t step, uint32_t layer,
		   uint32_t head)
{
	uint32_t x[4] = {a->req, a->step, a->layer, a->head}, y[4] = {req, step, layer, head};

	for (int i = 0; i < 4; i++)
		if (x[i] != y[i])
			return x[i] < y[i] ? -1 : 1;
	return 0;
}

static const struct sim_selrec *scan(const struct sim_selfile *f, uint32_t req, uint32_t step,
				     uint32_t layer, uint32_t head)
{
	for (size_t i = 0; i < f->n_rec; i++)
		if (!cmp_key(&f->rec[i], req, step, layer, head))
			return &f->rec[i];
	return NULL;
}

/* As the replay's check_selections: whether rec fits the synthetic trace. */
static bool fits(const struct sim_selfile *f, const struct sim_selrec *rec)
{
	uint64_t nb;

	if (rec->req >= N_REQ || (uint64_t)rec->step + 1 >= req_out[rec->req] ||
	    rec->layer >= N_LAYERS || rec->head >= N_HEADS || rec->n > R)
		return false;
	nb = ((uint64_t)req_in[rec->req] + rec->step + 1 + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
	for (uint32_t j = 0; j < rec->n; j++)
		if (f->blocks[rec->first + j] >= nb)
			return false;
	return true;
}

static void use(const struct sim_selfile *f, const uint8_t *data, size_t size)
{
	uint32_t row[N_HEADS * R];
	size_t blocks = 0;

	for (size_t i = 0; i < f->n_rec; i++) {
		const struct sim_selrec *rec = &f->rec[i];

		CHECK(rec->line >= 1);
		CHECK(rec->first <= f->n_blocks && rec->n <= f->n_blocks - rec->first);
		blocks += rec->n;
		if (i)
			CHECK(cmp_key(&f->rec[i - 1], rec->req, rec->step, rec->layer, rec->head) <
			      0);
		CHECK(sim_selfile_find(f, rec->req, rec->step, rec->layer, rec->head) == rec);
		CHECK(sim_selfile_has_req(f, rec->req));
		(void)fits(f, rec);
	}
	CHECK(blocks == f->n_blocks);
	/* the replay's per-step lookups over the synthetic trace, one key past each bound */
	for (uint32_t q = 0; q <= N_REQ; q++) {
		bool any = false;

		for (size_t i = 0; i < f->n_rec; i++)
			any |= f->rec[i].req == q;
		CHECK(!!sim_selfile_has_req(f, q) == any);
		for (uint32_t s = 0; s < 10; s++)
			for (uint32_t l = 0; l <= N_LAYERS; l++) {
				for (uint32_t h = 0; h < N_HEADS; h++) {
					const struct sim_selrec *rec =
						sim_selfile_find(f, q, s, l, h);
					uint32_t n = rec ? rec->n : 0;

					CHECK(rec == scan(f, q, s, l, h));
					for (uint32_t j = 0; j < R; j++)
						row[h * R + j] = j < n ? f->blocks[rec->first + j]
								       : UINT32_MAX;
				}
				(void)row;
			}
	}
	/* keys taken from the input itself, so large values are looked up too */
	for (size_t i = 0; i + 16 <= size && i < 256; i += 16) {
		uint32_t k[4];

		memcpy(k, data + i, sizeof(k));
		CHECK(sim_selfile_find(f, k[0], k[1], k[2], k[3]) ==
		      scan(f, k[0], k[1], k[2], k[3]));
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sim_selfile f, keep;
	char err[200];
	int rc;

	put_input(data, size);
	memset(&f, 0x5a, sizeof(f));
	keep = f;
	rc = sim_selfile_read(path, &f, err, size % 3 == 0 ? 0 : sizeof(err));
	if (rc) {
		CHECK(rc < 0 && rc > -4096);
		CHECK(memcmp(&f, &keep, sizeof(f)) == 0); /* *out untouched */
		return 0;
	}
	CHECK(f.n_rec == count_records(data, size));
	CHECK((f.n_rec == 0 || f.rec) && (f.n_blocks == 0 || f.blocks));
	use(&f, data, size);
	sim_selfile_free(&f);
	CHECK(f.rec == NULL && f.blocks == NULL && f.n_rec == 0);
	sim_selfile_free(NULL);
	return 0;
}
