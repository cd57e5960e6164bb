/* alltoall_pairwise.c — pairwise all_to_all: in step s every rank sends to
 * rank r+s while receiving from rank r-s, so each link carries one message. */
#include <string.h>

#include "algo/algo.h"

static int run(crun__link_t *l, crun__coll_t *c) {
  int p = l->size, r = l->rank;
  size_t es = crun__esize(c);
  if (c->in_counts[r] && c->outs[r] != c->ins[r]) memmove(c->outs[r], c->ins[r], c->in_counts[r] * es);
  for (int s = 1; s < p; s++) {
    int to = (r + s) % p, from = (r - s + p) % p;
    CRUN_CHECK(crun__sendrecv(l, c, to, c->ins[to], c->in_counts[to] * es, from, c->outs[from],
                              c->out_counts[from] * es));
  }
  return 0;
}

const crun__algo_t crun__algo_alltoall_pairwise = {"pairwise", CRUN__COLL_ALL_TO_ALL, run};
