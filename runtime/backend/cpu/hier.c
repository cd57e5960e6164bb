/* hier.c — transport selection for cpu groups and the hierarchical engine for
 * groups that span hosts.
 *
 * Selection (crun__cpu_engine_open, called once the TCP mesh is up):
 *   CRUN_TRANSPORT=tcp (or CRUN_SHM=0): TCP only.
 *   CRUN_TRANSPORT=shm: every rank must be on one host and the shared-memory
 *     engine must attach, else the group fails to form with CRUN_EINVAL.
 *   unset / auto: ranks on one host use the shared-memory engine; ranks on
 *     several hosts with at least one host holding two or more ranks use the
 *     hierarchical engine below (CRUN_HIER=0: flat TCP instead); one rank per
 *     host stays on TCP.
 * A rank's host is its boot id, hostname and IPC/mount/network namespaces, unless
 * CRUN_HOST_ID says otherwise: "rank_div:K" puts global rank r on fake host
 * r / K (so one machine can pretend to be several: specs, tests), any other
 * text is the host's name as given.
 *
 * The hierarchical engine joins the ranks of each host with a shared-memory
 * communicator and runs the inter-host stage over the group's own TCP mesh
 * among one representative per host:
 *   all_reduce: shm reduce to local rank 0, TCP all_reduce among them, shm
 *               broadcast back; from CRUN_HIER_SPLIT bytes (default 64 KiB;
 *               <= 0: never) when every host holds L ranks and L divides the
 *               count: shm reduce_scatter into L slices, slice j all-reduced
 *               over TCP among the local ranks j of every host (L streams at
 *               once), shm all_gather; from two segments of CRUN_HIER_SEGMENT
 *               bytes (default 4 MiB; <= 0: never) those three stages run as a
 *               pipeline over the segments: a second thread per rank carries
 *               segment k over TCP while the calling thread reduce-scatters
 *               segment k+1 and all-gathers segment k-1 through shared memory,
 *               so the host links stay busy while the local stages run;
 *   broadcast:  TCP broadcast among the root and the first rank of every
 *               other host, then shm broadcast on every host;
 *   reduce:     shm reduce to the root (its host) or the first rank, TCP
 *               reduce among them to the root;
 *   barrier:    shm barrier, TCP barrier among first ranks, shm barrier.
 * all_gather, reduce_scatter, gather, scatter and all_to_all run on the flat
 * TCP algorithms (their data crosses hosts once anyway), after the check
 * below among the ranks of each host: a rank that called one of them where
 * its host's ranks called a collective of the engine met no frame from
 * them (they waited in shared memory, it over TCP) until the timeout; now
 * they meet in shared memory and fail with EMISMATCH. avg sums in shared
 * memory; its TCP stage carries avg (frames that say so) and divides by the
 * group size. Before a broadcast, a reduce, an avg all_reduce or a flat TCP
 * collective the ranks of each host compare their calls (h_agree): the
 * stages cannot see a root or an avg that differs, nor a TCP collective. A mismatch that a stage finds names that stage's
 * call; on that failure path the ranks publish their calls on the progress
 * board, and each names the user's calls on both sides (h_explain), as
 * does the group's failure text that a later call's ESTATE quotes. */
#include "backend/cpu/hier.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "transport/shm/shm_int.h"

typedef struct {
  crun_pg_t *pg;
  crun__link_t base;        /* the group's TCP link */
  crun__shm_comm_t *comm;   /* this host's ranks; NULL when alone */
  int nhosts, host;
  int *host_of, *lrank_of, *first, *reps;  /* size, size, nhosts, nhosts */
  int *column;              /* [host * L + j] = pg rank of local rank j on host
                               (when every host holds L > 1 ranks), else NULL */
  size_t split_bytes;       /* all_reduce from this size splits (CRUN_HIER_SPLIT) */
  size_t seg_bytes;         /* split all_reduce segments (CRUN_HIER_SEGMENT) */
} hier_t;

/* A link over the representatives: rank i of the sub-link is pg rank map[i]. */
typedef struct {
  crun__link_t *base;
  const int *map;
} sub_t;

static int sub_xfer(void *impl, crun__coll_t *c, const crun__xfer_t *x) {
  sub_t *s = impl;
  crun__xfer_t y = *x;
  y.to = x->to >= 0 ? s->map[x->to] : -1;
  y.from = x->from >= 0 ? s->map[x->from] : -1;
  return s->base->xfer(s->base->impl, c, &y);
}

static void *sub_scratch(void *impl, size_t n) {
  sub_t *s = impl;
  return s->base->scratch(s->base->impl, n);
}

/* Writes this rank's host identity into buf (see the file comment). */
static void host_key(const crun_pg_t *pg, char *buf, size_t n) {
  const char *id = getenv("CRUN_HOST_ID");
  if (id && *id) {
    long k = 0;
    if (sscanf(id, "rank_div:%ld", &k) == 1 && k > 0) {
      snprintf(buf, n, "fake-%ld", (long)pg->global[pg->rank] / k);
      return;
    }
    snprintf(buf, n, "id-%s", id);
    return;
  }
  crun__shm_host_identity(buf, n);
}

/* Exchanges host keys; host_of[r] = index of r's host in order of first
 * appearance. Returns the number of hosts or a negative status. */
