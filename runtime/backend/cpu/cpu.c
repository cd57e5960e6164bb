/* cpu.c — the "cpu" backend: collectives over the TCP mesh with the algorithm
 * picked per call (runtime/algo), unless an attached engine (the same-host
 * shared-memory one, or the hierarchical one across hosts: hier.c picks by
 * CRUN_TRANSPORT and the ranks' hosts) supports the call, in which case it
 * runs it. */
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "backend/backend.h"
#include "backend/cpu/hier.h"
#include "tensor/half.h"
#include "transport/tcp.h"

typedef struct {
  crun_pg_t *pg;
  crun__tcp_t *tcp;
  void *scratch;
  size_t scap;
  int has_engine;
  crun__engine_t engine;
  crun__link_t link;      /* the TCP link, for engines that use it */
  char *algo;             /* CRUN_ALGO when the group was made */
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
  crun__transport_t mode;
  const char *algo = getenv("CRUN_ALGO");
  int rc = crun__cpu_transport(&mode);
  if (rc == 0) rc = crun__algo_check_env(algo);
  if (rc == 0) rc = crun__tcp_open(pg, &b->tcp);
  if (rc == 0 && !(b->algo = strdup(algo ? algo : ""))) {
    crun__tcp_close(b->tcp);
    rc = crun_error(CRUN_ENOMEM, "cpu backend");
  }
  if (rc < 0) { free(b); return rc; }
  b->link = (crun__link_t){pg->rank, pg->size, b, link_xfer, link_scratch, b->algo, 0, pg};
  rc = crun__cpu_engine_open(pg, mode, &b->link, &b->engine);
  b->has_engine = rc == 0;
  if (rc < 0 && rc != CRUN_ENOTSUP) {
    crun__tcp_close(b->tcp);
    free(b->algo);
    free(b);
    return rc;
  }
  *state = b;
  return 0;
}

/* The group failed on this rank (any failure: crun__pg_fail and the group's
 * own bookkeeping call this once): the peers waiting in a call learn it from
 * the mesh and the engine (and a peer in a refusal's agreement from the
 * board: pg/work.c break_group). */
static void cpu_abort(void *state, int status, const char *text) {
  cpu_t *b = state;
  crun__tcp_abort(b->tcp, status, text);
  if (b->has_engine && b->engine.abort) b->engine.abort(b->engine.state, status, text);
}

static void cpu_destroy(void *state) {
  cpu_t *b = state;
  if (!b) return;
  if (b->has_engine && b->engine.destroy) b->engine.destroy(b->engine.state);
  crun__tcp_close(b->tcp);
  free(b->scratch);
  free(b->algo);
  free(b);
}

static int is_half(crun_dtype_t dt) { return dt == CRUN_FLOAT16 || dt == CRUN_BFLOAT16; }

static void widen(crun_dtype_t dt, float *dst, const void *src, size_t n) {
  if (dt == CRUN_FLOAT16) crun__f16_to_f32_n(dst, src, n);
  else crun__bf16_to_f32_n(dst, src, n);
}

static void narrow_to(crun_dtype_t dt, void *dst, const float *src, size_t n) {
  if (dt == CRUN_FLOAT16) crun__f32_to_f16_n(dst, src, n);
  else crun__f32_to_bf16_n(dst, src, n);
}

/* Runs a float16/bfloat16 reduction in float32: every step accumulates in
 * float32 and the result is rounded once at the end, as crun_reduce_n does
 * (the wire carries float32; headers still name the caller's dtype). */
static int run_widened(crun__link_t *l, const crun__algo_t *a, crun__coll_t *c) {
  int rs = c->kind == CRUN__COLL_REDUCE_SCATTER, p = l->size;
  size_t nin = rs ? c->count * (size_t)p : c->count;
  float *w = malloc((nin + c->count + 1) * sizeof(float));
  const void **ins = rs ? malloc(sizeof(void *) * (size_t)p) : NULL;
  if (!w || (rs && !ins)) { free(w); free(ins); return crun_error(CRUN_ENOMEM, "float32 accumulation buffer"); }
  crun__coll_t wc = *c;
  wc.dt = CRUN_FLOAT32;
  wc.user_dt = (int)c->dt;
  wc.buf = rs ? w + nin : w;
  for (int j = 0; rs && j < p; j++) {
    widen(c->dt, w + (size_t)j * c->count, c->ins[j], c->count);
    ins[j] = w + (size_t)j * c->count;
  }
  if (rs) wc.ins = ins;
  else widen(c->dt, w, c->buf, c->count);
  int rc = a->run(l, &wc);
  if (rc == 0 && (c->kind != CRUN__COLL_REDUCE || l->rank == c->root)) narrow_to(c->dt, c->buf, wc.buf, c->count);
  free(ins);
  free(w);
  return rc;
}

