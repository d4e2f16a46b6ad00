/* SPDX-License-Identifier: MIT */
#include <errno.h>

#include "fault.h"

atomic_uint kvt_fault_armed;

struct fault_state {
	bool armed, fired;
	bool shared; /* this thread holds the shared site (mask is that site) */
	uint32_t mask;
	uint64_t nth, hits;
	enum kvt_fault_site site;
};

static _Thread_local struct fault_state fs = {.site = KVT_FAULT_SITES};

/* The shared site's arming, counted on every thread. owner is taken (compare-and-swap) by
   the thread that arms it; nth and the count are reset before mask is published, and a hit
   loads mask first. Counts are exact when the site is armed and disarmed while no hit can
   happen (no save in flight), which is how a test uses it. */
static struct {
	atomic_bool owner;
	atomic_uint mask;
	atomic_uint_fast64_t nth, hits;
	atomic_bool fired;
} shared;

static void shared_release(void)
{
	atomic_store_explicit(&shared.mask, 0, memory_order_release);
	atomic_store_explicit(&shared.owner, false, memory_order_release);
	fs.shared = false;
}

int kvt_fault_arm(uint32_t mask, uint64_t nth)
{
	if (mask & ~(KVT_FAULT_ALL | KVT_FAULT_SHARED))
		return -EINVAL;
	if ((mask & KVT_FAULT_SHARED) && (mask & ~KVT_FAULT_SHARED))
		return -EINVAL;
	if ((mask & KVT_FAULT_SHARED) && !fs.shared) {
		bool expected = false;

		if (!atomic_compare_exchange_strong(&shared.owner, &expected, true))
			return -EBUSY;
	}
	if (fs.shared && !(mask & KVT_FAULT_SHARED))
		shared_release();
	if (!fs.armed)
		atomic_fetch_add_explicit(&kvt_fault_armed, 1, memory_order_relaxed);
	fs = (struct fault_state){.armed = true, .mask = mask, .nth = nth, .site = KVT_FAULT_SITES};
	if (mask & KVT_FAULT_SHARED) {
		fs.shared = true;
		atomic_store_explicit(&shared.mask, 0, memory_order_release);
		atomic_store_explicit(&shared.nth, nth, memory_order_relaxed);
		atomic_store_explicit(&shared.hits, 0, memory_order_relaxed);
		atomic_store_explicit(&shared.fired, false, memory_order_relaxed);
		atomic_store_explicit(&shared.mask, mask, memory_order_release);
	}
	return 0;
}

uint64_t kvt_fault_disarm(void)
{
	uint64_t hits = kvt_fault_hits();

	if (fs.shared) {
		fs.hits = hits;
		fs.fired = kvt_fault_fired();
		fs.site = kvt_fault_fired_site();
		shared_release();
	}
	if (fs.armed)
		atomic_fetch_sub_explicit(&kvt_fault_armed, 1, memory_order_relaxed);
	fs.armed = false;
	return hits;
}

uint64_t kvt_fault_hits(void)
{
	return fs.shared ? atomic_load_explicit(&shared.hits, memory_order_acquire) : fs.hits;
}

bool kvt_fault_fired(void)
{
	return fs.shared ? atomic_load_explicit(&shared.fired, memory_order_acquire) : fs.fired;
}

enum kvt_fault_site kvt_fault_fired_site(void)
{
	if (fs.shared)
		return kvt_fault_fired() ? KVT_FAULT_STAGE : KVT_FAULT_SITES;
	return fs.site;
}

bool kvt_fault_slow(enum kvt_fault_site site)
{
	if ((1u << site) & KVT_FAULT_SHARED) {
		if (!(atomic_load_explicit(&shared.mask, memory_order_acquire) & (1u << site)))
			return false;
		if (atomic_fetch_add_explicit(&shared.hits, 1, memory_order_acq_rel) + 1 !=
		    atomic_load_explicit(&shared.nth, memory_order_relaxed))
			return false;
		atomic_store_explicit(&shared.fired, true, memory_order_release);
		return true;
	}
	if (!fs.armed || !(fs.mask & (1u << site)))
		return false;
	if (++fs.hits != fs.nth)
		return false;
	fs.fired = true;
	fs.site = site;
	return true;
}
