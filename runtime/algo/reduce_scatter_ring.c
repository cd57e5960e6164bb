/* reduce_scatter_ring.c — ring reduce_scatter: in step s each rank sends its
 * partial sum of block (r-s-1) to the right and folds its own block (r-s-2)
 * into what arrives from the left; after p-1 steps rank r holds block r. */
#include <string.h>

#include "algo/algo.h"

static int run(crun__link_t *l, crun__coll_t *c) {
  int p = l->size, r = l->rank, right = (r + 1) % p, left = (r + p - 1) % p;
  size_t bytes = c->count * crun__esize(c);
  char *s = l->scratch(l->impl, 3 * bytes + 1);
  if (!s) return crun_error(CRUN_ENOMEM, "reduce_scatter scratch");
  char *acc[2] = {s, s + bytes}, *tmp = s + 2 * bytes;
  const void *send = c->ins[(r + p - 1) % p];
  for (int st = 0; st < p - 1; st++) {
    int rb = (r - st - 2 + 2 * p) % p;
    char *dst = st == p - 2 ? (char *)c->buf : acc[st % 2];
    if (bytes) memcpy(dst, c->ins[rb], bytes);
    crun__xfer_t x = {right, send, bytes, left, tmp, bytes, dst};
    CRUN_CHECK(l->xfer(l->impl, c, &x));
    send = dst;
  }
  if (p == 1 && bytes) memcpy(c->buf, c->ins[0], bytes);
  return crun__finish_avg(l, c, c->buf, c->count);
}

const crun__algo_t crun__algo_reduce_scatter_ring = {"ring", CRUN__COLL_REDUCE_SCATTER, run};
