/* check.c — the host-side signature check before every collective of an
 * nccl group (CRUN_NCCL_CHECK=0 turns it off). Each rank writes what it calls
 * (kind, seq, dtype, count, op, root, its deadline in wall time; all_to_all:
 * the count it sends each peer) under "nccl/sig/<seq>/<rank>" in the group's
 * store and waits for every other rank's key until the call's deadline, then
 * compares: a mismatch fails on every rank with the mpi backend's EMISMATCH
 * text, a rank that never came is named in an ETIMEDOUT with where every
 * rank is (the progress board), before anyone enters NCCL. A rank that
 * arrives after a peer's deadline fails instead of entering NCCL alone. A
 * rank's previous key is deleted once it passed the next check (everyone
 * read it by then). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/nccl/nccl_int.h"

enum { SIG_KIND, SIG_SEQ, SIG_DTYPE, SIG_COUNT, SIG_OP, SIG_ROOT, SIG_CMP, SIG_DEADLINE = SIG_CMP, SIG_WORDS };
#define GUARD 0.5

static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Our signature as peer p should see it; count: what we expect from p. */
static void expect_from(const crun__coll_t *c, int p, int64_t *s) {
  s[SIG_KIND] = c->kind;
  s[SIG_SEQ] = (int64_t)c->seq;
  s[SIG_DTYPE] = c->dt;
  s[SIG_COUNT] = c->kind == CRUN__COLL_ALL_TO_ALL ? (int64_t)c->out_counts[p] : (int64_t)c->count;
  s[SIG_OP] = crun__coll_reduces(c->kind) ? (int64_t)c->op : -1;
  s[SIG_ROOT] = crun__coll_rooted(c->kind) ? c->root : -1;
}

static void shape(const crun_pg_t *pg, char *b, size_t cap, const int64_t *s, int show_op, int show_root) {
  const char *dn = s[SIG_DTYPE] >= 0 && s[SIG_DTYPE] < CRUN_DTYPE_COUNT ? crun_dtype_name((crun_dtype_t)s[SIG_DTYPE]) : NULL;
  size_t n = (size_t)snprintf(b, cap, "%s[%lld]", dn ? dn : "?", (long long)s[SIG_COUNT]);
  if (show_op && s[SIG_OP] >= 0 && n < cap)
    n += (size_t)snprintf(b + n, cap - n, " %s", crun_reduce_op_name((crun_reduce_op_t)s[SIG_OP]));
  if (show_root && s[SIG_ROOT] >= 0 && n < cap) /* as the caller gave it: its global rank */
    snprintf(b + n, cap - n, " root %lld",
             s[SIG_ROOT] < pg->size ? (long long)pg->global[s[SIG_ROOT]] : (long long)s[SIG_ROOT]);
}

static void sig_key(char *k, size_t cap, uint64_t seq, int r) {
  snprintf(k, cap, "nccl/sig/%llu/%d", (unsigned long long)seq, r);
}

/* Names the ranks whose key is missing and where every rank is. */
static int timed_out(crun__nccl_t *b, const crun__coll_t *c, const char *desc) {
  crun_pg_t *pg = b->pg;
  int n = pg->size, nl = 0, *late = malloc(sizeof(int) * (size_t)n);
  char who[256] = "some ranks", where[768] = "";
  for (int p = 0; late && p < n; p++) {
    if (p == pg->rank) continue;
    char k[64];
    sig_key(k, sizeof k, c->seq, p);
    const char *kp = k;
    int ok = 0;
    if (crun_store_check(pg->board, &kp, 1, &ok) == 0 && !ok) late[nl++] = p;
  }
  if (late && nl) crun__pg_ranks_text(pg, who, sizeof who, late, nl);
  free(late);
  crun__pg_progress_report(pg, where, sizeof where);
  return crun_error(CRUN_ETIMEDOUT, "%s on %s: no data from %s after %.1f s%s%s", desc, CRUN__WHO(pg, pg->rank), who,
                    c->timeout, where[0] ? "; " : "", where);
}

static int compare(crun__nccl_t *b, const crun__coll_t *c, crun_buf_t *v, const char *desc, double entered) {
  crun_pg_t *pg = b->pg;
  int64_t e[SIG_WORDS], t[SIG_WORDS];
  for (int p = 0; p < pg->size; p++) {
    if (p == pg->rank) continue;
    size_t want = sizeof(int64_t) * (SIG_WORDS + (size_t)(c->kind == CRUN__COLL_ALL_TO_ALL ? pg->size : 0));
    const crun_buf_t *x = &v[p];
    if (x->len < sizeof t)
      return crun_error(CRUN_EIO, "%s on %s: %s's signature is %zu bytes", desc, CRUN__WHO(pg, pg->rank),
                        CRUN__WHO(pg, p), x->len);
    memcpy(t, x->data, sizeof t);
    if (t[SIG_KIND] == CRUN__COLL_ALL_TO_ALL && x->len >= sizeof(int64_t) * (SIG_WORDS + (size_t)pg->size))
      memcpy(&t[SIG_COUNT], (const char *)x->data + sizeof(int64_t) * (SIG_WORDS + (size_t)pg->rank), sizeof(int64_t));
    (void)want;
    expect_from(c, p, e);
    if (memcmp(e, t, sizeof(int64_t) * SIG_CMP)) {
      char mine[96], theirs[96];
      int dop = e[SIG_OP] != t[SIG_OP], droot = e[SIG_ROOT] != t[SIG_ROOT];
      shape(pg, mine, sizeof mine, e, dop, droot);
      shape(pg, theirs, sizeof theirs, t, dop, droot);
      return crun_error(CRUN_EMISMATCH, "%s on %s expected %s, %s sent %s #%lld %s", desc, CRUN__WHO(pg, pg->rank), mine,
                        CRUN__WHO(pg, p),
                        crun__coll_name((int)t[SIG_KIND]), (long long)t[SIG_SEQ], theirs);
    }
  }
  for (int p = 0; p < pg->size; p++) {
    if (p == pg->rank) continue;
    memcpy(t, v[p].data, sizeof t);
    double pd = (double)t[SIG_DEADLINE] * 1e-6;
    if (entered >= pd + GUARD)
      return crun_error(CRUN_ETIMEDOUT, "%s on %s: arrived %.1f s after %s's deadline for it; %s "
                        "gave up waiting (timeout %.1f s)", desc, CRUN__WHO(pg, pg->rank), entered - pd,
                        CRUN__WHO(pg, p), CRUN__WHO(pg, p), c->timeout);
  }
  return 0;
}

