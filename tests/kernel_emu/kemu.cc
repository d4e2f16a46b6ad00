/* SPDX-License-Identifier: MIT */
/*
 * The CPU kernel emulator's scheduler (see kemu.h): the threads of a CTA are fibers on the
 * launching thread, switched by Boost.Context's fcontext layer (what boost::context::fiber is
 * built on: a switch is a few instructions, where ucontext's also makes a sigprocmask system
 * call, which took nine tenths of the emulator's time). The scheduler runs every ready fiber
 * until it finishes or waits; then, when the whole of a warp waits at a shuffle (or a vote:
 * ballot, match, __syncwarp), it exchanges the values and readies the warp; when every thread of
 * the CTA waits at __syncthreads(), it readies them all; when neither can happen with threads still
 * waiting, the CTA can never finish on a GPU either, and the launch fails with the reason
 * (kemu_last_fault). Round-robin in the schedule's fixed order (kemu_set_schedule), so every run
 * is the same.
 *
 * Under ASan the stack switches are announced (__sanitizer_start/finish_switch_fiber), so ASan
 * keeps checking the fibers' stacks and the kernels' accesses.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/detail/fcontext.hpp>
#include <mutex>

#include "kemu.h"

#if defined(__SANITIZE_ADDRESS__)
#define KEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KEMU_ASAN 1
#endif
#endif
#ifdef KEMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

/* A fiber's stack. ASan clears the shadow of the whole stack at every switch, so larger stacks
   cost time there; the kernels need a few KiB. */
#define KEMU_STACK (128u << 10)

#define KEMU_MAX_THREADS 1024

