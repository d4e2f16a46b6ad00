/* SPDX-License-Identifier: MIT */
/*
 * The replay engine (replay.h): a serving loop over a trace on simulated time. The policies
 * kvtier, snapstream and sparse-offload run the library's manager and scheduler on the model
 * backend here; the vLLM baseline (full) is vllm.c, the reports report.c.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hmap.h"
#include "kvtier.h"
#include "replay_impl.h"
#include "simutil.h"

/* With prefix reuse, requests are created (and matched against the prefix cache) only while
   fewer than this many created ones have not begun their prefill: an engine matches a prompt
   when it is about to prefill it, as vLLM does at admission, not when it is queued. Enough
   to keep the scheduler's prefill fed: an iteration prefills 2048 tokens of every layer by
   default, a fraction of one mean Mooncake prompt. */
#define PREFIX_AHEAD 4

static const char *const policy_names[] = {"kvtier", "snapstream", "sparse-offload", "full"};

const char *sim_policy_name(enum sim_policy p)
{
	return (unsigned)p < 4 ? policy_names[p] : "?";
}

int sim_policy_parse(const char *name, enum sim_policy *p)
{
	for (unsigned i = 0; name && i < 4; i++)
		if (!strcmp(name, policy_names[i])) {
			*p = (enum sim_policy)i;
			return 0;
		}
	return -EINVAL;
}

void sim_replay_opts_init(struct sim_replay_opts *o)
{
	struct sim_sel_params sel = SIM_SEL_PARAMS_INIT;

	memset(o, 0, sizeof(*o));
	o->policy = SIM_POLICY_KVTIER;
	sim_preset_model("llama3-8b", &o->model);
	sim_preset_gpu("h100", &o->gpu);
	o->hbm_gib = 0;
	o->dram_gib = 256;
	o->disk_gbps = 6;
	o->block_tokens = 32;
	o->sink_tokens = 128;
	o->topk_tokens = 1024;
	o->recent_tokens = 512;
	o->recall_blocks = 8;
	o->ws_window = 12;
	o->recall_cache_frac = 0.10;
	o->recall_layers = 8;
	o->so_recent_tokens = 64;
	o->so_recall_blocks = 0;
	o->sel = sel;
	o->ws_control = true;
	o->fused = true;
	o->max_requests = 256;
	o->max_tokens = 8192;
	o->cpu_time = true;
	o->sel_thread = true;
	o->prefix_cache = true;
}

/* A u32 option of the engine: its name, bounds and field. */
struct u32_opt {
	const char *name;
	uint32_t lo, hi;
	size_t off;
};

struct dbl_opt {
	const char *name;
	double lo, hi;
	bool lo_open; /* lo itself is refused */
	size_t off;
};

#define OFF(f) offsetof(struct sim_replay_opts, f)

static const struct u32_opt u32_opts[] = {
	{"max-batch", 1, 1u << 20, OFF(max_requests)},
	{"max-batch-tokens", 1, UINT32_MAX, OFF(max_tokens)},
	{"concurrency", 1, 1u << 20, OFF(concurrency)},
	{"block-tokens", 8, 64, OFF(block_tokens)},
	{"sink", 0, 1u << 24, OFF(sink_tokens)},
	{"topk", 0, 1u << 24, OFF(topk_tokens)},
	{"recent", 1, 1u << 24, OFF(recent_tokens)},
	{"recall", 0, 1024, OFF(recall_blocks)},
	{"recall-layers", 0, 1u << 16, OFF(recall_layers)},
	{"ws-window", 1, 64, OFF(ws_window)},
	{"recall-threads", 0, 64, OFF(recall_threads)},
	{"sel-window", 1, 64, OFF(sel.window)},
	{"chunked-prefill", 1, 1u << 24, OFF(chunk_tokens)},
};

/* A recall cache fraction of 0 leaves recall no frame to load into (kvt_recall_blocks
   refuses the first decode); with --recall 0 no fraction is used at all, so 0 is never
   worth accepting. Too small a positive fraction is refused when the run starts, where the
   frame size is known. */
static const struct dbl_opt dbl_opts[] = {
	{"hbm-gib", 1e-3, 1e6, false, OFF(hbm_gib)},
	{"dram-gib", 1e-3, 1e7, false, OFF(dram_gib)},
	{"disk-gib", 0, 1e8, false, OFF(disk_gib)},
	{"disk-gbps", 1e-3, 1e4, false, OFF(disk_gbps)},
	{"recall-cache-frac", 0, 0.99, true, OFF(recall_cache_frac)},
	{"sel-keep", 0, 1, false, OFF(sel.p_keep)},
	{"sel-revisit", 0, 1, false, OFF(sel.p_revisit)},
};

int sim_replay_opt(const char *name, const char *arg, struct sim_replay_opts *o)
{
	if (!strcmp(name, "no-ws-control"))
		o->ws_control = false;
	else if (!strcmp(name, "no-fused-transfer"))
		o->fused = false;
	else if (!strcmp(name, "no-cpu-time"))
		o->cpu_time = false;
	else if (!strcmp(name, "no-prefix-cache"))
		o->prefix_cache = false;
	else if (!strcmp(name, "roofline"))
		o->roofline = true;
	else if (!strcmp(name, "spill-dir")) {
		if (!arg || !*arg)
			return -1;
		o->spill_dir = arg;
	} else
		goto valued;
	return 0;
valued:
	for (size_t i = 0; i < sizeof(u32_opts) / sizeof(u32_opts[0]); i++) {
		const struct u32_opt *u = &u32_opts[i];
		uint32_t v;

		if (strcmp(name, u->name))
			continue;
		if (!arg || sim_parse_u32(arg, u->lo, u->hi, &v))
			return -1;
		if (u->off == OFF(block_tokens) && (v & (v - 1)))
			return -1; /* a power of two */
		*(uint32_t *)((char *)o + u->off) = v;
		return 0;
	}
	for (size_t i = 0; i < sizeof(dbl_opts) / sizeof(dbl_opts[0]); i++) {
		const struct dbl_opt *d = &dbl_opts[i];
		double v;

		if (strcmp(name, d->name))
			continue;
		if (!arg || sim_parse_double(arg, d->lo, d->hi, &v) || (d->lo_open && v == d->lo))
			return -1;
		*(double *)((char *)o + d->off) = v;
		return 0;
	}
	return 1;
}

int sim_replay_opt_want(const char *name, char *buf, size_t len)
{
	for (size_t i = 0; i < sizeof(u32_opts) / sizeof(u32_opts[0]); i++) {
		const struct u32_opt *u = &u32_opts[i];

		if (strcmp(name, u->name))
			continue;
		snprintf(buf, len, "an integer in [%u, %u]%s", u->lo, u->hi,
			 u->off == OFF(block_tokens) ? ", a power of two" : "");
		return 0;
	}
	for (size_t i = 0; i < sizeof(dbl_opts) / sizeof(dbl_opts[0]); i++) {
		const struct dbl_opt *d = &dbl_opts[i];

		if (strcmp(name, d->name))
			continue;
		snprintf(buf, len, "a number in %c%g, %g]", d->lo_open ? '(' : '[', d->lo, d->hi);
		return 0;
	}
	return 1;
}

#undef OFF

/* ---- The run's bookkeeping (replay_impl.h) ---------------------------------------------- */

static int push_double(double **a, size_t *n, size_t *cap, double v)
{
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 4096;
		double *p = realloc(*a, nc * sizeof(*p));

		if (!p)
			return -ENOMEM;
		*a = p;
		*cap = nc;
	}
	(*a)[(*n)++] = v;
	return 0;
}

void run_fail_req(struct run *run, size_t i, const char *reason)
{
	struct sim_req_result *r = &run->res->reqs[i];

	r->status = SIM_REQ_FAILED;
	r->reason = reason;
	r->finish_s = run->now;
	run->res->failed++;
	run->finished++;
}

const char *run_static_reject(const struct run *run, size_t i)
{
	const struct sim_trace_req *q = &run->t->reqs[i];

	if (q->input_tokens == 0)
		return "empty prompt";
	if (q->output_tokens == 0)
		return "no output tokens";
	if (run->o->model.max_context &&
	    (uint64_t)q->input_tokens + q->output_tokens > run->o->model.max_context)
		return "input + output exceed the model's context";
	if (q->input_tokens > INT32_MAX - q->output_tokens)
		return "too many tokens";
	return NULL;
}

