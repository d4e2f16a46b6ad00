/* SPDX-License-Identifier: MIT */
/*
 * The manager's life cycle (manager/manager.c), beyond the public API. Calls recall.c,
 * spill.c and base.c.
 */
#ifndef KVT_MANAGER_H
#define KVT_MANAGER_H

#include "backend.h"
#include "kvtier.h"

/* Creates a manager on an explicit backend, bypassing the public backend choice (benchmarks
   use the null backend this way). */
int kvt_manager_create_with(const struct kvt_config *cfg, const struct kvt_backend_ops *ops,
			    struct kvt_manager **out);

/* The backend's transfer figures (zero where it keeps none) as kvt_manager_stats reads them,
   without settling anything: for a benchmark reading them between the calls it times. */
void kvt_manager_be_stats(const struct kvt_manager *m, struct kvt_be_stats *out);

#endif /* KVT_MANAGER_H */
