/* test_store.c — hash, file and prefix stores: torch Store semantics,
 * deadlines, binary values, and cross-process races on the file store. */
#include "harness.h"

#include <stdint.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_store_common.h"

TEST(hash_semantics) {
  crun_store_t *s;
  EXPECT_OK(crun_store_hash_new(&s));
  exercise(s);
  exercise_deadlines(s);
  crun_store_release(s);
}

/* Another handle on the shared store (ctx). */
static crun_store_t *same_store(void *ctx) {
  crun_store_retain(ctx);
  return ctx;
}

TEST(hash_queues) {
  crun_store_t *s;
  EXPECT_OK(crun_store_hash_new(&s));
  exercise(s);
  exercise_queues(s, 1);
  exercise_concurrent_pops(same_store, s);
  crun_store_release(s);
}

static char tmp_path[PATH_MAX];
static const char *fresh_path(void) {
  crun_test_tmp_path(tmp_path, sizeof tmp_path, "crun_test_store_%d_XXXXXX", (int)getpid());
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

/* A new handle on the file store at path ctx. */
static crun_store_t *file_handle(void *ctx) {
  crun_store_t *s = NULL;
  EXPECT_OK(crun_store_file_new(ctx, &s));
  return s;
}

TEST(file_queues) {
  crun_store_t *s;
  const char *path = fresh_path();
  EXPECT_OK(crun_store_file_new(path, &s));
  exercise(s);
  exercise_queues(s, 1);
  exercise_concurrent_pops(file_handle, (void *)path);
  crun_store_release(s);
  unlink(path);
}

TEST(prefix_queues) {
  crun_store_t *h, *p, *other;
  EXPECT_OK(crun_store_hash_new(&h));
  EXPECT_OK(crun_store_prefix_new("pre", h, &p));
  EXPECT_OK(crun_store_prefix_new("other", h, &other));
  EXPECT_OK(crun_store_set(other, "hidden", "1", 1));
  EXPECT_OK(crun_store_set(h, "top", "1", 1));
  exercise_queues(p, 0);
  crun_store_keys_t k;
  EXPECT_OK(crun_store_list_keys(p, &k));
  EXPECT_EQ_INT(k.count, 2); /* q, zz\001: its own keys only, stripped */
  EXPECT(strcmp(k.keys[0], "q") == 0 && strcmp(k.keys[1], "zz\001") == 0);
  crun_store_keys_free(&k);
  EXPECT_OK(crun_store_list_keys(h, &k));
  EXPECT_EQ_INT(k.count, 4);
  EXPECT(strcmp(k.keys[0], "other/hidden") == 0 && strcmp(k.keys[1], "pre/q") == 0 &&
         strcmp(k.keys[3], "top") == 0);
  crun_store_keys_free(&k);
  int64_t n;
  EXPECT_OK(crun_store_queue_push(p, "pq", "v", 1));
  EXPECT_OK(crun_store_queue_len(h, "pre/pq", &n));
  EXPECT_EQ_INT(n, 1);
  EXPECT_OK(crun_store_queue_len(other, "pq", &n));
  EXPECT_EQ_INT(n, 0);
  crun_store_release(other);
  crun_store_release(p);
  crun_store_release(h);
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

/* Users of a file store with world_size; a forked child releasing the
 * handles it inherited does not count them out (only their opener does). */
TEST(file_world_size) {
  const char *path = fresh_path();
  crun_store_file_opts_t o = {.world_size = 3};
  crun_store_t *a, *b, *c;
  EXPECT_OK(crun_store_file_open(path, &o, &a));
  EXPECT_OK(crun_store_file_open(path, &o, &b));
  pid_t pid = fork();
  if (pid == 0) {
    crun_store_release(a); /* the parent's registration: must not count out */
    crun_store_release(b);
    _exit(0);
  }
  int st;
  EXPECT(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  crun_store_release(a);
  EXPECT(file_exists(path)); /* 1 of 3 closed, b still open */
  EXPECT_OK(crun_store_file_open(path, &o, &c));
  crun_store_release(b);
  EXPECT(file_exists(path)); /* c still open */
  crun_store_release(c);
  EXPECT(!file_exists(path)); /* 3 of 3 closed, nobody left */
  /* world_size counts closes: 2 closes of 3 leave the file even with no user */
  EXPECT_OK(crun_store_file_open(path, &o, &a));
  crun_store_release(a);
  EXPECT_OK(crun_store_file_open(path, &o, &a));
  crun_store_release(a);
  EXPECT(file_exists(path));
  unlink(path);
  o.world_size = -1;
  EXPECT_STATUS(crun_store_file_open(path, &o, &a), CRUN_EINVAL);
}

/* Counts this process's descriptors open on path (through /proc/self/fd). */
static int fds_on(const char *path) {
  char link[64], target[256];
  int n = 0;
  for (int fd = 0; fd < 1024; fd++) {
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t l = readlink(link, target, sizeof target - 1);
    if (l <= 0) continue;
    target[l] = 0;
    n += strcmp(target, path) == 0;
  }
  return n;
}

struct opener { const char *path; crun_store_t *s; int rc; };
static void *open_in_thread(void *arg) {
  struct opener *o = arg;
  crun_store_file_opts_t opts = {.world_size = 1};
  o->rc = crun_store_file_open(o->path, &opts, &o->s);
  return NULL;
}

/* An open that waits for the lock while the last user removes the file
 * must not join the removed log: it opens the path again. */
TEST(file_open_races_removal) {
  const char *path = fresh_path();
  crun_store_t *c;
  EXPECT_OK(crun_store_file_new(path, &c)); /* writes the header */
  crun_store_release(c);
  int lock = open(path, O_RDWR);
  EXPECT(lock >= 0 && flock(lock, LOCK_EX) == 0); /* as a leaving user holds it */
  struct opener o = {path, NULL, 1};
  pthread_t th;
  EXPECT(pthread_create(&th, NULL, open_in_thread, &o) == 0);
  double end = crun_clock() + 10;
  while (fds_on(path) < 2 && crun_clock() < end) usleep(1000); /* it opened and waits for the lock */
  EXPECT(fds_on(path) >= 2);
  unlink(path); /* the leaving user removes the file, then unlocks */
  flock(lock, LOCK_UN);
  close(lock);
  pthread_join(th, NULL);
  EXPECT_OK(o.rc);
  EXPECT(file_exists(path)); /* it made a new file at the path... */
  EXPECT_OK(crun_store_set(o.s, "k", "v", 1));
  EXPECT_OK(crun_store_file_new(path, &c)); /* ...that later users share */
  expect_value(c, "k", "v");
  crun_store_release(c);
  crun_store_release(o.s);
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
  X(prefix_semantics) X(hash_get_wakes_on_set) X(bad_arguments) X(file_multiprocess_race) \
  X(hash_queues) X(file_queues) X(prefix_queues) X(file_world_size) X(file_open_races_removal)
CRUN_TEST_MAIN()
