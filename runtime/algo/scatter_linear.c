/* scatter_linear.c — scatter by direct sends from the root to every rank. */
#include <string.h>

#include "algo/algo.h"

static int run(crun__link_t *l, crun__coll_t *c) {
  size_t bytes = c->count * crun__esize(c);
  if (l->rank != c->root) return crun__recv(l, c, c->root, c->buf, bytes);
  for (int j = 0; j < l->size; j++)
    if (j != l->rank) CRUN_CHECK(crun__send(l, c, j, c->ins[j], bytes));
  if (bytes && c->buf != c->ins[l->rank]) memmove(c->buf, c->ins[l->rank], bytes);
  return 0;
}

const crun__algo_t crun__algo_scatter_linear = {"linear", CRUN__COLL_SCATTER, run};
