/* root_agree.c — before a rooted collective (broadcast, reduce, gather,
 * scatter) runs over the TCP mesh, its ranks agree on the root: a
 * dissemination exchange (ceil(log2 n) rounds of 32 bytes) of the smallest
 * and the largest root given, each with the lowest rank that gave it. A root
 * that differs between ranks is otherwise seen by no frame (a rank that takes
 * itself for the root only sends) or leaves two roots waiting for each other
 * until the timeout; now every rank fails the call itself, with the same
 * text. CRUN_ROOT_CHECK=0 skips it (one step less per rooted call). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"

enum { MIN_ROOT, MIN_RANK, MAX_ROOT, MAX_RANK, WORDS };

/* Folds the pair (root, rank) of `got` into `mine`: the smallest root with
 * its lowest rank, the largest root with its lowest rank. */
static void fold(int64_t *mine, const int64_t *got) {
  if (got[MIN_ROOT] < mine[MIN_ROOT] || (got[MIN_ROOT] == mine[MIN_ROOT] && got[MIN_RANK] < mine[MIN_RANK])) {
    mine[MIN_ROOT] = got[MIN_ROOT];
    mine[MIN_RANK] = got[MIN_RANK];
  }
  if (got[MAX_ROOT] > mine[MAX_ROOT] || (got[MAX_ROOT] == mine[MAX_ROOT] && got[MAX_RANK] < mine[MAX_RANK])) {
    mine[MAX_ROOT] = got[MAX_ROOT];
    mine[MAX_RANK] = got[MAX_RANK];
  }
}

/* CRUN_ROOT_CHECK, read once (groups on several threads may race to read
 * it: each stores the same value). */
static int enabled(void) {
  static atomic_int on = -1;
  int v = atomic_load_explicit(&on, memory_order_relaxed);
  if (v < 0) {
    const char *e = getenv("CRUN_ROOT_CHECK");
    v = !(e && strcmp(e, "0") == 0);
    atomic_store_explicit(&on, v, memory_order_relaxed);
  }
  return v;
}

/* A root as the caller gave it: dist.lua's src/dst is a global rank. */
static long long global_root(const crun__link_t *l, int64_t root) {
  return root >= INT32_MIN && root <= INT32_MAX ? crun__pg_global(l->pg, (int)root) : (long long)root;
}

int crun__root_agree(crun__link_t *l, crun__coll_t *c) {
  if (l->size < 2 || !crun__coll_rooted(c->kind) || !enabled()) return 0;
  int64_t mine[WORDS] = {c->root, l->rank, c->root, l->rank}, got[WORDS];
  for (int d = 1; d < l->size; d <<= 1) {
    crun__xfer_t x = {.to = (l->rank + d) % l->size, .sbuf = mine, .sbytes = sizeof mine,
                      .from = (l->rank - d + l->size) % l->size, .rbuf = got, .rbytes = sizeof got,
                      .check = 1};
    CRUN_CHECK(l->xfer(l->impl, c, &x));
    fold(mine, got);
  }
  if (mine[MIN_ROOT] == mine[MAX_ROOT]) return 0;
  char desc[64];
  crun__pg_coll_desc(l->pg, c, desc, sizeof desc);
  const char *what = c->kind == CRUN__COLL_BROADCAST || c->kind == CRUN__COLL_SCATTER ? "src" : "dst";
  return crun_error(CRUN_EMISMATCH, "%s on %s: the ranks disagree on %s: %s gave %lld, %s gave %lld (every rank "
                    "must give the same)", desc, CRUN__WHO(l->pg, l->rank), what, CRUN__WHO(l->pg, (int)mine[MIN_RANK]),
                    global_root(l, mine[MIN_ROOT]), CRUN__WHO(l->pg, (int)mine[MAX_RANK]), global_root(l, mine[MAX_ROOT]));
}