static int map_hosts(crun_pg_t *pg, int *host_of, char *desc, size_t cap) {
  char key[64], mine[400];
  host_key(pg, mine, sizeof mine);
  snprintf(key, sizeof key, "hier/host/%d", pg->rank);
  CRUN_CHECK(crun_store_set(pg->store, key, mine, strlen(mine)));
  crun_buf_t *keys = calloc((size_t)pg->size, sizeof *keys);
  if (!keys) return crun_error(CRUN_ENOMEM, "host map");
  int nhosts = 0, rc = 0;
  size_t used = 0;
  desc[0] = 0;
  for (int q = 0; q < pg->size && rc == 0; q++) {
    snprintf(key, sizeof key, "hier/host/%d", q);
    rc = crun_store_get(pg->store, key, &keys[q]);
    if (rc < 0) break;
    int h = 0;
    while (h < q && !(keys[h].len == keys[q].len && !memcmp(keys[h].data, keys[q].data, keys[q].len))) h++;
    host_of[q] = h < q ? host_of[h] : nhosts++;
    if (used + 40 < cap) used += (size_t)snprintf(desc + used, cap - used, "%s%s on host %d",
                                                  q ? ", " : "", CRUN__WHO(pg, q), host_of[q]);
  }
  for (int q = 0; q < pg->size; q++) crun_buf_free(&keys[q]);
  free(keys);
  return rc < 0 ? rc : nhosts;
}

/* Publishes ok and sets *all to whether every rank published 1. */
static int agree_ok(crun_pg_t *pg, int ok, int *all) {
  char key[64];
  snprintf(key, sizeof key, "hier/ok/%d", pg->rank);
  CRUN_CHECK(crun_store_set(pg->store, key, ok ? "1" : "0", 1));
  *all = 1;
  for (int q = 0; q < pg->size; q++) {
    crun_buf_t v = {0};
    snprintf(key, sizeof key, "hier/ok/%d", q);
    CRUN_CHECK(crun_store_get(pg->store, key, &v));
    if (v.len != 1 || ((char *)v.data)[0] != '1') *all = 0;
    crun_buf_free(&v);
  }
  return 0;
}

static double left(const crun__coll_t *c) {
  double t = c->deadline > 0 ? c->deadline - crun_clock() : c->timeout;
  return t > 1e-3 ? t : 1e-3;
}

/* Runs c (kind, root in representative indices) among reps over TCP. An avg
 * stays avg there, so that its frames say so (a rank that sums meets one
 * that averages as an EMISMATCH), and divides by the group's size: the
 * shared-memory stages before it sum. */
static int reps_run(hier_t *h, crun__coll_t *c) {
  sub_t s = {&h->base, h->reps};
  crun__link_t l = {h->host, h->nhosts, &s, sub_xfer, sub_scratch, h->base.algo, h->pg->size, NULL};
  return crun__cpu_run_link(&l, c);
}

/* How the shared-memory engine describes h_agree's stage (SIG_WORDS int64). */
#define CHECK_STAGE "all_gather(int64[5])"

/* The text of a shared-memory stage's error after its own "shm <op> #<n> on
 * rank <local rank>: " prefix, which names the stage and a local rank. */
static const char *shm_body(const char *t) {
  const char *on = strncmp(t, "shm ", 4) == 0 ? strstr(t, " on rank ") : NULL;
  const char *colon = on ? strstr(on, ": ") : NULL;
  return colon ? colon + 2 : t;
}

/* The group rank of this host's local rank k (k itself when out of range). */
static int local_to_group(const hier_t *h, int k) {
  for (int q = 0, j = 0; q < h->pg->size; q++)
    if (h->host_of[q] == h->host && j++ == k) return q;
  return k;
}

/* Rewrites a shm stage's error (status rc) of the user's call c so that it
 * names c and this rank's group rank first, then what the stage said, the
 * stage, and which group ranks the stage's local ranks are:
 * "all_reduce #7 on rank 2: <text> (stage: node-local broadcast) [...]". */
static int shm_err(hier_t *h, const crun__coll_t *c, const char *stage, int rc) {
  char map[160], desc[64];
  size_t used = 0;
  map[0] = 0;
  for (int q = 0; q < h->pg->size && used + 12 < sizeof map; q++)
    if (h->host_of[q] == h->host)
      used += (size_t)snprintf(map + used, sizeof map - used, "%s%d", used ? "," : "", q);
  char text[900];
  snprintf(text, sizeof text, "%s", crun_last_error());
  const char *name = crun_err_name(rc);
  const char *t = strncmp(text, name, strlen(name)) == 0 ? text + strlen(name) + 2 : text;
  /* h_agree's stage, met by a rank that went straight to its first stage */
  const char *note = rc == CRUN_EMISMATCH && strstr(t, CHECK_STAGE) ? "; " CHECK_STAGE " is its check of a "
                     "broadcast, reduce, avg all_reduce or TCP collective: the ranks' calls differ" : "";
  crun__pg_coll_desc(h->pg, c, desc, sizeof desc);
  const char *body = shm_body(t);
  int k, n = 0;
  if (sscanf(body, "rank %d failed first: %n", &k, &n) == 1 && n > 0) /* relayed: its text says the rest */
    return crun_error(rc, "%s on %s (stage: %s): %s failed first: %s", desc, CRUN__WHO(h->pg, h->pg->rank), stage,
                      CRUN__WHO(h->pg, local_to_group(h, k)), body + n);
  return crun_error(rc, "%s on %s: %s (stage: %s) [hierarchical engine: the stage's ranks 0.. are "
                    "group ranks %s on host %d%s]", desc, CRUN__WHO(h->pg, h->pg->rank), body, stage, map, h->host, note);
}

