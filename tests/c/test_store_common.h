/* test_store_common.h — the store checks every store kind must pass (torch's
 * test_store cases and deadlines); included by the test_store*.c files. */
#ifndef CRUN_TEST_STORE_COMMON_H
#define CRUN_TEST_STORE_COMMON_H

#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

/* Expects the value under key to equal the C string want. */
static inline void expect_value(crun_store_t *s, const char *key, const char *want) {
  crun_buf_t b;
  EXPECT_OK(crun_store_get(s, key, &b));
  if (b.len != strlen(want) || memcmp(b.data, want, b.len) != 0)
    crun_test_fail(__FILE__, __LINE__, "get '%s' = '%.*s', want '%s'", key, (int)b.len,
                   (char *)b.data, want);
  crun_buf_free(&b);
}

/* Expects compare_set to return the C string want. */
static inline void expect_cas(crun_store_t *s, const char *key, const char *exp, const char *des,
                       const char *want) {
  crun_buf_t b;
  EXPECT_OK(crun_store_compare_set(s, key, exp, strlen(exp), des, strlen(des), &b));
  if (b.len != strlen(want) || memcmp(b.data, want, b.len) != 0)
    crun_test_fail(__FILE__, __LINE__, "compare_set '%s' -> '%.*s', want '%s'", key,
                   (int)b.len, (char *)b.data, want);
  crun_buf_free(&b);
}

/* The torch test_store cases, for any store. */
static inline void exercise(crun_store_t *s) {
  int64_t v, n0, n;
  int flag;
  EXPECT_OK(crun_store_num_keys(s, &n0));
  EXPECT_OK(crun_store_set(s, "key0", "value0", 6));
  expect_value(s, "key0", "value0");
  EXPECT_OK(crun_store_set(s, "key0", "value1", 6));
  expect_value(s, "key0", "value1");
  /* binary-safe values, including NUL and an empty value */
  EXPECT_OK(crun_store_set(s, "bin", "a\0b", 3));
  crun_buf_t b;
  EXPECT_OK(crun_store_get(s, "bin", &b));
  EXPECT(b.len == 3 && memcmp(b.data, "a\0b", 3) == 0);
  crun_buf_free(&b);
  EXPECT_OK(crun_store_set(s, "empty", "", 0));
  expect_value(s, "empty", "");
  /* add creates the key at 0 */
  EXPECT_OK(crun_store_add(s, "cnt", 5, &v));
  EXPECT_EQ_INT(v, 5);
  EXPECT_OK(crun_store_add(s, "cnt", -7, &v));
  EXPECT_EQ_INT(v, -2);
  expect_value(s, "cnt", "-2");
  EXPECT_STATUS(crun_store_add(s, "key0", 1, &v), CRUN_EINVAL);
  /* compare_set */
  expect_cas(s, "cs_missing", "x", "y", "x");      /* missing, non-empty expected */
  EXPECT_OK(crun_store_check(s, (const char *[]){"cs_missing"}, 1, &flag));
  EXPECT_EQ_INT(flag, 0);
  expect_cas(s, "cs", "", "first", "first");       /* missing, empty expected: sets */
  expect_cas(s, "cs", "wrong", "second", "first"); /* mismatch: unchanged */
  expect_cas(s, "cs", "first", "second", "second");
  expect_value(s, "cs", "second");
  /* append */
  EXPECT_OK(crun_store_append(s, "ap", "ab", 2));
  EXPECT_OK(crun_store_append(s, "ap", "cd", 2));
  expect_value(s, "ap", "abcd");
  /* multi_set / multi_get */
  const char *ks[] = {"m1", "m2", "m3"};
  const void *vs[] = {"one", "two", ""};
  size_t ls[] = {3, 3, 0};
  EXPECT_OK(crun_store_multi_set(s, ks, 3, vs, ls));
  crun_buf_t outs[3];
  EXPECT_OK(crun_store_multi_get(s, ks, 3, outs));
  EXPECT(outs[0].len == 3 && memcmp(outs[0].data, "one", 3) == 0);
  EXPECT(outs[1].len == 3 && memcmp(outs[1].data, "two", 3) == 0);
  EXPECT(outs[2].len == 0);
  for (int i = 0; i < 3; i++) crun_buf_free(&outs[i]);
  /* check / wait / delete / num_keys */
  EXPECT_OK(crun_store_check(s, ks, 3, &flag));
  EXPECT_EQ_INT(flag, 1);
  EXPECT_OK(crun_store_wait(s, ks, 3, 1.0));
  EXPECT_OK(crun_store_num_keys(s, &n));
  EXPECT_EQ_INT(n - n0, 9); /* key0 bin empty cnt cs ap m1 m2 m3 */
  int existed = -1;
  EXPECT_OK(crun_store_delete_key(s, "m1", &existed));
  EXPECT_EQ_INT(existed, 1);
  EXPECT_OK(crun_store_delete_key(s, "m1", &existed));
  EXPECT_EQ_INT(existed, 0);
  EXPECT_OK(crun_store_num_keys(s, &n));
  EXPECT_EQ_INT(n - n0, 8);
  EXPECT_OK(crun_store_check(s, ks, 3, &flag));
  EXPECT_EQ_INT(flag, 0);
}

