/* SPDX-License-Identifier: MIT */
/*
 * bench_recall_cuda (bench_recall_emu over the emulated runtime): what kvt_decode_recall costs
 * the host on the CUDA backend, and its device time, beside the same call on the host backend
 * (Quest scoring on the CPU, then the recall), on the same inputs.
 *
 * Two managers of the same configuration, one per backend, get the same prompts (a value
 * pattern, no top-K, so prefill runs no SnapKV) and, each step, one decode token per (sequence,
 * layer) and one kvt_decode_recall per layer with fresh random queries, then kvt_manager_stats
 * (on the CUDA backend that applies what the calls' programs reported, which they do not wait
 * for: that host work is in the figure). Both make the same decisions (the device scoring is
 * the CPU's, block for block): the run fails unless their recall counters agree. Prints each
 * backend's median time per step (the first step excluded), per (sequence, layer), their ratio,
 * and the CUDA calls' device time per step (kvt_stats.recall_device_ns; every call timed:
 * KVTIER_RECALL_TIME_EVERY=1 unless set, whose two runtime calls a call are in the host figure).
 *
 * Over the emulated runtime (bench_recall_emu, KVT_TEST_EMULATED) the kernels' CPU stand-ins
 * are subtracted from the CUDA figure (fake_cuda_work_seconds: a GPU does that work instead),
 * its own bookkeeping (bounds checks, shadow copies) stays in (an upper bound of the host side
 * a GPU would see), and the device time is not a figure (the fake's event times are made up).
 * On a GPU (bench_recall_cuda, bench/gpu-run.sh) everything is measured; --cuda-only leaves
 * the host backend out (larger shapes: its scoring is the slow part) and so the comparison.
 *
 * --blocks times kvt_recall_device_blocks instead, the selection an engine makes on the GPU:
 * each (sequence, layer, kv head) keeps r random blocks, a tenth of them replaced each step,
 * handed over in device memory on the CUDA backend (uploaded outside the timing) and host
 * memory on the host backend; no scoring on either, so the CUDA figure is the host's whole
 * part of an engine-selected recall.
 *
 * --step makes the calls through a decode step, as an engine does: kvt_step_begin, the step's
 * recall per layer (kvt_step_recall, or kvt_step_recall_device_blocks), kvt_step_end, all
 * timed; the step's calls look no sequence up by id.
 *
 * --head-dim D sets the heads' dimension (default 128): the host's part of a call does not
 * depend on it, the memory does, so a smaller one lets the emulated runtime hold the full
 * 256 x 32 x 8 shape (its regions' host state as cold as a real step leaves it) on a machine
 * that cannot hold 128.
 *
 * Usage: bench_recall_cuda [--cuda-only] [--blocks] [--step] [--head-dim D]
 *                          [SEQS LAYERS PROMPT R STEPS] (default 16 4 4096 16 8)
 * Exit status 0, 1 on a failure, 2 on bad usage, 77 without a usable device.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "kvtier.h"
#ifdef KVT_TEST_EMULATED
#include "fake_cudart.h"
#define EMULATED 1
#define WORK_SECONDS() fake_cuda_work_seconds()
#else
#define EMULATED 0
#define WORK_SECONDS() 0.0
#endif

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void *dev_copy(const void *src, size_t n)
{
	void *d = NULL;

	if (cudaMalloc(&d, n) != cudaSuccess || cudaMemcpy(d, src, n, cudaMemcpyHostToDevice))
		return NULL;
	return d;
}

/* The median of t[1 .. n) (the first step warms up). */
static double median(double *t, uint32_t n)
{
	qsort(t + 1, n - 1, sizeof(*t), cmp_double);
	return t[1 + (n - 1) / 2];
}

