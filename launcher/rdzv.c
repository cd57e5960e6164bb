/* rdzv.c — torchrun's c10d rendezvous on crun's TCP store, in rounds: the
 * job runs round 0; a membership change or a restart opens round R + 1,
 * which every surviving agent (and any node waiting to join) takes part in.
 *
 * Keys, all under "crun/rdzv/<run id>/<R>/" (jobs with other run ids on the
 * same store never see them; round R never sees round R - 1's):
 *   joined     counter; an agent's add of 1 gives it its slot 1, 2, ...
 *   slot/<s>   "<nproc> <pid> <role> <host>" of the agent in slot s
 *   closed     N, the slots in the round; set once (compare-and-set)
 *   verdict    how the round ended (agent.c), set once (compare-and-set):
 *              "<kind> <restarts> <expect> <lost> <text>", kind done (the
 *              job succeeded), next (round R + 1 follows) or end (the job
 *              failed; text says why); restarts: worker failures restarted
 *              so far; expect: the nodes round R + 1 waits for; lost: the
 *              node ranks of R declared lost ("-": none); text: why.
 * A round closes when MAX agents joined, or as many as the previous round's
 * verdict expects, or when at least MIN joined and last_call_timeout passed
 * since an agent first saw MIN of them; the first agent to see that sets
 * `closed`. Slots 1..N are the members. An agent whose slot is above N came
 * late: it waits (join_timeout) for the round's verdict and joins the next
 * round; the members see it waiting (joined > N) and open that round when
 * N < MAX. Node ranks are first come: node r is the agent in slot r + 1.
 * Global ranks are node-major. Which agent serves the store does not
 * matter: it keeps serving until every client has left (agent.c). */
#include "launcher.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POLL_SLICE 0.1
#define SLOT_VALUE_MAX 512

const char *crun__rdzv_key(char *buf, size_t n, const crun__opts_t *o, int round, const char *fmt,
                           long long x) {
  int off = snprintf(buf, n, "crun/rdzv/%s/%d/", o->run_id, round);
  snprintf(buf + off, n - (size_t)off, fmt, x);
  return buf;
}
#define rkey(buf, n, o, fmt, x) crun__rdzv_key(buf, n, o, round, fmt, x) /* callers hold `round` */

/* The text of the last error without its leading "ENAME: ". */
static const char *bare(void) {
  const char *e = crun_last_error(), *sep = strstr(e, ": ");
  return sep && sep - e < 16 ? sep + 2 : e;
}

void crun__round_place(const crun__node_t *nodes, int n, int me, crun__round_t *out) {
  out->node_rank = me;
  out->nnodes = n;
  out->rank_base = out->world_size = out->role_rank_base = out->role_world_size = 0;
  for (int r = 0; r < n; r++) {
    int same_role = strcmp(nodes[r].role, nodes[me].role) == 0;
    if (r < me) out->rank_base += nodes[r].nproc;
    if (r < me && same_role) out->role_rank_base += nodes[r].nproc;
    out->world_size += nodes[r].nproc;
    if (same_role) out->role_world_size += nodes[r].nproc;
  }
}

int crun__verdict_parse(const char *text, size_t len, crun__verdict_t *v) {
  char buf[CRUN_VERDICT_MAX];
  size_t n = len < sizeof buf - 1 ? len : sizeof buf - 1;
  memcpy(buf, text, n);
  buf[n] = 0;
  int off = 0;
  memset(v, 0, sizeof *v);
  if (sscanf(buf, "%15s %d %d %255s %n", v->kind, &v->restarts, &v->expect, v->lost, &off) != 4 ||
      (strcmp(v->kind, "done") && strcmp(v->kind, "next") && strcmp(v->kind, "end")))
    return crun_error(CRUN_EPROTO, "rendezvous: bad verdict '%s' on the store", buf);
  snprintf(v->text, sizeof v->text, "%s", buf + off);
  return 0;
}

/* Reads round `round`'s verdict into v; *found 0 when there is none yet. */
static int read_verdict(const crun__opts_t *o, crun_store_t *st, int round, crun__verdict_t *v, int *found) {
  char k[200];
  const char *kp = rkey(k, sizeof k, o, "verdict", 0);
  CRUN_CHECK(crun_store_check(st, &kp, 1, found));
  if (!*found) return 0;
  crun_buf_t b = {0};
  CRUN_CHECK(crun_store_get(st, kp, &b));
  int rc = crun__verdict_parse(b.data, b.len, v);
  crun_buf_free(&b);
  return rc;
}