/* Deadlines: get, wait and multi_get on a missing key fail in time. */
static inline void exercise_deadlines(crun_store_t *s) {
  crun_buf_t b, outs[2];
  crun_store_set_timeout(s, 0.2);
  double t0 = crun_clock();
  EXPECT_STATUS(crun_store_get(s, "nope", &b), CRUN_ETIMEDOUT);
  double dt = crun_clock() - t0;
  EXPECT(dt >= 0.19 && dt < 3.0);
  EXPECT(strstr(crun_last_error(), "nope'") != NULL);
  t0 = crun_clock();
  EXPECT_STATUS(crun_store_wait(s, (const char *[]){"nope", "nada"}, 2, 0.1), CRUN_ETIMEDOUT);
  dt = crun_clock() - t0;
  EXPECT(dt >= 0.09 && dt < 3.0);
  EXPECT_OK(crun_store_set(s, "here", "1", 1));
  EXPECT_STATUS(crun_store_multi_get(s, (const char *[]){"here", "nope"}, 2, outs), CRUN_ETIMEDOUT);
  EXPECT(outs[0].data == NULL && outs[1].data == NULL);
}

/* Item i of a queue test: a signed, non-periodic integer with binary bytes
 * (NUL, 0xff) around it, of varying length; item 5 is empty. Returns its
 * length. */
static inline size_t queue_item(int i, uint8_t *buf) {
  if (i == 5) return 0;
  int64_t v = (i % 2 ? -1 : 1) * ((int64_t)i * i * 7919 + 13);
  size_t n = 0;
  memcpy(buf, &v, 8), n += 8;
  buf[n++] = 0, buf[n++] = 0xff;
  n += (size_t)snprintf((char *)buf + n, 32, "%lld", (long long)v);
  memset(buf + n, 'a' + i % 26, (size_t)(i * 37 % 23)), n += (size_t)(i * 37 % 23);
  return n;
}

/* Expects the head of queue key to be queue_item(i). */
static inline void expect_pop(crun_store_t *s, const char *key, int i, double timeout) {
  uint8_t want[96];
  size_t wl = queue_item(i, want);
  crun_buf_t b;
  EXPECT_OK(crun_store_queue_pop(s, key, 1, timeout, &b));
  if (b.len != wl || memcmp(b.data, want, wl) != 0)
    crun_test_fail(__FILE__, __LINE__, "pop #%d of '%s': %zu bytes, want %zu", i, key, b.len, wl);
  crun_buf_free(&b);
}

/* Queues on any store: FIFO, a namespace apart from plain keys, empty and
 * timed-out pops, queue_len; list_keys is sorted and queue-free, and
 * complete (as many keys as num_keys) when `all` (not for a prefix store,
 * whose num_keys counts the inner store's keys, as torch's does). */
static inline void exercise_queues(crun_store_t *s, int all) {
  uint8_t item[96];
  int64_t n;
  crun_buf_t b;
  EXPECT_OK(crun_store_queue_len(s, "q", &n));
  EXPECT_EQ_INT(n, 0);
  for (int i = 0; i < 300; i++) EXPECT_OK(crun_store_queue_push(s, "q", item, queue_item(i, item)));
  EXPECT_OK(crun_store_set(s, "q", "plain", 5)); /* another namespace */
  EXPECT_OK(crun_store_queue_len(s, "q", &n));
  EXPECT_EQ_INT(n, 300);
  for (int i = 0; i < 300; i++) expect_pop(s, "q", i, 1.0);
  EXPECT_OK(crun_store_queue_len(s, "q", &n));
  EXPECT_EQ_INT(n, 0);
  expect_value(s, "q", "plain");
  double t0 = crun_clock();
  EXPECT_STATUS(crun_store_queue_pop(s, "q", 0, 0, &b), CRUN_ENOTFOUND);
  EXPECT_TEXT("q' is empty");
  EXPECT(crun_clock() - t0 < 1.0 && b.data == NULL);
  t0 = crun_clock();
  EXPECT_STATUS(crun_store_queue_pop(s, "q", 1, 0.2, &b), CRUN_ETIMEDOUT);
  double dt = crun_clock() - t0;
  EXPECT(dt >= 0.19 && dt < 3.0);
  EXPECT_TEXT("q'");
  EXPECT_OK(crun_store_queue_push(s, "q", "z", 1)); /* usable after a timeout */
  EXPECT_OK(crun_store_queue_pop(s, "q", 1, 1.0, &b));
  EXPECT(b.len == 1 && ((char *)b.data)[0] == 'z');
  crun_buf_free(&b);
  /* list_keys: every plain key once, sorted, no queue */
  EXPECT_OK(crun_store_queue_push(s, "queue-only", "x", 1));
  EXPECT_OK(crun_store_set(s, "zz\001", "", 0));
  crun_store_keys_t k;
  EXPECT_OK(crun_store_list_keys(s, &k));
  EXPECT_OK(crun_store_num_keys(s, &n));
  if (all) EXPECT_EQ_INT(k.count, n);
  int saw_q = 0, saw_zz = 0;
  size_t bytes = 0;
  for (size_t i = 0; i < k.count; i++) {
    if (i) EXPECT(strcmp(k.keys[i - 1], k.keys[i]) < 0);
    EXPECT(strcmp(k.keys[i], "queue-only") != 0);
    saw_q += strcmp(k.keys[i], "q") == 0;
    saw_zz += strcmp(k.keys[i], "zz\001") == 0;
    bytes += strlen(k.keys[i]) + 1;
  }
  EXPECT(saw_q == 1 && saw_zz == 1 && bytes == k.len);
  crun_store_keys_free(&k);
  EXPECT(k.keys == NULL && k.buf == NULL && k.count == 0);
  EXPECT_STATUS(crun_store_list_keys(s, NULL), CRUN_EINVAL);
  EXPECT_STATUS(crun_store_queue_pop(s, NULL, 1, 1, &b), CRUN_EINVAL);
  EXPECT_STATUS(crun_store_queue_push(s, "q", NULL, 3), CRUN_EINVAL);
  EXPECT_STATUS(crun_store_queue_pop(s, "q", 1, 1e300, &b), CRUN_EINVAL); /* no infinite deadline */
  EXPECT_TEXT("timeout");
  EXPECT_OK(crun_store_queue_pop(s, "queue-only", 0, 0, &b));
  crun_buf_free(&b);
}

