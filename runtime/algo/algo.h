/* algo.h — collective algorithms over point-to-point steps, one per file.
 *
 * An algorithm sees the group as a crun__link_t: its rank and size, a step
 * function (send to one peer while receiving from another, optionally reducing
 * what arrives) and a scratch allocator. It never touches sockets, so any
 * transport that provides `xfer` runs every algorithm. */
#ifndef CRUN_ALGO_H
#define CRUN_ALGO_H

#include "pg/pg_internal.h"

/* One step: send sbytes to `to` and/or receive rbytes from `from` (-1: none).
 * With red_dst set, received elements are reduced (c->op) into red_dst as
 * they arrive, rbuf being scratch of rbytes. check: a root_agree step
 * (crun__root_agree), whose frames do not carry the call's data and are
 * compared without the root. */
typedef struct {
  int to;
  const void *sbuf;
  size_t sbytes;
  int from;
  void *rbuf;
  size_t rbytes;
  void *red_dst;
  int check;
} crun__xfer_t;

typedef struct crun__link {
  int rank, size;
  void *impl;
  int (*xfer)(void *impl, crun__coll_t *c, const crun__xfer_t *x);
  /* Returns a buffer of at least n bytes valid until the next call (cached). */
  void *(*scratch)(void *impl, size_t n);
  /* CRUN_ALGO as it was when the group was made ("" when unset), read once
   * rather than on every call; NULL: read the environment per call */
  const char *algo;
  /* how many ranks an avg divides by (0: size); a stage among some ranks of
   * a larger group (hier.c) divides by the group's size */
  int avg_size;
  /* the group whose ranks the link's ranks are, for error texts (CRUN__WHO);
   * NULL on a link among other indices (hier.c's hosts): named as they are */
  const crun_pg_t *pg;
} crun__link_t;

typedef int (*crun__algo_fn)(crun__link_t *l, crun__coll_t *c);

typedef struct {
  const char *name;   /* selectable with CRUN_ALGO=<name> */
  int kind;           /* CRUN__COLL_* */
  crun__algo_fn run;
} crun__algo_t;

/* Picks the algorithm for c on a group of `size` ranks: CRUN_ALGO when it
 * names one for c's kind, else by message size and world size. algo_env is
 * CRUN_ALGO's value (NULL: getenv it). */
const crun__algo_t *crun__algo_pick(const crun__coll_t *c, int size, const char *algo_env);

/* Checks CRUN_ALGO's comma list: each item an algorithm's name ("ring") or
 * full name ("allreduce_ring"). Returns 0, or EINVAL naming the unknown item
 * (a misspelt name would silently leave the default algorithms in place). */
int crun__algo_check_env(const char *env);

/* Helpers shared by the algorithms. */
static inline size_t crun__esize(const crun__coll_t *c) { return crun_dtype_size(c->dt); }

/* Element range [*off, *off + *n) of block b when count is split in `parts`. */
static inline void crun__block(size_t count, int parts, int b, size_t *off, size_t *n) {
  size_t q = count / (size_t)parts, r = count % (size_t)parts, ub = (size_t)b;
  *off = ub * q + (ub < r ? ub : r);
  *n = q + (ub < r ? 1 : 0);
}

/* Sends / receives / both in one step. */
int crun__send(crun__link_t *l, crun__coll_t *c, int to, const void *buf, size_t bytes);
int crun__recv(crun__link_t *l, crun__coll_t *c, int from, void *buf, size_t bytes);
int crun__sendrecv(crun__link_t *l, crun__coll_t *c, int to, const void *sbuf, size_t sbytes,
                   int from, void *rbuf, size_t rbytes);

/* For a rooted collective on a link of 2 or more ranks: the ranks agree on
 * c->root before any data moves (root_agree.c); EMISMATCH naming both roots
 * and the ranks that gave them otherwise, on every rank. */
int crun__root_agree(crun__link_t *l, crun__coll_t *c);

/* Divides the result by l->avg_size (0: l->size) when c->op is AVG. */
int crun__finish_avg(crun__link_t *l, crun__coll_t *c, void *buf, size_t count);

#define CRUN_ALGO_LIST(X)                                                   \
  X(allreduce_ring) X(allreduce_rd) X(bcast_binomial) X(bcast_chain)        \
  X(reduce_binomial) X(allgather_ring) X(gather_linear) X(scatter_linear)   \
  X(reduce_scatter_ring) X(alltoall_pairwise) X(barrier_dissemination)

#define CRUN_X_ALGO_DECL(name) extern const crun__algo_t crun__algo_##name;
CRUN_ALGO_LIST(CRUN_X_ALGO_DECL)
#undef CRUN_X_ALGO_DECL

#endif
