/* work.c — Work handles and the group's queue: a blocking call with nothing
 * queued runs inline on the caller's thread; async calls (and blocking ones
 * issued behind them) run on the group's progress thread in issue order. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"

void crun__coll_free(crun__coll_t *c) {
  if (c->dev && c->dev_ops) c->dev_ops->free(c->dev);
  c->dev = NULL;
  free(c->outs);
  free(c->ins);
  free(c->out_counts);
  free(c->in_counts);
}

/* Skips the "ENAME: " prefix of a recorded error text. */
static const char *strip_name(const char *text) {
  if (!text) return "(no memory for the failure's text)";
  const char *p = strstr(text, ": ");
  return p ? p + 2 : text;
}

/* Marks the group broken and tells the peers (first failure only). */
static void break_group(crun_pg_t *pg, int rc, const char *text) {
  pthread_mutex_lock(&pg->mu);
  int first = pg->broken == NULL;
  if (first) pg->broken = strdup(text);
  atomic_store(&pg->is_broken, 1);
  pthread_mutex_unlock(&pg->mu);
  if (first) CRUN_LOG(WARN, PG, "group '%s' failed: %s", pg->prefix, text);
  if (first && crun__obs_on) crun__obs_failed(pg, rc, text);
  if (first && pg->be->abort) pg->be->abort(pg->be_state, rc, text);
  if (first && pg->be_dev && pg->be_dev_state && pg->be_dev->abort) pg->be_dev->abort(pg->be_dev_state, rc, text);
  /* a peer waiting in a refusal's agreement (coll.c), which reads the board,
   * learns it from "stopped/<rank>": left last, after the backends told the
   * peers waiting in a call, so that a slow store delays only this rank */
  if (first && pg->size > 1 && !pg->be->private_board) crun__pg_leave_stopped(pg, "failed");
}

void crun__pg_fail(crun_pg_t *pg, int rc, const char *text) { break_group(pg, rc, text); }

/* Reports name ranks of the group. The text of a failure on a group whose
 * rank r is not global rank r (a sub-group) gets which global ranks those
 * are, once, so that "rank 1" is not read as global rank 1. Returns a copy
 * to free (NULL without memory). */
static char *failure_text(const crun_pg_t *pg, const char *text) {
  static const char mark[] = "are global ranks";
  int shifted = 0;
  for (int r = 0; r < pg->size && !shifted; r++) shifted = pg->global[r] != r;
  if (!shifted || strstr(text, mark)) return strdup(text);
  char map[160];
  size_t len = 0;
  for (int r = 0; r < pg->size && len + 16 < sizeof map; r++)
    len += (size_t)snprintf(map + len, sizeof map - len, r ? ",%d" : "%d", pg->global[r]);
  if (len + 16 >= sizeof map) snprintf(map + len, sizeof map - len, ",...");
  size_t n = strlen(text) + strlen(map) + strlen(pg->prefix) + 64;
  char *s = malloc(n);
  if (s) snprintf(s, n, "%s [group '%s': its ranks 0-%d %s %s]", text, pg->prefix, pg->size - 1, mark, map);
  return s;
}

/* Returns w's description, written on first use (not on the hot path: a
 * collective that succeeds never formats it). Called with pg->mu held. */
static const char *desc_locked(crun_work_t *w) {
  if (!w->desc[0]) crun__pg_coll_desc(w->pg, &w->c, w->desc, sizeof w->desc);
  return w->desc;
}

/* Records how inline work w ended (rc < 0: failed, the text in
 * crun_last_error()); one that ran (ran) and failed breaks the group. */
static void ended(crun_pg_t *pg, crun_work_t *w, int rc, int ran) {
  w->status = rc < 0 ? rc : 0;
  if (rc >= 0) return;
  w->err = ran ? failure_text(pg, crun_last_error()) : strdup(crun_last_error());
  /* after the copy: aborting the backend fails pending p2p, which records text */
  if (ran) break_group(pg, rc, w->err ? w->err : crun_last_error());
}

