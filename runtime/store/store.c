/* store.c — the public store API: argument checks, deadlines, reference
 * counting, then dispatch through the kind's vtable. */
#include "store/store_impl.h"
#include "core/clock_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void crun_buf_free(crun_buf_t *b) {
  if (!b) return;
  free(b->data);
  b->data = NULL;
  b->len = 0;
}

int crun__buf_set(crun_buf_t *b, const void *data, size_t len) {
  b->data = malloc(len + 1);
  b->len = 0;
  if (!b->data) return crun_error(CRUN_ENOMEM, "store: out of memory for a %zu-byte value", len);
  if (len) memcpy(b->data, data, len);
  ((char *)b->data)[len] = 0;
  b->len = len;
  return 0;
}

void crun__store_init(crun_store_t *s, const crun__store_ops_t *ops) {
  s->ops = ops;
  atomic_init(&s->refs, 1);
  atomic_init(&s->timeout_ns, (int64_t)(CRUN_STORE_DEFAULT_TIMEOUT * 1e9));
}

const char *crun__store_keys_str(const char *const *keys, size_t n, char *buf, size_t cap) {
  size_t used = 0, shown = n < 4 ? n : 4;
  buf[0] = 0;
  for (size_t i = 0; i < shown && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "%s'%s'", i ? ", " : "", keys[i]);
  if (n > shown && used < cap) snprintf(buf + used, cap - used, " (+%zu more)", n - shown);
  return buf;
}

void crun_store_retain(crun_store_t *s) {
  if (s) atomic_fetch_add(&s->refs, 1);
}

int crun__store_try_retain(crun_store_t *s) {
  int n = atomic_load(&s->refs);
  while (n > 0)
    if (atomic_compare_exchange_weak(&s->refs, &n, n + 1)) return 1;
  return 0;
}

void crun_store_release(crun_store_t *s) {
  if (s && atomic_fetch_sub(&s->refs, 1) == 1) s->ops->destroy(s);
}

void crun_store_set_timeout(crun_store_t *s, double seconds) {
  if (!s) return;
  /* NaN or <= 0: the default; inf or more than 31 years: the longest (the
   * nanoseconds of inf wrapped to a negative timeout: every call timed out) */
  if (!(seconds > 0)) seconds = CRUN_STORE_DEFAULT_TIMEOUT;
  if (seconds > CRUN__MAX_TIMEOUT) seconds = CRUN__MAX_TIMEOUT;
  atomic_store(&s->timeout_ns, (int64_t)(seconds * 1e9));
}

double crun_store_get_timeout(crun_store_t *s) {
  return s ? (double)atomic_load(&s->timeout_ns) * 1e-9 : CRUN_STORE_DEFAULT_TIMEOUT;
}

/* Absolute deadline for a call with `timeout` (<= 0: the store's). */
static double deadline_of(crun_store_t *s, double timeout) {
  return crun_clock() + (timeout > 0 ? timeout : crun_store_get_timeout(s));
}

/* Validates the store and one key. */
static int check_key(crun_store_t *s, const char *key, const char *op) {
  if (!s) return crun_error(CRUN_EINVAL, "store %s: store is NULL", op);
  if (!key) return crun_error(CRUN_EINVAL, "store %s: key is NULL", op);
  return 0;
}

/* Validates the store and a key list. */
static int check_keys(crun_store_t *s, const char *const *keys, size_t n, const char *op) {
  if (!s) return crun_error(CRUN_EINVAL, "store %s: store is NULL", op);
  if (n && !keys) return crun_error(CRUN_EINVAL, "store %s: key list is NULL", op);
  for (size_t i = 0; i < n; i++)
    if (!keys[i]) return crun_error(CRUN_EINVAL, "store %s: key #%zu is NULL", op, i + 1);
  return 0;
}

#define CRUN__SLOT(s, slot, op)                                                     \
  do {                                                                              \
    if (!(s)->ops->slot)                                                            \
      return crun_error(CRUN_ENOTSUP, "%s store does not support %s", (s)->ops->kind, op); \
  } while (0)

