/* kv.c — the string-keyed byte-value hash table shared by the hash store, the
 * file store's cache and the TCP server, plus torch's add / compare_set rules
 * on top of it. Not thread-safe: callers hold their own lock. */
#include "store/store_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t crun__kv_hash(const char *key, size_t klen) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < klen; i++) h = (h ^ (uint8_t)key[i]) * 1099511628211ull;
  return h;
}

int crun__kv_init(crun__kv_t *kv) {
  kv->nslots = 64;
  kv->count = 0;
  kv->slots = calloc(kv->nslots, sizeof *kv->slots);
  return kv->slots ? 0 : crun_error(CRUN_ENOMEM, "store table: out of memory");
}

void crun__kv_free(crun__kv_t *kv) {
  for (size_t i = 0; i < kv->nslots && kv->slots; i++) {
    crun__kv_entry_t *e = kv->slots[i];
    while (e) {
      crun__kv_entry_t *next = e->next;
      free(e->key);
      free(e->val);
      free(e);
      e = next;
    }
  }
  free(kv->slots);
  kv->slots = NULL;
  kv->nslots = kv->count = 0;
}

crun__kv_entry_t *crun__kv_find(crun__kv_t *kv, const char *key, size_t klen) {
  uint64_t h = crun__kv_hash(key, klen);
  for (crun__kv_entry_t *e = kv->slots[h & (kv->nslots - 1)]; e; e = e->next)
    if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0) return e;
  return NULL;
}

/* Doubles the slot array when the load factor passes 1. */
static void kv_grow(crun__kv_t *kv) {
  size_t n = kv->nslots * 2;
  crun__kv_entry_t **slots = calloc(n, sizeof *slots);
  if (!slots) return; /* keep the old, longer chains */
  for (size_t i = 0; i < kv->nslots; i++) {
    crun__kv_entry_t *e = kv->slots[i];
    while (e) {
      crun__kv_entry_t *next = e->next;
      e->next = slots[e->hash & (n - 1)];
      slots[e->hash & (n - 1)] = e;
      e = next;
    }
  }
  free(kv->slots);
  kv->slots = slots;
  kv->nslots = n;
}

/* Finds key or inserts it with an empty value. */
static crun__kv_entry_t *kv_upsert(crun__kv_t *kv, const char *key, size_t klen) {
  crun__kv_entry_t *e = crun__kv_find(kv, key, klen);
  if (e) return e;
  if (kv->count >= kv->nslots) kv_grow(kv);
  e = calloc(1, sizeof *e);
  if (!e || !(e->key = malloc(klen + 1))) {
    free(e);
    return NULL;
  }
  memcpy(e->key, key, klen);
  e->key[klen] = 0;
  e->klen = klen;
  e->hash = crun__kv_hash(key, klen);
  e->next = kv->slots[e->hash & (kv->nslots - 1)];
  kv->slots[e->hash & (kv->nslots - 1)] = e;
  kv->count++;
  return e;
}

/* Makes room for `len` bytes in the entry's value buffer. */
static int kv_reserve(crun__kv_entry_t *e, size_t len) {
  if (len <= e->cap && e->val) return 0;
  size_t cap = len < 16 ? 16 : len;
  uint8_t *v = realloc(e->val, cap);
  if (!v) return crun_error(CRUN_ENOMEM, "store: out of memory for a %zu-byte value", len);
  e->val = v;
  e->cap = cap;
  return 0;
}

int crun__kv_set(crun__kv_t *kv, const char *key, size_t klen, const void *val, size_t len) {
  crun__kv_entry_t *e = kv_upsert(kv, key, klen);
  if (!e) return crun_error(CRUN_ENOMEM, "store: out of memory for key '%.*s'", CRUN__KLEN(klen), key);
  CRUN_CHECK(kv_reserve(e, len));
  if (len) memcpy(e->val, val, len);
  e->len = len;
  return 0;
}

int crun__kv_append(crun__kv_t *kv, const char *key, size_t klen, const void *val, size_t len) {
  crun__kv_entry_t *e = kv_upsert(kv, key, klen);
  if (!e) return crun_error(CRUN_ENOMEM, "store: out of memory for key '%.*s'", CRUN__KLEN(klen), key);
  if (e->len + len > e->cap) CRUN_CHECK(kv_reserve(e, e->cap * 2 > e->len + len ? e->cap * 2 : e->len + len));
  if (len) memcpy(e->val + e->len, val, len);
  e->len += len;
  return 0;
}

int crun__kv_delete(crun__kv_t *kv, const char *key, size_t klen) {
  uint64_t h = crun__kv_hash(key, klen);
  crun__kv_entry_t **pp = &kv->slots[h & (kv->nslots - 1)];
  for (; *pp; pp = &(*pp)->next) {
    crun__kv_entry_t *e = *pp;
    if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0) {
      *pp = e->next;
      free(e->key);
      free(e->val);
      free(e);
      kv->count--;
      return 1;
    }
  }
  return 0;
}