#define SHM(stage, call)                                                      \
  do {                                                                        \
    crun__shm_comm_label(h->comm, c->seq);                                    \
    int shm_rc_ = (call);                                                     \
    if (shm_rc_ < 0) return shm_err(h, c, stage, shm_rc_);                    \
  } while (0)

/* The TCP stage among reps; a failure also aborts this host's communicator,
 * so the local ranks waiting for this rank fail at once with its error
 * instead of at their deadline. */
static int reps_stage(hier_t *h, crun__coll_t *c) {
  int rc = reps_run(h, c);
  return rc < 0 && h->comm ? crun__shm_fail_last(h->comm, rc) : rc;
}

static int is_rep(const hier_t *h) { return h->reps[h->host] == h->pg->rank; }

/* The op of c's shared-memory stages: avg sums there (its TCP stage divides). */
static crun_reduce_op_t local_op(const crun__coll_t *c) { return c->op == CRUN_OP_AVG ? CRUN_OP_SUM : c->op; }

/* reps[x] = the root on the root's host, else the host's first rank. */
static void set_reps(hier_t *h, int root) {
  for (int x = 0; x < h->nhosts; x++) h->reps[x] = h->first[x];
  if (root >= 0) h->reps[h->host_of[root]] = root;
}

/* The split all_reduce as a pipeline over segments of h->seg_bytes (a whole
 * number of L-element groups). The calling thread runs every shared-memory
 * stage, in the same order on every local rank: RS(0), RS(1), AG(0), RS(2),
 * AG(1), ..., AG(S-1); a worker thread runs TCP(0..S-1) in order, TCP(k)
 * once RS(k) is done. So TCP(k) overlaps AG(k-1) and RS(k+1), which touch
 * other segments only. The worker is joined before return (the buffer stays
 * the caller's); its failure fails the collective with its own text. */
typedef struct {
  hier_t *h;
  crun__coll_t s;            /* the TCP stage's template (op, deadline, seq) */
  char *buf;
  size_t count, seg, es;     /* elements: whole buffer, one segment */
  int l, j, nseg;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int ready, done, stop, rc; /* segments reduce-scattered / carried; main gave up; worker's status */
  char err[900];
} pipe_t;

/* Elements [*off, *off + *n) of the buffer are segment k. */
static void pipe_seg(const pipe_t *p, int k, size_t *off, size_t *n) {
  *off = (size_t)k * p->seg;
  *n = p->count - *off < p->seg ? p->count - *off : p->seg;
}

/* The TCP stage of segment k: slice j of it all-reduced among the column's
 * ranks; posts done = k + 1, or the failure with its text. */
static int pipe_carry(pipe_t *p, int k) {
  size_t off, n;
  pipe_seg(p, k, &off, &n);
  crun__coll_t s = p->s;
  s.buf = p->buf + (off + (size_t)p->j * (n / (size_t)p->l)) * p->es;
  s.count = n / (size_t)p->l;
  int rc = reps_run(p->h, &s);
  pthread_mutex_lock(&p->mu);
  if (rc < 0) {
    p->rc = rc;
    snprintf(p->err, sizeof p->err, "%s", crun_last_error());
  } else {
    p->done = k + 1;
  }
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  return rc;
}

static void *pipe_worker(void *arg) {
  pipe_t *p = arg;
  for (int k = 0; k < p->nseg; k++) {
    pthread_mutex_lock(&p->mu);
    while (p->ready <= k && !p->stop) pthread_cond_wait(&p->cv, &p->mu);  /* main always posts or stops */
    int stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    if (stop || pipe_carry(p, k) < 0) break;
  }
  return NULL;
}

/* Waits until the worker carried segment k, or failed, or the collective's
 * deadline (plus a second, so that the worker's own timeout, which names the
 * peers, arrives first) passed. */
static int pipe_wait(pipe_t *p, int k, const crun__coll_t *c) {
  double until = crun_clock() + left(c) + 1.0;
  struct timespec ts;
  ts.tv_sec = (time_t)until;
  ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
  pthread_mutex_lock(&p->mu);
  int late = 0;
  while (p->done <= k && p->rc == 0 && !late) late = pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT;
  int rc = p->rc, done = p->done;
  pthread_mutex_unlock(&p->mu);
  if (rc < 0) {
    const char *name = crun_err_name(rc);
    const char *t = strncmp(p->err, name, strlen(name)) == 0 ? p->err + strlen(name) + 2 : p->err;
    return crun_error(rc, "%s", t);
  }
  if (done <= k)
    return crun_error(CRUN_ETIMEDOUT, "hierarchical all_reduce #%llu: %s: the TCP stage of segment %d of %d "
                      "did not finish before the deadline", (unsigned long long)c->seq, CRUN__WHO(p->h->pg, p->h->pg->rank), k + 1,
                      p->nseg);
  return 0;
}

