/* prefix.c — a store that prepends "<prefix>/" to every key and forwards to
 * the inner store's vtable (keeping the caller's deadline). */
#include "store/store_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  crun_store_t base;
  crun_store_t *inner;
  char *prefix; /* includes the trailing '/' */
  size_t plen;
} prefix_store_t;

#define P(s) ((prefix_store_t *)(s))

/* Returns a malloc'd "<prefix>/<key>" or NULL. */
static char *full_key(crun_store_t *s, const char *key) {
  size_t kl = strlen(key);
  char *k = malloc(P(s)->plen + kl + 1);
  if (!k) return NULL;
  memcpy(k, P(s)->prefix, P(s)->plen);
  memcpy(k + P(s)->plen, key, kl + 1);
  return k;
}

/* Builds the prefixed copy of a key list; frees and fails on OOM. */
static char **full_keys(crun_store_t *s, const char *const *keys, size_t n) {
  char **ks = calloc(n, sizeof *ks);
  for (size_t i = 0; ks && i < n; i++) {
    if (!(ks[i] = full_key(s, keys[i]))) {
      while (i--) free(ks[i]);
      free(ks);
      return NULL;
    }
  }
  return ks;
}

static void free_keys(char **ks, size_t n) {
  for (size_t i = 0; ks && i < n; i++) free(ks[i]);
  free(ks);
}

#define INNER(s) (P(s)->inner)
#define ONE_KEY(s, key, call)                                                       \
  do {                                                                              \
    char *fk = full_key(s, key);                                                    \
    if (!fk) return crun_error(CRUN_ENOMEM, "prefix store: out of memory");         \
    int rc_ = (call);                                                               \
    free(fk);                                                                       \
    return rc_;                                                                     \
  } while (0)
#define MANY_KEYS(s, keys, n, call)                                                 \
  do {                                                                              \
    char **fks = full_keys(s, keys, n);                                             \
    if (!fks) return crun_error(CRUN_ENOMEM, "prefix store: out of memory");        \
    int rc_ = (call);                                                               \
    free_keys(fks, n);                                                              \
    return rc_;                                                                     \
  } while (0)
#define NEED(s, slot)                                                               \
  do {                                                                              \
    if (!INNER(s)->ops->slot)                                                       \
      return crun_error(CRUN_ENOTSUP, "%s store does not support " #slot,          \
                        INNER(s)->ops->kind);                                       \
  } while (0)

static int p_set(crun_store_t *s, const char *key, const void *val, size_t len) {
  NEED(s, set);
  ONE_KEY(s, key, INNER(s)->ops->set(INNER(s), fk, val, len));
}

static int p_get(crun_store_t *s, const char *key, double deadline, crun_buf_t *out) {
  NEED(s, get);
  ONE_KEY(s, key, INNER(s)->ops->get(INNER(s), fk, deadline, out));
}

static int p_add(crun_store_t *s, const char *key, int64_t delta, int64_t *out) {
  NEED(s, add);
  ONE_KEY(s, key, INNER(s)->ops->add(INNER(s), fk, delta, out));
}

static int p_compare_set(crun_store_t *s, const char *key, const void *exp, size_t elen,
                         const void *des, size_t dlen, crun_buf_t *out) {
  NEED(s, compare_set);
  ONE_KEY(s, key, INNER(s)->ops->compare_set(INNER(s), fk, exp, elen, des, dlen, out));
}

static int p_wait(crun_store_t *s, const char *const *keys, size_t n, double deadline) {
  NEED(s, wait);
  MANY_KEYS(s, keys, n, INNER(s)->ops->wait(INNER(s), (const char *const *)fks, n, deadline));
}

static int p_check(crun_store_t *s, const char *const *keys, size_t n, int *all) {
  NEED(s, check);
  MANY_KEYS(s, keys, n, INNER(s)->ops->check(INNER(s), (const char *const *)fks, n, all));
}

static int p_delete_key(crun_store_t *s, const char *key, int *existed) {
  NEED(s, delete_key);
  ONE_KEY(s, key, INNER(s)->ops->delete_key(INNER(s), fk, existed));
}

/* Counts the inner store's keys, as torch's PrefixStore does. */
static int p_num_keys(crun_store_t *s, int64_t *out) {
  NEED(s, num_keys);
  return INNER(s)->ops->num_keys(INNER(s), out);
}