/* The status of inline work w once it ended, its failure's text recorded
 * again for this thread. */
static int inline_status(const crun_work_t *w) {
  return w->status < 0 ? crun_error(w->status, "%s", strip_name(w->err)) : 0;
}

int crun__pg_execute(crun_pg_t *pg, crun_work_t *w) {
  crun__coll_t *c = &w->c;
  int rc, ran = 0;
  char *broken = NULL;
  if (atomic_load(&pg->is_broken)) {
    pthread_mutex_lock(&pg->mu);
    broken = pg->broken ? strdup(pg->broken) : NULL;
    if (broken) desc_locked(w);
    pthread_mutex_unlock(&pg->mu);
  }
  const struct crun_backend_vtable *be = c->cuda && pg->be_dev ? pg->be_dev : pg->be;
  void *state;
  crun_backend_fn fn;
  if (c->kind == CRUN__COLL_ALL_REDUCE && !c->cuda && pg->ar_fn) { /* backend.h direct */
    state = pg->ar_state;
    fn = pg->ar_fn;
  } else {
    state = be == pg->be_dev ? pg->be_dev_state : pg->be_state;
    fn = crun__backend_slot(be, c->kind);
  }
  if (broken) {
    rc = crun_error(CRUN_ESTATE, "%s on %s: the group is unusable after an earlier failure: %s",
                    w->desc, CRUN__WHO(pg, pg->rank), broken);
  } else if (!fn) {
    rc = crun_error(CRUN_ENOTSUP, "%s is not supported by backend %s", crun__coll_name(c->kind), be->name);
  } else {
    c->deadline = crun__clock_coarse() + c->timeout;
    crun__pg_mark(pg, c);
    rc = 0;
    /* a held start (core/trace_int.h) is written now unless the backend's
     * engine writes it after posting */
    if (!be->posts_obs || c->kind == CRUN__COLL_SEND || c->kind == CRUN__COLL_RECV) crun__obs_posted();
    if (be == pg->be_dev && !state) { /* "auto": the first CUDA collective connects it */
      rc = be->create(pg, &pg->be_dev_state);
      state = pg->be_dev_state;
    }
    if (crun__obs_on) crun__obs_start(pg, w);
    if (rc == 0) rc = fn(state, c);
    crun__obs_posted(); /* not under crun__obs_on: the mode may change meanwhile */
    ran = 1;
    if (rc == CRUN__PENDING) {
      pthread_mutex_lock(&pg->mu);
      pg->npending++;
      pthread_mutex_unlock(&pg->mu);
      free(broken);
      return CRUN__PENDING;
    }
  }
  free(broken);
  crun__obs_posted();
  if (crun__obs_on) crun__obs_end(pg, w, rc, 1);
  ended(pg, w, rc, ran);
  return 0;
}

static void work_unref(crun_work_t *w);

void crun__pg_p2p_done(crun_pg_t *pg, crun__coll_t *c, int rc) {
  crun_work_t *w = (crun_work_t *)(void *)((char *)c - offsetof(crun_work_t, c));
  if (crun__obs_on) crun__obs_end(pg, w, rc, 0);
  w->status = rc < 0 ? rc : 0;
  if (rc < 0) w->err = failure_text(pg, crun_last_error());
  /* the group is broken before done is published: a caller that sees its
   * failed p2p and calls again finds the group ESTATE, not still whole */
  if (rc < 0 && rc != CRUN_ECLOSED) break_group(pg, rc, w->err ? w->err : "p2p failure");
  /* once done is set, a blocking caller may return and free w (or leave the
   * frame it lives in): what comes after takes nothing from it */
  pthread_mutex_lock(&pg->mu);
  pg->npending--;
  w->done = 1;
  pthread_cond_broadcast(&pg->cv);
  int queued = w->queued;
  pthread_mutex_unlock(&pg->mu);
  if (queued) work_unref(w);
}