static void pipe_post(pipe_t *p, int *field, int v) {
  pthread_mutex_lock(&p->mu);
  *field = v;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

/* Where the worker thread cannot start, the calling thread carries each
 * segment itself, just before its all_gather: the order of the shared-memory
 * stages (which the local ranks must agree on) and of the TCP stages (which
 * the other hosts must agree on) stays the same, only the overlap is lost. */
static int pipe_all_reduce(hier_t *h, crun__coll_t *c, const crun__coll_t *s, int l, int j) {
  pipe_t p = {.h = h, .s = *s, .buf = c->buf, .count = c->count, .es = crun_dtype_size(c->dt), .l = l, .j = j};
  size_t per = h->seg_bytes / p.es / (size_t)l;   /* elements per rank per segment */
  p.seg = (per ? per : 1) * (size_t)l;
  size_t nseg = (p.count + p.seg - 1) / p.seg;
  if (nseg < 2 || nseg > 1u << 20) return CRUN_ENOTSUP;
  p.nseg = (int)nseg;
  pthread_t tid;
  /* glibc's init calls do not fail; if one did, this rank could not follow the
   * schedule its peers follow, so it fails rather than fall back */
  if (pthread_mutex_init(&p.mu, NULL))
    return crun_error(CRUN_ENOMEM, "hierarchical all_reduce: %s: pipeline lock", CRUN__WHO(h->pg, h->pg->rank));
  pthread_condattr_t ca;   /* timed waits count on the monotonic clock, as crun_clock does */
  int bad = pthread_condattr_init(&ca) || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) ||
            pthread_cond_init(&p.cv, &ca);
  pthread_condattr_destroy(&ca);
  if (bad) {
    pthread_mutex_destroy(&p.mu);
    return crun_error(CRUN_ENOMEM, "hierarchical all_reduce: %s: pipeline condition", CRUN__WHO(h->pg, h->pg->rank));
  }
  int threaded = pthread_create(&tid, NULL, pipe_worker, &p) == 0;
  int rc = 0, tcp_failed = 0;
  size_t off, n;
  for (int k = 0; k <= p.nseg && rc == 0; k++) {
    if (k < p.nseg) {
      pipe_seg(&p, k, &off, &n);
      char *seg = p.buf + off * p.es;
      crun__shm_comm_label(h->comm, c->seq);
      rc = crun__shm_reduce_scatter(h->comm, seg + (size_t)j * (n / (size_t)l) * p.es, seg, n / (size_t)l,
                                    c->dt, local_op(c), left(c));
      if (rc < 0) { rc = shm_err(h, c, "node-local reduce_scatter", rc); break; }
      pipe_post(&p, &p.ready, k + 1);
    }
    if (k >= 1) {
      rc = threaded ? pipe_wait(&p, k - 1, c) : pipe_carry(&p, k - 1);
      if (rc < 0) { tcp_failed = 1; break; }
      pipe_seg(&p, k - 1, &off, &n);
      char *seg = p.buf + off * p.es;
      crun__shm_comm_label(h->comm, c->seq);
      rc = crun__shm_all_gather(h->comm, seg, seg + (size_t)j * (n / (size_t)l) * p.es, n / (size_t)l, c->dt,
                                left(c));
      if (rc < 0) rc = shm_err(h, c, "node-local all_gather", rc);
    }
  }
  if (threaded) {
    pipe_post(&p, &p.stop, 1);
    pthread_join(tid, NULL);
  }
  pthread_cond_destroy(&p.cv);
  pthread_mutex_destroy(&p.mu);
  /* like reps_stage: the local ranks waiting on this one fail now, with its error */
  if (tcp_failed) rc = crun__shm_fail_last(h->comm, rc);
  return rc;
}

/* Large all_reduce when every host holds L ranks and L divides count: shm
 * reduce_scatter into L slices, slice j all-reduced over TCP among the ranks
 * of local rank j (one per host, all slices at once), shm all_gather. */
static int h_all_reduce_split(hier_t *h, crun__coll_t *c, crun__coll_t *s) {
  int l = crun__shm_comm_size(h->comm), j = crun__shm_comm_rank(h->comm);
  size_t q = c->count / (size_t)l, es = crun_dtype_size(c->dt);
  char *mine = (char *)c->buf + (size_t)j * q * es;
  for (int x = 0; x < h->nhosts; x++) h->reps[x] = h->column[x * l + j];
  if (c->count / 2 >= h->seg_bytes / es) {
    int rc = pipe_all_reduce(h, c, s, l, j);
    if (rc != CRUN_ENOTSUP) return rc;
  }
  SHM("node-local reduce_scatter", crun__shm_reduce_scatter(h->comm, mine, c->buf, q, c->dt, local_op(c), left(c)));
  s->buf = mine;
  s->count = q;
  CRUN_CHECK(reps_stage(h, s));
  SHM("node-local all_gather", crun__shm_all_gather(h->comm, c->buf, mine, q, c->dt, left(c)));
  return 0;
}

/* avg's TCP stage divides (reps_run); the shared-memory ones sum. */
static int h_all_reduce(hier_t *h, crun__coll_t *c) {
  crun__coll_t s = *c;
  if (h->column && c->count * crun_dtype_size(c->dt) >= h->split_bytes &&
      c->count % (size_t)crun__shm_comm_size(h->comm) == 0)
    return h_all_reduce_split(h, c, &s);
  set_reps(h, -1);
  if (h->comm)
    SHM("node-local reduce", crun__shm_reduce(h->comm, c->buf, NULL, c->count, c->dt, local_op(c), 0, left(c)));
  if (is_rep(h)) CRUN_CHECK(reps_stage(h, &s));
  if (h->comm) SHM("node-local broadcast", crun__shm_broadcast(h->comm, c->buf, c->count, c->dt, 0, left(c)));
  return 0;
}

