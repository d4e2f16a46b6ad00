/* SPDX-License-Identifier: MIT */
/* placeholder while the disk tier is written (not committed) */
#include "internal.h"

KVT_API int kvt_seq_fetch(struct kvt_manager *m, const uint64_t *seqs, uint32_t n)
{
	(void)m; (void)seqs; (void)n;
	return -ENOTSUP;
}

KVT_API int kvt_seq_spill(struct kvt_manager *m, uint64_t seq)
{
	(void)m; (void)seq;
	return -ENOTSUP;
}