int crun_store_set(crun_store_t *s, const char *key, const void *val, size_t len) {
  CRUN_CHECK(check_key(s, key, "set"));
  if (len && !val) return crun_error(CRUN_EINVAL, "store set '%s': value is NULL", key);
  CRUN__SLOT(s, set, "set");
  return s->ops->set(s, key, val, len);
}

int crun_store_get(crun_store_t *s, const char *key, crun_buf_t *out) {
  CRUN_CHECK(check_key(s, key, "get"));
  if (!out) return crun_error(CRUN_EINVAL, "store get '%s': out is NULL", key);
  out->data = NULL;
  out->len = 0;
  CRUN__SLOT(s, get, "get");
  return s->ops->get(s, key, deadline_of(s, 0), out);
}

int crun_store_add(crun_store_t *s, const char *key, int64_t delta, int64_t *out) {
  int64_t tmp;
  CRUN_CHECK(check_key(s, key, "add"));
  CRUN__SLOT(s, add, "add");
  return s->ops->add(s, key, delta, out ? out : &tmp);
}

int crun_store_compare_set(crun_store_t *s, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, crun_buf_t *out) {
  CRUN_CHECK(check_key(s, key, "compare_set"));
  if ((elen && !expected) || (dlen && !desired) || !out)
    return crun_error(CRUN_EINVAL, "store compare_set '%s': NULL argument", key);
  out->data = NULL;
  out->len = 0;
  CRUN__SLOT(s, compare_set, "compare_set");
  return s->ops->compare_set(s, key, expected, elen, desired, dlen, out);
}

int crun_store_wait(crun_store_t *s, const char *const *keys, size_t n, double timeout) {
  CRUN_CHECK(check_keys(s, keys, n, "wait"));
  if (n == 0) return 0;
  /* a NaN deadline compares false with the clock: the wait never ended;
   * inf (or more than 31 years) is the longest, as in crun_store_set_timeout */
  if (timeout != timeout)
    return crun_error(CRUN_EINVAL, "store wait '%s': timeout %g s is not a number of seconds", keys[0], timeout);
  if (timeout > CRUN__MAX_TIMEOUT) timeout = CRUN__MAX_TIMEOUT;
  CRUN__SLOT(s, wait, "wait");
  return s->ops->wait(s, keys, n, deadline_of(s, timeout));
}

int crun_store_check(crun_store_t *s, const char *const *keys, size_t n, int *all_exist) {
  CRUN_CHECK(check_keys(s, keys, n, "check"));
  if (!all_exist) return crun_error(CRUN_EINVAL, "store check: all_exist is NULL");
  *all_exist = 1;
  if (n == 0) return 0;
  CRUN__SLOT(s, check, "check");
  return s->ops->check(s, keys, n, all_exist);
}

int crun_store_delete_key(crun_store_t *s, const char *key, int *existed) {
  int tmp;
  CRUN_CHECK(check_key(s, key, "delete_key"));
  CRUN__SLOT(s, delete_key, "delete_key");
  return s->ops->delete_key(s, key, existed ? existed : &tmp);
}

int crun_store_num_keys(crun_store_t *s, int64_t *out) {
  if (!s || !out) return crun_error(CRUN_EINVAL, "store num_keys: NULL argument");
  CRUN__SLOT(s, num_keys, "num_keys");
  return s->ops->num_keys(s, out);
}

int crun_store_append(crun_store_t *s, const char *key, const void *val, size_t len) {
  CRUN_CHECK(check_key(s, key, "append"));
  if (len && !val) return crun_error(CRUN_EINVAL, "store append '%s': value is NULL", key);
  CRUN__SLOT(s, append, "append");
  return s->ops->append(s, key, val, len);
}

int crun_store_multi_get(crun_store_t *s, const char *const *keys, size_t n, crun_buf_t *outs) {
  CRUN_CHECK(check_keys(s, keys, n, "multi_get"));
  if (n && !outs) return crun_error(CRUN_EINVAL, "store multi_get: outs is NULL");
  for (size_t i = 0; i < n; i++) outs[i].data = NULL, outs[i].len = 0;
  if (n == 0) return 0;
  CRUN__SLOT(s, multi_get, "multi_get");
  int rc = s->ops->multi_get(s, keys, n, deadline_of(s, 0), outs);
  if (rc < 0)
    for (size_t i = 0; i < n; i++) crun_buf_free(&outs[i]);
  return rc;
}