static int h_broadcast(hier_t *h, crun__coll_t *c) {
  set_reps(h, c->root);
  crun__coll_t s = *c;
  s.root = h->host_of[c->root];
  if (is_rep(h)) CRUN_CHECK(reps_stage(h, &s));
  if (h->comm) SHM("node-local broadcast", crun__shm_broadcast(h->comm, c->buf, c->count, c->dt, h->lrank_of[h->reps[h->host]], left(c)));
  return 0;
}

static int h_reduce(hier_t *h, crun__coll_t *c) {
  set_reps(h, c->root);
  crun__coll_t s = *c;
  s.root = h->host_of[c->root];
  int root = h->pg->rank == c->root;
  size_t bytes = c->count * crun_dtype_size(c->dt);
  void *tmp = root ? c->buf : malloc(bytes ? bytes : 1);
  if (!tmp) return crun_error(CRUN_ENOMEM, "reduce: %zu-byte buffer on %s", bytes, CRUN__WHO(h->pg, h->pg->rank));
  int rc = 0;
  if (h->comm) {
    crun__shm_comm_label(h->comm, c->seq);
    rc = crun__shm_reduce(h->comm, tmp, root ? NULL : c->buf, c->count, c->dt, local_op(c),
                          h->lrank_of[h->reps[h->host]], left(c));
    if (rc < 0) rc = shm_err(h, c, "node-local reduce", rc);
  } else if (!root) {
    memcpy(tmp, c->buf, bytes);
  }
  s.buf = tmp;
  if (rc == 0 && is_rep(h)) rc = reps_stage(h, &s);   /* the root is its host's rep: avg divides there */
  if (!root) free(tmp);
  return rc;
}

static int h_barrier(hier_t *h, crun__coll_t *c) {
  set_reps(h, -1);
  if (h->comm) SHM("node-local barrier in", crun__shm_barrier(h->comm, left(c)));
  if (is_rep(h)) CRUN_CHECK(reps_stage(h, c));
  if (h->comm) SHM("node-local barrier out", crun__shm_barrier(h->comm, left(c)));
  return 0;
}

/* Whether the engine's stages run c (else the flat TCP algorithms do). */
static int h_staged(const crun__coll_t *c) {
  return c->kind == CRUN__COLL_ALL_REDUCE || c->kind == CRUN__COLL_BROADCAST ||
         c->kind == CRUN__COLL_REDUCE || c->kind == CRUN__COLL_BARRIER;
}

/* The engine takes every collective of the group: those it does not stage
 * as well, so that their ranks check their calls against their host's. */
static int h_supports(void *state, const crun__coll_t *c) {
  (void)state;
  (void)c;
  return 1;
}

/* The words of c that every rank of the group must agree on. */
enum { SIG_KIND, SIG_ROOT, SIG_DTYPE, SIG_COUNT, SIG_OP, SIG_WORDS };
_Static_assert(SIG_WORDS == 5, "CHECK_STAGE names all_gather(int64[5])");

/* all_to_all's counts are per peer and may differ between ranks: its
 * frames check them. */
static void h_sig(const crun__coll_t *c, int64_t *w) {
  w[SIG_KIND] = c->kind;
  w[SIG_ROOT] = crun__coll_rooted(c->kind) ? c->root : -1;
  w[SIG_DTYPE] = c->kind == CRUN__COLL_BARRIER ? -1 : (int64_t)c->dt;
  w[SIG_COUNT] = c->kind == CRUN__COLL_BARRIER || c->kind == CRUN__COLL_ALL_TO_ALL ? -1 : (int64_t)c->count;
  w[SIG_OP] = crun__coll_reduces(c->kind) ? (int64_t)c->op : -1;
}

/* Writes "reduce(float32[3], sum, root 1)" for a signature
 * ("all_to_all(float32)": no count). */
