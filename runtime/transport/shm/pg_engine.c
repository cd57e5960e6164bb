/* pg_engine.c — attaches the shared-memory engine to a cpu process group
 * (the crun__shm_engine_open hook of backend/backend.h).
 *
 * Attaching is decided collectively through the group's store: every rank
 * publishes its host identity (boot id, hostname, IPC, mount and network
 * namespaces);
 * when all match, every rank creates the communicator and publishes whether
 * that worked; the engine is used only when it worked everywhere, else every
 * rank declines and the group stays on TCP. The engine takes every
 * collective (broadcast, all_reduce, reduce, all_gather, gather, scatter,
 * reduce_scatter, all_to_all, barrier: a decision that depends on the kind
 * only, so it is the same on every rank); send/recv stay on TCP.
 * CRUN_SHM=0 turns the engine off (checked by the cpu backend). */
#include "transport/shm/shm_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/trace_int.h"

/* Network namespaces count: ranks in different ones are on different hosts
 * even when they share the kernel (boot id), hostname and /dev/shm, as the
 * hosts that scripts/netns.sh builds do; a host's addresses and its abstract
 * unix sockets (the store's same-host shortcut) live in its namespace. */
void crun__shm_host_identity(char *buf, size_t n) {
  char boot[64] = "", host[256] = "", ipc[64] = "", mnt[64] = "", net[64] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
    fclose(f);
  }
  boot[strcspn(boot, "\n")] = 0;
  if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
  ssize_t k = readlink("/proc/self/ns/ipc", ipc, sizeof ipc - 1);
  ipc[k > 0 ? k : 0] = 0;
  k = readlink("/proc/self/ns/mnt", mnt, sizeof mnt - 1);
  mnt[k > 0 ? k : 0] = 0;
  k = readlink("/proc/self/ns/net", net, sizeof net - 1);
  net[k > 0 ? k : 0] = 0;
  snprintf(buf, n, "%s/%s/%s/%s/%s", boot, host, ipc, mnt, net);
}

/* Publishes `val` under "<what>/<rank>" and sets *all_same to whether every
 * rank published the same value. */
static int agree(crun_pg_t *pg, const char *what, const char *val, int *all_same) {
  char key[64];
  snprintf(key, sizeof key, "shm/%s/%d", what, pg->rank);
  CRUN_CHECK(crun_store_set(pg->store, key, val, strlen(val)));
  *all_same = 1;
  for (int q = 0; q < pg->size; q++) {
    crun_buf_t v = {0};
    snprintf(key, sizeof key, "shm/%s/%d", what, q);
    CRUN_CHECK(crun_store_get(pg->store, key, &v));
    if (v.len != strlen(val) || memcmp(v.data, val, v.len) != 0) *all_same = 0;
    crun_buf_free(&v);
  }
  return 0;
}

typedef struct {
  crun_pg_t *pg;
  crun__shm_comm_t *comm;
} eng_t;

static int eng_supports(void *state, const crun__coll_t *c) {
  (void)state;
  switch (c->kind) {
  case CRUN__COLL_BROADCAST: case CRUN__COLL_ALL_REDUCE: case CRUN__COLL_REDUCE:
  case CRUN__COLL_ALL_GATHER: case CRUN__COLL_REDUCE_SCATTER: case CRUN__COLL_BARRIER:
  case CRUN__COLL_GATHER: case CRUN__COLL_SCATTER: case CRUN__COLL_ALL_TO_ALL:
    return 1;
  default:
    return 0;
  }
}

