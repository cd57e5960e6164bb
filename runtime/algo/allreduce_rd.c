/* allreduce_rd.c — recursive doubling all_reduce for small messages: log2(p)
 * exchanges of the whole buffer. With p not a power of two, the first 2*rem
 * ranks pair up (even sends to odd) so a power of two takes part, and the odd
 * ones hand the result back at the end. */
#include <string.h>

#include "algo/algo.h"

/* Maps a rank of the power-of-two exchange back to a group rank. */
static int real_rank(int v, int rem) { return v < rem ? v * 2 + 1 : v + rem; }

static int exchange(crun__link_t *l, crun__coll_t *c, int v, int pof2, int rem, char *tmp) {
  size_t bytes = c->count * crun__esize(c);
  for (int mask = 1; mask < pof2; mask <<= 1) {
    int peer = real_rank(v ^ mask, rem);
    CRUN_CHECK(crun__sendrecv(l, c, peer, c->buf, bytes, peer, tmp, bytes));
    CRUN_CHECK(crun_reduce_into(c->dt, c->op, c->buf, tmp, c->count));
  }
  return 0;
}

static int run(crun__link_t *l, crun__coll_t *c) {
  int p = l->size, r = l->rank, pof2 = 1;
  while (pof2 * 2 <= p) pof2 *= 2;
  int rem = p - pof2, v = r - rem;
  size_t bytes = c->count * crun__esize(c);
  char *tmp = l->scratch(l->impl, bytes + 1);
  if (!tmp) return crun_error(CRUN_ENOMEM, "all_reduce scratch");
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      CRUN_CHECK(crun__send(l, c, r + 1, c->buf, bytes));
      v = -1;
    } else {
      crun__xfer_t x = {-1, NULL, 0, r - 1, tmp, bytes, c->buf, 0};
      CRUN_CHECK(l->xfer(l->impl, c, &x));
      v = r / 2;
    }
  }
  if (v >= 0) CRUN_CHECK(exchange(l, c, v, pof2, rem, tmp));
  if (r < 2 * rem) {
    if (r % 2) CRUN_CHECK(crun__send(l, c, r - 1, c->buf, bytes));
    else CRUN_CHECK(crun__recv(l, c, r + 1, c->buf, bytes));
  }
  return crun__finish_avg(l, c, c->buf, c->count);
}

const crun__algo_t crun__algo_allreduce_rd = {"rd", CRUN__COLL_ALL_REDUCE, run};
