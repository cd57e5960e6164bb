/* gather_linear.c — gather by direct sends: every rank sends its block to the
 * root, which receives them in rank order (the others wait in socket buffers). */
#include <string.h>

#include "algo/algo.h"

static int run(crun__link_t *l, crun__coll_t *c) {
  size_t bytes = c->count * crun__esize(c);
  if (l->rank != c->root) return crun__send(l, c, c->root, c->in, bytes);
  if (bytes && c->outs[l->rank] != c->in) memmove(c->outs[l->rank], c->in, bytes);
  for (int j = 0; j < l->size; j++)
    if (j != l->rank) CRUN_CHECK(crun__recv(l, c, j, c->outs[j], bytes));
  return 0;
}

const crun__algo_t crun__algo_gather_linear = {"linear", CRUN__COLL_GATHER, run};