/* Publishes completion of w to waiters. Called with pg->mu held. */
static void finish_locked(crun_pg_t *pg, crun_work_t *w) {
  w->done = 1;
  pthread_cond_broadcast(&pg->cv);
}

/* The group's busy flag: the one thread that runs an operation (or pumps the
 * background ones) holds it. A blocking call with nothing queued takes it
 * without pg->mu (crun__pg_submit), so it is taken only here, from 0 to 1;
 * returns 1 when this thread got it. */
static int busy_take(crun_pg_t *pg) {
  int free_ = 0;
  return atomic_compare_exchange_strong(&pg->busy, &free_, 1);
}

/* Gives the busy flag back and wakes the threads that wait for it: the
 * progress thread with queued work. Without pg->mu. A waiter counts itself in
 * busy_waiters before it reads busy, and this store comes before the read of
 * busy_waiters (both sequentially consistent): either the waiter sees busy
 * clear or this sees the waiter, which holds pg->mu until it sleeps on cv,
 * so the broadcast under pg->mu cannot come before its sleep. */
static void busy_give(crun_pg_t *pg) {
  atomic_store(&pg->busy, 0);
  if (atomic_load(&pg->busy_waiters)) {
    pthread_mutex_lock(&pg->mu);
    pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
  }
}

/* Numbers collective c, about to run (busy held). Collectives are numbered
 * in the order the group runs them, so that the number is the run order
 * whichever threads issued them (the TCP transport matches frames by it); a
 * queued one has none until it starts. */
static void number(crun_pg_t *pg, crun__coll_t *c) {
  if (c->kind == CRUN__COLL_SEND || c->kind == CRUN__COLL_RECV) return;
  c->seq = atomic_load_explicit(&pg->next_seq, memory_order_relaxed) + 1;
  atomic_store_explicit(&pg->next_seq, c->seq, memory_order_relaxed);
}

/* Numbers a call that was refused before it ran, as number() would have
 * had it run now: only with nothing queued and nothing running (busy taken
 * here, so that no call is numbered meanwhile: number() reads and writes the
 * counter in two steps). Returns 1 with its number in *seq, else 0. */
int crun__pg_number_refused(crun_pg_t *pg, uint64_t *seq) {
  if (!busy_take(pg)) return 0;
  int ok = !atomic_load(&pg->queued);
  if (ok) {
    *seq = atomic_load_explicit(&pg->next_seq, memory_order_relaxed) + 1;
    atomic_store_explicit(&pg->next_seq, *seq, memory_order_relaxed);
  }
  busy_give(pg);
  return ok;
}

/* Runs the head of the queue, busy held. Called with pg->mu held; returns
 * with it held and busy given back. */
static void run_head_locked(crun_pg_t *pg) {
  crun_work_t *w = pg->head;
  pg->head = w->next;
  if (!pg->head) pg->tail = NULL;
  atomic_fetch_sub(&pg->queued, 1);
  w->queued = 1;
  number(pg, &w->c); /* under mu: crun_work_describe reads it */
  w->desc[0] = 0;     /* a description made while it was queued had no number */
  pthread_mutex_unlock(&pg->mu);
  int pending = crun__pg_execute(pg, w) == CRUN__PENDING;
  /* no wake-up: the only thread that waits for busy (busy_waiters) is this
   * one, the progress thread; a second such waiter would need busy_give */
  atomic_store(&pg->busy, 0);
  pthread_mutex_lock(&pg->mu);
  if (pending) { /* crun__pg_p2p_done finishes it and drops the queue's reference */
    pthread_cond_broadcast(&pg->cv);
    return;
  }
  finish_locked(pg, w);
  pthread_mutex_unlock(&pg->mu);
  work_unref(w);
  pthread_mutex_lock(&pg->mu);
}

/* The progress thread: runs queued work in issue order. A p2p operation that
 * goes on in the background (the backend pumps it) does not hold the queue.
 * Once stopped it still runs what is queued, as long as busy is free. */
