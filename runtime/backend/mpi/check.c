/* check.c — the signature exchange that precedes every collective: each rank
 * sends every other rank what it is calling (kind, seq, dtype, count, op,
 * root; for all_to_all the count it sends that peer) and waits for theirs
 * until the call's deadline. All ranks see the same signatures, so a mismatch
 * fails on every rank, naming both calls, before anyone enters MPI; a rank
 * that never comes is named in an ETIMEDOUT. Since nobody leaves before every
 * rank arrived, the exchange is also a complete barrier.
 *
 * A rank that arrives after a peer gave up still finds that peer's signature
 * (sent when it entered). So signatures carry the sender's deadline in wall
 * time: a rank that arrived after a peer's deadline fails instead of entering
 * MPI alone, and one that arrived close to it waits briefly for that peer's
 * abort notice. This assumes the hosts' clocks agree to well under the
 * guard (GUARD, or a quarter of a shorter call's timeout). */
#include <stdint.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/mpi/mpi_int.h"
#include "core/fault.h"

#define GUARD 0.5 /* seconds around a peer's deadline where we cannot tell */

/* The guard for a call: GUARD, or a quarter of the call's timeout when that
 * is shorter. A guard as long as the timeout put every arrival "near" the
 * peers' deadlines, so every call waited until past them (timeout 0.3 s:
 * 0.8 s per all_reduce). With a short timeout, clocks that differ by more
 * than this leave a late rank to the watchdog. */
static double guard(const crun__coll_t *c) { return c->timeout / 4 < GUARD ? c->timeout / 4 : GUARD; }

/* Fills the signature of c as seen by peer p; `incoming` gives the count we
 * expect from p (all_to_all) instead of the one we send it. */
static void fill_sig(const crun__coll_t *c, int p, int incoming, int64_t *s) {
  s[CRUN__SIG_KIND] = c->kind;
  s[CRUN__SIG_SEQ] = (int64_t)c->seq;
  s[CRUN__SIG_DTYPE] = c->dt;
  if (c->kind == CRUN__COLL_ALL_TO_ALL) s[CRUN__SIG_COUNT] = (int64_t)(incoming ? c->out_counts[p] : c->in_counts[p]);
  else s[CRUN__SIG_COUNT] = (int64_t)c->count;
  s[CRUN__SIG_OP] = crun__coll_reduces(c->kind) ? (int64_t)c->op : -1;
  s[CRUN__SIG_ROOT] = crun__coll_rooted(c->kind) ? c->root : -1;
}

/* Wall-clock seconds (comparable between processes and, roughly, hosts). */
static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wall-clock seconds as the microseconds a signature carries; a deadline
 * beyond the int64 range (timeout math.huge: no deadline) is INT64_MAX, not
 * the undefined conversion that read as a deadline long past. */
static int64_t wall_us(double s) {
  double us = s * 1e6;
  return us < 9.0e18 ? (int64_t)us : INT64_MAX;
}

/* Writes "float32[512]" plus the op / root when the two calls differ there. */
static void shape(char *b, size_t cap, const int64_t *s, int show_op, int show_root) {
  const char *dn = crun_dtype_name((crun_dtype_t)s[CRUN__SIG_DTYPE]);
  size_t n = (size_t)snprintf(b, cap, "%s[%lld]", dn ? dn : "?", (long long)s[CRUN__SIG_COUNT]);
  if (show_op && s[CRUN__SIG_OP] >= 0 && n < cap)
    n += (size_t)snprintf(b + n, cap - n, " %s", crun_reduce_op_name((crun_reduce_op_t)s[CRUN__SIG_OP]));
  if (show_root && s[CRUN__SIG_ROOT] >= 0 && n < cap)
    snprintf(b + n, cap - n, " root %lld", (long long)s[CRUN__SIG_ROOT]);
}

/* Reports peer p's signature `t` against our expectation `e`. */
static int mismatch(const crun__mpi_t *b, const crun__coll_t *c, int p, const int64_t *e, const int64_t *t) {
  char desc[64], mine[96], theirs[96];
  crun__pg_coll_desc(b->pg, c, desc, sizeof desc);
  int dop = e[CRUN__SIG_OP] != t[CRUN__SIG_OP], droot = e[CRUN__SIG_ROOT] != t[CRUN__SIG_ROOT];
  shape(mine, sizeof mine, e, dop, droot);
  shape(theirs, sizeof theirs, t, dop, droot);
  return crun_error(CRUN_EMISMATCH, "%s on %s expected %s, %s sent %s #%lld %s", desc, CRUN__WHO(b->pg, b->rank), mine, CRUN__WHO(b->pg, p),
                    crun__coll_name((int)t[CRUN__SIG_KIND]), (long long)t[CRUN__SIG_SEQ], theirs);
}

