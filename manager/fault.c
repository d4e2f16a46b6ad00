/* SPDX-License-Identifier: MIT */
#include "fault.h"

atomic_uint kvt_fault_armed;

struct fault_state {
	bool armed, fired;
	uint32_t mask;
	uint64_t nth, hits;
	enum kvt_fault_site site;
};

static _Thread_local struct fault_state fs = {.site = KVT_FAULT_SITES};

void kvt_fault_arm(uint32_t mask, uint64_t nth)
{
	if (!fs.armed)
		atomic_fetch_add_explicit(&kvt_fault_armed, 1, memory_order_relaxed);
	fs = (struct fault_state){.armed = true, .mask = mask, .nth = nth, .site = KVT_FAULT_SITES};
}

uint64_t kvt_fault_disarm(void)
{
	uint64_t hits = fs.hits;

	if (fs.armed)
		atomic_fetch_sub_explicit(&kvt_fault_armed, 1, memory_order_relaxed);
	fs.armed = false;
	return hits;
}

uint64_t kvt_fault_hits(void)
{
	return fs.hits;
}

bool kvt_fault_fired(void)
{
	return fs.fired;
}

enum kvt_fault_site kvt_fault_fired_site(void)
{
	return fs.site;
}

bool kvt_fault_slow(enum kvt_fault_site site)
{
	if (!fs.armed || !(fs.mask & (1u << site)))
		return false;
	if (++fs.hits != fs.nth)
		return false;
	fs.fired = true;
	fs.site = site;
	return true;
}