static void *progress_main(void *arg) {
  crun_pg_t *pg = arg;
  pthread_mutex_lock(&pg->mu);
  for (;;) {
    while (!atomic_load(&pg->stop) && !pg->head) pthread_cond_wait(&pg->cv, &pg->mu);
    if (!pg->head) break;
    if (busy_take(pg)) {
      run_head_locked(pg);
      continue;
    }
    if (atomic_load(&pg->stop)) break;
    atomic_fetch_add(&pg->busy_waiters, 1); /* before reading busy: busy_give */
    while (!atomic_load(&pg->stop) && atomic_load(&pg->busy)) pthread_cond_wait(&pg->cv, &pg->mu);
    atomic_fetch_sub(&pg->busy_waiters, 1);
  }
  pthread_mutex_unlock(&pg->mu);
  return NULL;
}

void crun__pg_queue_stop(crun_pg_t *pg) {
  pthread_mutex_lock(&pg->mu);
  atomic_store(&pg->stop, 1);
  pthread_cond_broadcast(&pg->cv);
  int had = pg->has_thread;
  pthread_mutex_unlock(&pg->mu);
  if (had) pthread_join(pg->thread, NULL);
}

/* Appends w to the queue, starting the progress thread on first use. */
static int enqueue_locked(crun_pg_t *pg, crun_work_t *w) {
  if (!pg->has_thread) {
    if (pthread_create(&pg->thread, NULL, progress_main, pg) != 0)
      return crun_error(CRUN_ESYS, "cannot start the progress thread of group '%s'", pg->prefix);
    pg->has_thread = 1;
  }
  atomic_fetch_add(&w->refs, 1);
  w->next = NULL;
  if (pg->tail) pg->tail->next = w;
  else pg->head = w;
  pg->tail = w;
  atomic_fetch_add(&pg->queued, 1);
  pthread_cond_broadcast(&pg->cv);
  return 0;
}

/* A copy on the heap of the blocking call's Work w, which must be queued
 * (it then outlives nothing: the call waits for it). The copy takes over what
 * w owns and a reference to the group. */
static crun_work_t *to_heap(crun_work_t *w) {
  crun_work_t *h = malloc(sizeof *h);
  if (!h) return NULL;
  memcpy(h, w, sizeof *h);
  atomic_init(&h->refs, 1);
  h->on_stack = 0;
  crun_pg_retain(w->pg);
  w->c.outs = NULL, w->c.ins = NULL, w->c.out_counts = NULL, w->c.in_counts = NULL;
  w->c.dev = NULL, w->scratch = NULL, w->err = NULL;
  return h;
}

static int is_done(crun_pg_t *pg, crun_work_t *w) {
  pthread_mutex_lock(&pg->mu);
  int d = w->done;
  pthread_mutex_unlock(&pg->mu);
  return d;
}

/* Runs the blocking call's w on this thread, busy held; gives busy back. A
 * p2p operation that goes on in the background is pumped here until done
 * (busy held throughout: the queue waits, as it would behind any operation). */
static int run_inline(crun_pg_t *pg, crun_work_t *w) {
  w->c.caller_pumps = pg->pump != NULL;
  number(pg, &w->c);
  if (crun__obs_on) crun__obs_enqueue(pg, w, 0);
  int pending = crun__pg_execute(pg, w) == CRUN__PENDING;
  while (pending && !is_done(pg, w)) /* a backend that returns CRUN__PENDING sets pump */
    if (pg->pump) pg->pump(pg->pump_arg, 0.05);
  w->done = 1; /* the caller's: nobody else waits for it */
  busy_give(pg);
  return inline_status(w);
}