/* Compares every peer's signature with what we expect from it. */
static int compare(const crun__mpi_t *b, const crun__coll_t *c) {
  int64_t e[CRUN__SIG_WORDS];
  for (int p = 0; p < b->size; p++) {
    if (p == b->rank) continue;
    const int64_t *t = b->sig_in + (size_t)p * CRUN__SIG_WORDS;
    fill_sig(c, p, 1, e);
    if (memcmp(e, t, sizeof(int64_t) * CRUN__SIG_CMP)) return mismatch(b, c, p, e, t);
  }
  return 0;
}

/* Where rank p is: this call when its signature came, else the last call
 * whose signature we got from it ("" when none yet). */
static void whereabouts(const crun__mpi_t *b, const crun__coll_t *c, int p, int arrived, char *buf, size_t cap) {
  const int64_t *t = b->sig_in + (size_t)p * CRUN__SIG_WORDS;
  if (arrived) crun__pg_coll_desc(b->pg, c, buf, cap);
  else if (t[CRUN__SIG_KIND] < 0) buf[0] = 0;
  else snprintf(buf, cap, "%s #%lld", crun__coll_name((int)t[CRUN__SIG_KIND]), (long long)t[CRUN__SIG_SEQ]);
}

/* Appends "rank 2 is at barrier #1; ranks 0-1 are at all_reduce #2" to out
 * (ranks of group pg, named as crun__pg_ranks_text names them). */
static void report(const crun_pg_t *pg, char *out, size_t cap, char (*at)[64], int n, int *rs) {
  size_t len = strlen(out);
  char *done = calloc((size_t)n, 1);
  for (int r = 0; done && r < n && len < cap; r++) {
    if (done[r]) continue;
    int m = 0;
    for (int q = r; q < n; q++)
      if (!done[q] && !strcmp(at[q], at[r])) rs[m++] = q, done[q] = 1;
    char who[256];
    crun__pg_ranks_text(pg, who, sizeof who, rs, m);
    if (at[r][0]) len += (size_t)snprintf(out + len, cap - len, "; %s %s at %s", who, m > 1 ? "are" : "is", at[r]);
    else len += (size_t)snprintf(out + len, cap - len, "; %s %s not entered any collective", who, m > 1 ? "have" : "has");
  }
  free(done);
}

/* Names the ranks whose signature did not come (cancelling those receives)
 * and where every rank is. */
static int timed_out(crun__mpi_t *b, const crun__coll_t *c) {
  int n = b->size, nl = 0, *late = malloc(sizeof(int) * (size_t)n);
  char (*at)[64] = calloc((size_t)n, 64), desc[64], who[256] = "some ranks", where[1024] = "";
  crun__pg_coll_desc(b->pg, c, desc, sizeof desc);
  for (int p = 0; late && at && p < n; p++) {
    MPI_Request *r = &b->reqs[p];
    int arrived = p == b->rank || *r == MPI_REQUEST_NULL;
    if (!arrived) MPI_Cancel(r), MPI_Wait(r, MPI_STATUS_IGNORE), late[nl++] = p;
    whereabouts(b, c, p, arrived, at[p], 64);
  }
  if (late && at && nl) {
    crun__pg_ranks_text(b->pg, who, sizeof who, late, nl);
    report(b->pg, where, sizeof where, at, n, late);
  }
  free(late);
  free(at);
  return crun_error(CRUN_ETIMEDOUT, "%s on %s: no data from %s after %.1f s%s", desc, CRUN__WHO(b->pg, b->rank), who,
                    c->timeout, where);
}


/* Decides whether a peer may have given up on this call before our
 * signature reached it (see the top of the file). */
