/* bcast_chain.c — pipelined chain broadcast for large messages: the root
 * sends segments down the chain root -> root+1 -> ...; each rank forwards
 * segment k-1 while it receives segment k, so all links stream at once. */
#include "algo/algo.h"

#define SEG (512u << 10)

static int run(crun__link_t *l, crun__coll_t *c) {
  int p = l->size, v = (l->rank - c->root + p) % p;
  int prev = v > 0 ? (l->rank + p - 1) % p : -1, next = v + 1 < p ? (l->rank + 1) % p : -1;
  size_t bytes = c->count * crun__esize(c), nseg = bytes ? (bytes + SEG - 1) / SEG : 1;
  char *buf = c->buf;
  for (size_t k = 0; k <= nseg; k++) {
    size_t so = (k - 1) * SEG, ro = k * SEG;
    crun__xfer_t x = {-1, NULL, 0, -1, NULL, 0, NULL, 0};
    if (k > 0 && next >= 0) x = (crun__xfer_t){next, buf + so, bytes - so < SEG ? bytes - so : SEG, -1, NULL, 0, NULL, 0};
    if (k < nseg && prev >= 0) {
      x.from = prev;
      x.rbuf = buf + ro;
      x.rbytes = bytes - ro < SEG ? bytes - ro : SEG;
    }
    if (x.to >= 0 || x.from >= 0) CRUN_CHECK(l->xfer(l->impl, c, &x));
  }
  return 0;
}

const crun__algo_t crun__algo_bcast_chain = {"chain", CRUN__COLL_BROADCAST, run};