static void h_sig_text(const int64_t *w, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s(", crun__coll_name((int)w[SIG_KIND]));
  if (w[SIG_DTYPE] >= 0 && n >= 0 && (size_t)n < cap)
    n += snprintf(buf + n, cap - (size_t)n, "%s", crun_dtype_name((crun_dtype_t)w[SIG_DTYPE]));
  if (w[SIG_DTYPE] >= 0 && w[SIG_COUNT] >= 0 && n >= 0 && (size_t)n < cap)
    n += snprintf(buf + n, cap - (size_t)n, "[%lld]", (long long)w[SIG_COUNT]);
  if (w[SIG_OP] >= 0 && n >= 0 && (size_t)n < cap)
    n += snprintf(buf + n, cap - (size_t)n, ", %s", crun_reduce_op_name((crun_reduce_op_t)w[SIG_OP]));
  if (w[SIG_ROOT] >= 0 && n >= 0 && (size_t)n < cap)
    n += snprintf(buf + n, cap - (size_t)n, ", root %lld", (long long)w[SIG_ROOT]);
  if (n >= 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, ")");
}

/* Checks that this host's ranks make the same call (kind, root, dtype,
 * count, op), with one small shared-memory all_gather. Each stage of the
 * engine compares only what its own members pass it, and a rank that is not
 * its host's representative passes only the local part: a root or kind that
 * differs on it could match that part (broadcast from rank 1 on one rank,
 * from rank 0 on the others, all on another host) and give it the wrong
 * data without an error. Every local rank sees every signature, so all of
 * them fail alike; other hosts' ranks differ in the TCP stage's frames. */
static int h_agree(hier_t *h, const crun__coll_t *c) {
  int l = crun__shm_comm_size(h->comm), bad = -1;
  int64_t local[16 * SIG_WORDS], mine[SIG_WORDS];
  int64_t *all = l <= 16 ? local : malloc(sizeof(int64_t) * SIG_WORDS * (size_t)l);
  if (!all) return crun_error(CRUN_ENOMEM, "hierarchical engine: %s: call signatures", CRUN__WHO(h->pg, h->pg->rank));
  h_sig(c, mine);
  crun__shm_comm_label(h->comm, c->seq);
  int rc = crun__shm_all_gather(h->comm, all, mine, SIG_WORDS, CRUN_INT64, left(c));
  for (int j = 0; rc == 0 && bad < 0 && j < l; j++)
    if (memcmp(all + (size_t)j * SIG_WORDS, mine, sizeof mine)) bad = j;
  if (rc < 0) {
    rc = shm_err(h, c, "node-local check that the calls agree", rc);
  } else if (bad >= 0) {
    int q = 0;   /* group rank of local rank `bad` */
    for (int k = -1; q < h->pg->size; q++)
      if (h->host_of[q] == h->host && ++k == bad) break;
    char desc[64], me[128], them[128];
    crun__pg_coll_desc(h->pg, c, desc, sizeof desc);
    h_sig_text(mine, me, sizeof me);
    h_sig_text(all + (size_t)bad * SIG_WORDS, them, sizeof them);
    rc = crun_error(CRUN_EMISMATCH, "%s on %s: %s (same host) called %s but %s called %s "
                    "[hierarchical engine]", desc, CRUN__WHO(h->pg, h->pg->rank), CRUN__WHO(h->pg, q), them, CRUN__WHO(h->pg, h->pg->rank), me);
  }
  if (all != local) free(all);
  return rc;
}

/* Whether c needs h_agree: its root, or avg (run as sum), is invisible to
 * the stages, and a flat TCP collective has no shared-memory stage (its
 * ranks would wait over TCP for ranks that wait for them in shared memory).
 * Every other call starts with a shared-memory stage whose own check sees
 * what differs (and a rank that runs h_agree meets one that does not as a
 * different stage), so the common sum all_reduce and barrier skip the extra
 * stage (about 15 us per small all_reduce with 2 ranks per host on a loaded
 * 2-core machine; a TCP collective across hosts takes longer anyway). */
static int h_needs_agree(const crun__coll_t *c) {
  return c->kind == CRUN__COLL_BROADCAST || c->kind == CRUN__COLL_REDUCE || !h_staged(c) ||
         (c->kind == CRUN__COLL_ALL_REDUCE && c->op == CRUN_OP_AVG);
}

static int h_dispatch(hier_t *h, crun__coll_t *c) {
  if (h->comm && h_needs_agree(c)) CRUN_CHECK(h_agree(h, c));
  CRUN_CHECK(crun__root_agree(&h->base, c)); /* across hosts: the stages see only host indices */
  switch (c->kind) {
  case CRUN__COLL_ALL_REDUCE: return h_all_reduce(h, c);
  case CRUN__COLL_BROADCAST: return h_broadcast(h, c);
  case CRUN__COLL_REDUCE: return h_reduce(h, c);
  case CRUN__COLL_BARRIER: return h_barrier(h, c);
  }
  return crun__cpu_run_link(&h->base, c);   /* the flat TCP algorithms */
}

/* ------------------------------------------ naming the calls that differ
 * A stage that meets another call names the stages (the check's
 * all_gather(int64[5]) against the reduce an all_reduce starts with), and a
 * rank that was told of it by another names that rank's stage. On EMISMATCH
 * (the failure path only) every rank publishes its own call under
 * hier/call/<seq>/<rank> on the progress board and looks for a rank whose
 * call differs, so that each names the user's calls on both sides. */

/* The board key of rank q's call c. */
static void call_key(const crun__coll_t *c, int q, char *key, size_t cap) {
  snprintf(key, cap, "hier/call/%llu/%d", (unsigned long long)c->seq, q);
}

/* Reads rank q's published signature of c into sig when it is there now:
 * 1 read, 0 not (yet) there. Never blocks. */
static int call_peek(hier_t *h, const crun__coll_t *c, int q, int64_t *sig) {
  char key[64];
  crun_buf_t v = {0};
  call_key(c, q, key, sizeof key);
  if (crun__pg_board_peek(h->pg, key, &v) <= 0) return 0;
  int ok = v.len == sizeof(int64_t) * SIG_WORDS;
  if (ok) memcpy(sig, v.data, v.len);
  crun_buf_free(&v);
  return ok;
}

/* Polls the ranks' published calls for up to `wait` seconds, until one
 * differs from `mine` (its rank returned, its call in theirs) or every rank
 * (only those on this host: local) has published; -1 when none differs.
 * seen[q] marks the ranks already read. */
static int call_find_diff(hier_t *h, const crun__coll_t *c, const int64_t *mine, int local, double wait,
                          int64_t *theirs, char *seen) {
  double until = crun_clock() + wait;
  for (;;) {
    int missing = 0;
    for (int q = 0; q < h->pg->size; q++) {
      if (seen[q]) continue;
      if (!call_peek(h, c, q, theirs)) { missing += !local || h->host_of[q] == h->host; continue; }
      seen[q] = 1;
      if (memcmp(theirs, mine, sizeof(int64_t) * SIG_WORDS)) return q;
    }
    if (!missing || crun_clock() >= until) return -1;
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
}

/* Publishes mine (this rank's call c, which failed with EMISMATCH `text`)
 * and returns a rank whose call differs (its call in theirs), or -1. The
 * same host's ranks are failed first (they may wait for this one in a
 * stage) and waited for up to half a second. When none of them differs,
 * the group fails now with the stage's text (the ranks of other hosts may
 * wait for this one over TCP, and publish only once they fail), and the
 * rest are waited for up to a quarter of a second (the group's text is
 * then the stage's: *failed says so). A rank told of the failure finds the
 * calls of those that told it at once. */
static int call_compare(hier_t *h, const crun__coll_t *c, const char *text, const int64_t *mine,
                        int64_t *theirs, int *failed) {
  if (h->comm && !atomic_load_explicit(&h->comm->hdr->abort_rank, memory_order_acquire))
    crun__shm_fail(h->comm, CRUN_EMISMATCH, "%s", text);
  char key[64], full[960], *seen = calloc((size_t)h->pg->size, 1);
  *failed = 0;
  call_key(c, h->pg->rank, key, sizeof key);
  int q = -1;
  if (seen && crun_store_set(h->pg->board, key, mine, sizeof(int64_t) * SIG_WORDS) == 0) {
    seen[h->pg->rank] = 1;
    q = call_find_diff(h, c, mine, 1, 0.5, theirs, seen);
    if (q < 0) {
      snprintf(full, sizeof full, "%s: %s", crun_err_name(CRUN_EMISMATCH), text);
      crun__pg_fail(h->pg, CRUN_EMISMATCH, full);
      *failed = 1;
      q = call_find_diff(h, c, mine, 0, 0.25, theirs, seen);
    }
  }
  free(seen);
  return q;
}

/* The group failed with the stage's text `was` (call_compare, while it
 * looked for the other side's call): a later call's ESTATE quotes the
 * group's text, so it becomes `now`, which names the user's calls. A text
 * that another failure recorded first stays. */
static void restate_group_failure(hier_t *h, const char *was, const char *now) {
  crun_pg_t *pg = h->pg;
  char *copy = strdup(now);
  pthread_mutex_lock(&pg->mu);
  if (copy && pg->broken && strcmp(pg->broken, was) == 0) {
    free(pg->broken);
    pg->broken = copy;
    copy = NULL;
  }
  pthread_mutex_unlock(&pg->mu);
  free(copy);
}

/* This call's EMISMATCH rc unchanged, unless a rank is found whose call
 * differs in more than the root (root_agree's and h_agree's texts name a
 * root that differs already): then an EMISMATCH that names both calls, as
 * the user made them. Out of line: a call that succeeds saves no registers
 * or stack for it. */
static __attribute__((noinline)) int h_explain(hier_t *h, const crun__coll_t *c, int rc) {
  char text[900];
  const char *name = crun_err_name(rc), *t = crun_last_error();
  snprintf(text, sizeof text, "%s", strncmp(t, name, strlen(name)) == 0 && t[strlen(name)] == ':' ?
           t + strlen(name) + 2 : t);
  int64_t mine[SIG_WORDS], theirs[SIG_WORDS];
  h_sig(c, mine);
  int failed, q = call_compare(h, c, text, mine, theirs, &failed), root_only = q >= 0;
  for (int w = 0; q >= 0 && w < SIG_WORDS; w++) root_only = root_only && (w == SIG_ROOT || theirs[w] == mine[w]);
  if (q < 0 || root_only) return crun_error(rc, "%s", text);
  char desc[64], me[128], them[128];
  crun__pg_coll_desc(h->pg, c, desc, sizeof desc);
  h_sig_text(mine, me, sizeof me);
  h_sig_text(theirs, them, sizeof them);
  rc = crun_error(rc, "%s on %s: %s called %s but %s called %s [hierarchical engine]", desc,
                  CRUN__WHO(h->pg, h->pg->rank), CRUN__WHO(h->pg, q), them, CRUN__WHO(h->pg, h->pg->rank), me);
  if (failed) {
    char was[960];
    snprintf(was, sizeof was, "%s: %s", crun_err_name(rc), text);
    restate_group_failure(h, was, crun_last_error());
  }
  return rc;
}

/* Runs one collective; a timeout also says where every rank is, a
 * mismatch which calls differ. */
static int h_run(void *state, crun__coll_t *c) {
  hier_t *h = state;
  if (h->comm) crun__shm_comm_label(h->comm, c->seq);
  int rc = h_dispatch(h, c);
  if (rc == CRUN_EMISMATCH) rc = h_explain(h, c, rc);
  return crun__pg_timeout_report(h->pg, rc);
}

/* The group failed on this rank: this host's ranks fail at once with its
 * text (the communicator's abort record) instead of waiting for it. */
static void h_abort(void *state, int status, const char *text) {
  hier_t *h = state;
  /* a failure of the engine's own stage has written the record already */
  if (h->comm && !atomic_load_explicit(&h->comm->hdr->abort_rank, memory_order_acquire))
    crun__shm_fail(h->comm, status, "%s", text);
}

static void h_destroy(void *state) {
  hier_t *h = state;
  if (!h) return;
  crun__shm_comm_destroy(h->comm);
  free(h->host_of);
  free(h->column);
  free(h);
}

/* Builds the hierarchical engine from the host map (collective). */
static int hier_open(crun_pg_t *pg, const crun__link_t *tcp, int *host_of, int nhosts,
                     crun__engine_t *out) {
  int n = pg->size, lsize = 0, all = 0;
  hier_t *h = calloc(1, sizeof *h);
  int *arr = malloc(sizeof(int) * (size_t)(2 * n + 2 * nhosts));
  if (!h || !arr) { free(h); free(arr); free(host_of); return crun_error(CRUN_ENOMEM, "hierarchical engine"); }
  memcpy(arr, host_of, sizeof(int) * (size_t)n);
  free(host_of);
  *h = (hier_t){.pg = pg, .base = *tcp, .nhosts = nhosts, .host_of = arr, .lrank_of = arr + n,
                .first = arr + 2 * n, .reps = arr + 2 * n + nhosts};
  h->host = arr[pg->rank];
  int *count = h->reps;
  for (int x = 0; x < nhosts; x++) count[x] = 0;
  for (int q = n - 1; q >= 0; q--) h->first[arr[q]] = q;
  for (int q = 0; q < n; q++) h->lrank_of[q] = count[arr[q]]++;
  lsize = count[h->host];
  int even = lsize > 1;
  for (int x = 0; x < nhosts; x++) even = even && count[x] == lsize;
  h->column = even ? malloc(sizeof(int) * (size_t)n) : NULL;
  for (int q = 0; h->column && q < n; q++) h->column[arr[q] * lsize + h->lrank_of[q]] = q;
  long split = crun_env_int("CRUN_HIER_SPLIT", 64L << 10);
  h->split_bytes = split > 0 ? (size_t)split : (size_t)-1;
  long seg = crun_env_int("CRUN_HIER_SEGMENT", 4L << 20);
  h->seg_bytes = seg > 0 ? (size_t)seg : (size_t)-1;
  int rc = 0;
  if (lsize > 1) {
    char prefix[48];
    snprintf(prefix, sizeof prefix, "hier/shm/%d", h->host);
    rc = crun__shm_comm_create(pg->store, prefix, h->lrank_of[pg->rank], lsize, pg->timeout, &h->comm);
    if (rc < 0)
      CRUN_LOG(WARN, SHM, "rank %d: shared memory unavailable, staying on TCP: %s", pg->rank, crun_last_error());
  }
  int ar = agree_ok(pg, rc == 0, &all);
  if (ar < 0 || !all) { h_destroy(h); return ar < 0 ? ar : CRUN_ENOTSUP; }
  *out = (crun__engine_t){.name = "hier", .state = h, .supports = h_supports, .run = h_run, .abort = h_abort,
                          .destroy = h_destroy};
  if (pg->rank == 0)
    CRUN_LOG(INFO, SHM, "group of %d ranks on %d hosts uses the hierarchical engine", n, nhosts);
  return 0;
}

/* Reads CRUN_TRANSPORT (and the CRUN_SHM=0 alias) into *mode. */
int crun__cpu_transport(crun__transport_t *mode) {
  const char *t = getenv("CRUN_TRANSPORT");
  *mode = CRUN__TR_AUTO;
  if (t && *t && strcmp(t, "auto") != 0) {
    if (!strcmp(t, "tcp")) *mode = CRUN__TR_TCP;
    else if (!strcmp(t, "shm")) *mode = CRUN__TR_SHM;
    else return crun_error(CRUN_EINVAL, "CRUN_TRANSPORT=%s: expected tcp, shm or auto", t);
  }
  if (*mode == CRUN__TR_AUTO && crun_env_int("CRUN_SHM", 1) == 0) *mode = CRUN__TR_TCP;
  return 0;
}

int crun__cpu_engine_open(crun_pg_t *pg, crun__transport_t mode, const crun__link_t *tcp,
                          crun__engine_t *out) {
  if (mode == CRUN__TR_TCP || pg->size < 2) return CRUN_ENOTSUP;
  int *host_of = malloc(sizeof(int) * (size_t)pg->size);
  char desc[256];
  if (!host_of) return crun_error(CRUN_ENOMEM, "host map");
  int nhosts = map_hosts(pg, host_of, desc, sizeof desc);
  if (nhosts < 0) { free(host_of); return nhosts; }
  if (nhosts == 1) {
    free(host_of);
    int rc = crun__shm_engine_open ? crun__shm_engine_open(pg, out) : CRUN_ENOTSUP;
    if (rc < 0 && mode == CRUN__TR_SHM)
      return crun_error(CRUN_EINVAL, "CRUN_TRANSPORT=shm: %s: the shared-memory engine could not "
                        "attach (%s)", CRUN__WHO(pg, pg->rank), crun__shm_engine_open ? crun_last_error() : "not built in");
    return rc;
  }
  if (mode == CRUN__TR_SHM) {
    free(host_of);
    return crun_error(CRUN_EINVAL, "CRUN_TRANSPORT=shm needs every rank on one host, but %s sees "
                      "%d hosts: %s", CRUN__WHO(pg, pg->rank), nhosts, desc);
  }
  if (nhosts == pg->size || crun_env_int("CRUN_HIER", 1) == 0) { free(host_of); return CRUN_ENOTSUP; }
  return hier_open(pg, tcp, host_of, nhosts, out);
}
