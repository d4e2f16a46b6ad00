/* SPDX-License-Identifier: MIT */
/*
 * fault: every fault site of a scripted workload, failed one at a time (manager/fault.h).
 *
 * The workload (host backend, t_small_config geometry, one save thread so saves are real,
 * recall of 2 blocks into an 8-frame cache, a host tier small enough that blocks spill to a
 * disk tier in a mkdtemp directory) creates a manager and seven sequences, prefills every
 * layer (in both orders), decodes in batches across block boundaries, recalls (scored and
 * given, evicting other sequences' frames), attends, reads resident and host-only tokens,
 * preempts and resumes, spills and fetches (explicitly, and through reads, decode and
 * resume), runs the scheduler over three requests (it preempts and resumes one), then works
 * the prefix cache: a sequence created with a hash chain caches its spans; a second shares
 * part of them and prefills the rest in chunks (the chunk alone, rows from 0, rows from
 * halfway; each layer's last chunk assembles the layer from the host history) between loads
 * of its history; both are spilled (their shared blocks stay) and destroyed, a prefill that
 * needs host room sends the idle spans to the spill file, and a third sequence's create
 * reads them back; prefix matches in between. It destroys sequences and the manager. Every
 * library call of it is one numbered step whose result is known in advance (0; -ENOTSUP for
 * spill and fetch in a build without the disk tier; the tokens of each prefix match).
 *
 *   1. Counting runs (kvt_fault_arm(mask, 0)) give K, the hits of the whole workload, and the
 *      hits after every step; one run per site class gives the split.
 *   2. A fault-free snapshot run records the visible state before every step: the stats, the
 *      scheduler's pending count, and per sequence its info, token counts, resident
 *      positions, frames, recall views and attention output; also the outputs of the attend
 *      steps and the state and attention at the end.
 *   3. For N in 1..K a run fails hit N. The call that takes it must return a negative errno
 *      and change nothing visible: the state right after it must equal the fault-free
 *      state before it, except where blocks sit between host and disk (the documented
 *      exceptions: a fetch keeps the sequences that came back, a spill the blocks it wrote,
 *      and stats.disk_io_errors counts the failure). Every token of every live sequence must
 *      then read back bit-exact through kvt_seq_read_token and kvt_seq_read_token_host. The
 *      call is retried once with the hook disarmed: it must succeed and leave the state the
 *      fault-free run had after it. Every later step must return what it did without the
 *      fault (attention outputs bit for bit); at the end every token is read back again, the
 *      state is compared with the fault-free end, and attention after a recall of fixed
 *      blocks must match. The ASan build's leak check covers every failure path.
 *      A call may take its fault and succeed only where nothing is lost (see absorbed()).
 *      The prefix cache is best effort: a fault may cost it a span (a create that could not
 *      read one back shares less; a span that could not be written to the spill file is
 *      dropped; a last prefill that could not cache its spans leaves them out), so a later
 *      match may come out shorter, never longer. The run then prefills from where its match
 *      ends and is compared at the end by content (CMP_SHORT), not by what sharing saved.
 *
 * Problems are collected (the first of each run) and listed at the end, grouped by the call
 * that took the fault, the site and the kind; the test fails if there is any. Environment:
 * KVT_FAULT_ONLY=<n> walks hit n only, KVT_FAULT_STRIDE=<n> one hit in n (a quick run, without
 * KVT_TEST_LONG=1, walks one in 4), KVT_FAULT_VERBOSE=1 prints every problem,
 * KVT_FAULT_STEPS=1 prints the steps and their hits; TMPDIR chooses where the spill
 * directory is made (default /tmp).
 */
#include "test_fault.h"

#define RC_FRAMES 8	/* recall cache frames */
#define DEV_GROUPS 36	/* device groups of resident sets: the scheduler preempts */
#define HOST_GROUPS 256 /* host groups without a disk tier */
#define HOST_GROUPS_DISK 48

#define MAX_PROBLEMS 64

const uint64_t seq_id[N_IDS] = {11, 12, 13, 14, 21, 22, 23, 31, 32, 33, 34};
const uint32_t seq_prompt[N_IDS] = {48, 40, 20, 64, 32, 44, 16, 56, 60, 52, 96};
const uint32_t seq_max_new[N_IDS] = {0, 0, 0, 0, 6, 5, 4}; /* scheduler requests */
/* Prompts that begin with another's tokens: positions below seq_base_len[j] hold those of
   sequence seq_base[j] (the spans their hash chains share), the rest their own. */