/* Runs the collective on the communicator. */
static int dispatch(crun__shm_comm_t *s, crun__coll_t *c, double t) {
  switch (c->kind) {
  case CRUN__COLL_BROADCAST:
    return crun__shm_broadcast(s, c->buf, c->count, c->dt, c->root, t);
  case CRUN__COLL_ALL_REDUCE:
    return crun__shm_allreduce(s, c->buf, NULL, c->count, c->dt, c->op, t);
  case CRUN__COLL_REDUCE:
    return crun__shm_reduce(s, c->buf, NULL, c->count, c->dt, c->op, c->root, t);
  case CRUN__COLL_ALL_GATHER:
    return crun__shm_all_gather_v(s, c->outs, c->in, c->count, c->dt, t);
  case CRUN__COLL_REDUCE_SCATTER:
    return crun__shm_reduce_scatter_v(s, c->buf, c->ins, c->count, c->dt, c->op, t);
  case CRUN__COLL_GATHER:
    return crun__shm_gather_v(s, c->outs, c->in, c->count, c->dt, c->root, t);
  case CRUN__COLL_SCATTER:
    return crun__shm_scatter_v(s, c->buf, (const void *const *)c->ins, c->count, c->dt, c->root, t);
  case CRUN__COLL_ALL_TO_ALL:
    return crun__shm_all_to_all_v(s, c->outs, c->out_counts, (const void *const *)c->ins,
                                  c->in_counts, c->dt, t);
  case CRUN__COLL_BARRIER:
    return crun__shm_barrier(s, t);
  }
  return crun_error(CRUN_ENOTSUP, "shm engine: %s is not supported", crun__coll_name(c->kind));
}

/* Runs one collective of the group on the engine by the group's deadline,
 * numbered as the group numbers it; a timeout also says where every rank is. */
static int eng_run(void *state, crun__coll_t *c) {
  eng_t *e = state;
  crun__shm_comm_label(e->comm, c->seq);
  if (c->deadline > 0) crun__shm_comm_deadline(e->comm, c->deadline, c->timeout);
  return crun__pg_timeout_report(e->pg, dispatch(e->comm, c, c->timeout));
}

/* eng_run for an all_reduce (crun__engine_t all_reduce: the cpu backend's
 * direct): the group checked its arguments and set its deadline. */
static int eng_all_reduce(void *state, crun__coll_t *c) {
  eng_t *e = state;
  if (crun__obs_on) crun__obs_algo = "shm";
  return crun__pg_timeout_report(e->pg, crun__shm_allreduce_call(e->comm, c->buf, c->count, c->dt, c->op, c->seq,
                                                                 c->deadline, c->timeout));
}

/* The group failed on this rank (backend.h crun__engine_t.abort): the peers
 * waiting in the engine, now or at their next call, fail with its text. */
static void eng_abort(void *state, int status, const char *text) {
  eng_t *e = state;
  /* a failure of the engine's own has written the record already */
  if (e->comm && !atomic_load_explicit(&e->comm->hdr->abort_rank, memory_order_acquire))
    crun__shm_fail(e->comm, status, "%s", text);
}

static void eng_destroy(void *state) {
  eng_t *e = state;
  crun__shm_comm_destroy(e->comm);
  free(e);
}

int crun__shm_engine_open(crun_pg_t *pg, crun__engine_t *out) {
  char host[400];
  int same = 0, ok = 0;
  crun__shm_host_identity(host, sizeof host);
  CRUN_CHECK(agree(pg, "host", host, &same));
  if (!same) return CRUN_ENOTSUP;
  crun__shm_comm_t *c = NULL;
  /* its texts name the group's ranks as the group's own do */
  int rc = crun__shm_comm_create_ranks(pg->store, "shm", pg->rank, pg->size, pg->global, pg->timeout, &c);
  if (rc < 0)
    CRUN_LOG(WARN, SHM, "%s: shared memory unavailable, staying on TCP: %s", CRUN__WHO(pg, pg->rank),
             crun_last_error());
  eng_t *e = rc == 0 ? calloc(1, sizeof *e) : NULL;
  rc = agree(pg, "ok", e ? "1" : "0", &ok);
  if (rc < 0 || !ok || !e) {
    crun__shm_comm_destroy(c);
    free(e);
    return rc < 0 ? rc : CRUN_ENOTSUP;
  }
  e->pg = pg;
  e->comm = c;
  *out = (crun__engine_t){.name = "shm", .state = e, .supports = eng_supports,
                          .run = eng_run, .destroy = eng_destroy, .abort = eng_abort, .posts_obs = 1,
                          .all_reduce = eng_all_reduce};
  CRUN_LOG(INFO, SHM, "group of %d ranks uses the shared-memory engine", pg->size);
  return 0;
}