int crun_store_multi_set(crun_store_t *s, const char *const *keys, size_t n,
                         const void *const *vals, const size_t *lens) {
  CRUN_CHECK(check_keys(s, keys, n, "multi_set"));
  if (n && (!vals || !lens)) return crun_error(CRUN_EINVAL, "store multi_set: values are NULL");
  for (size_t i = 0; i < n; i++)
    if (lens[i] && !vals[i])
      return crun_error(CRUN_EINVAL, "store multi_set: value #%zu is NULL", i + 1);
  if (n == 0) return 0;
  CRUN__SLOT(s, multi_set, "multi_set");
  return s->ops->multi_set(s, keys, n, vals, lens);
}

int crun_store_tcp_port(crun_store_t *s) {
  return (s && s->ops->port) ? s->ops->port(s) : -1;
}

int crun_store_queue_push(crun_store_t *s, const char *key, const void *val, size_t len) {
  CRUN_CHECK(check_key(s, key, "queue_push"));
  if (len && !val) return crun_error(CRUN_EINVAL, "store queue_push '%s': value is NULL", key);
  CRUN__SLOT(s, queue_push, "queue_push");
  return s->ops->queue_push(s, key, val, len);
}

int crun_store_queue_pop(crun_store_t *s, const char *key, int block, double timeout, crun_buf_t *out) {
  CRUN_CHECK(check_key(s, key, "queue_pop"));
  if (!out) return crun_error(CRUN_EINVAL, "store queue_pop '%s': out is NULL", key);
  out->data = NULL;
  out->len = 0;
  if (block && (timeout != timeout || timeout > CRUN__MAX_TIMEOUT))
    return crun_error(CRUN_EINVAL, "store queue_pop '%s': timeout %g s is not a number of seconds up to %g",
                      key, timeout, CRUN__MAX_TIMEOUT);
  CRUN__SLOT(s, queue_pop, "queue_pop");
  return s->ops->queue_pop(s, key, block ? deadline_of(s, timeout) : -1.0, out);
}

int crun_store_queue_len(crun_store_t *s, const char *key, int64_t *out) {
  CRUN_CHECK(check_key(s, key, "queue_len"));
  if (!out) return crun_error(CRUN_EINVAL, "store queue_len '%s': out is NULL", key);
  CRUN__SLOT(s, queue_len, "queue_len");
  return s->ops->queue_len(s, key, out);
}

static int cmp_keys(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Points keys[] at the count NUL-terminated keys of buf and sorts them. */
static int index_keys(crun_store_keys_t *k) {
  k->keys = malloc((k->count ? k->count : 1) * sizeof *k->keys);
  if (!k->keys) return crun_error(CRUN_ENOMEM, "store list_keys: out of memory for %zu keys", k->count);
  size_t p = 0;
  for (size_t i = 0; i < k->count; i++) {
    const char *nul = p < k->len ? memchr(k->buf + p, 0, k->len - p) : NULL;
    if (!nul) return crun_error(CRUN_EPROTO, "store list_keys: %zu keys announced, %zu found", k->count, i);
    k->keys[i] = k->buf + p;
    p = (size_t)(nul - k->buf) + 1;
  }
  if (p != k->len) return crun_error(CRUN_EPROTO, "store list_keys: %zu stray bytes after the keys", k->len - p);
  qsort(k->keys, k->count, sizeof *k->keys, cmp_keys);
  return 0;
}

int crun_store_list_keys(crun_store_t *s, crun_store_keys_t *out) {
  if (!s || !out) return crun_error(CRUN_EINVAL, "store list_keys: NULL argument");
  memset(out, 0, sizeof *out);
  CRUN__SLOT(s, list_keys, "list_keys");
  int rc = s->ops->list_keys(s, out);
  if (rc == 0) rc = index_keys(out);
  if (rc < 0) crun_store_keys_free(out);
  return rc;
}

void crun_store_keys_free(crun_store_keys_t *keys) {
  if (!keys) return;
  free(keys->keys);
  free(keys->buf);
  memset(keys, 0, sizeof *keys);
}