int run_token(struct run *run, size_t i, bool window)
{
	struct sim_req_result *r = &run->res->reqs[i];
	struct rreq *q = &run->rq[i];
	int err = 0;

	if (r->generated == 0) {
		r->first_token_s = run->now;
		if (window) {
			run->res->win_ttft_sum_s += run->now - r->arrival_s;
			run->res->win_ttft_n++;
		}
	} else {
		err = push_double(&run->res->itl_s, &run->res->n_itl, &run->itl_cap,
				  run->now - q->last_tok_s);
	}
	q->last_tok_s = run->now;
	r->generated++;
	if (window)
		run->res->win_decode_tokens++;
	if (r->generated == r->output_tokens) {
		r->status = SIM_REQ_DONE;
		r->finish_s = run->now;
		run->res->completed++;
		run->finished++;
		run->res->total_input_tokens += r->input_tokens;
		run->res->total_output_tokens += r->output_tokens;
	}
	return err;
}

static void progress(struct run *run, bool force)
{
	double w;

	if (!run->o->progress)
		return;
	w = sim_now_s();
	if (!force && w - run->last_progress < 0.2)
		return;
	run->last_progress = w;
	run->o->progress(run->o->progress_user, run->finished, run->t->count, run->now);
}

int run_end_iteration(struct run *run, const struct iter_rec *ir, double start)
{
	struct sim_replay_result *res = run->res;
	bool win = run->iter >= run->o->warmup_iterations;

	res->iterations++;
	run->batch_sum += ir->batch;
	if (ir->batch > res->max_batch_size)
		res->max_batch_size = ir->batch;
	run->loaded_sum += ir->loaded;
	run->lookups += ir->lookups;
	run->hits += ir->hits;
	res->t_gemm += ir->tm.gemm_s;
	res->t_attn_decode += ir->tm.attn_decode_s;
	res->t_attn_prefill += ir->tm.attn_prefill_s;
	res->t_kv_write += ir->tm.kv_write_s;
	res->t_overhead += ir->tm.overhead_s;
	res->t_transfer += ir->tm.transfer_s;
	res->t_cpu += ir->tm.cpu_s;
	if (win) {
		res->win_iterations++;
		res->win_time_s += ir->tm.total_s;
		res->win_blocks_loaded += ir->loaded;
		res->win_batch_sum += ir->batch;
		if (ir->n_dec &&
		    push_double(&res->win_tbt_s, &res->n_win_tbt, &run->tbt_cap, ir->tm.total_s))
			return -ENOMEM;
	}
	if (run->o->iter_csv)
		fprintf(run->o->iter_csv,
			"%llu,%.6f,%.6f,%u,%u,%u,%llu,%llu,%llu,%llu,%u,%u,%u,%.6g,%.6g,%.6g,%.6g,%.6g,"
			"%.6g\n",
			(unsigned long long)run->iter, start, ir->tm.total_s, ir->batch, ir->n_pre,
			ir->n_dec, (unsigned long long)ir->token_layers,
			(unsigned long long)ir->loaded, (unsigned long long)ir->lookups,
			(unsigned long long)ir->hits, ir->preempted, ir->resumed, ir->queued,
			ir->tm.gemm_s, ir->tm.attn_decode_s + ir->tm.attn_prefill_s,
			ir->tm.transfer_s, ir->tm.cpu_s, ir->tm.kv_write_s, ir->tm.overhead_s);
	run->iter++;
	progress(run, false);
	return 0;
}

bool run_over(const struct run *run)
{
	if (run->o->max_iterations && run->iter >= run->o->max_iterations)
		return true;
	return run->finished == run->t->count;
}

size_t run_arriving(struct run *run)
{
	if (run->next >= run->t->count)
		return SIZE_MAX;
	if (run->o->concurrency) {
		if (run->next - run->finished >= run->o->concurrency)
			return SIZE_MAX;
		run->res->reqs[run->next].arrival_s = run->now;
		return run->next;
	}
	return run->t->reqs[run->next].arrival_s <= run->now ? run->next : SIZE_MAX;
}

double run_next_arrival(const struct run *run)
{
	if (run->next >= run->t->count || run->o->concurrency)
		return -1;
	return run->t->reqs[run->next].arrival_s;
}

/* ---- kvtier, snapstream, sparse-offload: the manager and scheduler on the model backend */

/*
 * The selection model's draws of an iteration, a unit per sampled layer (sel_unit). Without
 * the measured CPU time (cpu_time false, so nothing a thread does can change a result) and
 * unless the options say otherwise (sel_thread), a second thread draws them from the moment
 * the batch is known, while the engine's thread prefills, appends and recalls: units are
 * claimed in order by whichever thread comes first, so the engine's thread draws a unit
 * itself rather than wait for one nobody has begun, and waits only for one the other thread
 * is drawing. A stream is its own generator, so the draws are the same whichever thread
 * makes them. With the CPU time in, the engine's thread draws every unit itself right before
 * its recall, so that no thread of the replay competes with the calls it times.
 */
struct sel_pool {
	pthread_t thread;
	bool started; /* the second thread runs (else the engine's thread draws everything) */
	bool quit;
	pthread_mutex_t mu;
	pthread_cond_t cv;	/* a job posted, a unit drawn, or quit */
	uint32_t gen;		/* the current job: iterations with draws so far */
	uint32_t nd;		/* its decode items */
	_Atomic uint64_t claim; /* gen << 32 | the next unit to claim */
	_Atomic uint32_t *done; /* [n_sampled]: the job each unit was last drawn for */
};

struct mrun {
	struct run *run;
	struct kvt_manager *m;
	struct kvt_sched *s;
	struct kvt_config cfg;
	bool recall, time_d2h;
	uint32_t r;
	uint32_t stride;    /* recall runs on layers l % stride == 0 */
	uint32_t n_sampled; /* how many */
	double scale;	    /* n_layers / n_sampled */
	struct sim_sel_params sel;
	uint64_t *dseq;
	uint32_t *dreq;	  /* request index of each decode item */
	uint32_t *blocks; /* the draws: [n_sampled][dcap][n_kv_heads][r] */
	size_t dcap;
	struct sel_pool pool;
	uint8_t dummy[64] __attribute__((aligned(64)));
	double cpu_s;
	struct kvt_stats st0;
	size_t *waitq; /* arrived, waiting for DRAM (FCFS) */
	size_t wq_head, wq_n;
	uint64_t *layer_tokens; /* prefill tokens through each layer this iteration */
	/* Prefix reuse (kvt_seq_create_prefix): on for this run, created requests not yet
	   prefilling, and how many live requests count each hash id as shared (an estimate of
	   which cached spans are referenced, for DRAM admission) */
	bool prefix;
	uint32_t unstarted;
	struct sim_hmap prefix_live;
	/* With a disk tier: live requests, and the host groups the spans of those not yet
	   prefilled will pin (rreq.pin_future summed) */
	uint32_t n_live;
	uint64_t pin_future;
	uint64_t max_layer_groups; /* one layer of the longest history of the trace */
};

static uint64_t groups_of(const struct mrun *mr, const struct sim_trace_req *q)
{
	uint64_t bt = mr->cfg.block_tokens;

	return ((uint64_t)q->input_tokens + q->output_tokens + bt - 1) / bt * mr->cfg.n_layers;
}

/* Host groups of `tokens` leading prompt tokens (whole blocks: spans are whole blocks). */
static uint64_t prefix_groups(const struct mrun *mr, uint64_t tokens)
{
	return tokens / mr->cfg.block_tokens * mr->cfg.n_layers;
}

/* The most tokens kvt_seq_create_prefix shares of a prompt of L tokens (whole spans): never
   the last token, nor, when the prefill selects top-K tokens, the observation window, whose
   queries the engine computes with the rest. For a prompt too short to select the library
   leaves only the last token: this errs by a span at most, on the safe side for admission. */
static uint32_t prefix_most(const struct mrun *mr, uint32_t L)
{
	uint32_t rest = mr->cfg.topk_tokens && mr->cfg.obs_window > 1 ? mr->cfg.obs_window : 1;

	return L > rest ? (L - rest) / SIM_TRACE_HASH_TOKENS * SIM_TRACE_HASH_TOKENS : 0;
}

