/* bcast_binomial.c — binomial tree broadcast: log2(p) rounds; in round k the
 * ranks that have the data send it 2^k ranks further (relative to the root). */
#include "algo/algo.h"

static int run(crun__link_t *l, crun__coll_t *c) {
  int p = l->size, v = (l->rank - c->root + p) % p, mask = 1;
  size_t bytes = c->count * crun__esize(c);
  while (mask < p) {
    if (v & mask) {
      CRUN_CHECK(crun__recv(l, c, (v - mask + c->root) % p, c->buf, bytes));
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < p) CRUN_CHECK(crun__send(l, c, (v + mask + c->root) % p, c->buf, bytes));
  return 0;
}

const crun__algo_t crun__algo_bcast_binomial = {"binomial", CRUN__COLL_BROADCAST, run};
