/* reduce_scatter_ring.c — ring reduce_scatter: in step s each rank sends its
 * partial sum of block (r-s-1) to the right and folds its own block (r-s-2)
 * into what arrives from the left; after p-1 steps rank r holds block r.
 * Large blocks go through the ring in slices (CRUN_RING_SLICE / p bytes of
 * each block at a time), so the partial sums forwarded are cache-hot. */
#include <string.h>

#include "algo/algo.h"

/* Runs the ring on elements [off, off + n) of every block. */
static int ring(crun__link_t *l, crun__coll_t *c, size_t off, size_t n, char *s) {
  int p = l->size, r = l->rank, right = (r + 1) % p, left = (r + p - 1) % p;
  size_t es = crun__esize(c), bytes = n * es;
  char *acc[2] = {s, s + bytes}, *tmp = s + 2 * bytes;
  const void *send = (const char *)c->ins[(r + p - 1) % p] + off * es;
  for (int st = 0; st < p - 1; st++) {
    int rb = (r - st - 2 + 2 * p) % p;
    char *dst = st == p - 2 ? (char *)c->buf + off * es : acc[st % 2];
    if (bytes) memcpy(dst, (const char *)c->ins[rb] + off * es, bytes);
    crun__xfer_t x = {right, send, bytes, left, tmp, bytes, dst, 0};
    CRUN_CHECK(l->xfer(l->impl, c, &x));
    send = dst;
  }
  return 0;
}

static int run(crun__link_t *l, crun__coll_t *c) {
  size_t es = crun__esize(c);
  if (l->size == 1) {
    if (c->count) memcpy(c->buf, c->ins[0], c->count * es);
    return crun__finish_avg(l, c, c->buf, c->count);
  }
  size_t slice = (size_t)crun_env_int("CRUN_RING_SLICE", 512L << 10) / (size_t)l->size / es;
  if (slice == 0 || slice > c->count) slice = c->count;
  char *s = l->scratch(l->impl, 3 * slice * es + 1);
  if (!s) return crun_error(CRUN_ENOMEM, "reduce_scatter scratch");
  for (size_t off = 0; off < c->count || off == 0; off += slice) {
    CRUN_CHECK(ring(l, c, off, c->count - off < slice ? c->count - off : slice, s));
    if (c->count == 0) break;
  }
  return crun__finish_avg(l, c, c->buf, c->count);
}

const crun__algo_t crun__algo_reduce_scatter_ring = {"ring", CRUN__COLL_REDUCE_SCATTER, run};
