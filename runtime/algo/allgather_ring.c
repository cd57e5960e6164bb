/* allgather_ring.c — ring all_gather: p-1 steps; in step s each rank passes
 * the block it received in step s-1 to its right neighbour. */
#include <string.h>

#include "algo/algo.h"

static int run(crun__link_t *l, crun__coll_t *c) {
  int p = l->size, r = l->rank, right = (r + 1) % p, left = (r + p - 1) % p;
  size_t bytes = c->count * crun__esize(c);
  if (bytes && c->outs[r] != c->in) memmove(c->outs[r], c->in, bytes);
  for (int s = 0; s < p - 1; s++) {
    int sb = (r - s + p) % p, rb = (r - s - 1 + 2 * p) % p;
    CRUN_CHECK(crun__sendrecv(l, c, right, c->outs[sb], bytes, left, c->outs[rb], bytes));
  }
  return 0;
}

const crun__algo_t crun__algo_allgather_ring = {"ring", CRUN__COLL_ALL_GATHER, run};
