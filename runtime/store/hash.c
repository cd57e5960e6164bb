/* hash.c — the in-process store: one crun__kv table under a mutex; blocking
 * calls sleep on a condition variable (monotonic clock) until their keys
 * appear or their deadline passes. */
#include "store/store_impl.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  crun_store_t base;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  crun__kv_t kv;
  crun__kv_t queues; /* their own namespace (store_impl.h) */
} hash_store_t;

#define H(s) ((hash_store_t *)(s))

/* Returns 1 when every key is present (lock held). */
static int all_present(hash_store_t *h, const char *const *keys, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!crun__kv_find(&h->kv, keys[i], strlen(keys[i]))) return 0;
  return 1;
}

/* Sleeps (lock held) on the condition variable for at most `left` seconds. */
static void sleep_locked(hash_store_t *h, double left) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double secs = floor(left);
  ts.tv_sec += (time_t)secs;
  ts.tv_nsec += (long)((left - secs) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_cond_timedwait(&h->cv, &h->mu, &ts);
}

/* Waits (lock held) until every key exists or the deadline passes. */
static int wait_locked(hash_store_t *h, const char *const *keys, size_t n, double deadline,
                       const char *op) {
  while (!all_present(h, keys, n)) {
    double left = deadline - crun_clock();
    if (left <= 0) {
      char buf[256];
      return crun_error(CRUN_ETIMEDOUT, "hash store %s: keys %s not set within the deadline",
                        op, crun__store_keys_str(keys, n, buf, sizeof buf));
    }
    sleep_locked(h, left);
  }
  return 0;
}

/* Runs a kv write (set or append) under the lock and wakes the waiters. */
static int h_write(crun_store_t *s, const char *key, const void *val, size_t len,
                   int (*write)(crun__kv_t *, const char *, size_t, const void *, size_t)) {
  pthread_mutex_lock(&H(s)->mu);
  int rc = write(&H(s)->kv, key, strlen(key), val, len);
  pthread_cond_broadcast(&H(s)->cv);
  pthread_mutex_unlock(&H(s)->mu);
  return rc;
}

static int h_set(crun_store_t *s, const char *key, const void *val, size_t len) {
  return h_write(s, key, val, len, crun__kv_set);
}

static int h_get(crun_store_t *s, const char *key, double deadline, crun_buf_t *out) {
  pthread_mutex_lock(&H(s)->mu);
  int rc = wait_locked(H(s), &key, 1, deadline, "get");
  if (rc == 0) {
    crun__kv_entry_t *e = crun__kv_find(&H(s)->kv, key, strlen(key));
    rc = crun__buf_set(out, e->val, e->len);
  }
  pthread_mutex_unlock(&H(s)->mu);
  return rc;
}

static int h_add(crun_store_t *s, const char *key, int64_t delta, int64_t *out) {
  pthread_mutex_lock(&H(s)->mu);
  int rc = crun__kv_add(&H(s)->kv, key, strlen(key), delta, out);
  pthread_cond_broadcast(&H(s)->cv);
  pthread_mutex_unlock(&H(s)->mu);
  return rc;
}

static int h_compare_set(crun_store_t *s, const char *key, const void *exp, size_t elen,
                         const void *des, size_t dlen, crun_buf_t *out) {
  const void *res;
  size_t rlen;
  pthread_mutex_lock(&H(s)->mu);
  int rc = crun__kv_compare_set(&H(s)->kv, key, strlen(key), exp, elen, des, dlen, &res, &rlen);
  if (rc == 0) rc = crun__buf_set(out, res, rlen);
  pthread_cond_broadcast(&H(s)->cv);
  pthread_mutex_unlock(&H(s)->mu);
  return rc;
}

static int h_wait(crun_store_t *s, const char *const *keys, size_t n, double deadline) {
  pthread_mutex_lock(&H(s)->mu);
  int rc = wait_locked(H(s), keys, n, deadline, "wait");
  pthread_mutex_unlock(&H(s)->mu);
  return rc;
}

static int h_check(crun_store_t *s, const char *const *keys, size_t n, int *all) {
  pthread_mutex_lock(&H(s)->mu);
  *all = all_present(H(s), keys, n);
  pthread_mutex_unlock(&H(s)->mu);
  return 0;
}

static int h_delete_key(crun_store_t *s, const char *key, int *existed) {
  pthread_mutex_lock(&H(s)->mu);
  *existed = crun__kv_delete(&H(s)->kv, key, strlen(key));
  pthread_mutex_unlock(&H(s)->mu);
  return 0;
}

static int h_num_keys(crun_store_t *s, int64_t *out) {
  pthread_mutex_lock(&H(s)->mu);
  *out = (int64_t)H(s)->kv.count;
  pthread_mutex_unlock(&H(s)->mu);
  return 0;
}