/* Counts request i's hash ids [from, to) as shared by one more (delta 1) or one fewer (-1)
   live request. 0 or -ENOMEM. */
static int prefix_count(struct mrun *mr, size_t i, uint32_t from, uint32_t to, int delta)
{
	const struct sim_trace_req *tq = &mr->run->t->reqs[i];
	const uint64_t *ids = sim_trace_hashes(mr->run->t, tq);

	for (uint32_t k = from; k < to; k++) {
		uint32_t c = sim_hmap_get(&mr->prefix_live, ids[k]);

		c = c == SIM_HMAP_NONE ? 0 : c;
		if (delta < 0 && c <= 1)
			sim_hmap_del(&mr->prefix_live, ids[k]);
		else if (sim_hmap_put(&mr->prefix_live, ids[k], delta < 0 ? c - 1 : c + 1))
			return -ENOMEM;
	}
	return 0;
}

/* Host groups of the cached spans live sequences share (never evicted), all layers. */
static uint64_t prefix_live_groups(const struct mrun *mr)
{
	struct kvt_stats st = KVT_STATS_INIT;

	if (!mr->prefix)
		return 0;
	kvt_manager_stats(mr->m, &st);
	return (st.prefix_blocks - st.prefix_blocks_idle) / mr->cfg.n_kv_heads;
}

static void release(struct mrun *mr, size_t i)
{
	struct rreq *q = &mr->run->rq[i];

	if (q->submitted) {
		mr->run->dram_used -= q->dram_res;
		q->dram_res = 0;
		q->submitted = false;
		if (!q->started)
			mr->unstarted--;
		prefix_count(mr, i, 0, q->n_ref, -1); /* only deletes: cannot fail */
		q->n_ref = 0;
		mr->pin_future -= q->pin_future;
		q->pin_future = 0;
		mr->n_live--;
	}
	if (q->sel) {
		sim_sel_group_fini(q->sel, mr->n_sampled * mr->cfg.n_kv_heads);
		free(q->sel);
		q->sel = NULL;
	}
}

/*
 * How many leading ids of request i's chain to give the library when there is a disk tier.
 * The spans live sequences share are never spilled, so with DRAM a cache of the histories
 * they must fit it beside what the calls touch: the chain is cut where its spans, with those
 * live sequences pin now and those the requests still prefilling will pin, would leave less
 * than one layer of the longest history the run may hold and the blocks one decode step
 * appends to (a block of every layer of every live request). Its spans a live request
 * already shares pin nothing more.
 * Without a disk tier DRAM admission reserves every history, so the whole chain goes.
 */
static uint32_t pin_chain(struct mrun *mr, size_t i)
{
	const struct sim_trace_req *q = &mr->run->t->reqs[i];
	const uint64_t *ids = sim_trace_hashes(mr->run->t, q);
	uint64_t span = prefix_groups(mr, SIM_TRACE_HASH_TOKENS), host = mr->run->host_groups;
	uint64_t used = prefix_live_groups(mr) + mr->pin_future + mr->max_layer_groups +
			(uint64_t)(mr->n_live + 1) * mr->cfg.n_layers;
	uint32_t c = 0;

	if (!host)
		return q->n_hash;
	for (; c < q->n_hash; c++) {
		if (sim_hmap_get(&mr->prefix_live, ids[c]) == SIM_HMAP_NONE)
			used += span;
		if (used > host)
			break;
	}
	return c;
}

/* Submits waiting requests in arrival order while DRAM holds their histories. */
static int submit_waiting(struct mrun *mr)
{
	struct run *run = mr->run;

	for (;;) {
		size_t i;

		if (mr->wq_n == 0) {
			const char *why;

			i = run_arriving(run);
			if (i == SIZE_MAX)
				return 0;
			run->next++;
			why = run_static_reject(run, i);
			if (!why && run->dram_groups &&
			    groups_of(mr, &run->t->reqs[i]) > run->dram_groups)
				why = "its history exceeds the DRAM budget";
			if (!why && run->host_groups &&
			    groups_of(mr, &run->t->reqs[i]) / mr->cfg.n_layers > run->host_groups)
				why = "one layer of its history exceeds DRAM (a call may touch it all)";
			if (why) {
				run_fail_req(run, i, why);
				continue;
			}
			mr->waitq[(mr->wq_head + mr->wq_n++) % run->t->count] = i;
		}
		i = mr->waitq[mr->wq_head];
		const struct sim_trace_req *q = &run->t->reqs[i];
		const uint64_t *ids = mr->prefix ? sim_trace_hashes(run->t, q) : NULL;
		struct rreq *rq = &run->rq[i];
		uint64_t need = groups_of(mr, q);
		uint32_t matched = 0, k = 0, n_chain = 0;
		int err;

		if (ids && mr->unstarted >= PREFIX_AHEAD)
			return 0; /* matched when its prefill is near (FCFS) */
		if (ids) {
			n_chain = pin_chain(mr, i);
			if (!n_chain)
				ids = NULL; /* no room to pin any span: created plainly */
		}
		if (ids) {
			/* what it adds: its history less the prefix it will share, and the
			   shared spans no live request holds (idle: free space until now) */
			err = kvt_prefix_match(mr->m, ids, n_chain, SIM_TRACE_HASH_TOKENS,
					       &matched);
			if (err) { /* a bug: the trace's ids are whole spans of the prompt */
				ERRF("kvt_prefix_match: %s (%s)", kvt_strerror(err),
				     kvt_manager_last_error(mr->m));
				return err;
			}
			if (matched > prefix_most(mr, q->input_tokens))
				matched = prefix_most(mr, q->input_tokens);
			k = matched / SIM_TRACE_HASH_TOKENS;
			need -= prefix_groups(mr, matched);
			for (uint32_t j = 0; j < k; j++)
				if (sim_hmap_get(&mr->prefix_live, ids[j]) == SIM_HMAP_NONE)
					need += prefix_groups(mr, SIM_TRACE_HASH_TOKENS);
		}
		if (run->dram_groups &&
		    run->dram_used + prefix_live_groups(mr) + need > run->dram_groups)
			return 0; /* waits for DRAM (FCFS: later ones wait too) */
		mr->wq_head = (mr->wq_head + 1) % run->t->count;
		mr->wq_n--;
		if (ids)
			err = kvt_seq_create_prefix(mr->m, i + 1, q->input_tokens, ids, n_chain,
						    SIM_TRACE_HASH_TOKENS, &matched);
		else
			err = kvt_seq_create(mr->m, i + 1, q->input_tokens);
		if (!err)
			err = kvt_sched_submit(mr->s, i + 1, q->output_tokens);
		if (err) {
			kvt_seq_destroy(mr->m, i + 1);
			run_fail_req(run, i,
				     err == -E2BIG ? "its resident set exceeds the HBM budget"
						   : "rejected by the manager");
			continue;
		}
		k = matched / SIM_TRACE_HASH_TOKENS;
		if (prefix_count(mr, i, 0, k, 1)) {
			ERRF("out of memory");
			return -ENOMEM;
		}
		rq->n_ref = k;
		rq->n_chain = n_chain;
		rq->pin_future =
			run->host_groups && n_chain > k
				? prefix_groups(mr, (uint64_t)(n_chain - k) * SIM_TRACE_HASH_TOKENS)
				: 0;
		mr->pin_future += rq->pin_future;
		mr->n_live++;
		rq->matched = matched;
		rq->dram_res = groups_of(mr, q) - prefix_groups(mr, matched);
		rq->submitted = true;
		rq->started = false;
		mr->unstarted++;
		run->dram_used += rq->dram_res;
		run->res->prefix_input_tokens += q->input_tokens;
		run->res->prefix_hit_tokens += matched;
	}
}

/* Selection streams of request i (lazily, at its first decode): stream k is the one of id
   i * n + k, (sampled layer, kv head) by layer; one allocation holds them all. 0 or -ENOMEM. */
static int sel_streams(struct mrun *mr, size_t i)
{
	uint32_t n = mr->n_sampled * mr->cfg.n_kv_heads;
	struct rreq *q = &mr->run->rq[i];

	if (q->sel)
		return 0;
	q->sel = malloc(n * sizeof(*q->sel));
	if (!q->sel)
		return -ENOMEM;
	if (sim_sel_group_init(&mr->sel, (uint64_t)i * n, n, q->sel)) {
		free(q->sel);
		q->sel = NULL;
		return -ENOMEM;
	}
	return 0;
}

