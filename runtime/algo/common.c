/* common.c — the step helpers every algorithm uses and the algorithm choice
 * (CRUN_ALGO override, else by message size and world size). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"

int crun__send(crun__link_t *l, crun__coll_t *c, int to, const void *buf, size_t bytes) {
  crun__xfer_t x = {.to = to, .sbuf = buf, .sbytes = bytes, .from = -1};
  return l->xfer(l->impl, c, &x);
}

int crun__recv(crun__link_t *l, crun__coll_t *c, int from, void *buf, size_t bytes) {
  crun__xfer_t x = {.to = -1, .from = from, .rbuf = buf, .rbytes = bytes};
  return l->xfer(l->impl, c, &x);
}

int crun__sendrecv(crun__link_t *l, crun__coll_t *c, int to, const void *sbuf, size_t sbytes,
                   int from, void *rbuf, size_t rbytes) {
  crun__xfer_t x = {.to = to, .sbuf = sbuf, .sbytes = sbytes, .from = from, .rbuf = rbuf,
                    .rbytes = rbytes};
  return l->xfer(l->impl, c, &x);
}

int crun__finish_avg(crun__link_t *l, crun__coll_t *c, void *buf, size_t count) {
  if (c->op != CRUN_OP_AVG || count == 0) return 0;
  return crun_scale_div(c->dt, buf, count, (double)(l->avg_size > 0 ? l->avg_size : l->size));
}

static const crun__algo_t *const all_algos[] = {
#define CRUN_X_ALGO_REF(name) &crun__algo_##name,
    CRUN_ALGO_LIST(CRUN_X_ALGO_REF)
#undef CRUN_X_ALGO_REF
};

static const char *const all_names[] = {
#define CRUN_X_ALGO_NAME(name) #name,
    CRUN_ALGO_LIST(CRUN_X_ALGO_NAME)
#undef CRUN_X_ALGO_NAME
};

/* Whether item (len bytes) is an algorithm's name or its full name. */
static int known_algo(const char *item, size_t len) {
  for (size_t i = 0; i < sizeof all_algos / sizeof all_algos[0]; i++)
    if ((strlen(all_algos[i]->name) == len && !strncmp(item, all_algos[i]->name, len)) ||
        (strlen(all_names[i]) == len && !strncmp(item, all_names[i], len)))
      return 1;
  return 0;
}

int crun__algo_check_env(const char *env) {
  if (!env || !*env) return 0;
  for (const char *p = env;; p++) {
    size_t len = strcspn(p, ",");
    if (!known_algo(p, len)) {
      char known[512] = "";
      for (size_t i = 0; i < sizeof all_names / sizeof all_names[0]; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", all_names[i]);
      return crun_error(CRUN_EINVAL, "CRUN_ALGO=%s: unknown algorithm '%.*s' (known: %s, or the part after '_')",
                        env, (int)len, p, known);
    }
    p += len;
    if (!*p) return 0;
  }
}

/* Returns the algorithm for `kind` named in the comma list CRUN_ALGO, or NULL. */
static const crun__algo_t *env_pick(int kind, const char *env) {
  if (!env) env = getenv("CRUN_ALGO");
  if (!env || !*env) return NULL;
  for (size_t i = 0; i < sizeof all_algos / sizeof all_algos[0]; i++) {
    const crun__algo_t *a = all_algos[i];
    if (a->kind != kind) continue;
    size_t n = strlen(a->name);
    for (const char *p = env; (p = strstr(p, a->name)) != NULL; p += n) {
      int start = p == env || p[-1] == ',' || p[-1] == '_';
      int end = p[n] == 0 || p[n] == ',';
      if (start && end) return a;
    }
  }
  return NULL;
}

const crun__algo_t *crun__algo_pick(const crun__coll_t *c, int size, const char *algo_env) {
  const crun__algo_t *a = env_pick(c->kind, algo_env);
  if (a) return a;
  size_t bytes = c->count * crun_dtype_size(c->dt);
  switch (c->kind) {
  case CRUN__COLL_ALL_REDUCE:
    return bytes < (256u << 10) || size < 2 ? &crun__algo_allreduce_rd : &crun__algo_allreduce_ring;
  case CRUN__COLL_BROADCAST:
    return bytes < (1u << 20) || size <= 2 ? &crun__algo_bcast_binomial : &crun__algo_bcast_chain;
  case CRUN__COLL_REDUCE: return &crun__algo_reduce_binomial;
  case CRUN__COLL_ALL_GATHER: return &crun__algo_allgather_ring;
  case CRUN__COLL_GATHER: return &crun__algo_gather_linear;
  case CRUN__COLL_SCATTER: return &crun__algo_scatter_linear;
  case CRUN__COLL_REDUCE_SCATTER: return &crun__algo_reduce_scatter_ring;
  case CRUN__COLL_ALL_TO_ALL: return &crun__algo_alltoall_pairwise;
  case CRUN__COLL_BARRIER: return &crun__algo_barrier_dissemination;
  }
  return NULL;
}
