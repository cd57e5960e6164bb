/* watch.c — the watchdog of an nccl group: a thread that, while operations
 * are pending, polls each one's end event (cudaEventQuery), the
 * communicator's asynchronous error (ncclCommGetAsyncError) and the peers'
 * abort notice in the store. At an operation's deadline it aborts the
 * communicator (ncclCommAbort: a host thread still inside NCCL returns) and
 * fails the operation with ETIMEDOUT naming the ranks that did not arrive
 * (the progress board in the group's store); on an asynchronous error or a
 * peer's notice it aborts too. The first failure breaks the group: every
 * later call is ESTATE. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/nccl/nccl_int.h"

#define POLL_S 0.02     /* event and async-error polling period */
#define NOTICE_S 0.25   /* store polling period for peers' abort notices */
#define IDLE_S 0.1      /* async-error polling period with nothing pending */

void crun__nccl_name_text(const crun_pg_t *pg, const crun__nccl_name_t *n, char *buf, size_t cap) {
  crun__coll_t c;
  memset(&c, 0, sizeof c);
  c.kind = n->kind, c.root = n->root, c.tag = n->tag, c.seq = n->seq;
  crun__pg_coll_desc(pg, &c, buf, cap);
}

int crun__nccl_pool_new(crun__nccl_pool_t **out) {
  crun__nccl_pool_t *p = calloc(1, sizeof *p);
  if (!p) return crun_error(CRUN_ENOMEM, "nccl backend: operation pool");
  pthread_mutex_init(&p->mu, NULL);
  atomic_init(&p->refs, 1);
  *out = p;
  return 0;
}

static void op_destroy(crun__nccl_op_t *op) {
  if (op->ev) cudaEventDestroy(op->ev);
  free(op);
}

static void pool_unref(crun__nccl_pool_t *p) {
  if (atomic_fetch_sub(&p->refs, 1) != 1) return;
  for (crun__nccl_op_t *op = p->spare, *nx; op; op = nx) nx = op->next, op_destroy(op);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

void crun__nccl_pool_release(crun__nccl_pool_t *p) {
  if (p) pool_unref(p);
}

/* A spare operation of p, reset (its event kept), else NULL; the operation
 * holds a reference to p until its last reference goes. */
static crun__nccl_op_t *op_take(crun__nccl_pool_t *p) {
  pthread_mutex_lock(&p->mu);
  crun__nccl_op_t *op = p->spare;
  if (op) p->spare = op->next, p->n--;
  pthread_mutex_unlock(&p->mu);
  if (!op) return NULL;
  cudaEvent_t ev = op->ev;
  memset(op, 0, sizeof *op);
  op->ev = ev;
  op->pool = p;
  atomic_fetch_add(&p->refs, 1);
  return op;
}

/* A new operation of p (no event yet), else NULL. */
static crun__nccl_op_t *op_new(crun__nccl_pool_t *p) {
  crun__nccl_op_t *op = calloc(1, sizeof *op);
  if (!op) return NULL;
  op->pool = p;
  atomic_fetch_add(&p->refs, 1);
  return op;
}

/* The last reference to op went: it goes back to its pool, its event with
 * it when the event's record has completed (nothing on a stream still
 * records it; a stream's earlier wait on it keeps that record) and the pool
 * has room; else both go. */
void crun__nccl_op_unref(crun__nccl_op_t *op) {
  if (!op || atomic_fetch_sub(&op->refs, 1) != 1) return;
  crun__nccl_pool_t *p = op->pool;
  free(op->err);
  op->err = NULL;
  if (op->ev && !op->ended && cudaEventQuery(op->ev) != cudaSuccess) {
    cudaEventDestroy(op->ev); /* no one can wait on it any more */
    op->ev = NULL;
  }
  pthread_mutex_lock(&p->mu);
  int keep = p->n < CRUN__NCCL_SPARE;
  if (keep) op->next = p->spare, p->spare = op, p->n++;
  pthread_mutex_unlock(&p->mu);
  if (!keep) op_destroy(op);
  pool_unref(p);
}

/* Fails op with (rc, text) unless it already ended. Called with mu held. */
static void fail_op_locked(crun__nccl_op_t *op, int rc, const char *text) {
  if (op->done) return;
  op->status = rc;
  op->err = strdup(text);
  atomic_store(&op->done, 1); /* after status and err: op_wait reads them once it sees done */
}

/* Removes op from the pending list. Called with mu held. */
static void unlink_locked(crun__nccl_t *b, crun__nccl_op_t *op) {
  crun__nccl_op_t *prev = NULL;
  for (crun__nccl_op_t **p = &b->pending; *p; prev = *p, p = &(*p)->next)
    if (*p == op) {
      *p = op->next;
      if (b->pending_tail == op) b->pending_tail = prev;
      crun__nccl_op_unref(op);
      return;
    }
}

/* Marks op, whose end event completed, done and unlinks it. Called with mu held. */
static void ended_locked(crun__nccl_t *b, crun__nccl_op_t *op) {
  op->ended = 1;
  atomic_store(&op->done, 1);
  unlink_locked(b, op);
}

/* Unlinks the oldest pending operations that are done or whose end event
 * completed (they end in order: one stream), giving them back to the pool
 * unless a handle still holds them. Returns how many it saw end. Called
 * with mu held. */
static int reap_locked(crun__nccl_t *b) {
  crun__nccl_op_t *op;
  int ended = 0;
  while ((op = b->pending) && (op->done || (op->end && cudaEventQuery(op->end) == cudaSuccess))) {
    if (op->done) unlink_locked(b, op);
    else ended_locked(b, op), ended++;
  }
  return ended;
}

/* Sets *ts to `s` seconds from now on CLOCK_MONOTONIC (the clock of b->cv). */
static void after(double s, struct timespec *ts) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += (time_t)s;
  ts->tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
  if (ts->tv_nsec >= 1000000000) { ts->tv_sec++; ts->tv_nsec -= 1000000000; }
}

