/* hier.h — transport selection for cpu groups (CRUN_TRANSPORT, CRUN_HOST_ID)
 * and the hierarchical engine for groups spanning hosts (hier.c). */
#ifndef CRUN_BACKEND_CPU_HIER_H
#define CRUN_BACKEND_CPU_HIER_H

#include "algo/algo.h"
#include "backend/backend.h"

typedef enum { CRUN__TR_AUTO, CRUN__TR_TCP, CRUN__TR_SHM } crun__transport_t;

/* Reads CRUN_TRANSPORT=tcp|shm|auto (unset: auto; CRUN_SHM=0 means tcp) into
 * *mode; CRUN_EINVAL names an unknown value. */
int crun__cpu_transport(crun__transport_t *mode);

/* Picks the engine of a cpu group once its TCP mesh (`tcp`, which must stay
 * valid until the engine is destroyed) is up; collective over the group.
 * Returns 0 with *out filled (the shared-memory engine on one host, the
 * hierarchical one across hosts), CRUN_ENOTSUP for plain TCP, or another
 * negative status (e.g. CRUN_TRANSPORT=shm with ranks on several hosts). */
int crun__cpu_engine_open(crun_pg_t *pg, crun__transport_t mode, const crun__link_t *tcp,
                          crun__engine_t *out);

/* Runs c on link l with the algorithm picked for l's size (float16/bfloat16
 * reductions accumulate in float32); defined in cpu.c. */
int crun__cpu_run_link(crun__link_t *l, crun__coll_t *c);

#endif