/* Takes a slot in round `round` and registers this agent in it. */
static int take_slot(const crun__opts_t *o, crun_store_t *st, int round, int64_t *slot) {
  char k[200], val[SLOT_VALUE_MAX], host[256] = "?";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = 0;
  int rc = crun_store_add(st, rkey(k, sizeof k, o, "joined", 0), 1, slot);
  if (rc < 0) return rc;
  int len = snprintf(val, sizeof val, "%d %ld %s %s", o->nproc, (long)getpid(), o->role, host);
  if (len >= (int)sizeof val) len = (int)sizeof val - 1;
  return crun_store_set(st, rkey(k, sizeof k, o, "slot/%lld", (long long)*slot), val, (size_t)len);
}

/* Reads `closed` (it exists) into *n. */
static int read_closed(const crun__opts_t *o, crun_store_t *st, int round, int64_t *n) {
  char k[200];
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
static int close_round(const crun__opts_t *o, crun_store_t *st, int round, int64_t n) {
  char k[200], val[24];
  int len = snprintf(val, sizeof val, "%lld", (long long)n);
  crun_buf_t got = {0};
  int rc = crun_store_compare_set(st, rkey(k, sizeof k, o, "closed", 0), "", 0, val, (size_t)len, &got);
  crun_buf_free(&got);
  return rc;
}

/* Waits until the round is closed (closing it when this agent sees it due:
 * MAX or `expect` joined, or MIN and the last call over); *n is then the
 * number of members. */
static int wait_closed(const crun__opts_t *o, crun_store_t *st, int round, int expect, int64_t *n) {
  char ck[200], jk[200];
  const char *kp = rkey(ck, sizeof ck, o, "closed", 0);
  rkey(jk, sizeof jk, o, "joined", 0);
  double deadline = crun_clock() + o->join_timeout, min_seen = -1;
  int enough = expect > 0 && expect < o->nnodes ? expect : o->nnodes;
  for (;;) { /* look first: the agent that completes the round closes it at once */
    int64_t joined = 0;
    CRUN_CHECK(crun_store_add(st, jk, 0, &joined));
    double now = crun_clock();
    if (joined >= o->min_nodes && min_seen < 0) min_seen = now;
    if (joined >= enough || (min_seen >= 0 && now - min_seen >= o->last_call_timeout)) {
      CRUN_CHECK(close_round(o, st, round, joined < o->nnodes ? joined : o->nnodes));
    } else if (joined < o->min_nodes && now >= deadline) {
      return crun_error(CRUN_ETIMEDOUT, "only %lld of at least %d node(s) joined round %d within "
                        "join_timeout %g s", (long long)joined, o->min_nodes, round, o->join_timeout);
    }
    int rc = crun_store_wait(st, &kp, 1, POLL_SLICE);
    if (rc == 0) return read_closed(o, st, round, n);
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
  snprintf(node->host, sizeof node->host, "?");
  if (sscanf(val, "%d %ld %63s %63s", &node->nproc, &pid, node->role, node->host) < 3 || node->nproc <= 0 ||
      node->nproc > CRUN_LAUNCH_MAX_NPROC) /* so that no sum of them overflows */
    return crun_error(CRUN_EPROTO, "rendezvous '%s': slot %lld holds '%s', not an agent's entry",
                      o->run_id, (long long)slot, val);
  node->pid = pid;
  return 0;
}

/* Reads the n members' entries into nodes[0..n), in slot (= node rank)
 * order, waiting up to close_timeout for them. */
static int read_members(const crun__opts_t *o, crun_store_t *st, int round, int64_t n, crun__node_t *nodes) {
  char (*keys)[200] = calloc((size_t)n, sizeof *keys);
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

/* A node that came after round `round` closed: waits (until `deadline`)
 * for the round's verdict, which opens the next round or ends the job. */
static int wait_verdict(const crun__opts_t *o, crun_store_t *st, int round, int64_t n, double deadline,
                        crun__verdict_t *v) {
  char k[200];
  const char *kp = rkey(k, sizeof k, o, "verdict", 0);
  CRUN_LOG(INFO, LAUNCH, "rendezvous '%s': round %d runs with %lld node(s); waiting to join the next",
           o->run_id, round, (long long)n);
  for (;;) {
    double left = deadline - crun_clock();
    if (left <= 0)
      return crun_error(CRUN_ETIMEDOUT, "round %d runs with %lld node(s)%s and did not make room for this "
                        "node within join_timeout %g s", round, (long long)n,
                        n >= o->nnodes ? " (the --nnodes maximum)" : "", o->join_timeout);
    int rc = crun_store_wait(st, &kp, 1, left < POLL_SLICE ? left : POLL_SLICE);
    if (rc == 0) break;
    if (rc != CRUN_ETIMEDOUT) return rc;
    if (crun__signals_pending()) return crun_error(CRUN_EINTR, "interrupted by a signal");
  }
  int found = 0;
  return read_verdict(o, st, round, v, &found);
}

/* The first round without a verdict, and the verdict before it (kind ""
 * for round 0). A job that already ended is an error. */
static int current_round(const crun__opts_t *o, crun_store_t *st, int *round_out, crun__verdict_t *prev) {
  memset(prev, 0, sizeof *prev);
  for (int round = 0;; round++) {
    crun__verdict_t v;
    int found = 0;
    CRUN_CHECK(read_verdict(o, st, round, &v, &found));
    if (!found) {
      *round_out = round;
      return 0;
    }
    if (strcmp(v.kind, "next"))
      return crun_error(CRUN_ESTATE, "the job of this run id already %s in round %d (%s); use a new "
                        "--rdzv-id", strcmp(v.kind, "done") ? "failed" : "finished", round, v.text);
    *prev = v;
  }
}

int crun__rdzv_join(const crun__opts_t *o, crun_store_t *st, int round, crun__round_t *out) {
  crun__verdict_t prev = {0};
  int rc = 0, found = 1;
  double deadline = crun_clock() + o->join_timeout;
  if (round < 0) rc = current_round(o, st, &round, &prev);
  else if (round > 0 && (rc = read_verdict(o, st, round - 1, &prev, &found)) == 0 && !found)
    rc = crun_error(CRUN_EPROTO, "round %d has no verdict", round - 1);
  int64_t slot = 0, n = 0;
  while (rc == 0) {
    if ((rc = take_slot(o, st, round, &slot)) < 0 ||
        (rc = wait_closed(o, st, round, prev.kind[0] ? prev.expect : 0, &n)) < 0 || slot <= n)
      break;
    if ((rc = wait_verdict(o, st, round, n, deadline, &prev)) < 0) break;
    if (strcmp(prev.kind, "next")) {
      rc = crun_error(CRUN_ESTATE, "the job %s in round %d (%s) before this node could join",
                      strcmp(prev.kind, "done") ? "failed" : "finished", round, prev.text);
      break;
    }
    round++;
  }
  if (rc < 0)
    return crun_error(rc, "rendezvous '%s' at %s:%d: %s", o->run_id, o->rdzv_host, o->rdzv_port, bare());
  if (n > CRUN_LAUNCH_MAX_NODES) /* MAX_NODES * MAX_NPROC fits an int */
    return crun_error(CRUN_ERANGE, "rendezvous '%s': %lld nodes (at most %d)", o->run_id, (long long)n,
                      CRUN_LAUNCH_MAX_NODES);
  crun__node_t *nodes = calloc((size_t)n, sizeof *nodes);
  if (!nodes) return crun_error(CRUN_ENOMEM, "rendezvous: out of memory for %lld nodes", (long long)n);
  rc = read_members(o, st, round, n, nodes);
  if (rc < 0) {
    free(nodes);
    return crun_error(rc, "rendezvous '%s' at %s:%d: %s", o->run_id, o->rdzv_host, o->rdzv_port, bare());
  }
  crun__round_place(nodes, (int)n, (int)(slot - 1), out);
  out->round = round;
  out->nodes = nodes;
  out->restarts = prev.kind[0] ? prev.restarts : 0;
  snprintf(out->why, sizeof out->why, "%s", prev.kind[0] ? prev.text : "");
  return 0;
}