static int grow_decode(struct mrun *mr, size_t n)
{
	if (n <= mr->dcap)
		return 0;
	size_t cap = n * 2;
	uint64_t *a = realloc(mr->dseq, cap * sizeof(*a));

	if (!a)
		return -ENOMEM;
	mr->dseq = a;
	uint32_t *b = realloc(mr->dreq, cap * sizeof(*b));

	if (!b)
		return -ENOMEM;
	mr->dreq = b;
	if (mr->recall) {
		uint32_t *c = realloc(mr->blocks, (size_t)mr->n_sampled * cap * mr->cfg.n_kv_heads *
							  mr->r * sizeof(*c));

		if (!c)
			return -ENOMEM;
		mr->blocks = c;
	}
	mr->dcap = cap;
	return 0;
}

/* The recorded selection of request i's decode step `step` for layer l into out[H][r]. */
static void recorded(const struct mrun *mr, size_t i, uint32_t step, uint32_t l, uint32_t *out)
{
	const struct sim_selfile *f = mr->run->o->selections;
	uint32_t H = mr->cfg.n_kv_heads, r = mr->r;

	for (uint32_t h = 0; h < H; h++) {
		const struct sim_selrec *rec = sim_selfile_find(f, (uint32_t)i, step, l, h);
		uint32_t n = rec ? rec->n : 0;

		for (uint32_t j = 0; j < r; j++)
			out[h * r + j] = j < n ? f->blocks[rec->first + j] : UINT32_MAX;
	}
}

/* Checks recorded selections against the trace and the policy (r blocks at most, blocks
   inside the history at their step): 0 or -EINVAL with "FILE:LINE: ..." in the run's err. */
static int check_selections(struct mrun *mr)
{
	const struct sim_selfile *f = mr->run->o->selections;
	const struct sim_trace *t = mr->run->t;
	struct run *run = mr->run;

	for (size_t k = 0; f && k < f->n_rec; k++) {
		const struct sim_selrec *rec = &f->rec[k];
		const struct sim_trace_req *q = rec->req < t->count ? &t->reqs[rec->req] : NULL;
		const char *bad = NULL;
		uint64_t nb = 0;

		if (!q)
			bad = "field 'REQUEST': past the trace's requests";
		else if (!mr->recall)
			bad = "the policy recalls nothing";
		else if ((uint64_t)rec->step + 1 >= q->output_tokens)
			bad = "field 'STEP': past the request's decode steps";
		else if (rec->layer >= mr->cfg.n_layers)
			bad = "field 'LAYER': out of range";
		else if (rec->head >= mr->cfg.n_kv_heads)
			bad = "field 'HEAD': out of range";
		else if (rec->n > mr->r)
			bad = "more blocks than the replay recalls per step (r)";
		if (!bad) {
			nb = ((uint64_t)q->input_tokens + rec->step + 1 + mr->cfg.block_tokens -
			      1) /
			     mr->cfg.block_tokens;
			for (uint32_t j = 0; j < rec->n && !bad; j++)
				if (f->blocks[rec->first + j] >= nb)
					bad = "field 'BLOCK': past the request's history at that step";
		}
		if (bad) {
			ERRF("%s:%u: %s", f->path, rec->line, bad);
			return -EINVAL;
		}
	}
	return 0;
}

/* Starts loading what the selection of decode item d (d < nd) on sampled layer l reads: its
   streams' headers when ahead is 2, their arrays when 1 (their headers are cached by then). */
static void sel_prefetch(const struct mrun *mr, uint32_t l, uint32_t d, uint32_t nd, uint32_t ahead)
{
	uint32_t H = mr->cfg.n_kv_heads;
	const struct sim_sel_stream *st;

	if (d >= nd || !mr->run->rq[mr->dreq[d]].sel)
		return;
	st = &mr->run->rq[mr->dreq[d]].sel[l / mr->stride * H];
	for (uint32_t h = 0; h < H; h++) {
		if (ahead == 2)
			__builtin_prefetch(&st[h], 0);
		else
			sim_sel_prefetch(&mr->sel, &st[h]);
	}
}

/* The draws of unit u of the current job into blocks[u]: the selections of its nd decode
   items on sampled layer u * stride (recorded ones for the requests a selections file
   names). Reads the items' streams and lengths, which the engine's thread leaves alone
   until every unit is drawn. */
static void sel_unit(struct mrun *mr, uint32_t u, uint32_t nd)
{
	struct run *run = mr->run;
	uint32_t H = mr->cfg.n_kv_heads, r = mr->r, bt = mr->cfg.block_tokens, l = u * mr->stride;
	uint32_t *out = &mr->blocks[(size_t)u * mr->dcap * H * r];

	/* a draw touches a few cache lines of its stream, and the streams of the requests lie
	   apart in memory: an item's are fetched an item or two ahead of its draws */
	sel_prefetch(mr, l, 0, nd, 2);
	sel_prefetch(mr, l, 1, nd, 2);
	sel_prefetch(mr, l, 0, nd, 1);
	for (uint32_t d = 0; d < nd; d++) {
		const struct sim_req_result *rr = &run->res->reqs[mr->dreq[d]];
		struct rreq *q = &run->rq[mr->dreq[d]];
		uint64_t tokens = (uint64_t)rr->input_tokens + rr->generated;
		uint32_t lo = mr->cfg.sink_tokens / bt;
		uint32_t hi = tokens > mr->cfg.recent_tokens
				      ? (uint32_t)((tokens - mr->cfg.recent_tokens) / bt)
				      : 0;

		sel_prefetch(mr, l, d + 2, nd, 2);
		sel_prefetch(mr, l, d + 1, nd, 1);
		if (run->o->selections && sim_selfile_has_req(run->o->selections, mr->dreq[d])) {
			recorded(mr, mr->dreq[d], rr->generated - 1, l, &out[(size_t)d * H * r]);
			continue;
		}
		for (uint32_t h = 0; h < H; h++)
			sim_sel_next(&mr->sel, &q->sel[l / mr->stride * H + h], lo, hi,
				     &out[((size_t)d * H + h) * r]);
	}
}

/* Claims the next unit of job gen not claimed yet: the unit, or UINT32_MAX when none is
   left (or gen is no longer the current job). */
static uint32_t sel_claim(struct sel_pool *p, uint32_t gen, uint32_t n_units)
{
	uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);

	while ((uint32_t)(c >> 32) == gen && (uint32_t)c < n_units)
		if (atomic_compare_exchange_weak_explicit(
			    &p->claim, &c, c + 1, memory_order_acq_rel, memory_order_acquire))
			return (uint32_t)c;
	return UINT32_MAX;
}

/* The second thread: waits for a job, draws the units it claims, tells of each. */
static void *sel_thread(void *arg)
{
	struct mrun *mr = arg;
	struct sel_pool *p = &mr->pool;
	uint32_t seen = 0, nd, u;

	for (;;) {
		pthread_mutex_lock(&p->mu);
		while (!p->quit && p->gen == seen)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->quit) {
			pthread_mutex_unlock(&p->mu);
			return NULL;
		}
		seen = p->gen;
		nd = p->nd;
		pthread_mutex_unlock(&p->mu);
		while ((u = sel_claim(p, seen, mr->n_sampled)) != UINT32_MAX) {
			sel_unit(mr, u, nd);
			atomic_store_explicit(&p->done[u], seen, memory_order_release);
			pthread_mutex_lock(&p->mu);
			pthread_cond_broadcast(&p->cv);
			pthread_mutex_unlock(&p->mu);
		}
	}
}

/* Sets up the draws of a run: the second thread only for a policy with recall, without the
   measured CPU time, where the options allow it (sel_thread) and with a second CPU online
   (otherwise, or if it cannot be started, the engine's thread draws everything). 0 or
   -ENOMEM. */
