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

/* The recall calls' host time so far by phase, in ns: each phase's wall time less the backend's
   time inside the runtime's calls during it (kvt_be_stats.runtime_ns: zero unless the backend
   times its calls, KVTIER_CUDA_TIME_CALLS=1). Kept only when the manager was created with
   KVTIER_TIME_PHASES=1 in the environment (all zero otherwise); a call makes five marks, each a
   clock read and a read of the backend's figures. */
struct kvt_phases {
	uint64_t settle; /* the layer's previous call settled: its fence waited for when not done,
			    its results applied to the host's copies */
	uint64_t check;	 /* the batch checked: members live and once, their tables grown, the
			    working sets their previous calls left counted */
	uint64_t size;	 /* the regions sized: targets, floors, drops and grows */
	uint64_t run;	 /* the members' decisions and loads; on the device the program written
			    (descriptors, cells, group entries) and queued */
};
void kvt_manager_phases(const struct kvt_manager *m, struct kvt_phases *out);

#endif /* KVT_MANAGER_H */