namespace kemu
{

coords cur;

namespace
{

namespace bctx = boost::context::detail;

enum fstate { READY, AT_SYNC, AT_SHFL, DONE };

struct fiber {
	bctx::fcontext_t ctx; /* where the fiber resumes */
	char *stack;	      /* KEMU_STACK usable bytes above a guard page */
	uint3 tid;
	enum fstate state;
	/* the pending shuffle or vote (op 0: a shuffle) */
	int op;
	unsigned int mask, arg;
	int width;
	bool xor_lanes;
	uint64_t val, result;
};

struct sched {
	bctx::fcontext_t main; /* where the scheduler resumes, set by each switch to a fiber */
	fiber *f;
	uint32_t n; /* threads per CTA */
	void (*fn)(void *);
	void *closure;
	fiber *running;
	bool fault;
#ifdef KEMU_ASAN
	const void *main_bottom;
	size_t main_size;
#endif
};

/* One launch at a time in the process: launches from several threads take turns (no
   thread-local state: the emulator may live in a dlopened plugin, where LeakSanitizer can
   misread dynamic TLS). Recursive, so that a launch from inside a kernel is refused, not a
   deadlock. */
std::recursive_mutex launch_mu;
sched *S;
fiber *pool;
uint32_t pool_n;
cudaError_t last_err;
char fault_msg[512];
struct kemu_launch_info info;
int schedule = KEMU_SCHED_LOCKSTEP;

void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void fail(const char *fmt, ...)
{
	va_list ap;
	int at;

	at = snprintf(fault_msg, sizeof(fault_msg), "kemu: CTA (%u,%u,%u): ", cur.bid.x, cur.bid.y,
		      cur.bid.z);
	va_start(ap, fmt);
	vsnprintf(fault_msg + at, sizeof(fault_msg) - (size_t)at, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", fault_msg);
	S->fault = true;
}

/* Back to the scheduler; returns when the scheduler runs this fiber again. */
__attribute__((noinline)) void yield()
{
#ifdef KEMU_ASAN
	void *fake = nullptr;

	__sanitizer_start_switch_fiber(&fake, S->main_bottom, S->main_size);
#endif
	S->main = bctx::jump_fcontext(S->main, nullptr).fctx;
#ifdef KEMU_ASAN
	__sanitizer_finish_switch_fiber(fake, &S->main_bottom, &S->main_size);
#endif
}

/* A fiber's first frame; t.fctx is the scheduler that switched to it. Never returns: the last
   jump leaves the fiber for good (its stack is reused by the next launch). */
void entry(bctx::transfer_t t)
{
	S->main = t.fctx;
#ifdef KEMU_ASAN
	__sanitizer_finish_switch_fiber(nullptr, &S->main_bottom, &S->main_size);
#endif
	S->fn(S->closure);
	S->running->state = DONE;
#ifdef KEMU_ASAN
	__sanitizer_start_switch_fiber(nullptr, S->main_bottom, S->main_size);
#endif
	bctx::jump_fcontext(S->main, nullptr);
	__builtin_unreachable();
}

/* Fibers for n threads, their stacks kept for later launches. */
int pool_reserve(uint32_t n)
{
	long page = sysconf(_SC_PAGESIZE);

	if (n <= pool_n)
		return 0;
	fiber *p = (fiber *)realloc(pool, n * sizeof(*p));
	if (!p)
		return -ENOMEM;
	pool = p;
	for (; pool_n < n; pool_n++) {
		char *m = (char *)mmap(nullptr, KEMU_STACK + (size_t)page, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (m == MAP_FAILED)
			return -ENOMEM;
		mprotect(m, (size_t)page, PROT_NONE); /* an overflow faults, not corrupts */
		pool[pool_n].stack = m + page;
	}
	return 0;
}

__attribute__((noinline)) void switch_to(fiber *f)
{
	S->running = f;
	cur.tid = f->tid;
#ifdef KEMU_ASAN
	void *fake = nullptr;

	__sanitizer_start_switch_fiber(&fake, f->stack, KEMU_STACK);
#endif
	f->ctx = bctx::jump_fcontext(f->ctx, nullptr).fctx;
#ifdef KEMU_ASAN
	__sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

/* Resolves a warp whose lanes [w0, w0 + cnt) all wait at a shuffle; false after a fault. */
bool shuffle_warp(fiber *f, uint32_t w0, uint32_t cnt)
{
	unsigned int full = cnt == 32 ? 0xffffffffu : (1u << cnt) - 1;

	for (uint32_t l = 0; l < cnt; l++) {
		fiber *x = &f[w0 + l];

		if (x->mask != full) {
			fail("warp %u lane %u: shuffle mask %#x, but the warp's live lanes are %#x",
			     w0 / 32, l, x->mask, full);
			return false;
		}
		if (x->op != f[w0].op || x->xor_lanes != f[w0].xor_lanes ||
		    x->width != f[w0].width) {
			fail("warp %u: lanes at different shuffles", w0 / 32);
			return false;
		}
		if (x->op)
			continue;
		if (x->width <= 0 || x->width > 32 || (x->width & (x->width - 1))) {
			fail("warp %u: shuffle width %d", w0 / 32, x->width);
			return false;
		}
	}
	if (f[w0].op) { /* a vote */
		unsigned int ballot = 0;

		for (uint32_t l = 0; l < cnt; l++)
			ballot |= (f[w0 + l].val != 0 ? 1u : 0u) << l;
		for (uint32_t l = 0; l < cnt; l++) {
			fiber *x = &f[w0 + l];
			unsigned int same = 0;

			for (uint32_t o = 0; o < cnt; o++)
				same |= (f[w0 + o].val == x->val ? 1u : 0u) << o;
			x->result = x->op == VOTE_BALLOT ? ballot : x->op == VOTE_MATCH ? same : 0;
			x->state = READY;
		}
		return true;
	}
	for (uint32_t l = 0; l < cnt; l++) {
		fiber *x = &f[w0 + l];
		uint32_t w = (uint32_t)x->width, base = l & ~(w - 1);
		uint32_t src = x->xor_lanes ? l ^ x->arg : base + x->arg % w;

		/* CUDA: an xor source in a later width-segment gives the lane its own value */
		if (x->xor_lanes && src / w > l / w)
			src = l;
		if (src >= cnt) {
			fail("warp %u lane %u: shuffle reads lane %u, which does not exist",
			     w0 / 32, l, src);
			return false;
		}
		x->result = f[w0 + src].val;
	}
	for (uint32_t l = 0; l < cnt; l++)
		f[w0 + l].state = READY;
	return true;
}

/* Readies f to run thread t from the start (make_fcontext takes the stack's top). */
void fiber_init(fiber *f, uint32_t t)
{
	f->tid = uint3{t % cur.bdim.x, t / cur.bdim.x % cur.bdim.y, t / (cur.bdim.x * cur.bdim.y)};
	f->state = READY;
	f->ctx = bctx::make_fcontext(f->stack + KEMU_STACK, KEMU_STACK, entry);
}

/* Runs one CTA to its end; false after a fault. */
bool run_cta()
{
	fiber *f = S->f;
	uint32_t n = S->n;

	for (uint32_t t = 0; t < n; t++)
		fiber_init(&f[t], t);
	for (;;) {
		uint32_t live = 0, at_sync = 0, at_shfl = 0, done, nw = (n + 31) / 32;
		bool released = false;

		/* Each warp runs its ready lanes, and its shuffle resolves once all its lanes are
		   there. Lockstep: once per warp and round, so the warps advance together; warp at
		   a time: again and again until the warp waits for the CTA. */
		for (uint32_t i = 0; i < nw; i++) {
			uint32_t w0 = 32 * (schedule == KEMU_SCHED_WARPS_REVERSE ? nw - 1 - i : i);
			uint32_t cnt = n - w0 < 32 ? n - w0 : 32;
			bool again;

			do {
				uint32_t shfl = 0;

				for (uint32_t x = 0; x < cnt; x++) {
					uint32_t l = schedule == KEMU_SCHED_LANES_REVERSE
							     ? cnt - 1 - x
							     : x;

					if (f[w0 + l].state == READY)
						switch_to(&f[w0 + l]);
					if (S->fault)
						return false;
					shfl += f[w0 + l].state == AT_SHFL;
				}
				again = shfl == cnt;
				if (again && !shuffle_warp(f, w0, cnt))
					return false;
				released |= again;
			} while (again && (schedule == KEMU_SCHED_WARPS_FORWARD ||
					   schedule == KEMU_SCHED_WARPS_REVERSE));
		}
		for (uint32_t t = 0; t < n; t++) {
			live += f[t].state != DONE;
			at_sync += f[t].state == AT_SYNC;
			at_shfl += f[t].state == AT_SHFL;
		}
		if (live == 0)
			return true;
		if (released)
			continue;
		done = n - live;
		if (at_sync == live && done == 0) {
			for (uint32_t t = 0; t < n; t++)
				f[t].state = READY;
			continue;
		}
		/* nothing can move: a warp partly at a shuffle, or a barrier some threads left */
		for (uint32_t w0 = 0; at_shfl && w0 < n; w0 += 32) {
			uint32_t cnt = n - w0 < 32 ? n - w0 : 32, shfl = 0, gone = 0;

			for (uint32_t l = 0; l < cnt; l++) {
				shfl += f[w0 + l].state == AT_SHFL;
				gone += f[w0 + l].state == DONE;
			}
			if (shfl) {
				fail("warp %u: %u of %u lanes at a shuffle, %u returned, the rest at "
				     "__syncthreads()",
				     w0 / 32, shfl, cnt, gone);
				return false;
			}
		}
		fail("__syncthreads() reached by %u of %u threads, %u returned before it", at_sync,
		     n, done);
		return false;
	}
}

/* A launch refused before any thread ran: err, and why in fault_msg. */
cudaError_t refuse(cudaError_t err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

cudaError_t refuse(cudaError_t err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(fault_msg, sizeof(fault_msg), fmt, ap);
	va_end(ap);
	last_err = err;
	return err;
}

} /* namespace */

void sync_cta()
{
	S->running->state = AT_SYNC;
	yield();
}

uint64_t shuffle(unsigned int mask, uint64_t v, unsigned int arg, int width, bool xor_lanes)
{
	fiber *me = S->running;

	me->op = 0;
	me->mask = mask;
	me->val = v;
	me->arg = arg;
	me->width = width;
	me->xor_lanes = xor_lanes;
	me->state = AT_SHFL;
	yield();
	return me->result;
}

unsigned int vote(unsigned int mask, uint64_t v, enum vote_op op)
{
	fiber *me = S->running;

	me->op = op;
	me->mask = mask;
	me->val = v;
	me->arg = 0;
	me->width = 32;
	me->xor_lanes = false;
	me->state = AT_SHFL;
	yield();
	return (unsigned int)me->result;
}

cudaError_t run_grid(dim3 grid, dim3 block, size_t shmem, cudaStream_t stream, void (*fn)(void *),
		     void *closure)
{
	std::lock_guard<std::recursive_mutex> hold(launch_mu);
	uint64_t threads = (uint64_t)block.x * block.y * block.z;
	sched s = {};
	sched *outer = S;
	coords saved = cur;
	bool ok = true;
	int err;

	info.launches++;
	info.grid[0] = grid.x, info.grid[1] = grid.y, info.grid[2] = grid.z;
	info.block[0] = block.x, info.block[1] = block.y, info.block[2] = block.z;
	/* the limits of every GPU since sm_30 */
	if (!grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > 65535 ||
	    grid.z > 65535 || threads == 0 || threads > KEMU_MAX_THREADS || block.z > 64 ||
	    shmem > 48 * 1024)
		return refuse(cudaErrorInvalidConfiguration,
			      "kemu: invalid launch: grid (%u,%u,%u), block (%u,%u,%u), %zu bytes "
			      "shared",
			      grid.x, grid.y, grid.z, block.x, block.y, block.z, shmem);
	if (outer) /* a launch from a kernel: dynamic parallelism, which the backend never uses */
		return refuse(cudaErrorLaunchFailure, "kemu: a launch inside a kernel");
	if (pool_reserve((uint32_t)threads))
		return refuse(cudaErrorLaunchFailure, "kemu: no memory for %llu fibers",
			      (unsigned long long)threads);
	err = kemu_stream_begin(stream);
	if (err)
		return refuse((cudaError_t)err, "kemu: launch on a stream that is not live");
	s.f = pool;
	s.n = (uint32_t)threads;
	s.fn = fn;
	s.closure = closure;
	S = &s;
	cur.bdim = block;
	cur.gdim = grid;
	for (uint32_t z = 0; ok && z < grid.z; z++)
		for (uint32_t y = 0; ok && y < grid.y; y++)
			for (uint32_t x = 0; ok && x < grid.x; x++) {
				cur.bid = uint3{x, y, z};
				ok = run_cta();
			}
	S = outer;
	cur = saved;
	kemu_stream_end(stream);
	if (!ok) {
		info.faults++;
		last_err = cudaErrorLaunchFailure;
		return last_err;
	}
	return cudaSuccess;
}

} /* namespace kemu */

extern "C" {

void kemu_get_launch_info(struct kemu_launch_info *out)
{
	std::lock_guard<std::recursive_mutex> hold(kemu::launch_mu);

	*out = kemu::info;
}

int kemu_set_schedule(int mode)
{
	std::lock_guard<std::recursive_mutex> hold(kemu::launch_mu);
	int old = kemu::schedule;

	if (mode < KEMU_SCHED_LOCKSTEP || mode > KEMU_SCHED_LANES_REVERSE)
		return -1;
	kemu::schedule = mode;
	return old;
}

const char *kemu_last_fault(void)
{
	return kemu::fault_msg;
}

cudaError_t cudaGetLastError(void)
{
	std::lock_guard<std::recursive_mutex> hold(kemu::launch_mu);
	cudaError_t e = kemu::last_err;

	kemu::last_err = cudaSuccess;
	return e;
}

cudaError_t cudaPeekAtLastError(void)
{
	std::lock_guard<std::recursive_mutex> hold(kemu::launch_mu);

	return kemu::last_err;
}

} /* extern "C" */