const uint64_t seq_base[N_IDS] = {[Q] = 31, [R] = 31};
const uint32_t seq_base_len[N_IDS] = {[Q] = 32, [R] = 48};

static const char *const site_name[KVT_FAULT_SITES + 1] = {"alloc", "xfer",  "io",
							   "cuda",  "stage", "none"};

/* ---- what the fault-free runs recorded ---------------------------------------------------- */

struct kvt_config g_cfg;
bool g_disk;	  /* the build has a disk tier (spill does not say -ENOTSUP) */
char g_dir[256];  /* spill directory */
uint32_t g_steps; /* steps of the fault-free workload */
const char *g_name[MAX_STEPS];
uint64_t g_hits_after[MAX_STEPS]; /* hits (all sites) after each step */
uint64_t g_k;			  /* hits of the whole workload, all sites */
uint64_t g_k_site[KVT_FAULT_SITES];
struct snap *g_snap[MAX_STEPS + 1]; /* before each step */
/* g_snap[i] is not the state right after step i - 1: the end checks ran in between */
bool g_snap_gap[MAX_STEPS + 1];
float *g_att[MAX_STEPS]; /* output of each attend step */
struct snap *g_end;	 /* at the end of the workload */
int g_end_att_rc[N_IDS][NL];
float g_end_att[N_IDS][NL][NQ * HD];
uint32_t g_sched_preempted, g_sched_resumed, g_sched_iters;

/* figures of the walk */
uint64_t g_walked[KVT_FAULT_SITES], g_failed, g_absorbed, g_retried, g_placement;
uint64_t g_tokens, g_lost, g_create_failed, g_log_msgs;
uint64_t g_short;

struct absorbed g_abs[32];
uint32_t g_n_abs;

static struct errs g_errs[32];
static uint32_t g_n_errs;

struct errs *count_error(const char *call, int rc)
{
	uint32_t i, k;

	for (i = 0; i < g_n_errs && strcmp(g_errs[i].call, call); i++)
		;
	if (i == g_n_errs) {
		if (g_n_errs == sizeof(g_errs) / sizeof(g_errs[0]))
			return NULL;
		g_errs[g_n_errs++].call = call;
	}
	for (k = 0; k < 8 && g_errs[i].count[k] && g_errs[i].rc[k] != rc; k++)
		;
	if (k < 8) {
		g_errs[i].rc[k] = rc;
		g_errs[i].count[k]++;
	}
	return &g_errs[i];
}

/* ---- problems ------------------------------------------------------------------------------ */

static struct problem g_prob[MAX_PROBLEMS];
uint32_t g_n_prob;
uint64_t g_prob_total, g_prob_dropped;
bool g_verbose;

struct run *g_run; /* for check_context */

static void run_context(char *buf, size_t len)
{
	if (g_run)
		snprintf(buf, len, "mode %d, N=%llu, step %u (%s): ", (int)g_run->mode,
			 (unsigned long long)g_run->nth, g_run->step,
			 g_run->what ? g_run->what : "-");
}

/* Records a problem of run r; only its first one counts (what follows is usually a
   consequence). The key groups problems by the call that took the fault, the site and kind. */
void problem(struct run *r, const char *kind, const char *fmt, ...)
{
	char msg[1800], key[160], first[2000];
	va_list ap;
	uint32_t i;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (r->tainted) {
		g_prob_dropped++;
		return;
	}
	r->tainted = true;
	g_prob_total++;
	if (r->mode == MODE_FAULT)
		snprintf(key, sizeof(key), "%s, %s hit: %s", r->fault_at ? r->fault_at : r->what,
			 site_name[r->fault_at ? r->site : KVT_FAULT_SITES], kind);
	else
		snprintf(key, sizeof(key), "fault-free run (mode %d): %s", (int)r->mode, kind);
	snprintf(first, sizeof(first), "N=%llu, fault in step %u (%s), at step %u (%s): %s",
		 (unsigned long long)r->nth, r->fault_at ? r->fault_step : 0,
		 r->fault_at ? r->fault_at : "-", r->step, r->what ? r->what : "-", msg);
	if (g_verbose)
		print_message("# problem: %s\n", first);
	for (i = 0; i < g_n_prob; i++)
		if (!strcmp(g_prob[i].key, key))
			break;
	if (i == g_n_prob) {
		if (g_n_prob == MAX_PROBLEMS)
			return;
		g_n_prob++;
		snprintf(g_prob[i].key, sizeof(g_prob[i].key), "%s", key);
		snprintf(g_prob[i].first, sizeof(g_prob[i].first), "%s", first);
	}
	g_prob[i].count++;
}