static int check_late(crun__mpi_t *b, crun__coll_t *c, double entered, const char *desc) {
  double wait_until = 0, g = guard(c);
  for (int p = 0; p < b->size; p++) {
    if (p == b->rank) continue;
    double pd = (double)b->sig_in[(size_t)p * CRUN__SIG_WORDS + CRUN__SIG_DEADLINE] * 1e-6;
    if (entered >= pd + g)
      return crun_error(CRUN_ETIMEDOUT, "%s on %s: arrived %.1f s after %s's deadline for it; %s "
                        "gave up waiting (timeout %.1f s)", desc, CRUN__WHO(b->pg, b->rank), entered - pd, CRUN__WHO(b->pg, p), CRUN__WHO(b->pg, p), c->timeout);
    if (entered > pd - g && pd + g > wait_until) wait_until = pd + g;
  }
  crun__mpi_spin_t spin = {0};
  while (wall() < wait_until) { /* a peer may have timed out just now: its notice would come */
    int rc = crun__mpi_poll_abort(b, desc);
    if (rc < 0) return rc;
    crun__mpi_relax(&spin);
  }
  return 0;
}

/* Cancels the signature receives posted so far (reqs[0..n)) after posting
 * call `call` to or from peer p failed with mpirc, and reports that with
 * MPI's error (a receive never posted would read as a signature that came:
 * an EMISMATCH against the last one, which nobody sent). The sends posted
 * stay with the group (its destroy keeps them until they complete). */
static int post_failed(crun__mpi_t *b, const crun__coll_t *c, int p, int mpirc, const char *call) {
  char desc[64], why[MPI_MAX_ERROR_STRING + 1] = "";
  int len = 0;
  crun__coll_desc(c, desc, sizeof desc);
  MPI_Error_string(mpirc, why, &len);
  for (int q = 0; q < b->size; q++)
    if (b->reqs[q] != MPI_REQUEST_NULL) MPI_Cancel(&b->reqs[q]), MPI_Wait(&b->reqs[q], MPI_STATUS_IGNORE);
  return crun_error(crun__mpi_status(mpirc), "%s on %s: %s of %s %s failed: %s", desc, CRUN__WHO(b->pg, b->rank),
                    call, strcmp(call, "MPI_Irecv") ? "its call signature to" : "the call signature from",
                    CRUN__WHO(b->pg, p), why);
}

/* Posts the receive of peer p's signature and the send of ours (fault site
 * mpi.sig_irecv: the receive fails with MPI_ERR_NO_MEM, as when MPI has no
 * memory for its request); returns 0 or post_failed's error. */
static int post(crun__mpi_t *b, const crun__coll_t *c, int p) {
  int n = b->size;
  int64_t *out = b->sig_out + (size_t)p * CRUN__SIG_WORDS;
  int rc = crun__fault_alloc("mpi.sig_irecv") ? MPI_ERR_NO_MEM
           : MPI_Irecv(b->sig_in + (size_t)p * CRUN__SIG_WORDS, CRUN__SIG_WORDS, MPI_INT64_T, p, CRUN__MPI_TAG_SIG,
                       b->ctrl, &b->reqs[p]);
  if (rc != MPI_SUCCESS) return post_failed(b, c, p, rc, "MPI_Irecv");
  rc = MPI_Isend(out, CRUN__SIG_WORDS, MPI_INT64_T, p, CRUN__MPI_TAG_SIG, b->ctrl, &b->reqs[n + p]);
  return rc == MPI_SUCCESS ? 0 : post_failed(b, c, p, rc, "MPI_Isend");
}

int crun__mpi_check(crun__mpi_t *b, crun__coll_t *c) {
  int n = b->size;
  if (n < 2) return 0;
  double entered = wall();
  int64_t dl = wall_us(entered + (c->deadline - crun_clock()));
  for (int p = 0; p < n; p++) b->reqs[p] = b->reqs[n + p] = MPI_REQUEST_NULL;
  for (int p = 0; p < n; p++) {
    if (p == b->rank) continue;
    int64_t *out = b->sig_out + (size_t)p * CRUN__SIG_WORDS;
    fill_sig(c, p, 0, out);
    out[CRUN__SIG_DEADLINE] = dl;
    CRUN_CHECK(post(b, c, p));
  }
  char desc[64];
  crun__pg_coll_desc(b->pg, c, desc, sizeof desc);
  int rc = crun__mpi_wait(b, b->reqs, 2 * n, n, c->deadline, desc);
  if (rc == 0 && (rc = crun__mpi_poll_abort(b, desc)) == 0 && (rc = compare(b, c)) == 0)
    return check_late(b, c, entered, desc);
  if (rc == 1) rc = timed_out(b, c);
  for (int p = 0; p < n; p++)
    if (b->reqs[p] != MPI_REQUEST_NULL) MPI_Cancel(&b->reqs[p]), MPI_Wait(&b->reqs[p], MPI_STATUS_IGNORE);
  return rc; /* our own signature sends may still be pending: the group's destroy keeps them (group.c) */
}
