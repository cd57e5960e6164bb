/* rdzv.c — torchrun's c10d rendezvous on crun's TCP store: one round, no
 * membership changes (a node that arrives after the round closed fails).
 *
 * Keys, all under "crun/rdzv/<run id>/" (jobs with other run ids on the same
 * store never see them):
 *   joined     counter; an agent's add of 1 gives it its slot 1, 2, ...
 *   slot/<s>   "<nproc> <pid> <role> <host>" of the agent in slot s
 *   closed     N, the slots in the round; set once (compare-and-set)
 * The round closes when MAX agents joined, or when at least MIN joined and
 * last_call_timeout passed since an agent first saw MIN of them; the first
 * agent to see that sets `closed`. Slots 1..N are the members. Node ranks are
 * first come: node r is the agent in slot r + 1. Global ranks are node-major.
 * Which agent serves the store does not matter: it keeps serving until every
 * client has left (agent.c). */
#include "launcher.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POLL_SLICE 0.1
#define SLOT_VALUE_MAX 512

/* "crun/rdzv/<run id>/" + the rest into buf. */
static const char *rkey(char *buf, size_t n, const crun__opts_t *o, const char *fmt, long long x) {
  int off = snprintf(buf, n, "crun/rdzv/%s/", o->run_id);
  snprintf(buf + off, n - (size_t)off, fmt, x);
  return buf;
}

/* The text of the last error without its leading "ENAME: ". */
static const char *bare(void) {
  const char *e = crun_last_error(), *sep = strstr(e, ": ");
  return sep && sep - e < 16 ? sep + 2 : e;
}

void crun__round_place(const crun__node_t *nodes, int n, int me, crun__round_t *out) {
  *out = (crun__round_t){.node_rank = me, .nnodes = n};
  for (int r = 0; r < n; r++) {
    int same_role = strcmp(nodes[r].role, nodes[me].role) == 0;
    if (r < me) out->rank_base += nodes[r].nproc;
    if (r < me && same_role) out->role_rank_base += nodes[r].nproc;
    out->world_size += nodes[r].nproc;
    if (same_role) out->role_world_size += nodes[r].nproc;
  }
}

/* Takes a slot and registers this agent in it. */
static int take_slot(const crun__opts_t *o, crun_store_t *st, int64_t *slot) {
  char k[160], val[SLOT_VALUE_MAX], host[256] = "?";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = 0;
  int rc = crun_store_add(st, rkey(k, sizeof k, o, "joined", 0), 1, slot);
  if (rc < 0) return rc;
  int len = snprintf(val, sizeof val, "%d %ld %s %s", o->nproc, (long)getpid(), o->role, host);
  if (len >= (int)sizeof val) len = (int)sizeof val - 1;
  return crun_store_set(st, rkey(k, sizeof k, o, "slot/%lld", (long long)*slot), val, (size_t)len);
}

/* Reads `closed` (it exists) into *n. */
static int read_closed(const crun__opts_t *o, crun_store_t *st, int64_t *n) {
  char k[160];
  crun_buf_t b = {0};
  int rc = crun_store_get(st, rkey(k, sizeof k, o, "closed", 0), &b);
  if (rc < 0) return rc;
  char num[24] = {0};
  memcpy(num, b.data, b.len < sizeof num - 1 ? b.len : sizeof num - 1);
  crun_buf_free(&b);
  *n = strtoll(num, NULL, 10);
  return *n > 0 ? 0 : crun_error(CRUN_EPROTO, "rendezvous '%s': bad round size '%s' on the store", o->run_id, num);
}

/* Closes the round with n slots unless another agent closed it first. */
static int close_round(const crun__opts_t *o, crun_store_t *st, int64_t n) {
  char k[160], val[24];
  int len = snprintf(val, sizeof val, "%lld", (long long)n);
  crun_buf_t got = {0};
  int rc = crun_store_compare_set(st, rkey(k, sizeof k, o, "closed", 0), "", 0, val, (size_t)len, &got);
  crun_buf_free(&got);
  return rc;
}

/* Waits until the round is closed (closing it when this agent sees it due);
 * *n is then the number of members. */
