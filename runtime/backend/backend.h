/* backend.h — the one fixed vtable every backend fills (cpu, later mpi and
 * nccl), and the engine hook through which a collective engine (the same-host
 * shared-memory one) takes over collectives of a cpu group.
 *
 * A slot left NULL means "not supported": the group fails the call with
 * CRUN_ENOTSUP naming the backend and the collective. Every collective slot
 * gets the descriptor with its deadline set and must return by it. */
#ifndef CRUN_BACKEND_H
#define CRUN_BACKEND_H

#include "pg/pg_internal.h"

typedef int (*crun_backend_fn)(void *state, crun__coll_t *c);

typedef struct crun_backend_vtable {
  const char *name;
  /* Connects the group (blocks, collective over its ranks). */
  int (*create)(crun_pg_t *pg, void **state);
  /* Tells the peers the group failed (best effort, never blocks) and closes. */
  void (*abort)(void *state, int status, const char *text);
  void (*destroy)(void *state);
  /* Optional: makes the state of sub-group pg (NULL on parent ranks that are
   * not members) from the parent's; every parent rank calls it, after the
   * parent agreed on the members. NULL: create is used. */
  int (*split)(void *parent_state, crun_pg_t *pg, void **state);
  /* Optional: non-zero when this process can use the backend (a GPU). */
  int (*available)(void);
  int device;       /* its buffers are device memory (CUDA) */
  int posts_obs;    /* its collectives call crun__obs_posted (core/trace_int.h) */
  int destroy_pending; /* destroy fails pending p2p work (ECLOSED) and closes: crun_pg_destroy may
                        * call it while Work handles still hold the group */
  int private_board; /* its ranks meet through the backend alone, each on a store of its own
                      * (mpi under mpirun): no peer reads the group's progress board */
  /* Optional: checks that the backend can run kind on dt (with op when it
   * reduces) before anything is queued; ENOTSUP naming them (and pg's rank) otherwise. */
  int (*validate)(int kind, crun_dtype_t dt, int has_op, crun_reduce_op_t op, const crun_pg_t *pg);
  /* Optional: non-zero when failing the group (abort) reaches every peer of
   * call c while it runs or at its next call, so that a rank whose own check
   * refused c can tell them why (coll.c); 0 or NULL: it cannot, and the
   * refusing rank only returns its error. */
  int (*abort_reaches)(void *state, const crun__coll_t *c);
  /* Optional: the function (and in *fn_state its state) that runs every
   * call of kind on this group without the backend's own dispatch, or NULL
   * when there is none. Asked once, when the group is made; the group then
   * calls it directly for host calls of kind (an all_reduce: the hot path of
   * a small one, pg/work.c crun__pg_execute). */
  crun_backend_fn (*direct)(void *state, int kind, void **fn_state);
  /* Optional: non-zero when peer q of the group is gone for good (its
   * process ended, or it closed or failed the group), as far as this rank
   * can tell at once without blocking; 0 when it cannot tell. Read by a
   * refusal's agreement (coll.c), so that it stops at once. */
  int (*peer_gone)(void *state, int q);
  crun_backend_fn send, recv, broadcast, all_reduce, reduce, all_gather, gather,
      scatter, reduce_scatter, all_to_all, barrier;
} crun_backend_vtable_t;

/* Returns the slot of `kind` (NULL when unsupported). */
crun_backend_fn crun__backend_slot(const crun_backend_vtable_t *vt, int kind);

/* Returns the backend named `name` ("cpu", "mpi", "nccl" when built in), or
 * NULL. NULL/"auto" give mpi when started by mpirun/srun (OMPI_COMM_WORLD_SIZE
 * or PMI_SIZE set) and MPI is built in, else cpu. */
const crun_backend_vtable_t *crun__backend_find(const char *name);

/* For backend "auto": the device backend to pair with the cpu one (nccl
 * when built in and a GPU is present), else NULL. */
const crun_backend_vtable_t *crun__backend_auto_device(const char *name);

/* Returns the names of the backends in this build ("cpu, mpi"). */
const char *crun__backend_names(void);

extern const crun_backend_vtable_t crun__backend_cpu;
/* Defined by runtime/backend/mpi/ (built when CRUN_HAVE_MPI; referenced
 * strongly so static links pull it in) and runtime/backend/nccl/ (weak until
 * that backend exists: an absent backend is simply not found). */
#if CRUN_HAVE_MPI
extern const crun_backend_vtable_t crun__backend_mpi;
#define CRUN__BACKEND_MPI (&crun__backend_mpi)
#else
#define CRUN__BACKEND_MPI ((const crun_backend_vtable_t *)0)
#endif
extern const crun_backend_vtable_t crun__backend_nccl __attribute__((weak));

/* A collective engine attached to a cpu group: when supports(c) is non-zero,
 * run(c) does the whole collective instead of the TCP algorithms. */
typedef struct crun__engine {
  const char *name;
  void *state;
  int (*supports)(void *state, const crun__coll_t *c);
  int (*run)(void *state, crun__coll_t *c);
  void (*destroy)(void *state);
  /* Optional: the group failed on this rank (status, text); makes the peers
   * waiting in the engine, now or at their next call, fail with that text
   * instead of waiting for this rank until it exits or their deadline. Never
   * blocks; may run on another thread than run. */
  void (*abort)(void *state, int status, const char *text);
  int posts_obs; /* run calls crun__obs_posted before it waits (core/trace_int.h) */
  /* Optional: runs an all_reduce as run does, when supports takes every
   * all_reduce (the backend's direct), setting crun__obs_algo itself */
  int (*all_reduce)(void *state, crun__coll_t *c);
} crun__engine_t;

/* Optional hook, defined by the shm engine when it is linked in: called by the
 * cpu backend once the TCP mesh is up (so it may use collectives over `pg`'s
 * store); returns 0 with *out filled to attach, CRUN_ENOTSUP to decline. It
 * must return the same decision on every rank (decide collectively). */
int crun__shm_engine_open(crun_pg_t *pg, crun__engine_t *out) __attribute__((weak));

#endif
