/* cpu.c — the "cpu" backend: collectives over the TCP mesh with the algorithm
 * picked per call (runtime/algo), unless an attached engine (the same-host
 * shared-memory one) supports the call, in which case it runs it. */
#include <stdlib.h>

#include "algo/algo.h"
#include "backend/backend.h"
#include "transport/tcp.h"

typedef struct {
  crun_pg_t *pg;
  crun__tcp_t *tcp;
  void *scratch;
  size_t scap;
  int has_engine;
  crun__engine_t engine;
} cpu_t;

static int link_xfer(void *impl, crun__coll_t *c, const crun__xfer_t *x) {
  return crun__tcp_xfer(((cpu_t *)impl)->tcp, c, x);
}

/* Grows the cached scratch buffer to n bytes. */
static void *link_scratch(void *impl, size_t n) {
  cpu_t *b = impl;
  if (n > b->scap) {
    free(b->scratch);
    b->scratch = malloc(n);
    b->scap = b->scratch ? n : 0;
  }
  return b->scratch;
}

static int cpu_create(crun_pg_t *pg, void **state) {
  cpu_t *b = calloc(1, sizeof *b);
  if (!b) return crun_error(CRUN_ENOMEM, "cpu backend");
  b->pg = pg;
  int rc = crun__tcp_open(pg, &b->tcp);
  if (rc < 0) { free(b); return rc; }
  if (crun__shm_engine_open && crun_env_int("CRUN_SHM", 1) != 0 && pg->size > 1)
    b->has_engine = crun__shm_engine_open(pg, &b->engine) == 0;
  *state = b;
  return 0;
}

static void cpu_abort(void *state, int status, const char *text) {
  crun__tcp_abort(((cpu_t *)state)->tcp, status, text);
}

static void cpu_destroy(void *state) {
  cpu_t *b = state;
  if (!b) return;
  if (b->has_engine && b->engine.destroy) b->engine.destroy(b->engine.state);
  crun__tcp_close(b->tcp);
  free(b->scratch);
  free(b);
}

/* Runs any collective: the engine when it takes it, else the picked algorithm. */
static int cpu_coll(void *state, crun__coll_t *c) {
  cpu_t *b = state;
  if (b->has_engine && b->engine.supports(b->engine.state, c)) return b->engine.run(b->engine.state, c);
  const crun__algo_t *a = crun__algo_pick(c, b->pg->size);
  if (!a) return crun_error(CRUN_ENOTSUP, "cpu backend: no algorithm for %s", crun__coll_name(c->kind));
  CRUN_LOG(TRACE, COLL, "%s #%llu: %s, %zu x %s", crun__coll_name(c->kind),
           (unsigned long long)c->seq, a->name, c->count, crun_dtype_name(c->dt));
  crun__link_t l = {b->pg->rank, b->pg->size, b, link_xfer, link_scratch};
  return a->run(&l, c);
}

static int cpu_send(void *state, crun__coll_t *c) { return crun__tcp_send(((cpu_t *)state)->tcp, c); }
static int cpu_recv(void *state, crun__coll_t *c) { return crun__tcp_recv(((cpu_t *)state)->tcp, c); }

const crun_backend_vtable_t crun__backend_cpu = {
    .name = "cpu", .create = cpu_create, .abort = cpu_abort, .destroy = cpu_destroy,
    .send = cpu_send, .recv = cpu_recv, .broadcast = cpu_coll, .all_reduce = cpu_coll,
    .reduce = cpu_coll, .all_gather = cpu_coll, .gather = cpu_coll, .scatter = cpu_coll,
    .reduce_scatter = cpu_coll, .all_to_all = cpu_coll, .barrier = cpu_coll};
