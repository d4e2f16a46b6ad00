/* SPDX-License-Identifier: MIT */
/*
 * fault: the walk (every fault site, each of its calls in turn) and the shared site.
 */
#include "test_fault.h"

/* The quick run's sample of the walk: hits 1, 1 + QUICK_STRIDE, ... */
#define QUICK_STRIDE 4

void test_fault_walk(void **state)
{
	const char *only = getenv("KVT_FAULT_ONLY");
	uint64_t n0 = 1, n1, stride;
	double t0 = t_now_s(), t1;

	(void)state;
	g_verbose = getenv("KVT_FAULT_VERBOSE") && *getenv("KVT_FAULT_VERBOSE") == '1';
	snprintf(g_dir, sizeof(g_dir), "%s/kvt-fault-XXXXXX",
		 getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	assert_non_null(mkdtemp(g_dir));
	kvt_log_set(log_sink, NULL);
	g_disk = probe_disk();
	g_cfg = fault_config(g_disk);

	/* 1. counting runs */
	run_once(MODE_COUNT, KVT_FAULT_ALL, 0);
	for (int s = 0; s < KVT_FAULT_SITES; s++) /* the thread-local sites: the walk's */
		if (KVT_FAULT_ALL & 1u << s)
			run_once(MODE_COUNT, 1u << s, 0);
	/* 2. the fault-free state before every step */
	run_once(MODE_SNAP, 0, 0);
	print_message("# fault: disk tier %s; %u steps, K = %llu hits (alloc %llu, xfer %llu, io "
		      "%llu, cuda %llu); scheduler: %u iterations, %u preempted, %u resumed\n",
		      g_disk ? "present" : "absent (spill/fetch answer -ENOTSUP)", g_steps,
		      (unsigned long long)g_k, (unsigned long long)g_k_site[KVT_FAULT_ALLOC],
		      (unsigned long long)g_k_site[KVT_FAULT_XFER],
		      (unsigned long long)g_k_site[KVT_FAULT_IO],
		      (unsigned long long)g_k_site[KVT_FAULT_CUDA], g_sched_iters,
		      g_sched_preempted, g_sched_resumed);
	if (getenv("KVT_FAULT_STEPS"))
		for (uint32_t i = 0; i < g_steps; i++)
			print_message("# step %3u %-28s hits %3llu..%llu\n", i, g_name[i],
				      (unsigned long long)(i ? g_hits_after[i - 1] + 1 : 1),
				      (unsigned long long)g_hits_after[i]);
	if (g_n_prob) {
		print_problems();
		fail_at(__FILE__, __LINE__, "the fault-free workload is not as expected");
	}
	CHECK_EQ(g_k, g_k_site[0] + g_k_site[1] + g_k_site[2] + g_k_site[3]);
	assert_true(g_k > 0);

	/* 3. every hit in turn; a quick run (not t_long_run) one in QUICK_STRIDE, which still
	   fails every step of the workload that takes more hits than that; KVT_FAULT_STRIDE=N
	   one in N whatever the run (CI's TSan build, where a whole walk takes minutes) */
	n1 = g_k;
	if (only && *only) {
		n0 = n1 = strtoull(only, NULL, 0);
	}
	stride = t_long_run() ? 1 : QUICK_STRIDE;
	if (getenv("KVT_FAULT_STRIDE") && *getenv("KVT_FAULT_STRIDE"))
		stride = strtoull(getenv("KVT_FAULT_STRIDE"), NULL, 0);
	if (stride == 0 || (only && *only))
		stride = 1;
	for (uint64_t n = n0; n <= n1; n += stride)
		run_once(MODE_FAULT, KVT_FAULT_ALL, n);
	t1 = t_now_s();
	kvt_log_set(NULL, NULL);

	if (stride > 1)
		print_message("# fault: this run walks one hit in %llu of the %llu "
			      "(KVT_TEST_LONG=1, meson's --setup full, walks them all)\n",
			      (unsigned long long)stride, (unsigned long long)g_k);
	print_message("# fault: %llu sites walked (alloc %llu, xfer %llu, io %llu, cuda %llu), "
		      "%llu failures returned errors (%llu retried, %llu manager creates), "
		      "%llu absorbed, %llu moved blocks between host and disk, %llu shared a "
		      "shorter prefix, %llu lost tokens, %llu tokens checked, %.1f s\n",
		      (unsigned long long)(g_walked[0] + g_walked[1] + g_walked[2] + g_walked[3]),
		      (unsigned long long)g_walked[KVT_FAULT_ALLOC],
		      (unsigned long long)g_walked[KVT_FAULT_XFER],
		      (unsigned long long)g_walked[KVT_FAULT_IO],
		      (unsigned long long)g_walked[KVT_FAULT_CUDA], (unsigned long long)g_failed,
		      (unsigned long long)g_retried, (unsigned long long)g_create_failed,
		      (unsigned long long)g_absorbed, (unsigned long long)g_placement,
		      (unsigned long long)g_short, (unsigned long long)g_lost,
		      (unsigned long long)g_tokens, t1 - t0);
	print_errors();
	print_problems();

	for (uint32_t i = 0; i <= g_steps && i <= MAX_STEPS; i++)
		free(g_snap[i]);
	for (uint32_t i = 0; i < g_steps; i++)
		free(g_att[i]);
	free(g_end);
	if (rmdir(g_dir))
		fail_at(__FILE__, __LINE__, "spill directory %s not empty or not removable (%s)",
			g_dir, strerror(errno));
	if (g_n_prob)
		fail_at(__FILE__, __LINE__, "%llu runs found problems (%u kinds), listed above",
			(unsigned long long)g_prob_total, g_n_prob);
}

/* ---- the hook itself: the shared site ------------------------------------------------------ */

/* What another thread sees: n hits of `site`, which of them failed (bit i: hit i + 1), and what
   arming the shared site there answered. */
struct other {
	enum kvt_fault_site site;
	uint32_t n, failed;
	int arm_shared;
	uint64_t local_hits; /* of a local arming there, taken and dropped after the hits */
};

static void *other_thread(void *arg)
{
	struct other *o = arg;

	for (uint32_t i = 0; i < o->n; i++)
		if (kvt_fault(o->site))
			o->failed |= 1u << i;
	o->arm_shared = kvt_fault_arm(KVT_FAULT_SHARED, 1);
	if (!o->arm_shared)
		kvt_fault_disarm();
	/* a local arming there does not see the shared count, nor the shared one its hits */
	if (!kvt_fault_arm(1u << KVT_FAULT_ALLOC, 0)) {
		(void)kvt_fault(KVT_FAULT_ALLOC);
		(void)kvt_fault(KVT_FAULT_ALLOC);
		o->local_hits = kvt_fault_disarm();
	}
	return NULL;
}

static struct other run_other(enum kvt_fault_site site, uint32_t n)
{
	struct other o = {.site = site, .n = n};
	pthread_t th;

	assert_int_equal(pthread_create(&th, NULL, other_thread, &o), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	return o;
}

/* KVT_FAULT_STAGE, armed on one thread, is counted and fired on every thread; the thread-local
   sites stay the arming thread's; one thread at a time holds the shared site. */
void test_fault_shared_site(void **state)
{
	struct other o;

	(void)state;
	assert_int_equal(kvt_fault_arm(KVT_FAULT_SHARED | 1u << KVT_FAULT_ALLOC, 1), -EINVAL);
	assert_int_equal(kvt_fault_arm(1u << KVT_FAULT_SITES, 1), -EINVAL);
	assert_false(kvt_fault(KVT_FAULT_STAGE)); /* nothing armed by the refusals */

	assert_int_equal(kvt_fault_arm(KVT_FAULT_SHARED, 3), 0);
	assert_false(kvt_fault(KVT_FAULT_STAGE)); /* hit 1, here */
	assert_false(kvt_fault(KVT_FAULT_ALLOC)); /* not armed: not counted */
	o = run_other(KVT_FAULT_STAGE, 4);	  /* hits 2..5 there: the 2nd of them fails */
	assert_int_equal(o.failed, 1u << 1);
	assert_int_equal(o.arm_shared, -EBUSY);
	assert_int_equal(o.local_hits, 2);
	assert_int_equal(kvt_fault_hits(), 5);
	assert_true(kvt_fault_fired());
	assert_int_equal(kvt_fault_fired_site(), KVT_FAULT_STAGE);
	o = run_other(KVT_FAULT_ALLOC, 3); /* another thread's allocations: not this arming's */
	assert_int_equal(o.failed, 0);
	assert_int_equal(kvt_fault_disarm(), 5);
	assert_true(kvt_fault_fired()); /* as for the local sites, kept after disarming */
	assert_int_equal(kvt_fault_fired_site(), KVT_FAULT_STAGE);

	/* released: the other thread may take it, and hits no longer count or fail */
	o = run_other(KVT_FAULT_STAGE, 3);
	assert_int_equal(o.failed, 0);
	assert_int_equal(o.arm_shared, 0);

	/* re-arming locally releases the shared site; a local arming never counts its hits */
	assert_int_equal(kvt_fault_arm(KVT_FAULT_SHARED, 1), 0);
	assert_int_equal(kvt_fault_arm(1u << KVT_FAULT_XFER, 2), 0);
	o = run_other(KVT_FAULT_STAGE, 2);
	assert_int_equal(o.failed, 0);
	assert_int_equal(o.arm_shared, 0);
	assert_false(kvt_fault(KVT_FAULT_STAGE));
	assert_false(kvt_fault(KVT_FAULT_XFER));
	assert_true(kvt_fault(KVT_FAULT_XFER));
	assert_int_equal(kvt_fault_fired_site(), KVT_FAULT_XFER);
	assert_int_equal(kvt_fault_disarm(), 2);
}