int crun__pg_all_reduce_now(crun_pg_t *pg, void *buf, size_t count, crun_dtype_t dt, crun_reduce_op_t op) {
  if (!pg->ar_fn || atomic_load_explicit(&pg->is_broken, memory_order_relaxed) || !busy_take(pg)) return 1;
  if (atomic_load(&pg->queued) || atomic_load(&pg->stop)) {
    busy_give(pg);
    return 1;
  }
  /* what work_new, run_inline and crun__pg_execute do for this call: a step
   * added to or changed in those must be mirrored here (the specs that see
   * a missing one: observe for the numbering and the recorder, dist_errors
   * "...follows calls that passed" for the failure) */
  crun_work_t w; /* every field but desc, which nothing reads on this path */
  w.c = (crun__coll_t){.kind = CRUN__COLL_ALL_REDUCE, .dt = dt, .user_dt = -1, .op = op, .count = count,
                       .buf = buf, .timeout = pg->timeout, .src_out = -1, .premul = 1.0,
                       .caller_pumps = pg->pump != NULL};
  w.obs = (crun__obs_op_t){0};
  w.pg = pg, w.async = 0, w.on_stack = 1, w.queued = 0, w.done = 0, w.status = 0;
  w.err = NULL, w.scratch = NULL, w.next = NULL, w.desc[0] = 0;
  atomic_init(&w.refs, 1);
  number(pg, &w.c);
  if (crun__obs_on) crun__obs_enqueue(pg, &w, 0);
  w.c.deadline = crun__clock_coarse() + w.c.timeout;
  crun__pg_mark(pg, &w.c);
  int rc = pg->ar_fn(pg->ar_state, &w.c); /* the engine writes the held start after its post */
  crun__obs_posted();
  if (crun__obs_on) crun__obs_end(pg, &w, rc, 1);
  ended(pg, &w, rc, 1);
  busy_give(pg);
  if (rc >= 0) return 0;
  rc = inline_status(&w);
  free(w.err);
  return rc;
}

int crun__pg_submit(crun_pg_t *pg, crun_work_t *w, crun_work_t **out) {
  w->async = out != NULL;
  /* A blocking call with nothing queued and nothing running runs here and
   * now, without pg->mu. A work is counted in queued before the progress
   * thread can take busy to run it, so with busy taken and none queued,
   * nothing issued before this call is still to run. */
  if (!w->async && busy_take(pg)) {
    if (!atomic_load(&pg->queued) && !atomic_load(&pg->stop)) return run_inline(pg, w);
    busy_give(pg);
  }
  pthread_mutex_lock(&pg->mu);
  if (!w->async && !pg->head && !atomic_load(&pg->stop) && busy_take(pg)) {
    pthread_mutex_unlock(&pg->mu);
    return run_inline(pg, w);
  }
  if (crun__obs_on) crun__obs_enqueue(pg, w, 1);
  crun_work_t *q = w->on_stack ? to_heap(w) : w;
  int rc = atomic_load(&pg->stop) ? crun_error(CRUN_ECLOSED, "group '%s' is being destroyed", pg->prefix)
           : !q     ? crun_error(CRUN_ENOMEM, "%s on %s: no memory to queue it", crun__coll_name(w->c.kind),
                                        CRUN__WHO(pg, pg->rank))
                    : enqueue_locked(pg, q);
  pthread_mutex_unlock(&pg->mu);
  if (rc < 0) {
    if (q != w) crun_work_release(q);
    return rc;
  }
  if (w->async) {
    *out = w;
    return 0;
  }
  rc = crun_work_wait(q, 0);
  if (q != w) {
    w->c.src_out = q->c.src_out;
    crun_work_release(q);
  }
  return rc;
}

/* A device work's wait or query failed: the group is broken too (the
 * backend's watchdog aborted it). Returns rc. */
static int dev_result(crun_work_t *w, int rc) {
  if (rc < 0 && rc != CRUN_ETIMEDOUT) {
    char *t = strdup(crun_last_error());
    if (t) break_group(w->pg, rc, t);
    if (t) crun_error(rc, "%s", strip_name(t));
    free(t);
  }
  return rc;
}

/* Longest wait given a deadline (~30 years): past it, or infinite, the end
 * time would not fit a timespec, so the wait has none (as for <= 0). */
#define WAIT_MAX_S 1e9

