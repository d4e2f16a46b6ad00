/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench recall --backend cuda: what a decode step's recall costs the host on the CUDA
 * backend, with the regions on the device, beside the CPU reference on the same inputs in the
 * same run, and the recall programs' device time.
 *
 * Two managers of one configuration (Llama-3-8B's geometry but the heads' dimension, --head-dim;
 * no top-K, so that prefill runs no SnapKV; the default save threads): the CUDA backend's, given
 * its prompts as device tensors, and the CPU reference's, on the null backend (the bookkeeping
 * alone, as the host mode measures it). Each runs, in turn, a decode step as an engine makes
 * it: kvt_step_begin, then layer by layer the append of the step's token (not timed) and the
 * layer's recall with r blocks per (sequence, kv head) chosen by the caller, then kvt_step_end.
 * The CUDA manager gets the selection in device memory (kvt_step_recall_device_blocks, copied
 * there outside the timing), the reference the same blocks in host memory
 * (kvt_step_recall_blocks). The selections are the host mode's: r distinct blocks outside the
 * sink and the recent ring, --churn percent of them replaced each step.
 *
 * Nothing is settled or waited for by the benchmark inside the run: a layer's call settles the
 * layer's call of the step before (its reports applied on the host), as in an engine's loop, so
 * that work is in the figure, and so is any wait a call makes (for the device, or for a save).
 * The figures are medians over the steps after the
 * first, (a) the CUDA backend's host time per step, (b) the reference's, and their ratio; on a
 * GPU (c) the programs' device time per step (kvt_stats.recall_device_ns over the sample of
 * calls the manager times, recall_device_timed, read at the end: their mean times the calls a
 * step). Over the CPU emulator the kernels' CPU stand-ins run on the calling thread (the
 * synchronous fake) are left out of (a) (the fake runtime's fake_cuda_work_seconds: a GPU does
 * that work; with the asynchronous fake they run on its own thread, and what (a) holds of them
 * is the calls' waits for them), the runtime's own bookkeeping stays in (an upper
 * bound of what a GPU's runtime costs the host; its copies between pinned and device memory,
 * a copy engine's work on a GPU, are printed apart: fake_cuda_copy_seconds), and (c) is not a
 * figure (the fake's event times are made up). The two managers must decide alike: the run fails
 * unless their lookups, hits and loads agree.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_cudart.h"
#include "kvtier.h"
#include "manager.h"

#define TOOL "kvtier-bench recall"

#ifndef KVT_BENCH_CUDART

int bench_recall_cuda(const struct bench_recall_opts *o)
{
	(void)o;
	fprintf(stderr, TOOL ": --backend cuda: this kvtier-bench was built without the CUDA "
			     "runtime's headers: skipped\n");
	return 77;
}

#else /* KVT_BENCH_CUDART */

/* One run: the runtime, the managers (CUDA, reference), the inputs and the figures. */
/* The parts of the library's own time a step is split into: struct kvt_phases's four, then the
   rest. */
#define N_PH 5

struct run {
	const struct bench_recall_opts *o;
	struct bench_rt rt;
	struct kvt_config c;
	struct kvt_manager *m[2]; /* CUDA backend, CPU reference (null backend) */
	cudaStream_t st;
	uint64_t *ids;
	uint32_t *sel, *dsel; /* [layers][seqs][n_kv_heads][r], host and device */
	size_t sn;	      /* their entries */
	uint32_t lo, span;    /* the blocks they name: [lo, lo + span), outside sink and ring */
	uint16_t *k;	      /* [n_kv_heads][prompt][head_dim]: the prompts' rows */
	void *dk, *dkd;	      /* their device copy; one decode token [seqs][n_kv_heads][head_dim] */
	uint8_t *dummy;	      /* the reference's tensors (the null backend reads none) */
	double *t[2], *work, *copy; /* per step: host time of each manager; the fake's kernel
				      time, and its copies' (pinned to device and back) */
	double *inrt, *own; /* per step, of t[0]: inside the CUDA runtime's calls (less the fake's
			     kernel time); the rest, the library's own (made at the report) */
	double *ph[N_PH];   /* per step, of own: the recall calls' phases (struct kvt_phases, in its
			       order), and the rest (made at the report) */
};

/* Whether err is a library error (then reported with manager m's last error). */
static bool kvt_failed(const struct run *r, int b, int err, const char *what)
{
	if (!err)
		return false;
	fprintf(stderr, TOOL ": %s manager: %s: %s (%s)\n", b ? "reference" : "CUDA", what,
		kvt_strerror(err), r->m[b] ? kvt_manager_last_error(r->m[b]) : "");
	return true;
}

/* The median of t[1 .. n) (sorts it; the first step fills the cache). */
static double median(double *t, uint32_t n)
{
	qsort(t + 1, n - 1, sizeof(*t), sim_cmp_double);
	return t[1 + (n - 1) / 2];
}

/* The step of t[1 .. n) that took longest (before median() sorts it): the first measured steps,
   where the regions still grow into the cache, as a rule. */
static uint32_t slowest(const double *t, uint32_t n)
{
	uint32_t at = 1;

	for (uint32_t s = 2; s < n; s++)
		if (t[s] > t[at])
			at = s;
	return at;
}

/* The 90th percentile of t[1 .. n) once median() sorted it. */
static double p90(const double *t, uint32_t n)
{
	return t[1 + (n - 1) * 9 / 10];
}

/* The configuration both managers share: tiers sized for the batch, a recall cache of cache_pct
   percent of the blocks one step asks for. */
static void config(const struct bench_recall_opts *o, struct kvt_config *c)
{
	*c = (struct kvt_config)KVT_CONFIG_INIT;
	c->n_layers = o->layers;
	c->topk_tokens = 0;
	c->recall_blocks = o->r;
	c->recall_threads = o->threads;
	c->head_dim = o->head_dim;

	uint32_t H = c->n_kv_heads, bt = c->block_tokens;
	uint64_t block = 2ull * bt * c->head_dim * 2, group = H * block;
	uint64_t frames = (c->sink_tokens + c->recent_tokens) / bt + 2;
	uint64_t blocks = (o->prompt + o->steps + bt - 1) / bt + 1;
	uint64_t per_step = (uint64_t)o->seqs * o->layers * H * o->r;

	c->recall_cache_bytes = per_step * o->cache_pct / 100 * block;
	c->device_bytes = group * frames * o->layers * o->seqs + c->recall_cache_bytes;
	c->host_bytes = group * blocks * o->layers * o->seqs;
}

/* Managers, tensors, sequences prefilled, the first selection. 0, or 1 (reported). */
static int setup(struct run *r)
{
	const struct bench_recall_opts *o = r->o;
	uint32_t H, D, bt;
	size_t krow, kn;
	uint64_t rng = 7;
	uint16_t *kd;
	int err;

	config(o, &r->c);
	H = r->c.n_kv_heads;
	D = r->c.head_dim;
	bt = r->c.block_tokens;
	krow = (size_t)H * o->prompt * D;
	kn = (size_t)o->seqs * H * D;
	r->sn = (size_t)o->layers * o->seqs * H * o->r;
	r->lo = r->c.sink_tokens / bt;
	r->span = (bench_recall_shortest(o, bt) - r->c.recent_tokens) / bt - r->lo;
	r->c.backend = KVT_BACKEND_CUDA;
	/* the backend times its runtime calls, the manager its recall calls' phases: (a) is
	   printed in two parts, the second by phase */
	setenv("KVTIER_CUDA_TIME_CALLS", "1", 1);
	setenv("KVTIER_TIME_PHASES", "1", 1);
	err = kvt_manager_create(&r->c, &r->m[0]);
	unsetenv("KVTIER_TIME_PHASES"); /* (the reference's time as an engine's) */
	if (!err) {
		r->c.backend = KVT_BACKEND_HOST;
		err = kvt_manager_create_with(&r->c, &kvt_backend_null_ops, &r->m[1]);
	}
	if (err) {
		fprintf(stderr,
			TOOL ": cannot create the %s manager (%.1f GiB of host tier, %.1f GiB of "
			     "device tier): %s%s\n",
			r->m[0] ? "reference" : "CUDA", (double)r->c.host_bytes / (1 << 30),
			(double)r->c.device_bytes / (1 << 30), kvt_strerror(err),
			err == -ENOMEM ? " (lower --seqs, --prompt or --head-dim)" : "");
		return err == -ENODEV ? BENCH_SKIP : 1;
	}
	r->ids = calloc(o->seqs, sizeof(*r->ids));
	r->sel = malloc(r->sn * sizeof(*r->sel));
	r->k = malloc(krow * sizeof(*r->k));
	r->dummy = calloc(1, 64);
	r->t[0] = calloc(o->steps, sizeof(double));
	r->t[1] = calloc(o->steps, sizeof(double));
	r->work = calloc(o->steps, sizeof(double));
	r->copy = calloc(o->steps, sizeof(double));
	r->inrt = calloc(o->steps, sizeof(double));
	r->own = calloc(o->steps, sizeof(double));
	for (int k = 0; k < N_PH; k++)
		r->ph[k] = calloc(o->steps, sizeof(double));
	if (!r->ids || !r->sel || !r->k || !r->dummy || !r->t[0] || !r->t[1] || !r->work ||
	    !r->copy || !r->inrt || !r->own || !r->ph[0] || !r->ph[1] || !r->ph[2] || !r->ph[3] ||
	    !r->ph[4]) {
		fprintf(stderr, TOOL ": out of memory\n");
		return 1;
	}
	bench_rand_bf16(&rng, r->k, krow, 0x7fu);
	kd = calloc(kn, 2); /* the decode tokens' rows: zeros */
	if (!kd) {
		fprintf(stderr, TOOL ": out of memory\n");
		return 1;
	}
	err = bench_cu_failed(&r->rt, r->rt.stream_create(&r->st), "cudaStreamCreate") ||
	      !(r->dk = bench_dev_buf(&r->rt, r->k, krow * 2, "cudaMalloc (prompt rows)")) ||
	      !(r->dkd = bench_dev_buf(&r->rt, kd, kn * 2, "cudaMalloc (decode rows)")) ||
	      !(r->dsel = bench_dev_buf(&r->rt, NULL, r->sn * sizeof(*r->sel),
					"cudaMalloc (selections)"));
	free(kd);
	if (err)
		return 1;
	for (uint32_t i = 0; i < o->seqs; i++) {
		r->ids[i] = 9000 + (uint64_t)i;
		for (int b = 0; b < 2; b++) {
			const void *kk = b ? (const void *)r->dummy : r->dk;

			if (kvt_failed(r, b,
				       kvt_seq_create(r->m[b], r->ids[i],
						      bench_recall_prompt(o, i, bt)),
				       "kvt_seq_create"))
				return 1;
			for (uint32_t l = 0; l < o->layers; l++)
				if (kvt_failed(r, b,
					       kvt_prefill_layer(r->m[b], r->ids[i], l, kk, kk, kk,
								 b ? NULL : r->st),
					       "kvt_prefill_layer"))
					return 1;
		}
	}
	/* r distinct blocks per (layer, sequence, head) */
	for (size_t g = 0; g < r->sn / o->r; g++)
		for (uint32_t j = 0; j < o->r; j++)
			r->sel[g * o->r + j] = r->lo + (uint32_t)((g * 7 + j * 5) % r->span);
	return 0;
}

/* A timed stretch of a step: its start, and the fake's kernel and copy seconds and the CUDA
   backend's runtime time then. */
struct lap {
	double t, w, c;
	uint64_t rt;
};

/* The CUDA backend's time inside the runtime's calls so far (KVTIER_CUDA_TIME_CALLS). */
static uint64_t runtime_ns(const struct run *r)
{
	struct kvt_be_stats bs;

	kvt_manager_be_stats(r->m[0], &bs);
	return bs.runtime_ns;
}

static void lap_start(const struct run *r, int b, struct lap *x)
{
	x->w = r->rt.work_seconds && !b ? r->rt.work_seconds() : 0;
	x->c = r->rt.copy_seconds && !b ? r->rt.copy_seconds() : 0;
	x->rt = b ? 0 : runtime_ns(r);
	x->t = sim_now_s();
}

/* Adds the stretch begun at x to step s of manager b: its time less the kernels' work (which
   goes to work[s]), and its copies to copy[s]. */
static void lap_end(struct run *r, int b, uint32_t s, const struct lap *x)
{
	double w = 0;

	r->t[b][s] += sim_now_s() - x->t;
	if (r->rt.work_seconds && !b) {
		w = r->rt.work_seconds() - x->w;
		r->work[s] += w;
		r->t[b][s] -= w;
	}
	if (r->rt.copy_seconds && !b)
		r->copy[s] += r->rt.copy_seconds() - x->c;
	if (!b) /* the kernels' work ran inside the calls (the synchronous fake) */
		r->inrt[s] += 1e-9 * (double)(runtime_ns(r) - x->rt) - w;
}

/* Step s on manager b, as an engine makes it: kvt_step_begin, then layer by layer the append
   of the step's token (not timed) and the layer's recall, then kvt_step_end. 0, or 1
   (reported). */
static int step(struct run *r, int b, uint32_t s)
{
	const struct bench_recall_opts *o = r->o;
	struct kvt_manager *m = r->m[b];
	size_t per_layer = (size_t)o->seqs * r->c.n_kv_heads * o->r;
	void *kv = b ? (void *)r->dummy : r->dkd, *st = b ? NULL : r->st;
	const char *what = "kvt_step_begin";
	struct lap x;
	int err;

	r->t[b][s] = 0;
	if (!b)
		r->work[s] = r->copy[s] = r->inrt[s] = 0;
	lap_start(r, b, &x);
	err = kvt_step_begin(m, r->ids, o->seqs);
	lap_end(r, b, s, &x);
	for (uint32_t l = 0; l < o->layers && !err; l++) {
		what = "kvt_step_append";
		err = kvt_step_append(m, l, kv, kv, st);
		if (err)
			break;
		what = "the step's recall";
		lap_start(r, b, &x);
		err = b ? kvt_step_recall_blocks(m, l, r->sel + l * per_layer, o->r, NULL)
			: kvt_step_recall_device_blocks(m, l, r->dsel + l * per_layer, o->r, st);
		lap_end(r, b, s, &x);
	}
	if (!err) {
		what = "kvt_step_end";
		lap_start(r, b, &x);
		err = kvt_step_end(m);
		lap_end(r, b, s, &x);
	}
	return kvt_failed(r, b, err, what);
}

/* Everything after the device was found: 0, 1 or BENCH_SKIP. */
static int run(struct run *r)
{
	const struct bench_recall_opts *o = r->o;
	struct kvt_stats st[2] = {KVT_STATS_INIT, KVT_STATS_INIT}, st1 = KVT_STATS_INIT;
	uint64_t rng = 42;
	int rc = setup(r);

	if (rc)
		return rc;
	for (uint32_t s = 0; s < o->steps; s++) {
		for (size_t x = 0; s && x < r->sn && o->churn_pct; x++)
			if (sim_splitmix64(&rng) % 100 < o->churn_pct)
				r->sel[x] = r->lo + (uint32_t)(sim_splitmix64(&rng) % r->span);
		if (bench_cu_failed(&r->rt,
				    r->rt.memcpy(r->dsel, r->sel, r->sn * sizeof(*r->sel),
						 cudaMemcpyHostToDevice),
				    "cudaMemcpy (selections)"))
			return 1;
		struct kvt_phases p0, p1;

		kvt_manager_phases(r->m[0], &p0);
		for (int b = 0; b < 2; b++)
			if (step(r, b, s))
				return 1;
		kvt_manager_phases(r->m[0], &p1);
		r->ph[0][s] = 1e-9 * (double)(p1.settle - p0.settle);
		r->ph[1][s] = 1e-9 * (double)(p1.check - p0.check);
		r->ph[2][s] = 1e-9 * (double)(p1.size - p0.size);
		r->ph[3][s] = 1e-9 * (double)(p1.run - p0.run);
		/* the first step's programs settled (read) before the figures start */
		if (s == 0 &&
		    kvt_failed(r, 0, kvt_manager_stats(r->m[0], &st1), "kvt_manager_stats"))
			return 1;
	}
	for (int b = 0; b < 2; b++)
		if (kvt_failed(r, b, kvt_manager_stats(r->m[b], &st[b]), "kvt_manager_stats"))
			return 1;
	if (st[0].recall_lookups != st[1].recall_lookups ||
	    st[0].recall_hits != st[1].recall_hits || st[0].recall_loads != st[1].recall_loads) {
		fprintf(stderr,
			TOOL ": the CUDA backend and the reference decided differently: lookups "
			     "%llu/%llu, hits %llu/%llu, loads %llu/%llu\n",
			(unsigned long long)st[0].recall_lookups,
			(unsigned long long)st[1].recall_lookups,
			(unsigned long long)st[0].recall_hits,
			(unsigned long long)st[1].recall_hits,
			(unsigned long long)st[0].recall_loads,
			(unsigned long long)st[1].recall_loads);
		return 1;
	}

	uint32_t H = r->c.n_kv_heads, n = o->steps - 1;
	uint32_t slow[2] = {slowest(r->t[0], o->steps), slowest(r->t[1], o->steps)};
	double mr, mo, mp[N_PH];

	for (uint32_t s = 0; s < o->steps; s++) { /* (before the medians sort t[0] and inrt) */
		r->own[s] = r->t[0][s] - r->inrt[s];
		r->ph[4][s] = r->own[s] - r->ph[0][s] - r->ph[1][s] - r->ph[2][s] - r->ph[3][s];
	}
	for (int k = 0; k < N_PH; k++)
		mp[k] = median(r->ph[k], o->steps);
	mr = median(r->inrt, o->steps);
	mo = median(r->own, o->steps);
	uint64_t per_step = (uint64_t)o->seqs * o->layers * H * o->r;
	double ma = median(r->t[0], o->steps), mb = median(r->t[1], o->steps),
	       mw = median(r->work, o->steps), mc = median(r->copy, o->steps),
	       ml = (double)o->seqs * o->layers;
	bool emu = bench_rt_emulated(&r->rt),
	     full = o->seqs == 256 && o->layers == 32 && o->r == 16;

	printf(TOOL
	       " --backend cuda: %s: %u sequences x %u layers x %u kv heads (%u q heads, "
	       "d=%u, bf16), prompt %u%s, r = %u, %u steps (first excluded), churn %u%%, recall "
	       "cache %llu frames (%u%% of the %llu blocks a step asks for); decode steps, the "
	       "selection given (in device memory on the CUDA backend)\n",
	       r->rt.device, o->seqs, o->layers, H, r->c.n_q_heads, r->c.head_dim, o->prompt,
	       o->stagger ? " (staggered: less i mod 32)" : "", o->r, o->steps, o->churn_pct,
	       (unsigned long long)(per_step * o->cache_pct / 100), o->cache_pct,
	       (unsigned long long)per_step);
	printf("(a) CUDA backend, host side: median %.3f ms per step (p90 %.3f, max %.3f at step "
	       "%u), %.3f us per (sequence, layer)",
	       ma * 1e3, p90(r->t[0], o->steps) * 1e3, r->t[0][o->steps - 1] * 1e3, slow[0],
	       ma * 1e6 / ml);
	if (r->rt.work_seconds)
		printf("; emulated runtime: its kernels' CPU stand-ins (median %.3f ms a step) "
		       "left out, its own bookkeeping in",
		       mw * 1e3);
	if (r->rt.copy_seconds)
		printf(", of which its copies between pinned and device memory (a copy engine's "
		       "work on a GPU; in the call where the runtime is synchronous) median %.3f ms "
		       "a step",
		       mc * 1e3);
	printf("\n    (a) in two parts: inside the CUDA runtime's calls median %.3f ms a step%s; the "
	       "library's own median %.3f ms\n",
	       mr * 1e3,
	       r->rt.work_seconds ? " (the emulated runtime's own work, its kernels' left out)"
				  : "",
	       mo * 1e3);
	printf("    (a) the library's own by phase of the recall calls, medians a step: settling "
	       "the layer's previous call %.1f us, checking the batch %.1f, sizing the regions "
	       "%.1f, writing and queuing the program %.1f; the rest (the step's begin and end, "
	       "the calls' entries) %.1f\n",
	       mp[0] * 1e6, mp[1] * 1e6, mp[2] * 1e6, mp[3] * 1e6, mp[4] * 1e6);
	printf("(b) CPU reference (null backend, kvt_step_recall_blocks): median %.3f ms per "
	       "step (p90 %.3f, max %.3f at step %u), %.3f us per (sequence, layer)\n",
	       mb * 1e3, p90(r->t[1], o->steps) * 1e3, r->t[1][o->steps - 1] * 1e3, slow[1],
	       mb * 1e6 / ml);
	if (emu)
		printf("(c) recall programs' device time: not measured (the emulated runtime's "
		       "event times are made up)\n");
	else {
		/* a sample of the calls is timed (kvtier.h): their mean, times the calls a step */
		uint64_t timed = st[0].recall_device_timed - st1.recall_device_timed,
			 calls = st[0].recall_calls - st1.recall_calls;

		printf("(c) recall programs' device time (recall_device_ns of the %llu calls timed "
		       "among %llu): mean %.3f ms per step over steps 1..%u\n",
		       (unsigned long long)timed, (unsigned long long)calls,
		       timed ? 1e-6 * (double)(st[0].recall_device_ns - st1.recall_device_ns) /
				       (double)timed * (double)calls / n
			     : 0.0,
		       n);
	}
	printf("ratio (b) / (a): %.2f\n", mb / (ma > 0 ? ma : 1e-12));
	printf("decisions: %llu lookups, %llu hits (hit rate %.3f), %llu loads: the same on both\n",
	       (unsigned long long)st[0].recall_lookups, (unsigned long long)st[0].recall_hits,
	       (double)st[0].recall_hits /
		       (double)(st[0].recall_lookups ? st[0].recall_lookups : 1),
	       (unsigned long long)st[0].recall_loads);
	printf("target (a) < 500 us per step at 256 x 32 x 8, r = 16: %s (median / target = "
	       "%.2f)\n",
	       full ? (ma < 500e-6 ? "met" : "NOT met") : "n/a (other shape)", ma / 500e-6);
	return 0;
}

/* Frees what run made (after the stream's work), the managers first. */
static void run_free(struct run *r)
{
	if (r->st)
		(void)r->rt.stream_sync(r->st);
	for (int b = 0; b < 2; b++)
		kvt_manager_destroy(r->m[b]);
	void *bufs[] = {r->dk, r->dkd, r->dsel};

	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		if (bufs[i])
			(void)r->rt.free(bufs[i]);
	if (r->st)
		(void)r->rt.stream_destroy(r->st);
	free(r->ids);
	free(r->sel);
	free(r->k);
	free(r->dummy);
	free(r->t[0]);
	free(r->t[1]);
	free(r->work);
	free(r->copy);
	free(r->inrt);
	free(r->own);
	for (int k = 0; k < N_PH; k++)
		free(r->ph[k]);
}

int bench_recall_cuda(const struct bench_recall_opts *o)
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