static int wait_closed(const crun__opts_t *o, crun_store_t *st, int64_t *n) {
  char ck[160], jk[160];
  const char *kp = rkey(ck, sizeof ck, o, "closed", 0);
  rkey(jk, sizeof jk, o, "joined", 0);
  double deadline = crun_clock() + o->join_timeout, min_seen = -1;
  for (;;) { /* look first: the agent that completes the round closes it at once */
    int64_t joined = 0;
    CRUN_CHECK(crun_store_add(st, jk, 0, &joined));
    double now = crun_clock();
    if (joined >= o->min_nodes && min_seen < 0) min_seen = now;
    if (joined >= o->nnodes || (min_seen >= 0 && now - min_seen >= o->last_call_timeout)) {
      CRUN_CHECK(close_round(o, st, joined < o->nnodes ? joined : o->nnodes));
    } else if (joined < o->min_nodes && now >= deadline) {
      return crun_error(CRUN_ETIMEDOUT, "only %lld of at least %d node(s) joined within join_timeout "
                        "%g s", (long long)joined, o->min_nodes, o->join_timeout);
    }
    int rc = crun_store_wait(st, &kp, 1, POLL_SLICE);
    if (rc == 0) return read_closed(o, st, n);
    if (rc != CRUN_ETIMEDOUT) return rc;
    if (crun__signals_pending()) return crun_error(CRUN_EINTR, "interrupted by a signal");
  }
}

/* Parses a slot's value into node. */
static int parse_slot(const crun__opts_t *o, int64_t slot, const crun_buf_t *b, crun__node_t *node) {
  char val[SLOT_VALUE_MAX];
  size_t len = b->len < sizeof val - 1 ? b->len : sizeof val - 1;
  memcpy(val, b->data, len);
  val[len] = 0;
  long pid;
  if (sscanf(val, "%d %ld %63s", &node->nproc, &pid, node->role) != 3 || node->nproc <= 0 ||
      node->nproc > CRUN_LAUNCH_MAX_NPROC) /* so that no sum of them overflows */
    return crun_error(CRUN_EPROTO, "rendezvous '%s': slot %lld holds '%s', not an agent's entry",
                      o->run_id, (long long)slot, val);
  return 0;
}

/* Reads the n members' entries into nodes[0..n), in slot (= node rank)
 * order, waiting up to close_timeout for them. */
static int read_members(const crun__opts_t *o, crun_store_t *st, int64_t n, crun__node_t *nodes) {
  char (*keys)[160] = calloc((size_t)n, sizeof *keys);
  const char **kp = calloc((size_t)n, sizeof *kp);
  crun_buf_t *vals = calloc((size_t)n, sizeof *vals);
  int rc = keys && kp && vals ? 0 : crun_error(CRUN_ENOMEM, "out of memory for %lld nodes", (long long)n);
  for (int64_t s = 0; rc == 0 && s < n; s++) kp[s] = rkey(keys[s], sizeof keys[s], o, "slot/%lld", s + 1);
  if (rc == 0 && (rc = crun_store_wait(st, kp, (size_t)n, o->close_timeout)) == CRUN_ETIMEDOUT)
    rc = crun_error(rc, "a member of the closed round did not register within close_timeout %g s",
                    o->close_timeout);
  if (rc == 0) rc = crun_store_multi_get(st, kp, (size_t)n, vals);
  for (int64_t s = 0; rc == 0 && s < n; s++) rc = parse_slot(o, s + 1, &vals[s], &nodes[s]);
  for (int64_t s = 0; vals && s < n; s++) crun_buf_free(&vals[s]);
  free(keys);
  free(kp);
  free(vals);
  return rc;
}

int crun__rdzv_join(const crun__opts_t *o, crun_store_t *st, crun__round_t *out) {
  int64_t slot = 0, n = 0;
  int rc = take_slot(o, st, &slot);
  if (rc == 0) rc = wait_closed(o, st, &n);
  if (rc < 0)
    return crun_error(rc, "rendezvous '%s' at %s:%d: %s", o->run_id, o->rdzv_host, o->rdzv_port, bare());
  if (slot > n)
    return crun_error(CRUN_ESTATE, "rendezvous '%s' at %s:%d: the round closed with %lld node(s) "
                      "before this node joined (crun has no membership changes yet: start every "
                      "node before the round closes, raise last_call_timeout, or use a new --rdzv-id)",
                      o->run_id, o->rdzv_host, o->rdzv_port, (long long)n);
  if (n > CRUN_LAUNCH_MAX_NODES) /* MAX_NODES * MAX_NPROC fits an int */
    return crun_error(CRUN_ERANGE, "rendezvous '%s': %lld nodes (at most %d)", o->run_id, (long long)n,
                      CRUN_LAUNCH_MAX_NODES);
  crun__node_t *nodes = calloc((size_t)n, sizeof *nodes);
  if (!nodes) return crun_error(CRUN_ENOMEM, "rendezvous: out of memory for %lld nodes", (long long)n);
  rc = read_members(o, st, n, nodes);
  if (rc == 0) crun__round_place(nodes, (int)n, (int)(slot - 1), out);
  free(nodes);
  if (rc < 0)
    return crun_error(rc, "rendezvous '%s' at %s:%d: %s", o->run_id, o->rdzv_host, o->rdzv_port, bare());
  return 0;
}