/* Many threads pop one queue while the main thread pushes: every item
 * reaches exactly one popper. open() gives each thread its own handle (a
 * TCP handle serves one request at a time). */
typedef struct {
  crun_store_t *s;
  int got[4096], n, rc;
  atomic_int *started;
} popper_t;

static inline void *popper_main(void *arg) {
  popper_t *p = arg;
  atomic_fetch_add(p->started, 1);
  for (;;) {
    crun_buf_t b;
    if ((p->rc = crun_store_queue_pop(p->s, "work", 1, 30, &b)) < 0) return NULL;
    int v = -1;
    if (b.len == 4) memcpy(&v, b.data, 4);
    crun_buf_free(&b);
    if (v < 0) return NULL; /* the end marker */
    if (p->n < 4096) p->got[p->n++] = v;
  }
}

static inline void exercise_concurrent_pops(crun_store_t *(*open)(void *), void *ctx) {
  enum { POPPERS = 8, ITEMS = 3000 };
  static popper_t ps[POPPERS];
  static unsigned char seen[ITEMS];
  static int pos[ITEMS]; /* value -> its place in the push order */
  pthread_t th[POPPERS];
  atomic_int started = 0;
  memset(seen, 0, sizeof seen);
  for (int i = 0; i < POPPERS; i++) {
    ps[i].s = open(ctx), ps[i].n = 0, ps[i].rc = 0, ps[i].started = &started;
    EXPECT(pthread_create(&th[i], NULL, popper_main, &ps[i]) == 0);
  }
  crun_store_t *pusher = open(ctx);
  double end = crun_clock() + 10;
  while (atomic_load(&started) < POPPERS && crun_clock() < end) usleep(1000);
  usleep(20000); /* most are blocked in their first pop now */
  for (int v = 0; v < ITEMS; v++) {
    int32_t x = v * 7 % ITEMS; /* 7 and ITEMS coprime: every value once */
    pos[x] = v;
    if (v % 64 == 63) usleep(100); /* lets the poppers in (a mutex favours the pusher) */
    EXPECT_OK(crun_store_queue_push(pusher, "work", &x, 4));
  }
  for (int i = 0; i < POPPERS; i++) EXPECT_OK(crun_store_queue_push(pusher, "work", "\xff\xff\xff\xff", 4));
  int total = 0, busy = 0;
  for (int i = 0; i < POPPERS; i++) {
    pthread_join(th[i], NULL);
    EXPECT_OK(ps[i].rc);
    for (int j = 0; j < ps[i].n; j++) {
      EXPECT(ps[i].got[j] >= 0 && ps[i].got[j] < ITEMS && !seen[ps[i].got[j]]);
      seen[ps[i].got[j]] = 1;
      if (j) EXPECT(pos[ps[i].got[j - 1]] < pos[ps[i].got[j]]); /* FIFO: each popper sees push order */
    }
    total += ps[i].n, busy += ps[i].n > 0;
    crun_store_release(ps[i].s);
  }
  EXPECT_EQ_INT(total, ITEMS);
  printf("%d items popped by %d of %d poppers\n", total, busy, POPPERS);
  int64_t left;
  EXPECT_OK(crun_store_queue_len(pusher, "work", &left));
  EXPECT_EQ_INT(left, 0);
  crun_store_release(pusher);
}

#endif
