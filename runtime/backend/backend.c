/* backend.c — the backend registry and vtable slot lookup. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

crun_backend_fn crun__backend_slot(const crun_backend_vtable_t *vt, int kind) {
  switch (kind) {
  case CRUN__COLL_SEND: return vt->send;
  case CRUN__COLL_RECV: return vt->recv;
  case CRUN__COLL_BROADCAST: return vt->broadcast;
  case CRUN__COLL_ALL_REDUCE: return vt->all_reduce;
  case CRUN__COLL_REDUCE: return vt->reduce;
  case CRUN__COLL_ALL_GATHER: return vt->all_gather;
  case CRUN__COLL_GATHER: return vt->gather;
  case CRUN__COLL_SCATTER: return vt->scatter;
  case CRUN__COLL_REDUCE_SCATTER: return vt->reduce_scatter;
  case CRUN__COLL_ALL_TO_ALL: return vt->all_to_all;
  case CRUN__COLL_BARRIER: return vt->barrier;
  }
  return NULL;
}

const char *crun__backend_names(void) {
  const crun_backend_vtable_t *mpi = CRUN__BACKEND_MPI, *nccl = &crun__backend_nccl;
  if (mpi && nccl) return "cpu, mpi, nccl";
  if (mpi) return "cpu, mpi";
  return nccl ? "cpu, nccl" : "cpu";
}

const crun_backend_vtable_t *crun__backend_auto_device(const char *name) {
  int is_auto = !name || !*name || !strcmp(name, "auto");
  const crun_backend_vtable_t *nccl = &crun__backend_nccl;
  if (!is_auto || !nccl || (nccl->available && !nccl->available())) return NULL;
  return crun__backend_find(name) == &crun__backend_cpu ? nccl : NULL;
}

/* mpirun/srun started this process and crun-lua did not spawn it (CRUN_LAUNCHER). */
static int started_by_mpirun(void) {
  return (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE")) && !getenv("CRUN_LAUNCHER");
}

const crun_backend_vtable_t *crun__backend_find(const char *name) {
  int is_auto = !name || !*name || !strcmp(name, "auto");
  const crun_backend_vtable_t *mpi = CRUN__BACKEND_MPI, *nccl = &crun__backend_nccl;
  if (mpi && (is_auto ? started_by_mpirun() : !strcmp(name, "mpi"))) return mpi;
  if (nccl && !is_auto && !strcmp(name, "nccl")) return nccl;
  if (is_auto || !strcmp(name, "cpu") || !strcmp(name, "gloo") || !strcmp(name, "tcp"))
    return &crun__backend_cpu;
  return NULL;
}
