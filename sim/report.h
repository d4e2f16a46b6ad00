/* SPDX-License-Identifier: MIT */
/* The reports of a replay (report.c): vLLM's summary figures, the JSON document and the
   per-request CSV of a sim_replay_run result. */
#ifndef SIM_REPORT_H
#define SIM_REPORT_H

#include <stdio.h>

#include "replay.h"

/* Summary figures in vLLM's terms (ms). Percentiles interpolate linearly between ranks. */
struct sim_replay_summary {
	double request_throughput, output_throughput, total_token_throughput;
	double mean_ttft_ms, median_ttft_ms, p99_ttft_ms;
	double mean_tpot_ms, median_tpot_ms, p99_tpot_ms;
	double mean_itl_ms, median_itl_ms, p99_itl_ms;
	double mean_e2el_ms, median_e2el_ms, p99_e2el_ms;
	double mean_scheduling_delay_ms;
};

/* 0 or -ENOMEM. */
int sim_replay_summarize(const struct sim_replay_result *res, struct sim_replay_summary *s);

/* The JSON document of a run (keys: a superset of `vllm bench serve`'s) to path: 0 or
   -errno with a message. `extra` (may be NULL) is merged in (trace figures, options). */
struct json_t;
int sim_replay_write_json(const struct sim_replay_result *res, const struct sim_replay_summary *s,
			  struct json_t *extra, const char *path, char *err, size_t err_len);

/* Per-request CSV: 0 or -errno. */
int sim_replay_write_requests_csv(const struct sim_replay_result *res, FILE *f);

#endif /* SIM_REPORT_H */
