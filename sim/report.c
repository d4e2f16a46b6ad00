/* SPDX-License-Identifier: MIT */
/* The reports of a replay (report.h): summary figures, the JSON document, per-request CSV. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "report.h"
#include "simutil.h"

/* The radix key of x: its bits, made to order as the values do (negatives reversed below the
   positives), -0.0 keyed as +0.0 since sim_cmp_double holds them equal. */
static uint64_t dkey(double x)
{
	uint64_t u;

	memcpy(&u, &x, sizeof(u));
	if (u == (uint64_t)1 << 63)
		u = 0;
	return u >> 63 ? ~u : u | (uint64_t)1 << 63;
}

/*
 * Sorts v[0..n) ascending into the order qsort with sim_cmp_double gives (NaNs aside, which
 * that comparison cannot order): a stable LSD radix sort on dkey, a byte a pass, the passes
 * whose byte every key shares skipped. Values that compare equal are the same bits but for
 * -0.0 and +0.0, which keep their order, as glibc's merge sort keeps it. Linear in n, where
 * qsort's calls of the comparison took most of a summary of millions of inter-token gaps;
 * falls back to qsort when the scratch array cannot be had.
 */
static void sort_doubles(double *v, size_t n)
{
	size_t count[8][256] = {{0}};
	double *a = v, *b;

	if (n < 2)
		return;
	b = malloc(n * sizeof(*b));
	if (!b) {
		qsort(v, n, sizeof(*v), sim_cmp_double);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		uint64_t k = dkey(v[i]);

		for (int d = 0; d < 8; d++)
			count[d][(k >> (8 * d)) & 0xff]++;
	}
	for (int d = 0; d < 8; d++) {
		size_t pos = 0, *c = count[d];
		double *t;

		if (c[(dkey(a[0]) >> (8 * d)) & 0xff] == n)
			continue; /* one byte value: the pass would keep the order */
		for (int j = 0; j < 256; j++) {
			size_t m = c[j];

			c[j] = pos;
			pos += m;
		}
		for (size_t i = 0; i < n; i++)
			b[c[(dkey(a[i]) >> (8 * d)) & 0xff]++] = a[i];
		t = a;
		a = b;
		b = t;
	}
	if (a != v)
		memcpy(v, a, n * sizeof(*v));
	free(a == v ? b : a);
}

/* Mean, median and p99 of v[0..n) (sorted in place). */
static void stats3(double *v, size_t n, double *mean, double *med, double *p99)
{
	double s = 0;

	*mean = *med = *p99 = 0;
	if (!n)
		return;
	sort_doubles(v, n);
	for (size_t i = 0; i < n; i++)
		s += v[i];
	*mean = s / (double)n;
	*med = sim_percentile(v, n, 0.5);
	*p99 = sim_percentile(v, n, 0.99);
}

int sim_replay_summarize(const struct sim_replay_result *res, struct sim_replay_summary *s)
{
	size_t n = res->n_reqs, k = 0, kt = 0;
	double *ttft = malloc((n + 1) * sizeof(double)), *tpot = malloc((n + 1) * sizeof(double));
	double *e2e = malloc((n + 1) * sizeof(double)), *itl = NULL, delay = 0;
	size_t nd = 0;

	memset(s, 0, sizeof(*s));
	if (!ttft || !tpot || !e2e)
		goto nomem;
	if (res->n_itl) {
		itl = malloc(res->n_itl * sizeof(double));
		if (!itl)
			goto nomem;
		memcpy(itl, res->itl_s, res->n_itl * sizeof(double));
	}
	for (size_t i = 0; i < n; i++) {
		const struct sim_req_result *r = &res->reqs[i];

		if (r->status != SIM_REQ_DONE)
			continue;
		ttft[k] = 1e3 * (r->first_token_s - r->arrival_s);
		e2e[k++] = 1e3 * (r->finish_s - r->arrival_s);
		if (r->output_tokens > 1)
			tpot[kt++] =
				1e3 * (r->finish_s - r->first_token_s) / (r->output_tokens - 1);
		delay += r->sched_s - r->arrival_s;
		nd++;
	}
	for (size_t i = 0; i < res->n_itl; i++)
		itl[i] *= 1e3;
	stats3(ttft, k, &s->mean_ttft_ms, &s->median_ttft_ms, &s->p99_ttft_ms);
	stats3(tpot, kt, &s->mean_tpot_ms, &s->median_tpot_ms, &s->p99_tpot_ms);
	stats3(e2e, k, &s->mean_e2el_ms, &s->median_e2el_ms, &s->p99_e2el_ms);
	stats3(itl, res->n_itl, &s->mean_itl_ms, &s->median_itl_ms, &s->p99_itl_ms);
	s->mean_scheduling_delay_ms = nd ? 1e3 * delay / (double)nd : 0;
	if (res->duration_s > 0) {
		s->request_throughput = (double)res->completed / res->duration_s;
		s->output_throughput = (double)res->total_output_tokens / res->duration_s;
		s->total_token_throughput =
			(double)(res->total_input_tokens + res->total_output_tokens) /
			res->duration_s;
	}
	free(ttft);
	free(tpot);
	free(e2e);
	free(itl);
	return 0;
nomem:
	free(ttft);
	free(tpot);
	free(e2e);
	free(itl);
	return -ENOMEM;
}