/* Leaves the gate; the last one out wakes an abort waiting for it. */
static void gate_leave(crun__nccl_t *b) {
  if (atomic_fetch_sub(&b->inside, 1) != 1 || !atomic_load(&b->aborted)) return;
  pthread_mutex_lock(&b->mu); /* the abort checks inside and sleeps under mu: no lost wake-up */
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

/* Without mu (two atomic operations per call, and no wait behind a watchdog
 * scan that holds mu): a thread counts itself inside before it reads the
 * mark, and the abort marks before it reads the count (both sequentially
 * consistent), so either the thread sees the mark and leaves, or the abort
 * sees it inside and waits for it. */
int crun__nccl_enter(crun__nccl_t *b, ncclComm_t *comm) {
  atomic_fetch_add(&b->inside, 1);
  ncclComm_t c = atomic_load(&b->comm);
  if (c && !atomic_load(&b->aborted)) {
    *comm = c;
    return 0;
  }
  gate_leave(b);
  return -1;
}

ncclResult_t crun__nccl_exit(crun__nccl_t *b, ncclResult_t r) {
  gate_leave(b);
  return r;
}

/* Waits until no thread is inside the gate, CRUN__NCCL_GRACE_S at most.
 * Called with mu held, the group marked aborted. */
static void drain_gate_locked(crun__nccl_t *b) {
  struct timespec ts;
  after(CRUN__NCCL_GRACE_S, &ts);
  while (atomic_load(&b->inside) > 0)
    if (pthread_cond_timedwait(&b->cv, &b->mu, &ts) != 0 && atomic_load(&b->inside) > 0) {
      CRUN_LOG(INFO, PG, "nccl group '%s': %d thread(s) still inside NCCL after %.2f s: ncclCommAbort unblocks them",
               b->pg->prefix, atomic_load(&b->inside), CRUN__NCCL_GRACE_S);
      return;
    }
}

/* The abort and the threads that use the communicator (issue 16).
 * ncclCommAbort frees the communicator. A thread that checked `aborted` a
 * moment before (run(), the gate) and is on its way into NCCL with the
 * pointer would then pass a freed one: so the abort first MARKS the group
 * (under mu; from then on the gate refuses every use and op_begin fails a
 * new call with ESTATE), then WAITS for the threads inside the gate to leave,
 * and only then swaps the pointer out (under mu) and calls ncclCommAbort.
 * The wait is bounded (CRUN__NCCL_GRACE_S): a thread inside the gate may be
 * blocked inside NCCL for good (a collective whose peer never comes: with the
 * double every collective blocks so; with NCCL a grouped send/recv's
 * connection setup), and only ncclCommAbort unblocks it, which NCCL allows
 * while a thread is inside a call on that communicator. Such a thread, once
 * back, passes the gate again for any further use of the communicator
 * (ncclGetLastError, ncclRedOpDestroy, the next call), which refuses it. What
 * the grace leaves open is a thread stalled longer than that between the
 * gate and NCCL's first read of the pointer. The watchdog reads the
 * communicator only with mu held after checking the mark, so it needs no
 * gate. Called by the watchdog and by break_group (any thread). */
void crun__nccl_abort_comm(crun__nccl_t *b, int rc, const char *text, int notify) {
  pthread_mutex_lock(&b->mu);
  int first = !atomic_load(&b->aborted);
  if (first) {
    atomic_store(&b->aborted, 1);
    b->fail_rc = rc;
    b->fail_text = strdup(text);
  }
  for (crun__nccl_op_t *op = b->pending; op; op = op->next) fail_op_locked(op, rc, text);
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
  if (!first) return;
  CRUN_LOG(WARN, PG, "nccl group '%s': aborting the communicator: %s", b->pg->prefix, text);
  if (notify) { /* best effort: peers' checks and watchdogs read it */
    char msg[700];
    const char *cut = strstr(text, " [reported by rank");
    int len = cut ? (int)(cut - text) : (int)strlen(text);
    const char *name = crun_err_name(rc); /* peers take the status from the text's prefix */
    int named = name && !strncmp(text, name, strlen(name)) && text[strlen(name)] == ':';
    snprintf(msg, sizeof msg, "%s%s%.*s [reported by %s]", named || !name ? "" : name, named || !name ? "" : ": ",
             len < 600 ? len : 600, text, CRUN__WHO(b->pg, b->pg->rank));
    const char *k = "nccl/abort";
    crun_buf_t old = {0};
    if (crun_store_compare_set(b->pg->board, k, "", 0, msg, strlen(msg), &old) < 0)
      CRUN_LOG(INFO, PG, "could not post the abort notice: %s", crun_last_error());
    crun_buf_free(&old);
  }
  pthread_mutex_lock(&b->mu);
  drain_gate_locked(b);
  ncclComm_t comm = atomic_exchange(&b->comm, NULL);
  pthread_mutex_unlock(&b->mu);
  if (comm) ncclCommAbort(comm);
}

/* Reads the progress board: the ranks not at `desc` (who) and where every
 * rank is (where). */
void crun__nccl_missing(crun__nccl_t *b, const char *desc, char *who, size_t wcap, char *where, size_t rcap) {
  crun_pg_t *pg = b->pg;
  int n = pg->size, nl = 0, *late = malloc(sizeof(int) * (size_t)n);
  snprintf(who, wcap, "some ranks");
  where[0] = 0;
  crun__pg_progress_report(pg, where, rcap);
  for (int r = 0; late && r < n; r++) {
    if (r == pg->rank) continue;
    char key[32];
    snprintf(key, sizeof key, "progress/%d", r);
    crun_buf_t v = {0};
    int ok = crun__pg_board_peek(pg, key, &v);
    if (ok < 0) break;
    if (!ok || v.len != strlen(desc) || memcmp(v.data, desc, v.len)) late[nl++] = r;
    crun_buf_free(&v);
  }
  if (late && nl) crun__pg_ranks_text(pg, who, wcap, late, nl);
  free(late);
}

/* A peer's abort notice was read (crun_last_error(): "ENAME: <desc> on rank
 * r: a peer aborted the group: <notice>"): fails each pending operation
 * naming itself, then aborts the communicator and breaks the group. */
static void peer_aborted(crun__nccl_t *b, int rc) {
  static const char mark[] = "a peer aborted the group: ";
  char full[1400], one[1400], desc[64];
  snprintf(full, sizeof full, "%s", crun_last_error());
  const char *bare = strstr(full, ": "), *notice = strstr(full, mark);
  pthread_mutex_lock(&b->mu);
  for (crun__nccl_op_t *op = b->pending; notice && op; op = op->next) {
    crun__nccl_name_text(b->pg, &op->name, desc, sizeof desc);
    snprintf(one, sizeof one, "%s on %s: %s", desc, CRUN__WHO(b->pg, b->pg->rank), notice);
    fail_op_locked(op, rc, one);
  }
  pthread_mutex_unlock(&b->mu);
  crun__nccl_abort_comm(b, rc, bare ? bare + 2 : full, 0);
  crun__pg_fail(b->pg, rc, full);
}

/* One pass of the watchdog over the pending operations. Called with mu held;
 * may drop it around calls that block. */
static void scan_locked(crun__nccl_t *b, double *next_notice) {
  double now = crun_clock();
  crun__nccl_op_t *expired = NULL, *oldest = NULL;
  /* the ended ones lead the list (one stream: in order); nothing after the
   * first that has not ended can have */
  if (reap_locked(b)) pthread_cond_broadcast(&b->cv); /* nccl_destroy waits for the list to empty */
  for (crun__nccl_op_t *op = b->pending, *nx; op; op = nx) {
    nx = op->next;
    if (op->done) { unlink_locked(b, op); continue; }
    if (!expired && now >= op->deadline) expired = op;
    if (!oldest || op->begun < oldest->begun) oldest = op;
  }
  /* mu held and not marked: the abort cannot swap the communicator out */
  if (atomic_load(&b->aborted)) return;
  ncclComm_t comm = atomic_load(&b->comm);
  ncclResult_t ae = ncclSuccess;
  if (comm) ncclCommGetAsyncError(comm, &ae);
  char text[1400];
  if (ae != ncclSuccess && ae != ncclInProgress) {
    const char *last = ncclGetLastError(comm);
    char what[64] = "the communicator"; /* the latest operation, pending or not */
    if (b->pending_tail) crun__nccl_name_text(b->pg, &b->pending_tail->name, what, sizeof what);
    else if (b->has_last) crun__nccl_name_text(b->pg, &b->last, what, sizeof what);
    snprintf(text, sizeof text, "EIO: %s on %s: NCCL reported an asynchronous error: %s%s%s; the communicator "
             "was aborted", what, CRUN__WHO(b->pg, b->pg->rank), ncclGetErrorString(ae), last && *last ? ": " : "",
             last && *last ? last : "");
    pthread_mutex_unlock(&b->mu);
    crun__nccl_abort_comm(b, CRUN_EIO, text + 5, 1);
    crun__pg_fail(b->pg, CRUN_EIO, text);
    pthread_mutex_lock(&b->mu);
    return;
  }
  if (expired) {
    char desc[64], who[256], where[768];
    crun__nccl_name_text(b->pg, &expired->name, desc, sizeof desc);
    double timeout = expired->timeout;
    atomic_fetch_add(&expired->refs, 1);
    pthread_mutex_unlock(&b->mu);
    crun__nccl_missing(b, desc, who, sizeof who, where, sizeof where);
    snprintf(text, sizeof text, "%s on %s: NCCL did not finish within %.1f s, the watchdog aborted the "
             "communicator; no data from %s%s%s", desc, CRUN__WHO(b->pg, b->pg->rank), timeout, who, where[0] ? "; " : "", where);
    crun__nccl_abort_comm(b, CRUN_ETIMEDOUT, text, 1);
    char full[1500];
    snprintf(full, sizeof full, "ETIMEDOUT: %s", text);
    crun__pg_fail(b->pg, CRUN_ETIMEDOUT, full);
    crun__nccl_op_unref(expired);
    pthread_mutex_lock(&b->mu);
    return;
  }
  /* only an operation waiting NOTICE_S or longer can be one a peer never
   * comes to: one that would end by itself (the call before the one a peer
   * refused) is not failed by the notice */
  if (oldest && now >= *next_notice && now - oldest->begun >= NOTICE_S) {
    *next_notice = now + NOTICE_S;
    char desc[64];
    crun__nccl_name_text(b->pg, &oldest->name, desc, sizeof desc);
    pthread_mutex_unlock(&b->mu);
    int rc = crun__nccl_poll_abort(b, desc);
    if (rc < 0) peer_aborted(b, rc);
    pthread_mutex_lock(&b->mu);
  }
}

static void *watch_main(void *arg) {
  crun__nccl_t *b = arg;
  double next_notice = 0;
  if (cudaSetDevice(b->device) != cudaSuccess) CRUN_LOG(INFO, PG, "watchdog: cudaSetDevice(%d) failed", b->device);
  pthread_mutex_lock(&b->mu);
  while (!b->stop) {
    /* idle: the asynchronous error is still polled, less often */
    double period = b->pending ? POLL_S : IDLE_S;
    if (atomic_load(&b->aborted)) { /* every pending operation was failed */
      while (b->pending) unlink_locked(b, b->pending);
      pthread_cond_wait(&b->cv, &b->mu);
      continue;
    }
    scan_locked(b, &next_notice);
    struct timespec ts;
    after(period, &ts);
    pthread_cond_timedwait(&b->cv, &b->mu, &ts);
  }
  pthread_mutex_unlock(&b->mu);
  return NULL;
}

int crun__nccl_watch_start(crun__nccl_t *b) {
  if (pthread_create(&b->watch, NULL, watch_main, b) != 0)
    return crun_error(CRUN_ESYS, "nccl group '%s': cannot start the watchdog thread", b->pg->prefix);
  b->has_watch = 1;
  return 0;
}

void crun__nccl_watch_stop(crun__nccl_t *b) {
  if (!b->has_watch) return;
  pthread_mutex_lock(&b->mu);
  b->stop = 1;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
  pthread_join(b->watch, NULL);
  b->has_watch = 0;
  while (b->pending) {
    crun__nccl_op_t *op = b->pending;
    b->pending = op->next;
    crun__nccl_op_unref(op);
  }
  b->pending_tail = NULL;
}

int crun__nccl_op_begin(crun__nccl_t *b, const crun__coll_t *c, crun__nccl_op_t **out) {
  pthread_mutex_lock(&b->mu);
  if (atomic_load(&b->aborted)) { /* marked since run() looked: the abort did not fail this one */
    char desc[64];
    crun__pg_coll_desc(b->pg, c, desc, sizeof desc);
    int rc = crun_error(CRUN_ESTATE, "%s on %s: the communicator was aborted: %s", desc, CRUN__WHO(b->pg, b->pg->rank),
                        b->fail_text ? b->fail_text : "?");
    pthread_mutex_unlock(&b->mu);
    return rc;
  }
  crun__nccl_op_t *op = op_take(b->pool);
  if (!op) { /* dry: the watchdog has not looked yet at the ones that ended */
    reap_locked(b);
    if (!(op = op_take(b->pool))) op = op_new(b->pool);
  }
  if (!op) {
    pthread_mutex_unlock(&b->mu);
    return crun_error(CRUN_ENOMEM, "%s on %s", crun__coll_name(c->kind), CRUN__WHO(b->pg, b->pg->rank));
  }
  atomic_init(&op->refs, 2); /* the pending list's and the caller's */
  op->deadline = c->deadline;
  op->timeout = c->timeout;
  op->begun = c->deadline - c->timeout; /* when the group started it: no clock read of our own */
  op->device = b->device;
  op->name = b->last = crun__nccl_name_of(c);
  b->has_last = 1;
  if (b->pending_tail) b->pending_tail->next = op;
  else b->pending = op;
  b->pending_tail = op;
  /* no wake-up: an idle watchdog looks again within IDLE_S, which every
   * deadline tolerates, and a wake-up per call (a futex call, the watchdog
   * taking mu and querying events) is the caller's time */
  pthread_mutex_unlock(&b->mu);
  *out = op;
  return 0;
}

int crun__nccl_op_end(crun__nccl_t *b, crun__nccl_op_t *op, int rc) {
  char text[1400];
  text[0] = 0;
  int recorded = 0;
  if (rc == 0) { /* the op's own event: its record, if any, completed before it came back to the pool */
    cudaError_t e = op->ev ? cudaSuccess : cudaEventCreateWithFlags(&op->ev, cudaEventDisableTiming);
    recorded = e == cudaSuccess && cudaEventRecord(op->ev, b->stream) == cudaSuccess;
  }
  if (rc < 0) snprintf(text, sizeof text, "%s", crun_last_error());
  pthread_mutex_lock(&b->mu);
  if (rc == 0 && recorded) op->end = op->ev;
  else if (rc == 0) {
    char desc[64];
    crun__nccl_name_text(b->pg, &op->name, desc, sizeof desc);
    rc = crun_error(CRUN_EIO, "%s on %s: cannot record the end event", desc, CRUN__WHO(b->pg, b->pg->rank));
  }
  if (op->done && op->status < 0) { /* the watchdog failed it meanwhile: its text wins */
    rc = op->status;
    snprintf(text, sizeof text, "%s", op->err);
    crun_error(rc, "%s", text);
  } else if (rc < 0) {
    fail_op_locked(op, rc, text[0] ? strchr(text, ' ') + 1 : "NCCL failure");
  }
  if (rc < 0) pthread_cond_broadcast(&b->cv); /* a success waits for the watchdog's next look */
  pthread_mutex_unlock(&b->mu);
  return rc;
}