/* ---- the hook ------------------------------------------------------------------------------ */

uint64_t hits_now(const struct run *r)
{
	return r->hit_base + (r->armed && !r->paused ? kvt_fault_hits() : 0);
}

/* Stops counting for checks that are not part of the workload (snapshots, read-back). */
void pause_hook(struct run *r)
{
	if (!r->armed || r->paused)
		return;
	r->hit_base += kvt_fault_disarm();
	r->paused = true;
}

void resume_hook(struct run *r)
{
	if (!r->armed || !r->paused)
		return;
	r->paused = false;
	kvt_fault_arm(r->mask, r->mode == MODE_FAULT ? r->nth - r->hit_base : 0);
}

/* ---- deterministic data ---------------------------------------------------------------------- */

/* Attention queries of (seq, layer), f32 [NQ][HD]. */
void attend_q(uint64_t id, uint32_t l, float *q)
{
	for (uint32_t g = 0; g < NQ; g++)
		for (uint32_t d = 0; d < HD; d++)
			q[g * HD + d] = t_value(id, l, 3000 + g, 0, d, 0);
}

/* The sequence whose values position pos of sequence j holds. */
uint64_t data_id(uint32_t j, uint32_t pos)
{
	return pos < seq_base_len[j] ? seq_base[j] : seq_id[j];
}

/* ---- setup ----------------------------------------------------------------------------------- */

void log_sink(void *user, enum kvt_log_level level, const char *msg)
{
	(void)user;
	(void)level;
	(void)msg;
	g_log_msgs++;
}

struct kvt_config fault_config(bool disk)
{
	struct kvt_config c = t_small_config();
	uint64_t block = 2ull * BT * HD * kvt_dtype_size(c.dtype), group = block * NH;

	c.save_threads = 1;
	c.staging_bytes = 4096; /* a prefill save of 48 tokens takes two chunks */
	c.recall_blocks = RB;
	c.ws_window = 4;
	c.recall_cache_bytes = RC_FRAMES * block;
	c.device_bytes = DEV_GROUPS * group + c.recall_cache_bytes;
	c.host_bytes = (disk ? HOST_GROUPS_DISK : HOST_GROUPS) * group;
	c.spill_dir = g_dir;
	c.disk_queue_depth = 8;
	return c;
}

/* Whether this build has a disk tier: a spill that does not answer -ENOTSUP. */
bool probe_disk(void)
{
	struct kvt_config c = fault_config(false);
	struct kvt_manager *m = NULL;
	size_t rb = (size_t)HD * kvt_dtype_size(c.dtype);
	uint8_t *k = t_xmalloc(NH * 16 * rb), *v = t_xmalloc(NH * 16 * rb);
	int rc;

	CHECK_RC(t_manager_create(&c, &m), 0);
	CHECK_RC(kvt_seq_create(m, 1, 16), 0);
	t_fill_prefill(&c, 1, 0, 16, k, v, NULL);
	CHECK_RC(t_prefill_layer(m, 1, 0, k, v, NULL, NULL), 0);
	rc = kvt_seq_spill(m, 1);
	kvt_manager_destroy(m);
	free(k);
	free(v);
	return rc != -ENOTSUP;
}

void print_errors(void)
{
	for (uint32_t i = 0; i < g_n_errs; i++) {
		char line[256];
		size_t n = 0;

		for (uint32_t k = 0; k < 8 && g_errs[i].count[k] && n < sizeof(line); k++)
			n += (size_t)snprintf(line + n, sizeof(line) - n, "%s%d x%u", k ? ", " : "",
					      g_errs[i].rc[k], g_errs[i].count[k]);
		print_message("# failed %-20s %s; %u moved blocks between host and disk\n",
			      g_errs[i].call, line, g_errs[i].placement);
	}
}

void print_problems(void)
{
	for (uint32_t a = 0; a < g_n_abs; a++)
		print_message("# absorbed: %s took %u %s faults and succeeded (first N=%llu)\n",
			      g_abs[a].call, g_abs[a].count, site_name[g_abs[a].site],
			      (unsigned long long)g_abs[a].first_n);
	for (uint32_t i = 0; i < g_n_prob; i++)
		print_message("# problem %u (%u runs): %s\n#   first: %s\n", i + 1, g_prob[i].count,
			      g_prob[i].key, g_prob[i].first);
	if (g_prob_dropped)
		print_message("# (%llu further problems in runs that already had one)\n",
			      (unsigned long long)g_prob_dropped);
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_fault_shared_site),
					   cmocka_unit_test(test_fault_walk)};

	check_context = run_context;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