int sim_replay_write_json(const struct sim_replay_result *res, const struct sim_replay_summary *s,
			  json_t *extra, const char *path, char *err, size_t err_len)
{
	json_t *o = json_object();
	int rc = 0;
	const struct {
		const char *k;
		double v;
	} num[] = {
		{"duration", res->duration_s},
		{"request_throughput", s->request_throughput},
		{"output_throughput", s->output_throughput},
		{"total_token_throughput", s->total_token_throughput},
		{"mean_ttft_ms", s->mean_ttft_ms},
		{"median_ttft_ms", s->median_ttft_ms},
		{"p99_ttft_ms", s->p99_ttft_ms},
		{"mean_tpot_ms", s->mean_tpot_ms},
		{"median_tpot_ms", s->median_tpot_ms},
		{"p99_tpot_ms", s->p99_tpot_ms},
		{"mean_itl_ms", s->mean_itl_ms},
		{"median_itl_ms", s->median_itl_ms},
		{"p99_itl_ms", s->p99_itl_ms},
		{"mean_e2el_ms", s->mean_e2el_ms},
		{"median_e2el_ms", s->median_e2el_ms},
		{"p99_e2el_ms", s->p99_e2el_ms},
		{"mean_scheduling_delay_ms", s->mean_scheduling_delay_ms},
		{"mean_batch_size", res->mean_batch_size},
		{"blocks_loaded_per_iteration", res->blocks_loaded_per_iteration},
		{"recall_hit_rate", res->recall_hit_rate},
		{"prefix_hit_rate", res->prefix_hit_rate},
		{"time_gemm_s", res->t_gemm},
		{"time_attention_decode_s", res->t_attn_decode},
		{"time_attention_prefill_s", res->t_attn_prefill},
		{"time_kv_write_s", res->t_kv_write},
		{"time_overhead_s", res->t_overhead},
		{"time_transfer_s", res->t_transfer},
		{"time_disk_s", res->t_disk},
		{"time_cpu_s", res->t_cpu},
		{"wall_s", res->wall_s},
	};

	if (!o)
		goto nomem;
	for (size_t i = 0; i < sizeof(num) / sizeof(num[0]); i++)
		if (json_object_set_new(o, num[i].k, json_real(num[i].v)))
			goto nomem;
	if (json_object_set_new(o, "completed", json_integer((json_int_t)res->completed)) ||
	    json_object_set_new(o, "failed", json_integer((json_int_t)res->failed)) ||
	    json_object_set_new(o, "total_input_tokens",
				json_integer((json_int_t)res->total_input_tokens)) ||
	    json_object_set_new(o, "total_output_tokens",
				json_integer((json_int_t)res->total_output_tokens)) ||
	    json_object_set_new(o, "max_batch_size", json_integer(res->max_batch_size)) ||
	    json_object_set_new(o, "iterations", json_integer((json_int_t)res->iterations)) ||
	    json_object_set_new(o, "preemptions", json_integer((json_int_t)res->preemptions)) ||
	    json_object_set_new(o, "disk_blocks_spilled",
				json_integer((json_int_t)res->disk_blocks_spilled)) ||
	    json_object_set_new(o, "disk_blocks_fetched",
				json_integer((json_int_t)res->disk_blocks_fetched)) ||
	    json_object_set_new(o, "prefix_input_tokens",
				json_integer((json_int_t)res->prefix_input_tokens)) ||
	    json_object_set_new(o, "prefix_hit_tokens",
				json_integer((json_int_t)res->prefix_hit_tokens)) ||
	    json_object_set_new(o, "prefill_tokens_computed",
				json_integer((json_int_t)res->prefill_tokens)) ||
	    json_object_set_new(o, "prefix_bytes_loaded",
				json_integer((json_int_t)res->prefix_bytes_loaded)) ||
	    json_object_set_new(o, "policy", json_string(res->policy)) ||
	    json_object_set_new(o, "model", json_string(res->model)) ||
	    json_object_set_new(o, "gpu", json_string(res->gpu)))
		goto nomem;
	if (extra && json_object_update(o, extra))
		goto nomem;
	if (json_dump_file(o, path, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(10))) {
		snprintf(err, err_len, "%s: cannot write: %s", path, strerror(errno));
		rc = errno ? -errno : -EIO;
	}
	json_decref(o);
	return rc;
nomem:
	json_decref(o);
	snprintf(err, err_len, "out of memory");
	return -ENOMEM;
}

int sim_replay_write_requests_csv(const struct sim_replay_result *res, FILE *f)
{
	fprintf(f, "request,arrival_s,scheduled_s,first_token_s,finish_s,input_tokens,"
		   "output_tokens,generated,status,reason\n");
	for (size_t i = 0; i < res->n_reqs; i++) {
		const struct sim_req_result *r = &res->reqs[i];

		fprintf(f, "%zu,%.6f,%.6f,%.6f,%.6f,%u,%u,%u,%s,%s\n", i, r->arrival_s, r->sched_s,
			r->first_token_s, r->finish_s, r->input_tokens, r->output_tokens,
			r->generated,
			r->status == SIM_REQ_DONE     ? "completed"
			: r->status == SIM_REQ_FAILED ? "failed"
						      : "pending",
			r->reason ? r->reason : "");
	}
	return ferror(f) ? -EIO : 0;
}