int crun_work_wait(crun_work_t *w, double timeout) {
  if (!w) return crun_error(CRUN_EINVAL, "crun_work_wait: NULL work");
  if (timeout != timeout) return crun_error(CRUN_EINVAL, "wait: the timeout is NaN (give seconds, or 0 for no limit)");
  if (timeout > WAIT_MAX_S) timeout = 0;
  crun_pg_t *pg = w->pg;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double end = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + timeout;
  pthread_mutex_lock(&pg->mu);
  /* an async send or recv: the board names its peer while the caller waits,
   * as for a blocking one (a peer's refusal then need not wait for this rank) */
  int p2p = w->c.kind == CRUN__COLL_SEND || w->c.kind == CRUN__COLL_RECV;
  uint64_t blocked = !w->done && w->async && p2p ? crun__pg_p2p_block(pg, &w->c) : 0;
  while (!w->done) {
    if (timeout <= 0) {
      pthread_cond_wait(&pg->cv, &pg->mu);
      continue;
    }
    ts.tv_sec = (time_t)end;
    ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
    if (pthread_cond_timedwait(&pg->cv, &pg->mu, &ts) != 0 && !w->done) {
      desc_locked(w);
      if (blocked) crun__pg_p2p_unblock(pg, blocked);
      pthread_mutex_unlock(&pg->mu);
      return crun_error(CRUN_ETIMEDOUT, "wait on %s on %s timed out after %.3g s; it is still running",
                        w->desc, CRUN__WHO(pg, pg->rank), timeout);
    }
  }
  if (blocked) crun__pg_p2p_unblock(pg, blocked);
  pthread_mutex_unlock(&pg->mu);
  if (w->status < 0) return crun_error(w->status, "%s", strip_name(w->err));
  /* device work: the caller's current stream waits on its end event */
  return w->c.dev ? dev_result(w, w->c.dev_ops->wait(w->c.dev, 0, 0)) : 0;
}

int crun_work_synchronize(crun_work_t *w, double timeout) {
  CRUN_CHECK(crun_work_wait(w, timeout));
  return w->c.dev ? dev_result(w, w->c.dev_ops->wait(w->c.dev, 1, timeout)) : 0;
}

int crun_work_is_completed(crun_work_t *w) {
  pthread_mutex_lock(&w->pg->mu);
  int d = w->done;
  pthread_mutex_unlock(&w->pg->mu);
  if (d && w->status == 0 && w->c.dev) d = w->c.dev_ops->query(w->c.dev) != 0;
  return d;
}

int crun_work_source(crun_work_t *w) {
  return crun_work_is_completed(w) && w->status == 0 && w->c.kind == CRUN__COLL_RECV ? w->c.src_out : -1;
}

const char *crun_work_describe(crun_work_t *w) {
  pthread_mutex_lock(&w->pg->mu);
  const char *d = desc_locked(w);
  pthread_mutex_unlock(&w->pg->mu);
  return d;
}

/* Drops one reference of the work object itself (never the group's). */
static void work_unref(crun_work_t *w) {
  if (atomic_fetch_sub(&w->refs, 1) != 1) return;
  crun__coll_free(&w->c);
  free(w->scratch);
  free(w->err);
  /* the caller still holds w's group reference: keep w as the group's spare
   * when it has none (crun_pg_release frees it) */
  crun_work_t *none = NULL;
  if (CRUN__WORK_SPARE && atomic_compare_exchange_strong(&w->pg->spare, &none, w)) return;
  free(w);
}

void crun_work_release(crun_work_t *w) {
  if (!w) return;
  if (w->on_stack) { /* only what it owns: the frame is the caller's (mostly nothing) */
    if (w->c.outs || w->c.ins || w->c.out_counts || w->c.in_counts || w->c.dev) crun__coll_free(&w->c);
    if (w->scratch) free(w->scratch);
    if (w->err) free(w->err);
    return;
  }
  crun_pg_t *pg = w->pg;
  work_unref(w);
  crun_pg_release(pg); /* the handle's reference; queued work never outlives its group */
}