/* Parses a stored decimal integer (as add writes them). */
static int kv_parse_int(const crun__kv_entry_t *e, int64_t *out) {
  char buf[32];
  if (e->len == 0 || e->len >= sizeof buf) goto bad;
  memcpy(buf, e->val, e->len);
  buf[e->len] = 0;
  char *end;
  errno = 0;
  long long v = strtoll(buf, &end, 10);
  if (errno || *end) goto bad;
  *out = v;
  return 0;
bad:
  return crun_error(CRUN_EINVAL, "add on key '%s': its value (%zu bytes) is not a decimal integer",
                    e->key, e->len);
}

int crun__kv_add(crun__kv_t *kv, const char *key, size_t klen, int64_t delta, int64_t *out) {
  crun__kv_entry_t *e = crun__kv_find(kv, key, klen);
  int64_t v = 0;
  if (e) CRUN_CHECK(kv_parse_int(e, &v));
  v = (int64_t)((uint64_t)v + (uint64_t)delta);
  char text[32];
  int n = snprintf(text, sizeof text, "%" PRId64, v);
  CRUN_CHECK(crun__kv_set(kv, key, klen, text, (size_t)n));
  *out = v;
  return 0;
}

int crun__kv_compare_set(crun__kv_t *kv, const char *key, size_t klen, const void *exp,
                         size_t elen, const void *des, size_t dlen, const void **res,
                         size_t *rlen) {
  crun__kv_entry_t *e = crun__kv_find(kv, key, klen);
  if (!e && elen != 0) { /* torch: missing key, non-empty expected -> expected */
    *res = exp;
    *rlen = elen;
    return 0;
  }
  if (!e || (e->len == elen && (elen == 0 || memcmp(e->val, exp, elen) == 0))) {
    CRUN_CHECK(crun__kv_set(kv, key, klen, des, dlen));
    e = crun__kv_find(kv, key, klen);
  }
  *res = e->val;
  *rlen = e->len;
  return 0;
}

int crun__kv_keys(const crun__kv_t *kv, crun_store_keys_t *out) {
  size_t len = 0;
  for (size_t i = 0; i < kv->nslots; i++)
    for (const crun__kv_entry_t *e = kv->slots[i]; e; e = e->next) len += e->klen + 1;
  out->buf = malloc(len ? len : 1);
  out->len = 0, out->count = 0, out->keys = NULL;
  if (!out->buf) return crun_error(CRUN_ENOMEM, "store list_keys: out of memory for %zu bytes of keys", len);
  for (size_t i = 0; i < kv->nslots; i++)
    for (const crun__kv_entry_t *e = kv->slots[i]; e; e = e->next) {
      memcpy(out->buf + out->len, e->key, e->klen + 1);
      out->len += e->klen + 1;
      out->count++;
    }
  return 0;
}

/* Item headers are a native size_t: queue tables never leave the process. */
#define QHDR sizeof(size_t)

int crun__kv_qpush(crun__kv_t *kv, const char *key, size_t klen, const void *val, size_t len) {
  crun__kv_entry_t *e = kv_upsert(kv, key, klen);
  if (!e) return crun_error(CRUN_ENOMEM, "store: out of memory for queue '%.*s'", CRUN__KLEN(klen), key);
  if (len > SIZE_MAX / 2 - QHDR - e->len)
    return crun_error(CRUN_ERANGE, "store: queue '%.*s' would pass %zu bytes", CRUN__KLEN(klen), key, SIZE_MAX / 2);
  size_t need = e->len + QHDR + len;
  if (need > e->cap) {
    int rc = kv_reserve(e, e->cap * 2 > need ? e->cap * 2 : need);
    if (rc < 0) {
      if (e->items == 0) crun__kv_delete(kv, key, klen); /* do not leave an empty queue */
      return rc;
    }
  }
  memcpy(e->val + e->len, &len, QHDR);
  if (len) memcpy(e->val + e->len + QHDR, val, len);
  e->len = need;
  e->items++;
  return 0;
}

int crun__kv_qpeek(crun__kv_t *kv, const char *key, size_t klen, const void **item, size_t *ilen) {
  crun__kv_entry_t *e = crun__kv_find(kv, key, klen);
  if (!e || e->items == 0) return 0;
  memcpy(ilen, e->val + e->head, QHDR);
  *item = e->val + e->head + QHDR;
  return 1;
}

void crun__kv_qdrop(crun__kv_t *kv, const char *key, size_t klen) {
  crun__kv_entry_t *e = crun__kv_find(kv, key, klen);
  if (!e || e->items == 0) return;
  size_t ilen;
  memcpy(&ilen, e->val + e->head, QHDR);
  e->head += QHDR + ilen;
  if (--e->items == 0) {
    crun__kv_delete(kv, key, klen);
    return;
  }
  if (e->head >= 4096 && e->head >= e->len / 2) { /* compact: amortized O(1) per item */
    memmove(e->val, e->val + e->head, e->len - e->head);
    e->len -= e->head;
    e->head = 0;
  }
}

int64_t crun__kv_qlen(crun__kv_t *kv, const char *key, size_t klen) {
  crun__kv_entry_t *e = crun__kv_find(kv, key, klen);
  return e ? (int64_t)e->items : 0;
}