int crun__nccl_check(crun__nccl_t *b, crun__coll_t *c) {
  crun_pg_t *pg = b->pg;
  int n = pg->size, rc = 0;
  if (n < 2 || !b->check) return 0;
  char desc[64], k[64];
  crun__pg_coll_desc(pg, c, desc, sizeof desc);
  double entered = wall();
  size_t words = SIG_WORDS + (size_t)(c->kind == CRUN__COLL_ALL_TO_ALL ? n : 0);
  int64_t *mine = calloc(words, sizeof(int64_t));
  char (*keys)[64] = calloc((size_t)n, 64);
  const char **kp = calloc((size_t)n, sizeof *kp);
  crun_buf_t *vals = calloc((size_t)n, sizeof *vals);
  if (!mine || !keys || !kp || !vals) { rc = crun_error(CRUN_ENOMEM, "%s: signature check", desc); goto out; }
  mine[SIG_KIND] = c->kind;
  mine[SIG_SEQ] = (int64_t)c->seq;
  mine[SIG_DTYPE] = c->dt;
  mine[SIG_COUNT] = (int64_t)c->count;
  mine[SIG_OP] = crun__coll_reduces(c->kind) ? (int64_t)c->op : -1;
  mine[SIG_ROOT] = crun__coll_rooted(c->kind) ? c->root : -1;
  mine[SIG_DEADLINE] = (int64_t)((entered + (c->deadline - crun_clock())) * 1e6);
  for (int p = 0; c->kind == CRUN__COLL_ALL_TO_ALL && p < n; p++) mine[SIG_WORDS + p] = (int64_t)c->in_counts[p];
  sig_key(k, sizeof k, c->seq, pg->rank);
  CRUN_CHECK_GOTO(crun_store_set(pg->store, k, mine, words * sizeof(int64_t)), rc, out);
  int m = 0;
  for (int p = 0; p < n; p++) {
    sig_key(keys[p], 64, c->seq, p);
    if (p != pg->rank) kp[m++] = keys[p];
  }
  for (;;) { /* wait in slices so that a peer's abort notice ends the wait */
    double left = c->deadline - crun_clock();
    if (left <= 0) { rc = timed_out(b, c, desc); goto out; }
    rc = crun_store_wait(pg->store, kp, (size_t)m, left < 0.25 ? left : 0.25);
    if (rc == 0) break;
    if (rc != CRUN_ETIMEDOUT) goto out;
    if ((rc = crun__nccl_poll_abort(b, desc)) < 0) goto out;
  }
  const char **all = calloc((size_t)n, sizeof *all);
  if (!all) { rc = crun_error(CRUN_ENOMEM, "%s: signature check", desc); goto out; }
  for (int p = 0; p < n; p++) all[p] = keys[p];
  rc = crun_store_multi_get(pg->store, all, (size_t)n, vals);
  free(all);
  if (rc == 0) rc = compare(b, c, vals, desc, entered);
  if (rc == 0 && b->last_checked) { /* everyone passed that check: nobody reads our old key again */
    sig_key(k, sizeof k, b->last_checked, pg->rank);
    crun_store_delete_key(pg->store, k, NULL);
  }
  if (rc == 0) b->last_checked = c->seq;
out:
  for (int p = 0; vals && p < n; p++) crun_buf_free(&vals[p]);
  free(vals);
  free(kp);
  free(keys);
  free(mine);
  return rc;
}

int crun__nccl_poll_abort(crun__nccl_t *b, const char *desc) {
  crun_buf_t v = {0};
  if (crun__pg_board_peek(b->pg, "nccl/abort", &v) <= 0) return 0; /* none, or the board unreadable */
  /* the peer's status when its text names one ("ETIMEDOUT: ..."), else ESTATE */
  int st = CRUN_ESTATE;
  const char *t = v.data, *colon = memchr(t, ':', v.len);
  for (int s = -1; colon && s >= -64; s--) {
    const char *name = crun_err_name(s);
    if (name && strlen(name) == (size_t)(colon - t) && !memcmp(name, t, (size_t)(colon - t))) { st = s; break; }
  }
  if (colon && st != CRUN_ESTATE) t = colon + 2 <= t + v.len ? colon + 2 : colon + 1;
  int rc = crun_error(st, "%s on %s: a peer aborted the group: %.*s", desc, CRUN__WHO(b->pg, b->pg->rank),
                      (int)(v.len - (size_t)(t - (const char *)v.data)), t);
  crun_buf_free(&v);
  return rc;
}
