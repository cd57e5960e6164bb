/* allreduce_ring.c — ring all_reduce for large messages: a reduce-scatter
 * ring (each rank ends owning one fully reduced block, reducing incoming data
 * as it arrives) followed by an all-gather ring. Moves 2(p-1)/p of the data
 * per rank; every rank ends with bitwise identical results. Buffers larger
 * than a slice (CRUN_RING_SLICE bytes, default 512 KiB) run the ring slice by
 * slice, so the block a rank forwards is still in cache from its reduction. */
#include "algo/algo.h"

/* Runs the two rings on elements [0, count) of buf. */
static int ring(crun__link_t *l, crun__coll_t *c, char *buf, size_t count, char *tmp) {
  int p = l->size, r = l->rank, right = (r + 1) % p, left = (r + p - 1) % p;
  size_t es = crun__esize(c), so, sn, ro, rn;
  for (int s = 0; s < p - 1; s++) {
    crun__block(count, p, (r - s + p) % p, &so, &sn);
    crun__block(count, p, (r - s - 1 + 2 * p) % p, &ro, &rn);
    crun__xfer_t x = {right, buf + so * es, sn * es, left, tmp, rn * es, buf + ro * es, 0};
    CRUN_CHECK(l->xfer(l->impl, c, &x));
  }
  for (int s = 0; s < p - 1; s++) {
    crun__block(count, p, (r + 1 - s + p) % p, &so, &sn);
    crun__block(count, p, (r - s + p) % p, &ro, &rn);
    CRUN_CHECK(crun__sendrecv(l, c, right, buf + so * es, sn * es, left, buf + ro * es, rn * es));
  }
  return 0;
}

static int run(crun__link_t *l, crun__coll_t *c) {
  int p = l->size;
  size_t es = crun__esize(c);
  if (p == 1) return crun__finish_avg(l, c, c->buf, c->count);
  size_t slice = (size_t)crun_env_int("CRUN_RING_SLICE", 512L << 10) / es;
  if (slice < (size_t)p || slice > c->count) slice = c->count;
  char *tmp = l->scratch(l->impl, (slice / (size_t)p + 1) * es);
  if (!tmp) return crun_error(CRUN_ENOMEM, "all_reduce scratch");
  for (size_t off = 0; off < c->count || off == 0; off += slice) {
    size_t n = c->count - off < slice ? c->count - off : slice;
    CRUN_CHECK(ring(l, c, (char *)c->buf + off * es, n, tmp));
    if (c->count == 0) break;
  }
  return crun__finish_avg(l, c, c->buf, c->count);
}

const crun__algo_t crun__algo_allreduce_ring = {"ring", CRUN__COLL_ALL_REDUCE, run};