static int needs_widening(const crun__coll_t *c) {
  return is_half(c->dt) && (c->kind == CRUN__COLL_ALL_REDUCE || c->kind == CRUN__COLL_REDUCE ||
                            c->kind == CRUN__COLL_REDUCE_SCATTER);
}

int crun__cpu_run_link(crun__link_t *l, crun__coll_t *c) {
  const crun__algo_t *a = crun__algo_pick(c, l->size, l->algo);
  if (!a) return crun_error(CRUN_ENOTSUP, "cpu backend: no algorithm for %s", crun__coll_name(c->kind));
  if (crun__obs_on) crun__obs_algo = a->name;
  CRUN_LOG(TRACE, COLL, "%s #%llu: %s, %zu x %s on %d ranks", crun__coll_name(c->kind),
           (unsigned long long)c->seq, a->name, c->count, crun_dtype_name(c->dt), l->size);
  return needs_widening(c) ? run_widened(l, a, c) : a->run(l, c);
}

/* Runs any collective: the engine when it takes it, else the picked algorithm. */
static int cpu_coll(void *state, crun__coll_t *c) {
  cpu_t *b = state;
  if (b->has_engine && b->engine.supports(b->engine.state, c)) {
    if (crun__obs_on) crun__obs_algo = b->engine.name;
    if (!b->engine.posts_obs) crun__obs_posted();
    return b->engine.run(b->engine.state, c);
  }
  crun__obs_posted();
  CRUN_CHECK(crun__root_agree(&b->link, c));
  return crun__cpu_run_link(&b->link, c);
}

/* An engine that takes every all_reduce and runs one directly serves them
 * without cpu_coll's per-call choice. */
static crun_backend_fn cpu_direct(void *state, int kind, void **fn_state) {
  cpu_t *b = state;
  crun__coll_t probe = {.kind = kind};
  /* the caller writes no held flight-recorder start before it: the engine
   * must (posts_obs), as cpu_coll asks of an engine that does not */
  if (kind != CRUN__COLL_ALL_REDUCE || !b->has_engine || !b->engine.all_reduce || !b->engine.posts_obs ||
      !b->engine.supports(b->engine.state, &probe))
    return NULL;
  *fn_state = b->engine.state;
  return b->engine.all_reduce;
}

/* The TCP mesh's abort frames reach every peer of a call the mesh runs; a
 * call an engine runs (the peers wait in shared memory) is told only by an
 * engine that can abort. */
static int cpu_abort_reaches(void *state, const crun__coll_t *c) {
  cpu_t *b = state;
  return !(b->has_engine && b->engine.supports(b->engine.state, c)) || b->engine.abort;
}

static int cpu_peer_gone(void *state, int q) { return crun__tcp_peer_gone(((cpu_t *)state)->tcp, q); }

static int cpu_send(void *state, crun__coll_t *c) { return crun__tcp_send(((cpu_t *)state)->tcp, c); }
static int cpu_recv(void *state, crun__coll_t *c) { return crun__tcp_recv(((cpu_t *)state)->tcp, c); }

const crun_backend_vtable_t crun__backend_cpu = {
    .name = "cpu", .posts_obs = 1, .destroy_pending = 1, .create = cpu_create, .abort = cpu_abort, .destroy = cpu_destroy,
    .abort_reaches = cpu_abort_reaches, .peer_gone = cpu_peer_gone, .direct = cpu_direct,
    .send = cpu_send, .recv = cpu_recv, .broadcast = cpu_coll, .all_reduce = cpu_coll,
    .reduce = cpu_coll, .all_gather = cpu_coll, .gather = cpu_coll, .scatter = cpu_coll,
    .reduce_scatter = cpu_coll, .all_to_all = cpu_coll, .barrier = cpu_coll};
