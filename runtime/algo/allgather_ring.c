/* allgather_ring.c — ring all_gather: p-1 steps; in step s each rank passes
 * the block it received in step s-1 to its right neighbour. Large blocks go
 * through the ring in slices (CRUN_RING_SLICE / p bytes of each block at a
 * time), so what a rank forwards is still in cache from its arrival. */
#include <string.h>

#include "algo/algo.h"

/* Runs the ring on bytes [off, off + n) of every block. */
static int ring(crun__link_t *l, crun__coll_t *c, size_t off, size_t n) {
  int p = l->size, r = l->rank, right = (r + 1) % p, left = (r + p - 1) % p;
  for (int s = 0; s < p - 1; s++) {
    int sb = (r - s + p) % p, rb = (r - s - 1 + 2 * p) % p;
    CRUN_CHECK(crun__sendrecv(l, c, right, (char *)c->outs[sb] + off, n, left, (char *)c->outs[rb] + off, n));
  }
  return 0;
}

static int run(crun__link_t *l, crun__coll_t *c) {
  size_t bytes = c->count * crun__esize(c);
  if (bytes && c->outs[l->rank] != c->in) memmove(c->outs[l->rank], c->in, bytes);
  size_t slice = (size_t)crun_env_int("CRUN_RING_SLICE", 512L << 10) / (size_t)l->size;
  if (slice == 0 || slice > bytes) slice = bytes;
  for (size_t off = 0; off < bytes || off == 0; off += slice) {
    CRUN_CHECK(ring(l, c, off, bytes - off < slice ? bytes - off : slice));
    if (bytes == 0) break;
  }
  return 0;
}

const crun__algo_t crun__algo_allgather_ring = {"ring", CRUN__COLL_ALL_GATHER, run};
