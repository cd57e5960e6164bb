/* store_impl.h — the store vtable every kind fills, and the shared in-memory
 * key/value table (crun__kv) used by the hash store, the file store's cache and
 * the TCP server. Internal to libcrunrt. */
#ifndef CRUN_STORE_IMPL_H
#define CRUN_STORE_IMPL_H

#include <string.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "crun.h"

/* Every slot receives an absolute deadline (crun_clock() seconds) where it may
 * block. A NULL optional slot makes the public call return CRUN_ENOTSUP. */
typedef struct crun__store_ops {
  const char *kind;
  int (*set)(crun_store_t *s, const char *key, const void *val, size_t len);
  int (*get)(crun_store_t *s, const char *key, double deadline, crun_buf_t *out);
  int (*add)(crun_store_t *s, const char *key, int64_t delta, int64_t *out);
  int (*compare_set)(crun_store_t *s, const char *key, const void *exp, size_t elen,
                     const void *des, size_t dlen, crun_buf_t *out);
  int (*wait)(crun_store_t *s, const char *const *keys, size_t n, double deadline);
  int (*check)(crun_store_t *s, const char *const *keys, size_t n, int *all);
  int (*delete_key)(crun_store_t *s, const char *key, int *existed);
  int (*num_keys)(crun_store_t *s, int64_t *out);
  int (*append)(crun_store_t *s, const char *key, const void *val, size_t len);
  int (*multi_get)(crun_store_t *s, const char *const *keys, size_t n, double deadline,
                   crun_buf_t *outs);
  int (*multi_set)(crun_store_t *s, const char *const *keys, size_t n,
                   const void *const *vals, const size_t *lens);
  int (*queue_push)(crun_store_t *s, const char *key, const void *val, size_t len);
  /* deadline < 0: do not block (CRUN_ENOTFOUND when empty) */
  int (*queue_pop)(crun_store_t *s, const char *key, double deadline, crun_buf_t *out);
  int (*queue_len)(crun_store_t *s, const char *key, int64_t *out);
  /* fills buf / len / count (unsorted; keys stays NULL: store.c indexes them) */
  int (*list_keys)(crun_store_t *s, crun_store_keys_t *out);
  int (*port)(crun_store_t *s);
  void (*destroy)(crun_store_t *s);
} crun__store_ops_t;

/* The common head of every store; each kind embeds it as its first member. */
struct crun_store {
  const crun__store_ops_t *ops;
  atomic_int refs;
  _Atomic int64_t timeout_ns;
};

/* Fills the common head (one reference, default timeout). */
void crun__store_init(crun_store_t *s, const crun__store_ops_t *ops);

/* Takes a reference to s unless its last one is gone (its destroy has begun
 * or is about to): returns 1 when taken. For a kind's own list of its
 * stores, which finds a store there until its destroy takes it off. */
int crun__store_try_retain(crun_store_t *s);

/* A key's length for "%.*s": keys from the wire carry no NUL (at most 200
 * bytes of one are printed). */
#define CRUN__KLEN(klen) ((int)((klen) > 200 ? 200 : (klen)))

/* The text of the last error on this thread without its leading "ENAME: ". */
static inline const char *crun__store_error_body(void) {
  const char *m = crun_last_error(), *colon = strstr(m, ": ");
  return colon ? colon + 2 : m;
}

/* Formats up to a few keys as "'a', 'b' (+3 more)" into buf for error texts. */
const char *crun__store_keys_str(const char *const *keys, size_t n, char *buf, size_t cap);

/* Copies bytes into a fresh crun_buf_t (a NUL is kept after the data). */
int crun__buf_set(crun_buf_t *b, const void *data, size_t len);

/* ---- crun__kv: a string-keyed hash table of byte values (not thread-safe) */
typedef struct crun__kv_entry {
  struct crun__kv_entry *next;
  uint64_t hash;
  size_t klen, len, cap;
  char *key;       /* NUL-terminated */
  uint8_t *val;
  size_t head, items; /* queue tables only: first unpopped byte, items held */
} crun__kv_entry_t;

typedef struct {
  crun__kv_entry_t **slots;
  size_t nslots, count;
} crun__kv_t;

int crun__kv_init(crun__kv_t *kv);

/* FNV-1a over the key bytes (the table's hash; the server's waiter index uses it too). */
uint64_t crun__kv_hash(const char *key, size_t klen);
void crun__kv_free(crun__kv_t *kv);
crun__kv_entry_t *crun__kv_find(crun__kv_t *kv, const char *key, size_t klen);
/* Sets key to val (creating it). */
int crun__kv_set(crun__kv_t *kv, const char *key, size_t klen, const void *val, size_t len);
/* Appends to key's value (creating it). */
int crun__kv_append(crun__kv_t *kv, const char *key, size_t klen, const void *val, size_t len);
/* Removes key; returns 1 when it existed. */
int crun__kv_delete(crun__kv_t *kv, const char *key, size_t klen);
/* torch add: parses the decimal value (missing = 0), adds, stores text. */
int crun__kv_add(crun__kv_t *kv, const char *key, size_t klen, int64_t delta, int64_t *out);
/* torch compare_set; *res points into the table (valid until next change). */
int crun__kv_compare_set(crun__kv_t *kv, const char *key, size_t klen, const void *exp,
                         size_t elen, const void *des, size_t dlen, const void **res,
                         size_t *rlen);

/* Fills *out (buf: NUL-separated keys, len bytes, count keys; unsorted)
 * with every key of the table. */
int crun__kv_keys(const crun__kv_t *kv, crun_store_keys_t *out);

/* ---- queues: a queue table is a crun__kv whose values hold packed items
 * (size_t length, then the bytes) from val + head to val + len, oldest
 * first. A queue exists while it holds items: popping the last one deletes
 * its entry, so an unknown queue and an empty one are the same. */

/* Appends a copy of val to the tail of queue key (created when missing). */
int crun__kv_qpush(crun__kv_t *kv, const char *key, size_t klen, const void *val, size_t len);
/* Points *item / *ilen at the head item of queue key and returns 1 (valid
 * until the table changes), or returns 0 when the queue is empty. */
int crun__kv_qpeek(crun__kv_t *kv, const char *key, size_t klen, const void **item, size_t *ilen);
/* Removes the head item of queue key (nothing when empty). */
void crun__kv_qdrop(crun__kv_t *kv, const char *key, size_t klen);
/* Number of items in queue key (0 when missing). */
int64_t crun__kv_qlen(crun__kv_t *kv, const char *key, size_t klen);

/* How many clients are connected to srv now (any thread may ask): the
 * launcher keeps serving a shared rendezvous endpoint while others use it. */
int crun__store_server_clients(crun_store_server_t *srv);

/* How many connections srv has accepted since it started (any thread may
 * ask): a client that keeps its connection adds one, however often it
 * waits. For tests and the stop log line. */
unsigned long crun__store_server_accepted(crun_store_server_t *srv);

#endif
