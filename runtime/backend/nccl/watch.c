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

void crun__nccl_op_unref(crun__nccl_op_t *op) {
  if (!op || atomic_fetch_sub(&op->refs, 1) != 1) return;
  if (op->end) cudaEventDestroy(op->end);
  free(op->err);
  free(op);
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
  for (crun__nccl_op_t **p = &b->pending; *p; p = &(*p)->next)
    if (*p == op) {
      *p = op->next;
      crun__nccl_op_unref(op);
      return;
    }
}

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
    snprintf(msg, sizeof msg, "%s%s%.*s [reported by rank %d]", named || !name ? "" : name, named || !name ? "" : ": ",
             len < 600 ? len : 600, text, b->pg->rank);
    const char *k = "nccl/abort";
    crun_buf_t old = {0};
    if (crun_store_compare_set(b->pg->board, k, "", 0, msg, strlen(msg), &old) < 0)
      CRUN_LOG(INFO, PG, "could not post the abort notice: %s", crun_last_error());
    crun_buf_free(&old);
  }
  ncclComm_t comm = atomic_exchange(&b->comm, NULL);
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
    const char *k = key;
    int ok = 0;
    crun_buf_t v = {0};
    if (crun_store_check(pg->board, &k, 1, &ok) < 0) break;
    if (ok && crun_store_get(pg->board, key, &v) < 0) break;
    if (!ok || v.len != strlen(desc) || memcmp(v.data, desc, v.len)) late[nl++] = r;
    crun_buf_free(&v);
  }
  if (late && nl) crun__ranks_text(who, wcap, late, nl);
  free(late);
}

/* One pass of the watchdog over the pending operations. Called with mu held;
 * may drop it around calls that block. */
static void scan_locked(crun__nccl_t *b, double *next_notice) {
  double now = crun_clock();
  crun__nccl_op_t *expired = NULL;
  for (crun__nccl_op_t *op = b->pending, *nx; op; op = nx) {
    nx = op->next;
    if (op->done) { unlink_locked(b, op); continue; }
    if (op->end && cudaEventQuery(op->end) == cudaSuccess) {
      op->done = 1;
      unlink_locked(b, op);
      pthread_cond_broadcast(&b->cv);
      continue;
    }
    if (!expired && now >= op->deadline) expired = op;
  }
  if (atomic_load(&b->aborted)) return;
  ncclResult_t ae = ncclSuccess;
  if (b->comm) ncclCommGetAsyncError(b->comm, &ae);
  char text[1400];
  if (ae != ncclSuccess && ae != ncclInProgress) {
    const char *last = ncclGetLastError(b->comm);
    snprintf(text, sizeof text, "EIO: %s on rank %d: NCCL reported an asynchronous error: %s%s%s; the communicator "
             "was aborted", b->pending ? b->pending->desc : b->last_desc[0] ? b->last_desc : "the communicator", b->pg->rank, ncclGetErrorString(ae), last && *last ? ": " : "",
             last && *last ? last : "");
    pthread_mutex_unlock(&b->mu);
    crun__nccl_abort_comm(b, CRUN_EIO, text + 5, 1);
    crun__pg_fail(b->pg, CRUN_EIO, text);
    pthread_mutex_lock(&b->mu);
    return;
  }
  if (expired) {
    char desc[64], who[256], where[768];
    snprintf(desc, sizeof desc, "%s", expired->desc);
    double timeout = expired->timeout;
    atomic_fetch_add(&expired->refs, 1);
    pthread_mutex_unlock(&b->mu);
    crun__nccl_missing(b, desc, who, sizeof who, where, sizeof where);
    snprintf(text, sizeof text, "%s on rank %d: NCCL did not finish within %.1f s, the watchdog aborted the "
             "communicator; no data from %s%s%s", desc, b->pg->rank, timeout, who, where[0] ? "; " : "", where);
    crun__nccl_abort_comm(b, CRUN_ETIMEDOUT, text, 1);
    char full[1500];
    snprintf(full, sizeof full, "ETIMEDOUT: %s", text);
    crun__pg_fail(b->pg, CRUN_ETIMEDOUT, full);
    crun__nccl_op_unref(expired);
    pthread_mutex_lock(&b->mu);
    return;
  }
  if (b->pending && now >= *next_notice) {
    *next_notice = now + NOTICE_S;
    pthread_mutex_unlock(&b->mu);
    char desc[64];
    snprintf(desc, sizeof desc, "%s", b->last_desc);
    int rc = crun__nccl_poll_abort(b, desc);
    if (rc < 0) {
      char full[1400];
      snprintf(full, sizeof full, "%s", crun_last_error());
      const char *bare = strstr(full, ": ");
      crun__nccl_abort_comm(b, rc, bare ? bare + 2 : full, 0);
      crun__pg_fail(b->pg, rc, full);
    }
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
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)(period * 1e9);
    if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
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
}

crun__nccl_op_t *crun__nccl_op_begin(crun__nccl_t *b, const crun__coll_t *c) {
  crun__nccl_op_t *op = calloc(1, sizeof *op);
  if (!op) return NULL;
  atomic_init(&op->refs, 2); /* the pending list's and the caller's */
  op->deadline = c->deadline;
  op->timeout = c->timeout;
  op->device = b->device;
  crun__coll_desc(c, op->desc, sizeof op->desc);
  pthread_mutex_lock(&b->mu);
  snprintf(b->last_desc, sizeof b->last_desc, "%s", op->desc);
  op->next = b->pending;
  b->pending = op;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
  return op;
}

int crun__nccl_op_end(crun__nccl_t *b, crun__nccl_op_t *op, int rc) {
  char text[1400] = "";
  cudaEvent_t ev = NULL;
  if (rc == 0 && cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess &&
      cudaEventRecord(ev, b->stream) != cudaSuccess) {
    cudaEventDestroy(ev);
    ev = NULL;
  }
  if (rc < 0) snprintf(text, sizeof text, "%s", crun_last_error());
  pthread_mutex_lock(&b->mu);
  if (rc == 0 && ev) op->end = ev;
  else if (rc == 0) rc = crun_error(CRUN_EIO, "%s on rank %d: cannot record the end event", op->desc, b->pg->rank);
  if (op->done && op->status < 0) { /* the watchdog failed it meanwhile: its text wins */
    rc = op->status;
    snprintf(text, sizeof text, "%s", op->err);
    crun_error(rc, "%s", text);
  } else if (rc < 0) {
    fail_op_locked(op, rc, text[0] ? strchr(text, ' ') + 1 : "NCCL failure");
  }
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
  return rc;
}