static int sel_pool_init(struct mrun *mr)
{
	struct sel_pool *p = &mr->pool;

	p->done = calloc(mr->n_sampled, sizeof(*p->done));
	if (!p->done)
		return -ENOMEM;
	for (uint32_t u = 0; u < mr->n_sampled; u++)
		atomic_init(&p->done[u], 0);
	atomic_init(&p->claim, 0);
	if (!mr->recall || mr->run->o->cpu_time || !mr->run->o->sel_thread ||
	    sysconf(_SC_NPROCESSORS_ONLN) < 2)
		return 0;
	if (pthread_mutex_init(&p->mu, NULL))
		return 0;
	if (pthread_cond_init(&p->cv, NULL)) {
		pthread_mutex_destroy(&p->mu);
		return 0;
	}
	p->started = !pthread_create(&p->thread, NULL, sel_thread, mr);
	if (!p->started) {
		pthread_cond_destroy(&p->cv);
		pthread_mutex_destroy(&p->mu);
	}
	return 0;
}

/* Stops the second thread (after the units it has claimed) and releases the pool. */
static void sel_pool_fini(struct mrun *mr)
{
	struct sel_pool *p = &mr->pool;

	if (p->started) {
		pthread_mutex_lock(&p->mu);
		p->quit = true;
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
		pthread_join(p->thread, NULL);
		pthread_cond_destroy(&p->cv);
		pthread_mutex_destroy(&p->mu);
		p->started = false;
	}
	free(p->done);
	p->done = NULL;
}

/* Posts the draws of this iteration's nd decode items (listed in dseq[] and dreq[], their
   streams made) as a new job. */
