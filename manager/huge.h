/* SPDX-License-Identifier: MIT */
/*
 * Table memory on transparent huge pages. The recall state of each (sequence, layer) (its key
 * table, slots, order list, frames, block metadata, views and working set) and each
 * sequence's block group table are read at random, a few bytes a block,
 * across hundreds of MB at a large batch: with 4 KiB pages nearly every lookup also misses the
 * TLB, and under a hypervisor each such miss is a two-level page walk. These tables come from
 * a private jemalloc arena whose fresh mappings are marked MADV_HUGEPAGE, so the kernel backs
 * them with 2 MiB pages where it can (the system's THP setting "madvise" or "always"; with
 * "never" they stay small and nothing else changes).
 *
 * Builds with AddressSanitizer or ThreadSanitizer, a process where the arena cannot be made,
 * and one started with KVTIER_HUGE_TABLES=0 in its environment use the C library's allocator
 * instead (so that the sanitizers see every table; or where huge pages cost more than they
 * save, e.g. a kernel that compacts memory on faults in marked mappings). The choice is made
 * once per process; a pointer from kvt_huge_realloc goes back only through kvt_huge_realloc
 * or kvt_huge_free.
 */
#ifndef KVT_HUGE_H
#define KVT_HUGE_H

#include <stdbool.h>
#include <stddef.h>

/* realloc in table memory (p NULL: a fresh block), behind the KVT_FAULT_ALLOC site. NULL when
   out of memory or n == 0, and p then stays as it was. */
void *kvt_huge_realloc(void *p, size_t n);

/* calloc in table memory, behind the KVT_FAULT_ALLOC site: NULL when out of memory, when
   n * size overflows or is 0. */
void *kvt_huge_calloc(size_t n, size_t size);

/* Frees p (NULL: nothing). */
void kvt_huge_free(void *p);

/* Whether table memory comes from the huge-page arena in this process (false: the C
   library's allocator). */
bool kvt_huge_active(void);

#endif /* KVT_HUGE_H */
