/* test_store_common.h — the store checks every store kind must pass (torch's
 * test_store cases and deadlines); included by the test_store*.c files. */
#ifndef CRUN_TEST_STORE_COMMON_H
#define CRUN_TEST_STORE_COMMON_H

#include "harness.h"

#include <stdint.h>

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

#endif
