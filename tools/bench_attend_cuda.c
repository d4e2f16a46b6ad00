/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench attend --backend cuda: the batched decode attention's HBM bandwidth on a GPU, as
 * a ratio to the device's copy bandwidth measured in the same run (goal: >= 0.7).
 *
 * A manager on the CUDA backend (the geometry and inputs of the host mode, tools/bench_attend.c)
 * gets the prompts as device tensors, a recall of r random blocks per kv head, and one open
 * step; q and out are device buffers. Timed per repetition with CUDA events on one stream,
 * median over --reps after one warm-up each:
 *   - kvt_attend_tables over tables kvt_step_tables wrote into device buffers: the kernels
 *     alone (no copy, no host work between the events): the figure held against the goal;
 *   - kvt_step_attend: the call as an engine makes it, the tables assembled on the host and
 *     copied, then the same kernels; the stream waits while the host assembles them, so its
 *     time between the events is the call's latency, not the kernels' (its host time too);
 *   - one cudaMemcpyAsync device to device of --copy-mib MiB: the device's copy bandwidth.
 * Bytes: the attention reads the K and V rows of every token the tables name (resident and
 * recalled, each once; counted from the tables read back to the host) and q, and writes out;
 * the copy reads and writes its size. Both are counted as the bytes they move through HBM,
 * reads and writes alike, so the ratio compares like with like: how close the attention's
 * traffic comes to what the memory sustains for a plain copy. (The attention moves almost
 * only reads; a device's read-only bandwidth can exceed its copy's somewhat, so a ratio near
 * or above 1 is possible.) The output of both calls is checked once against kvt_attend per
 * member (f32 on the host): a value further from the reference than |ref| / 256 + max|ref| /
 * 4096 (max over the member's output; bf16 keeps 8 significant bits, so its rounding alone is
 * within |ref| / 512; the rest allows for the sums' order) fails the run (exit 1), as does a
 * CUDA or library error; the times never do.
 *
 * Why here, and how it reaches CUDA: the benchmark drives the manager's public calls, which
 * live in this program (linked with the library's objects), not in the CUDA plugin, which
 * cannot call back into the library (so not a plugin entry, as `kvtier-bench transfer` is:
 * that one drives the backend alone); a separate program linked with cudart, as
 * tests/bench_recall_cuda.c is, would not be `kvtier-bench attend` and would need a second
 * build for the emulator. kvtier-bench does not link the CUDA runtime, so that it builds and
 * runs where there is none. So, as the plugin opens cuBLAS for `kvtier-bench
 * calibrate`, this mode opens the CUDA runtime with dlopen (bench_cudart.h) for the few
 * functions it needs (device buffers, copies, a stream, events). Over the CPU emulator the
 * fake's event times are made up: the run checks the code path and the output.
 * Exit 77 (skipped) when the plugin, a usable device or the runtime is missing.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_cudart.h"
#include "kvtier.h"

#define TOOL "kvtier-bench attend"
#define SKIP 77 /* the test harness's skip status (BENCH_SKIP) */

#ifndef KVT_BENCH_CUDART

int bench_attend_cuda(const struct bench_attend_opts *o)
{
	(void)o;
	fprintf(stderr, TOOL ": --backend cuda: this kvtier-bench was built without the CUDA "
			     "runtime's headers: skipped\n");
	return SKIP;
}

#else /* KVT_BENCH_CUDART */

#include <cuda_runtime_api.h>

#define TABLES 7 /* buffers of struct kvt_attn_tables */

/* One run: its options, the runtime, the manager, and what it allocated (NULL until then). */
struct run {
	const struct bench_attend_opts *o;
	struct bench_rt rt;
	struct kvt_config c;
	struct kvt_manager *m;
	struct bench_attend_in in;
	cudaStream_t st;
	cudaEvent_t ev[2];
	void *dk, *dqo, *dq, *dout[2], *scratch, *copy[2];
	uint64_t scratch_bytes; /* kvt_attend_tables_scratch's */
	void *dtab[TABLES], *htab[TABLES];
	size_t tab_bytes[TABLES]; /* their sizes */
	uint64_t *ids;
	double *t;
};

/* The median of t[0..n) (sorts t). */
static double median(double *t, uint32_t n)
{
	qsort(t, n, sizeof(*t), sim_cmp_double);
	return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* Whether e is an error (then reported, naming what failed). */
static bool cu_failed(const struct run *r, cudaError_t e, const char *what)
{
	return bench_cu_failed(&r->rt, e, what);
}

/* A device copy of n bytes of src (uninitialized when src is NULL): NULL on an error. */
static void *dev_buf(struct run *r, const void *src, size_t n, const char *what)
{
	return bench_dev_buf(&r->rt, src, n, what);
}

/* Whether err is a library error (then reported with the manager's last error). */
static bool kvt_failed(const struct run *r, int err, const char *what)
{
	if (!err)
		return false;
	fprintf(stderr, TOOL ": %s: %s (%s)\n", what, kvt_strerror(err),
		r->m ? kvt_manager_last_error(r->m) : "");
	return true;
}

/* The tables' buffers, device and host, in struct kvt_attn_tables's order; dt names the
   device ones, ht the host ones. 0, or 1 (reported). */
static int tables_alloc(struct run *r, struct kvt_attn_tables *dt, struct kvt_attn_tables *ht)
{
	uint32_t n = r->o->seqs, mf = bench_attend_max_frames(&r->c), rr = r->o->r;
	size_t rows = (size_t)n * r->c.n_kv_heads, *sz = r->tab_bytes;
	struct kvt_attn_tables *t[2] = {dt, ht};

	sz[0] = 4;
	sz[1] = sz[3] = rows * 4;
	sz[2] = rows * mf * 4;
	sz[4] = sz[5] = rows * rr * 4;
	sz[6] = rows * rr * 8;

	for (int i = 0; i < TABLES; i++) {
		r->htab[i] = calloc(1, sz[i]);
		if (!r->htab[i]) {
			fprintf(stderr, TOOL ": out of memory\n");
			return 1;
		}
		r->dtab[i] = dev_buf(r, r->htab[i], sz[i], "cudaMalloc (attention tables)");
		if (!r->dtab[i])
			return 1;
	}
	for (int k = 0; k < 2; k++) {
		void **b = k ? r->htab : r->dtab;

		*t[k] = (struct kvt_attn_tables){
			.size = sizeof(struct kvt_attn_tables),
			.max_batch = n,
			.max_frames = mf,
			.max_recall = rr,
			.n_batch = b[0],
			.n_tokens = b[1],
			.frames = b[2],
			.n_recall = b[3],
			.recall = b[4],
			.recall_tokens = b[5],
			.recall_skip = b[6],
		};
	}
	return 0;
}

/* The device tables read back into the host ones (after the stream's work). 0, or 1. */
static int tables_read(struct run *r)
{
	if (cu_failed(r, r->rt.stream_sync(r->st), "cudaStreamSynchronize (tables)"))
		return 1;
	for (int i = 0; i < TABLES; i++)
		if (cu_failed(r,
			      r->rt.memcpy(r->htab[i], r->dtab[i], r->tab_bytes[i],
					   cudaMemcpyDeviceToHost),
			      "cudaMemcpy (tables read back)"))
			return 1;
	return 0;
}

enum meth { M_TABLES, M_STEP, M_COPY };

/* One run of m on the stream between the two events; *host: the call's host time (seconds).
   0, or 1 (reported). */
static int run_once(struct run *r, enum meth m, const struct kvt_attn_tables *dt, void *copy_src,
		    void *copy_dst, size_t copy_bytes, double *host)
{
	double t0;
	int err = 0;

	if (cu_failed(r, r->rt.event_record(r->ev[0], r->st), "cudaEventRecord"))
		return 1;
	t0 = sim_now_s();
	switch (m) {
	case M_TABLES:
		err = kvt_attend_tables(r->m, dt, r->dq, r->dout[0], NULL, r->scratch,
					r->scratch_bytes, r->st);
		break;
	case M_STEP:
		err = kvt_step_attend(r->m, 0, r->dq, r->dout[1], NULL, r->st);
		break;
	case M_COPY:
		if (cu_failed(r,
			      r->rt.memcpy_async(copy_dst, copy_src, copy_bytes,
						 cudaMemcpyDeviceToDevice, r->st),
			      "cudaMemcpyAsync (device to device)"))
			return 1;
		break;
	}
	if (host)
		*host = sim_now_s() - t0;
	if (kvt_failed(r, err, m == M_TABLES ? "kvt_attend_tables" : "kvt_step_attend"))
		return 1;
	if (cu_failed(r, r->rt.event_record(r->ev[1], r->st), "cudaEventRecord") ||
	    cu_failed(r, r->rt.event_sync(r->ev[1]), "cudaEventSynchronize (the work timed)"))
		return 1;
	return 0;
}

/* m once untimed, then o->reps times: the median device time between the events (seconds)
   in *dev, the median host time of the call in *host (may be NULL). 0, or 1. */
static int time_meth(struct run *r, enum meth m, const struct kvt_attn_tables *dt, void *src,
		     void *dst, size_t bytes, double *dev, double *host)
{
	uint32_t reps = r->o->reps;
	double *th = r->t + reps;

	if (run_once(r, m, dt, src, dst, bytes, NULL))
		return 1;
	for (uint32_t s = 0; s < reps; s++) {
		float ms = 0;

		if (run_once(r, m, dt, src, dst, bytes, &th[s]) ||
		    cu_failed(r, r->rt.elapsed(&ms, r->ev[0], r->ev[1]), "cudaEventElapsedTime"))
			return 1;
		r->t[s] = 1e-3 * (double)ms;
	}
	*dev = median(r->t, reps);
	if (host)
		*host = median(th, reps);
	return 0;
}

/* The device-to-device copy of up to copy_mib MiB (halved until the device has 4 times it
   free, down to 1 MiB): its median time in *t, its size in *bytes. 0, or 1. */
static int time_copy(struct run *r, double *t, size_t *bytes)
{
	size_t n = (size_t)r->o->copy_mib << 20, free_b = 0, total = 0;

	if (cu_failed(r, r->rt.mem_info(&free_b, &total), "cudaMemGetInfo"))
		return 1;
	while (n > ((size_t)1 << 20) && n > free_b / 4)
		n /= 2;
	*bytes = n;
	for (int i = 0; i < 2; i++)
		if (!(r->copy[i] = dev_buf(r, NULL, n, "cudaMalloc (the copy's buffers)")))
			return 1;
	if (time_meth(r, M_COPY, NULL, r->copy[0], r->copy[1], n, t, NULL))
		return 1;
	for (int i = 0; i < 2; i++) {
		(void)r->rt.free(r->copy[i]);
		r->copy[i] = NULL;
	}
	return 0;
}

/* The two calls' outputs against kvt_attend per member. 0; 1 on a mismatch or an error
   (reported). *max_err: the largest |got - ref|. */
static int check(struct run *r, double *max_err)
{
	uint32_t Hq = r->c.n_q_heads, D = r->c.head_dim;
	size_t qn = (size_t)Hq * D, n = r->in.q_n, bad = 0;
	double scale;
	uint16_t *got = malloc(2 * n * sizeof(*got));
	float *qf = malloc(qn * sizeof(*qf)), *want = malloc(qn * sizeof(*want));
	const char *name[2] = {"kvt_attend_tables", "kvt_step_attend"};
	int rc = 1;

	*max_err = 0;
	if (!got || !qf || !want) {
		fprintf(stderr, TOOL ": out of memory\n");
		goto out;
	}
	for (int k = 0; k < 2; k++)
		if (cu_failed(r,
			      r->rt.memcpy(got + k * n, r->dout[k], n * 2, cudaMemcpyDeviceToHost),
			      "cudaMemcpy (out read back)"))
			goto out;
	for (uint32_t i = 0; i < r->o->seqs; i++) {
		for (size_t x = 0; x < qn; x++) { /* bf16 -> f32 */
			uint32_t u = (uint32_t)r->in.q[i * qn + x] << 16;

			memcpy(&qf[x], &u, 4);
		}
		if (kvt_failed(r, kvt_attend(r->m, r->ids[i], 0, qf, want), "kvt_attend"))
			goto out;
		scale = 0;
		for (size_t x = 0; x < qn; x++)
			scale = fmax(scale, fabs((double)want[x]));
		for (int k = 0; k < 2; k++) {
			for (size_t x = 0; x < qn; x++) {
				uint32_t u = (uint32_t)got[k * n + i * qn + x] << 16;
				float g;
				double e;

				memcpy(&g, &u, 4);
				e = fabs((double)g - (double)want[x]);
				if (e > *max_err || isnan(e))
					*max_err = isnan(e) ? INFINITY : e;
				if (!(e <= fabs((double)want[x]) / 256 + scale / 4096) && !bad++)
					fprintf(stderr,
						TOOL
						": %s: member %u, q head %zu, element %zu: %g, "
						"kvt_attend %g\n",
						name[k], i, x / D, x % D, (double)g,
						(double)want[x]);
			}
		}
	}
	if (bad) {
		fprintf(stderr,
			TOOL ": %zu of %zu output values beyond |ref| / 256 + max|ref| / 4096 "
			     "of kvt_attend\n",
			bad, 2 * n);
		goto out;
	}
	rc = 0;
out:
	free(got);
	free(qf);
	free(want);
	return rc;
}

/* Everything after the device was found: 0, 1 or SKIP. */
static int run(struct run *r)
{
	const struct bench_attend_opts *o = r->o;
	struct kvt_attn_tables dt, ht;
	double t_tab, t_step, h_step, t_copy, max_err;
	size_t copy_bytes, rows;
	uint64_t tokens;
	int err;

	if (cu_failed(r, r->rt.stream_create(&r->st), "cudaStreamCreate"))
		return 1;
	for (int i = 0; i < 2; i++)
		if (cu_failed(r, r->rt.event_create(&r->ev[i]), "cudaEventCreate"))
			return 1;
	bench_attend_config(o, &r->c);
	err = kvt_manager_create(&r->c, &r->m);
	if (err) {
		fprintf(stderr, TOOL ": cannot create the manager on the CUDA backend: %s%s\n",
			kvt_strerror(err), err == -ENODEV ? ": skipped" : "");
		return err == -ENODEV ? SKIP : 1;
	}
	kvt_manager_config(r->m, &r->c);
	r->ids = calloc(o->seqs, sizeof(*r->ids));
	r->t = calloc(2 * (size_t)o->reps, sizeof(*r->t));
	if (!r->ids || !r->t) {
		fprintf(stderr, TOOL ": out of memory\n");
		return 1;
	}
	if (bench_attend_inputs(o, &r->c, &r->in))
		return 1;
	if (!(r->dk = dev_buf(r, r->in.k, r->in.k_n * 2, "cudaMalloc (prompt rows)")) ||
	    !(r->dqo = dev_buf(r, r->in.qo, r->in.qo_n * 2, "cudaMalloc (window queries)")) ||
	    !(r->dq = dev_buf(r, r->in.q, r->in.q_n * 2, "cudaMalloc (q)")) ||
	    !(r->dout[0] = dev_buf(r, NULL, r->in.q_n * 2, "cudaMalloc (out)")) ||
	    !(r->dout[1] = dev_buf(r, NULL, r->in.q_n * 2, "cudaMalloc (out)")))
		return 1;
	for (uint32_t i = 0; i < o->seqs; i++) {
		r->ids[i] = 100 + (uint64_t)i;
		if (kvt_failed(r, kvt_seq_create(r->m, r->ids[i], o->prompt), "kvt_seq_create") ||
		    kvt_failed(r,
			       kvt_prefill_layer(r->m, r->ids[i], 0, r->dk, r->dk, r->dqo, r->st),
			       "kvt_prefill_layer"))
			return 1;
	}
	if (kvt_failed(r, kvt_step_begin(r->m, r->ids, o->seqs), "kvt_step_begin") ||
	    kvt_failed(r, kvt_step_recall_blocks(r->m, 0, r->in.sel, o->r, r->st),
		       "kvt_step_recall_blocks"))
		return 1;
	if (tables_alloc(r, &dt, &ht) ||
	    kvt_failed(r, kvt_step_tables(r->m, 0, &dt, r->st), "kvt_step_tables") ||
	    tables_read(r))
		return 1;
	rows = (size_t)o->seqs * r->c.n_kv_heads;
	if (*ht.n_batch != o->seqs) {
		fprintf(stderr, TOOL ": the tables name a batch of %u, not %u\n", *ht.n_batch,
			o->seqs);
		return 1;
	}
	tokens = bench_attend_tokens(&ht, rows);

	if (kvt_failed(r, kvt_attend_tables_scratch(r->m, &dt, &r->scratch_bytes),
		       "kvt_attend_tables_scratch"))
		return 1;
	if (r->scratch_bytes &&
	    !(r->scratch = dev_buf(r, NULL, r->scratch_bytes, "cudaMalloc (scratch)")))
		return 1;
	if (cu_failed(r, r->rt.stream_sync(r->st), "cudaStreamSynchronize (setup)") ||
	    time_meth(r, M_TABLES, &dt, NULL, NULL, 0, &t_tab, NULL) ||
	    time_meth(r, M_STEP, NULL, NULL, NULL, 0, &t_step, &h_step) ||
	    time_copy(r, &t_copy, &copy_bytes) || check(r, &max_err))
		return 1;

	double kv = (double)tokens * 2 * r->c.head_dim * 2, qo = 2.0 * (double)r->in.q_n * 2;
	double bytes = kv + qo, g_tab = bytes / t_tab / 1e9, g_step = bytes / t_step / 1e9;
	double g_copy = 2.0 * (double)copy_bytes / t_copy / 1e9, ratio = g_tab / g_copy;

	printf(TOOL
	       ": CUDA backend on %s: %u sequences x 8 kv heads (32 q heads, d=128, bf16), "
	       "prompt %u, r = %u, one layer; median of %u repetitions after one warm-up, CUDA "
	       "events on one stream\n",
	       r->rt.device, o->seqs, o->prompt, o->r, o->reps);
	if (bench_rt_emulated(&r->rt))
		printf("(emulated runtime: its event times are made up, and so are the figures "
		       "below; the output check is real)\n");
	printf("bytes per call: K and V rows of %llu tokens (resident and recalled, each once) "
	       "%.2f MB + q and out %.2f MB = %.2f MB\n",
	       (unsigned long long)tokens, kv / 1e6, qo / 1e6, bytes / 1e6);
	printf("kvt_attend_tables (the kernels alone, over tables in device memory): median %.3f "
	       "ms, %.1f GB/s\n",
	       t_tab * 1e3, g_tab);
	printf("kvt_step_attend (tables assembled on the host and copied, then the kernels): "
	       "median %.3f ms between the events, %.1f GB/s; host time of the call %.3f ms\n",
	       t_step * 1e3, g_step, h_step * 1e3);
	printf("device copy (cudaMemcpyAsync device to device, %.0f MiB): median %.3f ms, %.1f "
	       "GB/s read + write (%.1f GB/s each way)\n",
	       (double)copy_bytes / (1 << 20), t_copy * 1e3, g_copy, g_copy / 2);
	printf("ratio attention / copy bandwidth (bytes moved through HBM, reads and writes "
	       "alike): %.2f with kvt_attend_tables (goal >= 0.7: %s), %.2f with "
	       "kvt_step_attend\n",
	       ratio, ratio >= 0.7 ? "met" : "NOT met", g_step / g_copy);
	printf("check: both outputs against kvt_attend per member (f32, host): max |error| %.2e, "
	       "within |ref| / 256 + max|ref| / 4096: ok\n",
	       max_err);
	return 0;
}

/* Frees what run made (after the stream's work), the manager first. */
static void run_free(struct run *r)
{
	if (r->st)
		(void)r->rt.stream_sync(r->st);
	kvt_manager_destroy(r->m);
	void *bufs[] = {r->dk,	    r->dqo,	r->dq,	    r->dout[0],
			r->dout[1], r->scratch, r->copy[0], r->copy[1]};

	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		if (bufs[i])
			(void)r->rt.free(bufs[i]);
	for (int i = 0; i < TABLES; i++) {
		if (r->dtab[i])
			(void)r->rt.free(r->dtab[i]);
		free(r->htab[i]);
	}
	for (int i = 0; i < 2; i++)
		if (r->ev[i])
			(void)r->rt.event_destroy(r->ev[i]);
	if (r->st)
		(void)r->rt.stream_destroy(r->st);
	bench_attend_inputs_free(&r->in);
	free(r->ids);
	free(r->t);
}

int bench_attend_cuda(const struct bench_attend_opts *o)
{
	struct run r = {.o = o};
	int rc = bench_rt_start(&r.rt, TOOL);

	if (rc)
		return rc;
	rc = run(&r);
	run_free(&r);
	return rc;
}

#endif /* KVT_BENCH_CUDART */