static int p_append(crun_store_t *s, const char *key, const void *val, size_t len) {
  NEED(s, append);
  ONE_KEY(s, key, INNER(s)->ops->append(INNER(s), fk, val, len));
}

static int p_multi_get(crun_store_t *s, const char *const *keys, size_t n, double deadline,
                       crun_buf_t *outs) {
  NEED(s, multi_get);
  MANY_KEYS(s, keys, n,
            INNER(s)->ops->multi_get(INNER(s), (const char *const *)fks, n, deadline, outs));
}

static int p_multi_set(crun_store_t *s, const char *const *keys, size_t n,
                       const void *const *vals, const size_t *lens) {
  NEED(s, multi_set);
  MANY_KEYS(s, keys, n,
            INNER(s)->ops->multi_set(INNER(s), (const char *const *)fks, n, vals, lens));
}

static int p_queue_push(crun_store_t *s, const char *key, const void *val, size_t len) {
  NEED(s, queue_push);
  ONE_KEY(s, key, INNER(s)->ops->queue_push(INNER(s), fk, val, len));
}

static int p_queue_pop(crun_store_t *s, const char *key, double deadline, crun_buf_t *out) {
  NEED(s, queue_pop);
  ONE_KEY(s, key, INNER(s)->ops->queue_pop(INNER(s), fk, deadline, out));
}

static int p_queue_len(crun_store_t *s, const char *key, int64_t *out) {
  NEED(s, queue_len);
  ONE_KEY(s, key, INNER(s)->ops->queue_len(INNER(s), fk, out));
}

/* Keeps the inner keys that start with the prefix, stripped of it, in place
 * (the stripped list is never longer). */
static void strip_prefix(crun_store_t *s, crun_store_keys_t *k) {
  size_t in = 0, outp = 0, kept = 0;
  for (size_t i = 0; i < k->count; i++) {
    size_t kl = strlen(k->buf + in);
    if (kl >= P(s)->plen && memcmp(k->buf + in, P(s)->prefix, P(s)->plen) == 0) {
      memmove(k->buf + outp, k->buf + in + P(s)->plen, kl - P(s)->plen + 1);
      outp += kl - P(s)->plen + 1;
      kept++;
    }
    in += kl + 1;
  }
  k->len = outp;
  k->count = kept;
}

/* Lists only this prefix's keys (unlike num_keys, which counts the inner
 * store's, as torch's PrefixStore does). */
static int p_list_keys(crun_store_t *s, crun_store_keys_t *out) {
  NEED(s, list_keys);
  CRUN_CHECK(INNER(s)->ops->list_keys(INNER(s), out));
  strip_prefix(s, out);
  return 0;
}

static int p_port(crun_store_t *s) { return crun_store_tcp_port(INNER(s)); }

static void p_destroy(crun_store_t *s) {
  crun_store_release(INNER(s));
  free(P(s)->prefix);
  free(s);
}

static const crun__store_ops_t prefix_ops = {
    .kind = "prefix", .set = p_set, .get = p_get, .add = p_add, .compare_set = p_compare_set,
    .wait = p_wait, .check = p_check, .delete_key = p_delete_key, .num_keys = p_num_keys,
    .append = p_append, .multi_get = p_multi_get, .multi_set = p_multi_set,
    .queue_push = p_queue_push, .queue_pop = p_queue_pop, .queue_len = p_queue_len,
    .list_keys = p_list_keys, .port = p_port, .destroy = p_destroy};

int crun_store_prefix_new(const char *prefix, crun_store_t *inner, crun_store_t **out) {
  if (!prefix || !inner || !out)
    return crun_error(CRUN_EINVAL, "prefix store: prefix, inner and out must not be NULL");
  prefix_store_t *p = calloc(1, sizeof *p);
  size_t pl = strlen(prefix);
  if (!p || !(p->prefix = malloc(pl + 2))) {
    free(p);
    return crun_error(CRUN_ENOMEM, "prefix store: out of memory");
  }
  memcpy(p->prefix, prefix, pl);
  p->prefix[pl] = '/';
  p->prefix[pl + 1] = 0;
  p->plen = pl + 1;
  p->inner = inner;
  crun_store_retain(inner);
  crun__store_init(&p->base, &prefix_ops);
  crun_store_set_timeout(&p->base, crun_store_get_timeout(inner));
  *out = &p->base;
  return 0;
}