static void sel_post(struct mrun *mr, uint32_t nd)
{
	struct sel_pool *p = &mr->pool;

	if (!p->started) {
		p->gen++;
		p->nd = nd;
		atomic_store_explicit(&p->claim, (uint64_t)p->gen << 32, memory_order_release);
		return;
	}
	pthread_mutex_lock(&p->mu);
	p->gen++;
	p->nd = nd;
	atomic_store_explicit(&p->claim, (uint64_t)p->gen << 32, memory_order_release);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

/* Unit u of the current job, once drawn: the engine's thread draws the units nobody has
   claimed (u among them, in order) and waits only for one the second thread is drawing. */
static const uint32_t *sel_get(struct mrun *mr, uint32_t u)
{
	struct sel_pool *p = &mr->pool;
	uint32_t gen = p->gen;

	while (atomic_load_explicit(&p->done[u], memory_order_acquire) != gen) {
		uint32_t v = sel_claim(p, gen, mr->n_sampled);

		if (v != UINT32_MAX) {
			sel_unit(mr, v, p->nd);
			atomic_store_explicit(&p->done[v], gen, memory_order_release);
			continue;
		}
		/* the other thread has u: a unit takes tens of microseconds, so spin a little
		   before sleeping */
		for (int i = 0; i < 4096; i++)
			if (atomic_load_explicit(&p->done[u], memory_order_acquire) == gen)
				break;
		pthread_mutex_lock(&p->mu);
		while (atomic_load_explicit(&p->done[u], memory_order_acquire) != gen)
			pthread_cond_wait(&p->cv, &p->mu);
		pthread_mutex_unlock(&p->mu);
	}
	return &mr->blocks[(size_t)u * mr->dcap * mr->cfg.n_kv_heads * mr->r];
}

/* Recalls the draws of sampled layer l for its nd decode items; on -ENOSPC (the call needs
   more frames than the cache has) retries per sequence. */
static int recall_layer(struct mrun *mr, uint32_t l, uint32_t nd)
{
	struct run *run = mr->run;
	uint32_t H = mr->cfg.n_kv_heads, r = mr->r;
	const uint32_t *blocks = sel_get(mr, l / mr->stride);
	double t0;
	int err;

	t0 = sim_now_s();
	err = kvt_recall_blocks(mr->m, l, mr->dseq, nd, blocks, r, NULL);
	for (uint32_t d = 0; err == -ENOSPC && d < nd; d++) {
		int e = kvt_recall_blocks(mr->m, l, &mr->dseq[d], 1, &blocks[(size_t)d * H * r], r,
					  NULL);

		if (e && e != -ENOSPC) {
			mr->cpu_s += sim_now_s() - t0;
			ERRF("kvt_recall_blocks: %s (%s)", kvt_strerror(e),
			     kvt_manager_last_error(mr->m));
			return e;
		}
		/* -ENOSPC for one sequence alone: it attends without its recall this step */
	}
	mr->cpu_s += sim_now_s() - t0;
	if (err && err != -ENOSPC) {
		ERRF("kvt_recall_blocks: %s (%s)", kvt_strerror(err),
		     kvt_manager_last_error(mr->m));
		return err;
	}
	return 0;
}

/* Fails request i alone after a manager error on it. */
static void fail_running(struct mrun *mr, size_t i)
{
	kvt_sched_finish(mr->s, i + 1);
	kvt_seq_destroy(mr->m, i + 1);
	release(mr, i);
	run_fail_req(mr->run, i, "the manager refused its prefill");
}

/* Once request i's prompt is prefilled in every layer, the library has cached the spans of
   its chain that no other sequence had: they leave its DRAM reservation for the shared
   spans' count (prefix_live_groups), and its ids count as live shares. 0 or -ENOMEM. */
static int prefix_cached(struct mrun *mr, size_t i)
{
	struct rreq *q = &mr->run->rq[i];
	struct kvt_seq_info info = {.size = sizeof(info)};
	uint64_t now, before = prefix_groups(mr, q->matched);

	mr->pin_future -= q->pin_future; /* pinned now, or never (spilled during its prefill) */
	q->pin_future = 0;
	if (!q->n_chain || kvt_seq_info(mr->m, i + 1, &info) || info.size < sizeof(info))
		return 0;
	now = info.shared_blocks / mr->cfg.n_kv_heads;
	if (now > before) {
		mr->run->dram_used -= now - before;
		q->dram_res -= now - before;
	}
	/* every span of its chain is held (matched or registered now): its ids count as live
	   shares; when some were left out (cached by another sequence, or spilled) which ones
	   is unknown, and only the matched ones count (admission then counts the others as
	   spans it adds: the safe side) */
	if (now != prefix_groups(mr, (uint64_t)q->n_chain * SIM_TRACE_HASH_TOKENS))
		return 0;
	if (prefix_count(mr, i, q->n_ref, q->n_chain, 1))
		return -ENOMEM;
	q->n_ref = q->n_chain;
	return 0;
}

/* Lists the decode items of batch b in dseq[] and dreq[] and makes their selection streams
   (recall policies); returns how many, UINT32_MAX when out of memory. */
static uint32_t mrun_decodes(struct mrun *mr, const struct kvt_sched_batch *b)
{
	uint32_t nd = 0;

	for (uint32_t k = 0; k < b->n_items; k++) {
		const struct kvt_sched_item *it = &b->items[k];

		if (!it->decode)
			continue;
		if (mr->recall && sel_streams(mr, it->seq - 1))
			return UINT32_MAX;
		mr->dseq[nd] = it->seq;
		mr->dreq[nd++] = (uint32_t)(it->seq - 1);
	}
	return nd;
}

/* Prefills the prefill items of batch b (a request the manager refuses fails alone); adds
   them to w and ir. 0 or -ENOMEM. A request with a shared prefix prefills the rest:
   L - matched tokens through the linear layers and KV writes, their queries over all L keys
   in attention. */
static int mrun_prefill(struct mrun *mr, const struct kvt_sched_batch *b, struct sim_iter_work *w,
			struct iter_rec *ir)
{
	struct run *run = mr->run;
	const struct sim_model_preset *mp = &run->o->model;
	double t0;
	bool nomem = false;
	int err = 0;

	for (uint32_t k = 0; k < b->n_items; k++) {
		const struct kvt_sched_item *it = &b->items[k];
		size_t i = it->seq - 1;
		struct sim_req_result *r = &run->res->reqs[i];
		struct rreq *q = &run->rq[i];
		uint32_t L = r->input_tokens, new_tok = L - q->matched;
		uint32_t layers = it->layer_end - it->layer_begin;

		if (r->sched_s < 0)
			r->sched_s = run->now;
		if (it->decode)
			continue;
		if (!q->started) {
			q->started = true;
			mr->unstarted--;
		}
		/* per layer: the shared prefix's K/V from the host history (timed as an H2D
		   gather), then the whole layer's tensors, of which the library saves the rows
		   past the prefix */
		t0 = sim_now_s();
		for (uint32_t l = it->layer_begin; l < it->layer_end && !err; l++) {
			if (q->matched)
				err = kvt_seq_load_kv(mr->m, it->seq, l, 0, q->matched, mr->dummy,
						      mr->dummy, NULL);
			if (!err)
				err = kvt_prefill_layer(mr->m, it->seq, l, mr->dummy, mr->dummy,
							mr->dummy, NULL);
		}
		mr->cpu_s += sim_now_s() - t0;
		if (err) {
			fail_running(mr, i);
			err = 0;
			continue;
		}
		ir->n_pre++;
		if (it->layer_end == mr->cfg.n_layers) {
			run->res->prefill_tokens += new_tok;
			if (prefix_cached(mr, i)) {
				nomem = true;
				continue;
			}
		}
		/* the suffix passes the linear layers; its queries attend to every key */
		w->prefill_token_layers += (uint64_t)new_tok * layers;
		for (uint32_t l = it->layer_begin; l < it->layer_end; l++)
			mr->layer_tokens[l] += new_tok;
		w->prefill_attn_s += sim_prefill_attn_s(
			&run->o->gpu,
			sim_prefill_attn_flops(mp, L, layers) -
				(q->matched ? sim_prefill_attn_flops(mp, q->matched, layers) : 0),
			new_tok, L);
	}
	return nomem ? -ENOMEM : 0;
}

/* Recalls the selections of the nd decode items (sel_post'ed) on the sampled layers, which
   stand for all: their CPU time is scaled here, their modelled H2D time goes to *h2d_ns for
   the caller to scale. 0, or -errno with the run's message. */
static int mrun_recall(struct mrun *mr, uint32_t nd, double *h2d_ns)
{
	struct kvt_stats s0 = KVT_STATS_INIT, s1 = KVT_STATS_INIT;
	double cpu0 = mr->cpu_s;
	int err;

	kvt_manager_stats(mr->m, &s0);
	for (uint32_t l = 0; l < mr->cfg.n_layers; l += mr->stride) {
		err = recall_layer(mr, l, nd);
		if (err)
			return err;
	}
	kvt_manager_stats(mr->m, &s1);
	*h2d_ns = (double)(s1.model_ns_h2d - s0.model_ns_h2d);
	mr->cpu_s = cpu0 + (mr->cpu_s - cpu0) * mr->scale;
	return 0;
}

/* KV bytes the nd decode items' attention reads: each one's resident set and this step's
   recalled blocks (sampled layers scaled to all). */
static double decode_kv_bytes(const struct mrun *mr, uint32_t nd)
{
	const struct sim_model_preset *mp = &mr->run->o->model;
	double bytes = 0;

	for (uint32_t d = 0; d < nd; d++) {
		struct kvt_seq_info info = {.size = sizeof(info)};

		if (!kvt_seq_info(mr->m, mr->dseq[d], &info))
			bytes += ((double)info.frames_per_layer * mr->cfg.n_layers +
				  (double)info.recall_step_frames * mr->scale) *
				 2.0 * mr->cfg.block_tokens * mp->head_dim * mp->elem_bytes;
	}
	return bytes;
}

/* The iteration's modelled transfer time in seconds, from the manager's counters since the
   last iteration (the sampled layers' recall H2D, recall_h2d_ns, scaled to all; D2H only
   where the policy times it); the disk tier's time and blocks go to the run's result. */
static double mrun_transfer_s(struct mrun *mr, double recall_h2d_ns)
{
	struct sim_replay_result *res = mr->run->res;
	struct kvt_stats st = KVT_STATS_INIT;
	double t;

	kvt_manager_stats(mr->m, &st);
	t = 1e-9 *
	    ((double)(st.model_ns_h2d - mr->st0.model_ns_h2d) + recall_h2d_ns * (mr->scale - 1) +
	     (double)(st.model_ns_d2d - mr->st0.model_ns_d2d) +
	     (mr->time_d2h ? (double)(st.model_ns_d2h - mr->st0.model_ns_d2h) : 0) +
	     (double)(st.model_ns_disk - mr->st0.model_ns_disk));
	res->t_disk += 1e-9 * (double)(st.model_ns_disk - mr->st0.model_ns_disk);
	res->disk_blocks_spilled += st.disk_blocks_spilled - mr->st0.disk_blocks_spilled;
	res->disk_blocks_fetched += st.disk_blocks_fetched - mr->st0.disk_blocks_fetched;
	res->prefix_bytes_loaded += st.bytes_h2d_history - mr->st0.bytes_h2d_history;
	mr->st0 = st;
	return t;
}

/* Stamps the tokens of batch b at run->now: each finished prefill gives the first, each decode
   one more. A request that completes leaves the manager and frees its DRAM. 0 or -ENOMEM. */
static int mrun_stamp_tokens(struct mrun *mr, const struct kvt_sched_batch *b, bool win)
{
	struct run *run = mr->run;

	for (uint32_t k = 0; k < b->n_items; k++) {
		const struct kvt_sched_item *it = &b->items[k];
		size_t i = it->seq - 1;

		if (run->res->reqs[i].status != SIM_REQ_PENDING)
			continue;
		if (it->decode || it->layer_end == mr->cfg.n_layers) {
			if (run_token(run, i, win))
				return -ENOMEM;
		}
		/* the scheduler let go of it at commit: its history and DRAM are free now */
		if (run->res->reqs[i].status == SIM_REQ_DONE) {
			kvt_seq_destroy(mr->m, it->seq);
			release(mr, i);
		}
	}
	return 0;
}

static int mrun_iteration(struct mrun *mr)
{
	struct run *run = mr->run;
	struct kvt_sched_batch b;
	struct sim_iter_work w = {0};
	struct iter_rec ir = {0};
	struct kvt_sched_iter last;
	double t0, start = run->now, recall_h2d_ns = 0;
	uint32_t nd;
	bool win = run->iter >= run->o->warmup_iterations;
	int err;

	mr->cpu_s = 0;
	t0 = sim_now_s();
	err = kvt_sched_step(mr->s, &b);
	mr->cpu_s += sim_now_s() - t0;
	if (err) {
		ERRF("kvt_sched_step: %s", kvt_strerror(err));
		return err;
	}
	if (grow_decode(mr, b.n_items))
		goto nomem;
	nd = mrun_decodes(mr, &b);
	if (nd == UINT32_MAX)
		goto nomem;
	if (mr->recall && nd)
		sel_post(mr, nd); /* drawn while the prefills and appends run */
	memset(mr->layer_tokens, 0, mr->cfg.n_layers * sizeof(*mr->layer_tokens));
	w.prefill_layer_tokens = mr->layer_tokens;
	if (mrun_prefill(mr, &b, &w, &ir))
		goto nomem;
	/* The decode items are a step, as an engine runs them: its recalls size the regions by
	   the working sets counted when it began. */
	t0 = sim_now_s();
	err = nd ? kvt_step_begin(mr->m, mr->dseq, nd) : 0;
	if (err) {
		mr->cpu_s += sim_now_s() - t0;
		ERRF("kvt_step_begin: %s (%s)", kvt_strerror(err), kvt_manager_last_error(mr->m));
		return err;
	}
	for (uint32_t l = 0; nd && l < mr->cfg.n_layers && !err; l++)
		err = kvt_decode_append(mr->m, l, mr->dseq, nd, mr->dummy, mr->dummy, NULL);
	mr->cpu_s += sim_now_s() - t0;
	if (err)
		ERRF("kvt_decode_append: %s (%s)", kvt_strerror(err),
		     kvt_manager_last_error(mr->m));
	if (!err && mr->recall && nd)
		err = mrun_recall(mr, nd, &recall_h2d_ns);
	if (nd)
		(void)kvt_step_end(mr->m); /* (open: begun above) */
	if (err)
		return err;
	w.kv_bytes_read = decode_kv_bytes(mr, nd);
	t0 = sim_now_s();
	err = kvt_sched_commit(mr->s);
	mr->cpu_s += sim_now_s() - t0;
	if (err) {
		ERRF("kvt_sched_commit: %s", kvt_strerror(err));
		return err;
	}
	w.transfer_s = mrun_transfer_s(mr, recall_h2d_ns);
	kvt_sched_last(mr->s, &last);
	w.decode_tokens = nd;
	w.cpu_s = run->o->cpu_time ? mr->cpu_s : 0;
	sim_iter_time(&run->o->model, &run->o->gpu, &w, &ir.tm);
	run->now += ir.tm.total_s;

	ir.batch = b.n_items;
	ir.n_dec = nd;
	ir.token_layers = w.prefill_token_layers;
	ir.loaded = (uint64_t)llround((double)last.blocks_loaded * mr->scale);
	ir.lookups = last.recall_lookups;
	ir.hits = last.recall_hits;
	ir.preempted = b.it.preempted;
	ir.resumed = b.it.resumed;
	ir.queued = b.it.queued;
	run->res->preemptions += b.it.preempted;
	if (mrun_stamp_tokens(mr, &b, win))
		goto nomem;
	return run_end_iteration(run, &ir, start);
nomem:
	ERRF("out of memory");
	return -ENOMEM;
}

/* The manager's configuration of the policy (budgets are set by the caller). */
static void mrun_config(struct mrun *mr)
{
	const struct sim_replay_opts *o = mr->run->o;
	struct kvt_config c = KVT_CONFIG_INIT;

	c.n_layers = o->model.n_layers;
	c.n_kv_heads = o->model.n_kv_heads;
	c.n_q_heads = o->model.n_q_heads;
	c.head_dim = o->model.head_dim;
	c.dtype = o->model.elem_bytes == 4 ? KVT_DTYPE_F32 : KVT_DTYPE_BF16; /* or 2: check_opts */
	c.block_tokens = o->block_tokens;
	c.sink_tokens = o->sink_tokens;
	c.topk_tokens = o->topk_tokens;
	c.recent_tokens = o->recent_tokens;
	c.backend = KVT_BACKEND_MODEL;
	c.save_threads = 0;
	c.ws_window = o->ws_window;
	c.model_h2d_gbps = o->gpu.h2d_gbps;
	c.model_d2h_gbps = o->gpu.d2h_gbps;
	c.model_d2d_gbps = o->gpu.hbm_gbps / 2; /* a device copy reads and writes */
	c.model_call_ns = (uint32_t)o->gpu.call_ns;
	c.model_launch_ns = (uint32_t)o->gpu.launch_ns;
	c.model_fused = o->fused;
	c.recall_threads = o->recall_threads;
	if (!c.recall_threads) /* the second core, beside the selection model's thread */
		c.recall_threads = !o->cpu_time && sysconf(_SC_NPROCESSORS_ONLN) >= 2 ? 2 : 1;
	mr->r = o->recall_blocks;
	mr->time_d2h = true;
	mr->recall = o->recall_blocks > 0;
	switch (o->policy) {
	case SIM_POLICY_SNAPSTREAM:
		mr->r = 0;
		mr->recall = false;
		mr->time_d2h = false;
		break;
	case SIM_POLICY_SPARSE_OFFLOAD:
		c.sink_tokens = 0;
		c.topk_tokens = 0;
		c.recent_tokens = o->so_recent_tokens;
		c.model_fused = 0;
		mr->r = o->so_recall_blocks ? o->so_recall_blocks
					    : (o->sink_tokens + o->topk_tokens + o->block_tokens -
					       1) / o->block_tokens +
						      o->recall_blocks;
		mr->recall = mr->r > 0;
		break;
	default:
		break;
	}
	c.recall_blocks = 0; /* recall goes through kvt_recall_blocks: no scoring metadata */
	mr->cfg = c;
}

static int mrun_loop(struct run *run, double hbm_bytes)
{
	const struct sim_replay_opts *o = run->o;
	struct mrun *mr = calloc(1, sizeof(*mr));
	struct kvt_sched_config sc = KVT_SCHED_CONFIG_INIT;
	double rc_frac;
	int err;

	if (!mr)
		return -ENOMEM;
	mr->run = run;
	mrun_config(mr);
	rc_frac = o->policy == SIM_POLICY_SPARSE_OFFLOAD ? 0.9 : o->recall_cache_frac;
	if (!mr->recall)
		rc_frac = 0;
	mr->stride = 1;
	if (o->recall_layers && o->recall_layers < mr->cfg.n_layers && !o->selections)
		mr->stride = mr->cfg.n_layers / o->recall_layers;
	mr->n_sampled = (mr->cfg.n_layers + mr->stride - 1) / mr->stride;
	mr->scale = (double)mr->cfg.n_layers / mr->n_sampled;
	/* the resident sets get the rest of HBM; the simulated recall cache is the sampled
	   layers' share of it */
	mr->cfg.recall_cache_bytes = (uint64_t)(hbm_bytes * rc_frac / mr->scale);
	mr->cfg.device_bytes = (uint64_t)(hbm_bytes * (1 - rc_frac)) + mr->cfg.recall_cache_bytes;
	/* snapstream keeps nothing off the GPU: the library's write-through history gets room
	   enough never to bind (4 TiB of address range; the model backend allocates none) */
	mr->cfg.host_bytes = o->policy == SIM_POLICY_SNAPSTREAM
				     ? (uint64_t)4 << 40
				     : (uint64_t)(o->dram_gib * 1073741824.0);
	if (o->spill_dir && o->policy != SIM_POLICY_SNAPSTREAM) {
		mr->cfg.spill_dir = o->spill_dir;
		mr->cfg.disk_bytes = (uint64_t)(o->disk_gib * 1073741824.0);
		mr->cfg.model_disk_gbps = o->disk_gbps;
	}
	if (mr->recall) {
		/* the library's frame: one block of one (layer, kv head), K and V */
		uint64_t frame =
			2ull * mr->cfg.block_tokens * mr->cfg.head_dim * o->model.elem_bytes;

		if (mr->cfg.recall_cache_bytes < frame) {
			ERRF("the recall cache, %g of %.3g GiB of HBM, gives the %u simulated layers "
			     "%llu bytes: less than one block frame (%llu bytes); raise %s",
			     rc_frac, hbm_bytes / 1073741824.0, mr->n_sampled,
			     (unsigned long long)mr->cfg.recall_cache_bytes,
			     (unsigned long long)frame,
			     o->policy == SIM_POLICY_SPARSE_OFFLOAD
				     ? "--hbm-gib"
				     : "--recall-cache-frac or --hbm-gib, or turn recall off "
				       "with --recall 0");
			err = -EINVAL;
			goto out;
		}
	}
	mr->sel = o->sel;
	mr->sel.r = mr->r ? mr->r : 1;
	if (mr->recall && sim_sel_check(&mr->sel)) {
		ERRF("bad selection-model parameters (r %u, window %u, p_keep %g, p_revisit %g)",
		     mr->sel.r, mr->sel.window, mr->sel.p_keep, mr->sel.p_revisit);
		err = -EINVAL;
		goto out;
	}
	err = check_selections(mr);
	if (err)
		goto out;
	err = kvt_manager_create(&mr->cfg, &mr->m);
	if (err) {
		ERRF("kvt_manager_create: %s (check the cache geometry and budgets: block %u, "
		     "sink %u, top-K %u, ring %u, HBM %.3g GiB, recall cache %.3g GiB)",
		     kvt_strerror(err), mr->cfg.block_tokens, mr->cfg.sink_tokens,
		     mr->cfg.topk_tokens, mr->cfg.recent_tokens, hbm_bytes / 1073741824.0,
		     mr->cfg.recall_cache_bytes / 1073741824.0);
		goto out;
	}
	sc.max_requests = o->max_requests;
	sc.max_tokens = o->max_tokens;
	sc.ws_control = o->ws_control && o->policy == SIM_POLICY_KVTIER;
	if (o->chunk_tokens) {
		sc.max_inject_tokens = (uint64_t)o->chunk_tokens * mr->cfg.n_layers;
		if (sc.max_tokens < o->chunk_tokens)
			sc.max_tokens = o->chunk_tokens;
	}
	if (o->max_inject_tokens)
		sc.max_inject_tokens = o->max_inject_tokens;
	err = kvt_sched_create(mr->m, &sc, &mr->s);
	if (err) {
		ERRF("kvt_sched_create: %s", kvt_strerror(err));
		goto out;
	}
	{
		uint64_t group = 2ull * mr->cfg.block_tokens * mr->cfg.head_dim *
				 o->model.elem_bytes * mr->cfg.n_kv_heads;

		/* with a disk tier a history may live in DRAM or on disk: admission counts
		   both, and nothing when the disk has no limit */
		run->dram_groups = mr->cfg.spill_dir && !mr->cfg.disk_bytes
					   ? 0
					   : (mr->cfg.host_bytes + mr->cfg.disk_bytes) / group;
		run->host_groups = mr->cfg.spill_dir ? mr->cfg.host_bytes / group : 0;
	}
	/* snapstream keeps nothing off the GPU to share */
	mr->prefix = o->prefix_cache && run->t->hash_ids && o->policy != SIM_POLICY_SNAPSTREAM;
	for (size_t i = 0; i < run->t->count; i++)
		if (groups_of(mr, &run->t->reqs[i]) / mr->cfg.n_layers > mr->max_layer_groups &&
		    !run_static_reject(run, i))
			mr->max_layer_groups = groups_of(mr, &run->t->reqs[i]) / mr->cfg.n_layers;
	mr->waitq = malloc(run->t->count * sizeof(*mr->waitq));
	mr->layer_tokens = calloc(mr->cfg.n_layers, sizeof(*mr->layer_tokens));
	if (!mr->waitq || !mr->layer_tokens || sel_pool_init(mr)) {
		err = -ENOMEM;
		goto out;
	}
	mr->st0.size = sizeof(mr->st0);
	mr->st0.version = KVT_STATS_VERSION;
	kvt_manager_stats(mr->m, &mr->st0);
	while (!run_over(run)) {
		err = submit_waiting(mr);
		if (err)
			goto out;
		if (kvt_sched_pending(mr->s) == 0) {
			double na = run_next_arrival(run);

			if (mr->wq_n) {
				ERRF("request %zu waits for DRAM with nothing running",
				     mr->waitq[mr->wq_head]);
				err = -EDEADLK;
				goto out;
			}
			if (na < 0)
				break;
			if (na > run->now)
				run->now = na;
			continue;
		}
		err = mrun_iteration(mr);
		if (err)
			goto out;
	}
out:
	sel_pool_fini(mr); /* first: its thread may be drawing from the streams */
	for (size_t i = 0; i < run->t->count; i++)
		release(mr, i);
	kvt_sched_destroy(mr->s);
	kvt_manager_destroy(mr->m);
	free(mr->waitq);
	free(mr->layer_tokens);
	free(mr->dseq);
	free(mr->dreq);
	free(mr->blocks);
	sim_hmap_fini(&mr->prefix_live);
	free(mr);
	return err;
}

/* ---- Entry point -------------------------------------------------------------------------- */

static int check_opts(const struct sim_replay_opts *o, const struct sim_trace *t, char *err,
		      size_t len)
{
	if (!t || !t->count || !t->reqs) {
		snprintf(err, len, "empty trace");
		return -EINVAL;
	}
	if ((unsigned)o->policy > SIM_POLICY_FULL) {
		snprintf(err, len, "unknown policy");
		return -EINVAL;
	}
	if (!(o->dram_gib > 0) || !isfinite(o->dram_gib) || !isfinite(o->hbm_gib)) {
		snprintf(err, len, "budgets must be finite and the DRAM budget positive");
		return -EINVAL;
	}
	if (!(o->disk_gib >= 0) || !isfinite(o->disk_gib) || !(o->disk_gbps > 0) ||
	    !isfinite(o->disk_gbps)) {
		snprintf(err, len, "the disk budget must be finite and >= 0, its bandwidth > 0");
		return -EINVAL;
	}
	if (o->spill_dir) {
		const char *why = NULL;
		struct stat sb;

		if (stat(o->spill_dir, &sb))
			why = strerror(errno);
		else if (!S_ISDIR(sb.st_mode))
			why = "not a directory";
		else if (access(o->spill_dir, W_OK | X_OK))
			why = strerror(errno);
		if (why) {
			snprintf(err, len, "spill directory %s: %s", o->spill_dir, why);
			return -EINVAL;
		}
	}
	if (o->model.elem_bytes != 2 && o->model.elem_bytes != 4) {
		/* mrun_config's dtypes: any other size would be timed but not stored */
		snprintf(err, len,
			 "model element size %u bytes: the library stores 2 (bf16) or 4 (f32)",
			 o->model.elem_bytes);
		return -EINVAL;
	}
	if (!(o->recall_cache_frac >= 0 && o->recall_cache_frac < 1)) {
		snprintf(err, len, "the recall cache fraction must be in [0, 1)");
		return -EINVAL;
	}
	if (!o->max_requests || !o->max_tokens) {
		snprintf(err, len, "R_max and T_max must be at least 1");
		return -EINVAL;
	}
	return 0;
}

void sim_replay_gpu(const struct sim_replay_opts *o, struct sim_gpu_preset *g)
{
	*g = o->gpu;
	if (o->roofline)
		sim_gpu_roofline(g);
}

int sim_replay_run(const struct sim_replay_opts *o_in, const struct sim_trace *t,
		   struct sim_replay_result *res, char *err, size_t err_len)
{
	struct sim_replay_opts o_run = *o_in, *o = &o_run;
	struct run run = {.o = o, .t = t, .res = res, .err = err, .err_len = err_len};
	double weights = o->model.params * o->model.elem_bytes, hbm, w0 = sim_now_s();
	int rc;

	sim_replay_gpu(o_in, &o_run.gpu);
	memset(res, 0, sizeof(*res));
	rc = check_opts(o, t, err, err_len);
	if (rc)
		return rc;
	hbm = o->hbm_gib > 0 ? o->hbm_gib * 1073741824.0 : o->gpu.hbm_gib * 1073741824.0 - weights;
	if (hbm <= 0) {
		snprintf(err, err_len, "no HBM left for KV: %s weights %.1f GiB on %s %.1f GiB",
			 o->model.name, weights / 1073741824.0, o->gpu.name, o->gpu.hbm_gib);
		return -EINVAL;
	}
	res->n_reqs = t->count;
	res->reqs = calloc(t->count, sizeof(*res->reqs));
	run.rq = calloc(t->count, sizeof(*run.rq));
	if (!res->reqs || !run.rq) {
		free(run.rq);
		sim_replay_result_free(res);
		snprintf(err, err_len, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < t->count; i++) {
		struct sim_req_result *r = &res->reqs[i];

		r->arrival_s = o->concurrency ? -1 : t->reqs[i].arrival_s;
		r->sched_s = r->first_token_s = r->finish_s = -1;
		r->input_tokens = t->reqs[i].input_tokens;
		r->output_tokens = t->reqs[i].output_tokens;
	}
	snprintf(res->policy, sizeof(res->policy), "%s", sim_policy_name(o->policy));
	/* names are at most SIM_PRESET_NAME_MAX characters (the preset loader's rule) */
	snprintf(res->model, sizeof(res->model), "%.*s", SIM_PRESET_NAME_MAX, o->model.name);
	snprintf(res->gpu, sizeof(res->gpu), "%.*s", SIM_PRESET_NAME_MAX, o->gpu.name);
	run.last_progress = sim_now_s();
	rc = o->policy == SIM_POLICY_FULL ? frun_loop(&run, hbm) : mrun_loop(&run, hbm);
	free(run.rq);
	if (rc) {
		sim_replay_result_free(res);
		return rc;
	}
	progress(&run, true);
	res->iterations = run.iter;
	res->mean_batch_size = run.iter ? (double)run.batch_sum / (double)run.iter : 0;
	res->blocks_loaded_per_iteration = run.iter ? (double)run.loaded_sum / (double)run.iter : 0;
	res->recall_hit_rate = run.lookups ? (double)run.hits / (double)run.lookups : 0;
	res->prefix_hit_rate = res->prefix_input_tokens ? (double)res->prefix_hit_tokens /
								  (double)res->prefix_input_tokens
							: 0;
	res->duration_s = 0;
	for (size_t i = 0; i < t->count; i++)
		if (res->reqs[i].finish_s > res->duration_s)
			res->duration_s = res->reqs[i].finish_s;
	res->wall_s = sim_now_s() - w0;
	return 0;
}

void sim_replay_result_free(struct sim_replay_result *res)
{
	if (!res)
		return;
	free(res->reqs);
	free(res->itl_s);
	free(res->win_tbt_s);
	memset(res, 0, sizeof(*res));
}