int main(int argc, char **argv)
{
	uint32_t seqs = 16, layers = 4, prompt = 4096, r = 16, steps = 8, head_dim = 0;
	struct kvt_manager *m[2] = {NULL, NULL}; /* host, cuda */
	bool cuda_only = false, given = false, step = false;
	int first, n_dev = 0; /* the first manager made: host, or cuda */
	double *dev = NULL;
	uint32_t *sel = NULL, *dsel = NULL; /* --blocks: [layers][seqs][H][r] */
	struct kvt_config c = KVT_CONFIG_INIT;
	uint16_t *k = NULL, *q = NULL, *kd = NULL;
	void *dk = NULL, *dq = NULL, *dkd = NULL;
	uint64_t *ids = NULL, rng = 7;
	double *t[2] = {NULL, NULL}, *work = NULL;
	int err = 0, rc = 1;

	/* each step's device time, not a sample's (kvtier.h) */
	if (setenv("KVTIER_RECALL_TIME_EVERY", "1", 0)) {
		perror("bench_recall_cuda: setenv");
		return 1;
	}
	for (; argc > 1 && strncmp(argv[1], "--", 2) == 0; argc--, argv++) {
		if (strcmp(argv[1], "--cuda-only") == 0) {
			cuda_only = true;
		} else if (strcmp(argv[1], "--blocks") == 0) {
			given = true;
		} else if (strcmp(argv[1], "--step") == 0) {
			step = true;
		} else if (strcmp(argv[1], "--head-dim") == 0 && argc > 2) {
			char *end;

			head_dim = (uint32_t)strtoul(argv[2], &end, 10);
			if (*end || head_dim == 0) {
				fprintf(stderr,
					"bench_recall_cuda: --head-dim: a positive integer\n");
				return 2;
			}
			argc--, argv++;
		} else {
			fprintf(stderr, "bench_recall_cuda: unknown option %s\n", argv[1]);
			return 2;
		}
	}
	first = cuda_only ? 1 : 0;
	if (argc == 6) {
		seqs = (uint32_t)strtoul(argv[1], NULL, 10);
		layers = (uint32_t)strtoul(argv[2], NULL, 10);
		prompt = (uint32_t)strtoul(argv[3], NULL, 10);
		r = (uint32_t)strtoul(argv[4], NULL, 10);
		steps = (uint32_t)strtoul(argv[5], NULL, 10);
	} else if (argc != 1) {
		fprintf(stderr,
			"usage: %s [--cuda-only] [--blocks] [--step] [--head-dim D] [SEQS LAYERS "
			"PROMPT R STEPS]\n",
			argv[0]);
		return 2;
	}
	if (!seqs || !layers || prompt < 1024 || !r || steps < 2) {
		fprintf(stderr, "bench_recall_cuda: SEQS, LAYERS, R >= 1, PROMPT >= 1024, "
				"STEPS >= 2\n");
		return 2;
	}
	if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
		fprintf(stderr, "bench_recall_cuda: no usable CUDA device: skipped\n");
		return 77;
	}
	c.n_layers = layers;
	c.save_threads = 0;
	c.topk_tokens = 0;
	c.recall_blocks = r;
	if (head_dim)
		c.head_dim = head_dim;

	uint32_t H = c.n_kv_heads, Hq = c.n_q_heads, D = c.head_dim, bt = c.block_tokens;
	uint64_t row = (uint64_t)D * 2, block = 2ull * bt * row, group = H * block;
	uint64_t frames = (c.sink_tokens + c.recent_tokens) / bt + 2;
	uint64_t blocks = (prompt + steps + bt - 1) / bt + 1;
	size_t krow = (size_t)H * prompt * D, qn = (size_t)seqs * Hq * D, kn = (size_t)seqs * H * D;

	c.recall_cache_bytes = (uint64_t)seqs * layers * H * r * 2 * block;
	c.device_bytes = group * frames * layers * seqs + c.recall_cache_bytes;
	c.host_bytes = group * blocks * layers * seqs;
	for (int b = first; b < 2 && !err; b++) {
		c.backend = b ? KVT_BACKEND_CUDA : KVT_BACKEND_HOST;
		err = kvt_manager_create(&c, &m[b]);
		if (err)
			fprintf(stderr, "bench_recall_cuda: cannot create the %s manager: %s\n",
				b ? "CUDA" : "host", kvt_strerror(err));
	}
	if (err)
		goto out;
	ids = calloc(seqs, sizeof(*ids));
	k = malloc(krow * sizeof(*k));
	q = malloc(qn * sizeof(*q));
	kd = calloc(kn, sizeof(*kd));
	t[0] = calloc(steps, sizeof(double));
	t[1] = calloc(steps, sizeof(double));
	work = calloc(steps, sizeof(double));
	dev = calloc(steps, sizeof(double));
	if (!ids || !k || !q || !kd || !t[0] || !t[1] || !work || !dev) {
		fprintf(stderr, "bench_recall_cuda: out of memory\n");
		goto out;
	}
	for (size_t x = 0; x < krow; x++) /* bf16 values in about [-2, 2) */
		k[x] = (uint16_t)(0x3c00u + (splitmix64(&rng) & 0x7fu) +
				  ((splitmix64(&rng) & 1u) << 15));
	dk = dev_copy(k, krow * sizeof(*k));
	dkd = dev_copy(kd, kn * sizeof(*kd));
	if (!dk || !dkd || cudaMalloc(&dq, qn * sizeof(*q)) != cudaSuccess) {
		fprintf(stderr, "bench_recall_cuda: no device memory for the tensors\n");
		goto out;
	}
	/* --blocks: blocks outside the sink and the ring of the prompt */
	size_t sn = (size_t)layers * seqs * H * r;
	uint32_t lo = c.sink_tokens / bt, span = (prompt - c.recent_tokens) / bt - lo;

	if (given) {
		sel = malloc(sn * sizeof(*sel));
		if (!sel || cudaMalloc((void **)&dsel, sn * sizeof(*sel)) != cudaSuccess) {
			fprintf(stderr, "bench_recall_cuda: no memory for the selections\n");
			goto out;
		}
		for (size_t x = 0; x < sn; x++)
			sel[x] = lo + (uint32_t)(splitmix64(&rng) % span);
	}
	for (uint32_t i = 0; i < seqs && !err; i++) {
		ids[i] = 9000 + (uint64_t)i;
		for (int b = first; b < 2 && !err; b++) {
			const void *kk = b ? dk : k;

			err = kvt_seq_create(m[b], ids[i], prompt);
			for (uint32_t l = 0; !err && l < layers; l++)
				err = kvt_prefill_layer(m[b], ids[i], l, kk, kk, kk, NULL);
		}
	}
	for (uint32_t s = 0; s < steps && !err; s++) {
		for (size_t x = 0; x < qn; x++)
			q[x] = (uint16_t)(0x3c00u + (splitmix64(&rng) & 0xffu) +
					  ((splitmix64(&rng) & 1u) << 15));
		for (size_t x = 0; given && s && x < sn; x++) /* a tenth replaced */
			if (splitmix64(&rng) % 10 == 0)
				sel[x] = lo + (uint32_t)(splitmix64(&rng) % span);
		if (cudaMemcpy(dq, q, qn * sizeof(*q), cudaMemcpyHostToDevice) != cudaSuccess ||
		    (given && cudaMemcpy(dsel, sel, sn * sizeof(*sel), cudaMemcpyHostToDevice) !=
				      cudaSuccess)) {
			err = -EIO;
			break;
		}
		for (int b = first; b < 2 && !err; b++) {
			struct kvt_stats f0 = KVT_STATS_INIT, f1 = KVT_STATS_INIT;
			double t0, w0;

			for (uint32_t l = 0; l < layers && !err; l++)
				err = kvt_decode_append(m[b], l, ids, seqs, b ? dkd : kd,
							b ? dkd : kd, NULL);
			if (!err && b)
				err = kvt_manager_sync(m[b], NULL);
			if (!err)
				err = kvt_manager_stats(m[b], &f0);
			w0 = WORK_SECONDS();
			t0 = now_s();
			if (!err && step)
				err = kvt_step_begin(m[b], ids, seqs);
			for (uint32_t l = 0; l < layers && !err; l++) {
				const uint32_t *bl =
					given ? (b ? dsel : sel) + (size_t)l * seqs * H * r : NULL;
				const void *ql = b ? dq : (const void *)q;

				if (step)
					err = given ? kvt_step_recall_device_blocks(m[b], l, bl, r,
										    NULL)
						    : kvt_step_recall(m[b], l, ql, NULL);
				else
					err = given ? kvt_recall_device_blocks(m[b], l, ids, seqs,
									       bl, r, NULL)
						    : kvt_decode_recall(m[b], l, ids, seqs, ql,
									NULL);
			}
			if (!err && step)
				err = kvt_step_end(m[b]);
			/* and what the device's calls reported, applied (settled) on the host */
			if (!err)
				err = kvt_manager_stats(m[b], &f1);
			t[b][s] = now_s() - t0;
			if (b) {
				work[s] = WORK_SECONDS() - w0;
				t[b][s] -= work[s];
				dev[s] = 1e-9 * (double)(f1.recall_device_ns - f0.recall_device_ns);
			}
		}
	}
	if (err) {
		fprintf(stderr, "bench_recall_cuda: %s\n",
			kvt_manager_last_error(m[1]) && *kvt_manager_last_error(m[1])
				? kvt_manager_last_error(m[1])
				: (m[0] ? kvt_manager_last_error(m[0]) : "?"));
		goto out;
	}

	struct kvt_stats st[2] = {KVT_STATS_INIT, KVT_STATS_INIT};

	for (int b = first; b < 2; b++)
		kvt_manager_stats(m[b], &st[b]);
	if (!cuda_only &&
	    (st[0].recall_lookups != st[1].recall_lookups ||
	     st[0].recall_hits != st[1].recall_hits || st[0].recall_loads != st[1].recall_loads)) {
		fprintf(stderr,
			"bench_recall_cuda: the backends decided differently: lookups %llu/%llu, "
			"hits %llu/%llu, loads %llu/%llu\n",
			(unsigned long long)st[0].recall_lookups,
			(unsigned long long)st[1].recall_lookups,
			(unsigned long long)st[0].recall_hits,
			(unsigned long long)st[1].recall_hits,
			(unsigned long long)st[0].recall_loads,
			(unsigned long long)st[1].recall_loads);
		goto out;
	}

	double mh = cuda_only ? 0 : median(t[0], steps), mc = median(t[1], steps),
	       mw = median(work, steps), md = median(dev, steps);
	double per = (double)seqs * layers;

	printf("bench_recall_cuda: %s%s, %u sequences x %u layers x %u kv heads "
	       "(%u q heads, d=%u, bf16), prompt %u, r = %u, %u steps (first excluded)%s\n",
	       given ? "kvt_recall_device_blocks (the selection given)" : "kvt_decode_recall",
	       step ? " through decode steps" : "", seqs, layers, H, Hq, D, prompt, r, steps,
	       EMULATED ? ", emulated runtime" : "");
	if (!cuda_only)
		printf("host backend (%s): median %.3f ms per step, %.1f us per (sequence, layer)\n",
		       given ? "recall" : "Quest scoring on the CPU, recall", mh * 1e3,
		       mh * 1e6 / per);
	if (EMULATED)
		printf("CUDA backend, host side (emulated runtime, kernels' work left out): median "
		       "%.3f ms per step, %.1f us per (sequence, layer); the kernels' CPU stand-ins "
		       "took %.3f ms\n",
		       mc * 1e3, mc * 1e6 / per, mw * 1e3);
	else
		printf("CUDA backend, host side: median %.3f ms per step, %.1f us per (sequence, "
		       "layer); device time of the calls (recall_device_ns): median %.3f ms per "
		       "step, %.1f us per (sequence, layer)\n",
		       mc * 1e3, mc * 1e6 / per, md * 1e3, md * 1e6 / per);
	if (!cuda_only)
		printf("ratio host backend / CUDA host side: %.1fx; ", mh / (mc > 0 ? mc : 1e-9));
	printf("recall lookups %llu, hit rate %.3f%s\n", (unsigned long long)st[1].recall_lookups,
	       (double)st[1].recall_hits /
		       (double)(st[1].recall_lookups ? st[1].recall_lookups : 1),
	       cuda_only ? "" : " (both backends)");
	rc = 0;
out:
	kvt_manager_destroy(m[0]);
	kvt_manager_destroy(m[1]);
	free(dev);
	free(sel);
	cudaFree(dsel);
	cudaFree(dk);
	cudaFree(dq);
	cudaFree(dkd);
	free(ids);
	free(k);
	free(q);
	free(kd);
	free(t[0]);
	free(t[1]);
	free(work);
	return rc;
}
