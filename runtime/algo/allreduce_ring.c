/* allreduce_ring.c — ring all_reduce for large messages: a reduce-scatter
 * ring (each rank ends owning one fully reduced block, reducing incoming data
 * as it arrives) followed by an all-gather ring. Moves 2(p-1)/p of the data
 * per rank; every rank ends with bitwise identical results. */
#include "algo/algo.h"

static int run(crun__link_t *l, crun__coll_t *c) {
  int p = l->size, r = l->rank, right = (r + 1) % p, left = (r + p - 1) % p;
  size_t es = crun__esize(c), so, sn, ro, rn;
  char *buf = c->buf;
  if (p == 1) return crun__finish_avg(l, c, buf, c->count);
  char *tmp = l->scratch(l->impl, (c->count / (size_t)p + 1) * es);
  if (!tmp) return crun_error(CRUN_ENOMEM, "all_reduce scratch");
  for (int s = 0; s < p - 1; s++) {
    crun__block(c->count, p, (r - s + p) % p, &so, &sn);
    crun__block(c->count, p, (r - s - 1 + 2 * p) % p, &ro, &rn);
    crun__xfer_t x = {right, buf + so * es, sn * es, left, tmp, rn * es, buf + ro * es};
    CRUN_CHECK(l->xfer(l->impl, c, &x));
  }
  for (int s = 0; s < p - 1; s++) {
    crun__block(c->count, p, (r + 1 - s + p) % p, &so, &sn);
    crun__block(c->count, p, (r - s + p) % p, &ro, &rn);
    CRUN_CHECK(crun__sendrecv(l, c, right, buf + so * es, sn * es, left, buf + ro * es, rn * es));
  }
  return crun__finish_avg(l, c, buf, c->count);
}

const crun__algo_t crun__algo_allreduce_ring = {"ring", CRUN__COLL_ALL_REDUCE, run};
