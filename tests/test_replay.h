/* SPDX-License-Identifier: MIT */
/* The replay suite's helpers (test_replay.c) and the tests of its other files. */
#ifndef TEST_REPLAY_H
#define TEST_REPLAY_H

#include "replay.h"

/* Fails unless |got - want| <= 1e-12 + rel * |want|, naming `what`. */
void near(double got, double want, double rel, const char *what);
/* Defaults of policy p with the measured CPU time left out (deterministic runs). */
void opts(struct sim_replay_opts *o, enum sim_policy p);
/* n requests of in + out tokens, gap seconds apart, no hash ids. */
struct sim_trace mk_trace(size_t n, uint32_t in, uint32_t out, double gap);
/* sim_replay_run that must succeed. */
void run_ok(const struct sim_replay_opts *o, const struct sim_trace *t,
	    struct sim_replay_result *res);
/* Every request ended completed or failed, consistently with its record. */
void check_accounting(const struct sim_replay_result *res);
/* The bundled Mooncake trace (KVT_BUNDLED_TRACE). */
const char *bundled(void);
/* Reads the bundled trace (the model's context as the tools set it), keeping its first n
   requests. */
void read_bundled(struct sim_trace *t, size_t n);

/* test_replay_prefix.c */
void test_apc_repeat(void **state);
void test_apc_lru(void **state);
void test_apc_referenced(void **state);
void test_prefix_off_unchanged(void **state);
void test_prefix_deterministic(void **state);
void test_prefix_kvtier_repeat(void **state);
void test_prefix_dram(void **state);
void test_prefix_disk_pins(void **state);

#endif /* TEST_REPLAY_H */
