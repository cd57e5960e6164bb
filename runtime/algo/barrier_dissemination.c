/* barrier_dissemination.c — dissemination barrier: ceil(log2 p) rounds of
 * empty frames; in round k rank r signals r+2^k and waits for r-2^k. */
#include "algo/algo.h"

static int run(crun__link_t *l, crun__coll_t *c) {
  int p = l->size, r = l->rank;
  for (int k = 1; k < p; k <<= 1)
    CRUN_CHECK(crun__sendrecv(l, c, (r + k) % p, NULL, 0, (r - k + p) % p, NULL, 0));
  return 0;
}

const crun__algo_t crun__algo_barrier_dissemination = {"dissemination", CRUN__COLL_BARRIER, run};