static int h_append(crun_store_t *s, const char *key, const void *val, size_t len) {
  return h_write(s, key, val, len, crun__kv_append);
}

static int h_multi_get(crun_store_t *s, const char *const *keys, size_t n, double deadline,
                       crun_buf_t *outs) {
  pthread_mutex_lock(&H(s)->mu);
  int rc = wait_locked(H(s), keys, n, deadline, "multi_get");
  for (size_t i = 0; rc == 0 && i < n; i++) {
    crun__kv_entry_t *e = crun__kv_find(&H(s)->kv, keys[i], strlen(keys[i]));
    rc = crun__buf_set(&outs[i], e->val, e->len);
  }
  pthread_mutex_unlock(&H(s)->mu);
  return rc;
}

static int h_multi_set(crun_store_t *s, const char *const *keys, size_t n,
                       const void *const *vals, const size_t *lens) {
  int rc = 0;
  pthread_mutex_lock(&H(s)->mu);
  for (size_t i = 0; rc == 0 && i < n; i++)
    rc = crun__kv_set(&H(s)->kv, keys[i], strlen(keys[i]), vals[i], lens[i]);
  pthread_cond_broadcast(&H(s)->cv);
  pthread_mutex_unlock(&H(s)->mu);
  return rc;
}

static int h_queue_push(crun_store_t *s, const char *key, const void *val, size_t len) {
  pthread_mutex_lock(&H(s)->mu);
  int rc = crun__kv_qpush(&H(s)->queues, key, strlen(key), val, len);
  pthread_cond_broadcast(&H(s)->cv);
  pthread_mutex_unlock(&H(s)->mu);
  return rc;
}

/* Takes the head of queue key once it has one (deadline < 0: at once). */
static int h_queue_pop(crun_store_t *s, const char *key, double deadline, crun_buf_t *out) {
  size_t klen = strlen(key), ilen;
  const void *item;
  int rc = 0;
  pthread_mutex_lock(&H(s)->mu);
  while (!crun__kv_qpeek(&H(s)->queues, key, klen, &item, &ilen)) {
    double left = deadline - crun_clock();
    if (deadline < 0) rc = crun_error(CRUN_ENOTFOUND, "hash store queue_pop: queue '%s' is empty", key);
    else if (left <= 0)
      rc = crun_error(CRUN_ETIMEDOUT, "hash store queue_pop: queue '%s' got no item within the deadline", key);
    if (rc < 0) break;
    sleep_locked(H(s), left);
  }
  if (rc == 0 && (rc = crun__buf_set(out, item, ilen)) == 0) crun__kv_qdrop(&H(s)->queues, key, klen);
  pthread_mutex_unlock(&H(s)->mu);
  return rc;
}

static int h_queue_len(crun_store_t *s, const char *key, int64_t *out) {
  pthread_mutex_lock(&H(s)->mu);
  *out = crun__kv_qlen(&H(s)->queues, key, strlen(key));
  pthread_mutex_unlock(&H(s)->mu);
  return 0;
}

static int h_list_keys(crun_store_t *s, crun_store_keys_t *out) {
  pthread_mutex_lock(&H(s)->mu);
  int rc = crun__kv_keys(&H(s)->kv, out);
  pthread_mutex_unlock(&H(s)->mu);
  return rc;
}

static void h_destroy(crun_store_t *s) {
  crun__kv_free(&H(s)->kv);
  crun__kv_free(&H(s)->queues);
  pthread_cond_destroy(&H(s)->cv);
  pthread_mutex_destroy(&H(s)->mu);
  free(s);
}

static const crun__store_ops_t hash_ops = {
    .kind = "hash", .set = h_set, .get = h_get, .add = h_add, .compare_set = h_compare_set,
    .wait = h_wait, .check = h_check, .delete_key = h_delete_key, .num_keys = h_num_keys,
    .append = h_append, .multi_get = h_multi_get, .multi_set = h_multi_set,
    .queue_push = h_queue_push, .queue_pop = h_queue_pop, .queue_len = h_queue_len,
    .list_keys = h_list_keys, .destroy = h_destroy};

int crun_store_hash_new(crun_store_t **out) {
  if (!out) return crun_error(CRUN_EINVAL, "hash store: out is NULL");
  hash_store_t *h = calloc(1, sizeof *h);
  if (!h) return crun_error(CRUN_ENOMEM, "hash store: out of memory");
  int rc = crun__kv_init(&h->kv);
  if (rc == 0 && (rc = crun__kv_init(&h->queues)) < 0) crun__kv_free(&h->kv);
  if (rc < 0) {
    free(h);
    return rc;
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&h->mu, NULL);
  crun__store_init(&h->base, &hash_ops);
  *out = &h->base;
  return 0;
}
