/* reduce_binomial.c — binomial tree reduce: in round k, ranks whose bit k is
 * set (relative to the root) send their partial result 2^k ranks down and
 * stop; the others reduce what arrives. Non-root buffers stay unchanged. */
#include <string.h>

#include "algo/algo.h"

static int run(crun__link_t *l, crun__coll_t *c) {
  int p = l->size, v = (l->rank - c->root + p) % p;
  size_t bytes = c->count * crun__esize(c);
  char *s = l->scratch(l->impl, 2 * bytes + 1);
  if (!s) return crun_error(CRUN_ENOMEM, "reduce scratch");
  char *acc = v == 0 ? c->buf : s, *tmp = s + bytes;
  if (v != 0 && bytes) memcpy(acc, c->buf, bytes);
  for (int mask = 1; mask < p; mask <<= 1) {
    if (v & mask) {
      CRUN_CHECK(crun__send(l, c, (v - mask + c->root) % p, acc, bytes));
      return 0;
    }
    if (v + mask < p) {
      crun__xfer_t x = {-1, NULL, 0, (v + mask + c->root) % p, tmp, bytes, acc, 0};
      CRUN_CHECK(l->xfer(l->impl, c, &x));
    }
  }
  return crun__finish_avg(l, c, c->buf, c->count);
}

const crun__algo_t crun__algo_reduce_binomial = {"binomial", CRUN__COLL_REDUCE, run};
