/* test_store.c — hash, file and prefix stores: torch Store semantics,
 * deadlines, binary values, and cross-process races on the file store. */
#include "harness.h"

#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

/* Expects the value under key to equal the C string want. */
static void expect_value(crun_store_t *s, const char *key, const char *want) {
  crun_buf_t b;
  EXPECT_OK(crun_store_get(s, key, &b));
  if (b.len != strlen(want) || memcmp(b.data, want, b.len) != 0)
    crun_test_fail(__FILE__, __LINE__, "get '%s' = '%.*s', want '%s'", key, (int)b.len,
                   (char *)b.data, want);
  crun_buf_free(&b);
}

/* Expects compare_set to return the C string want. */
static void expect_cas(crun_store_t *s, const char *key, const char *exp, const char *des,
                       const char *want) {
  crun_buf_t b;
  EXPECT_OK(crun_store_compare_set(s, key, exp, strlen(exp), des, strlen(des), &b));
  if (b.len != strlen(want) || memcmp(b.data, want, b.len) != 0)
    crun_test_fail(__FILE__, __LINE__, "compare_set '%s' -> '%.*s', want '%s'", key,
                   (int)b.len, (char *)b.data, want);
  crun_buf_free(&b);
}

/* The torch test_store cases, for any store. */
static void exercise(crun_store_t *s) {
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
static void exercise_deadlines(crun_store_t *s) {
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

TEST(hash_semantics) {
  crun_store_t *s;
  EXPECT_OK(crun_store_hash_new(&s));
  exercise(s);
  exercise_deadlines(s);
  crun_store_release(s);
}

static char tmp_path[64];
static const char *fresh_path(void) {
  snprintf(tmp_path, sizeof tmp_path, "/tmp/crun_test_store_%d_XXXXXX", (int)getpid());
  int fd = mkstemp(tmp_path);
  close(fd);
  unlink(tmp_path);
  return tmp_path;
}

TEST(file_semantics) {
  crun_store_t *s, *s2;
  const char *path = fresh_path();
  EXPECT_OK(crun_store_file_new(path, &s));
  exercise(s);
  exercise_deadlines(s);
  /* a second handle on the same path sees everything */
  EXPECT_OK(crun_store_file_new(path, &s2));
  expect_value(s2, "cs", "second");
  int flag;
  EXPECT_OK(crun_store_check(s2, (const char *[]){"m1"}, 1, &flag));
  EXPECT_EQ_INT(flag, 0);
  crun_store_release(s);
  crun_store_release(s2);
  unlink(path);
}

TEST(file_rejects_foreign_file) {
  const char *path = fresh_path();
  FILE *f = fopen(path, "w");
  fputs("hello, not a store\n", f);
  fclose(f);
  crun_store_t *s = NULL;
  EXPECT_STATUS(crun_store_file_new(path, &s), CRUN_EPROTO);
  EXPECT(strstr(crun_last_error(), path) != NULL);
  EXPECT_STATUS(crun_store_file_new("/nonexistent-dir/x", &s), CRUN_ESYS);
  unlink(path);
}

TEST(prefix_semantics) {
  crun_store_t *h, *p;
  EXPECT_OK(crun_store_hash_new(&h));
  EXPECT_OK(crun_store_prefix_new("pre", h, &p));
  crun_store_release(h); /* the prefix store holds its own reference */
  exercise(p);
  exercise_deadlines(p);
  int flag;
  EXPECT_OK(crun_store_check(h, (const char *[]){"pre/key0"}, 1, &flag));
  EXPECT_EQ_INT(flag, 1);
  EXPECT_OK(crun_store_check(h, (const char *[]){"key0"}, 1, &flag));
  EXPECT_EQ_INT(flag, 0);
  EXPECT_EQ_INT(crun_store_tcp_port(p), -1);
  crun_store_release(p);
}

struct setter { crun_store_t *s; };
static void *late_setter(void *arg) {
  usleep(100000);
  crun_store_set(((struct setter *)arg)->s, "late", "v", 1);
  return NULL;
}

#include <pthread.h>
TEST(hash_get_wakes_on_set) {
  crun_store_t *s;
  EXPECT_OK(crun_store_hash_new(&s));
  struct setter a = {s};
  pthread_t th;
  pthread_create(&th, NULL, late_setter, &a);
  double t0 = crun_clock();
  expect_value(s, "late", "v");
  EXPECT(crun_clock() - t0 < 2.0);
  pthread_join(th, NULL);
  crun_store_release(s);
}

TEST(bad_arguments) {
  crun_store_t *s;
  crun_buf_t b;
  EXPECT_STATUS(crun_store_set(NULL, "k", "v", 1), CRUN_EINVAL);
  EXPECT_OK(crun_store_hash_new(&s));
  EXPECT_STATUS(crun_store_get(s, NULL, &b), CRUN_EINVAL);
  EXPECT_STATUS(crun_store_set(s, "k", NULL, 3), CRUN_EINVAL);
  EXPECT_STATUS(crun_store_wait(s, (const char *[]){"a", NULL}, 2, 0.1), CRUN_EINVAL);
  EXPECT_STATUS(crun_store_prefix_new(NULL, s, NULL), CRUN_EINVAL);
  crun_store_release(s);
}

/* Forks n children, each running fn(store path, child index); all must exit 0. */
static void run_children(int n, const char *path, void (*fn)(const char *, int)) {
  pid_t pids[16];
  for (int i = 0; i < n; i++) {
    pids[i] = fork();
    if (pids[i] == 0) {
      alarm(60);
      fn(path, i);
      _exit(0);
    }
  }
  for (int i = 0; i < n; i++) {
    int st;
    EXPECT(waitpid(pids[i], &st, 0) == pids[i]);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
}

static void child_adds(const char *path, int idx) {
  crun_store_t *s;
  int64_t v;
  char key[32];
  if (crun_store_file_new(path, &s) < 0) _exit(2);
  for (int i = 0; i < 200; i++)
    if (crun_store_add(s, "counter", 1, &v) < 0) _exit(3);
  /* compare_set race: each child tries to claim slot 0..9 in turn */
  for (int slot = 0; slot < 10; slot++) {
    snprintf(key, sizeof key, "slot%d", slot);
    char me[8];
    int ml = snprintf(me, sizeof me, "%d", idx);
    crun_buf_t b;
    if (crun_store_compare_set(s, key, "", 0, me, (size_t)ml, &b) < 0) _exit(4);
    crun_buf_free(&b);
  }
  snprintf(key, sizeof key, "done%d", idx);
  if (crun_store_set(s, key, "1", 1) < 0) _exit(5);
  crun_store_release(s);
}

TEST(file_multiprocess_race) {
  const char *path = fresh_path();
  crun_store_t *s;
  EXPECT_OK(crun_store_file_new(path, &s));
  run_children(8, path, child_adds);
  expect_value(s, "counter", "1600");
  const char *done[8] = {"done0", "done1", "done2", "done3", "done4", "done5", "done6", "done7"};
  EXPECT_OK(crun_store_wait(s, done, 8, 5.0));
  /* every slot has exactly one winner, and a later compare_set sees it */
  for (int slot = 0; slot < 10; slot++) {
    char key[16];
    snprintf(key, sizeof key, "slot%d", slot);
    crun_buf_t b, c;
    EXPECT_OK(crun_store_get(s, key, &b));
    EXPECT(b.len == 1 && ((char *)b.data)[0] >= '0' && ((char *)b.data)[0] <= '7');
    EXPECT_OK(crun_store_compare_set(s, key, "", 0, "x", 1, &c));
    EXPECT(c.len == b.len && memcmp(c.data, b.data, b.len) == 0);
    crun_buf_free(&b);
    crun_buf_free(&c);
  }
  int64_t n;
  EXPECT_OK(crun_store_num_keys(s, &n));
  EXPECT_EQ_INT(n, 1 + 10 + 8);
  crun_store_release(s);
  unlink(path);
}

#define CRUN_TESTS(X) X(hash_semantics) X(file_semantics) X(file_rejects_foreign_file) \
  X(prefix_semantics) X(hash_get_wakes_on_set) X(bad_arguments) X(file_multiprocess_race)
CRUN_TEST_MAIN()
