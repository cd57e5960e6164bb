/* test_pg_util.h — runs a function on N forked ranks joined in a process
 * group over a file store, for the pg and collective C tests. */
#ifndef CRUN_TEST_PG_UTIL_H
#define CRUN_TEST_PG_UTIL_H

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

typedef void (*pg_rank_fn)(crun_pg_t *pg, void *arg);

/* CRUN_SAN_TIMEOUT_SCALE (set by scripts/san_run.sh in a sanitizer build):
 * the factor on the group timeouts and deadlines below; 1 without it. */
static inline double pg_time_scale(void) {
  const char *v = getenv("CRUN_SAN_TIMEOUT_SCALE");
  double f = v ? strtod(v, NULL) : 1.0;
  return f >= 1.0 ? f : 1.0;
}

/* Reaps the n forked ranks pids[0..n) (a pid <= 0 is a fork that failed and
 * counts as failed); after `limit` s the rest are killed. Returns the number
 * that failed (non-zero exit, signal, fork failure or over the limit). */
static inline int pg_reap(int n, const pid_t *pids, double limit) {
  int failed = 0, left = 0;
  for (int r = 0; r < n; r++) {
    if (pids[r] > 0) left++;
    else failed++;
  }
  double end = crun_clock() + limit;
  while (left > 0) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      left--;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
      continue;
    }
    if (crun_clock() > end) {
      for (int r = 0; r < n; r++)
        if (pids[r] > 0) kill(pids[r], SIGKILL); /* never kill(-1): that signals every process */
      while (waitpid(-1, &st, 0) > 0) {}
      failed += left;
      break;
    }
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return failed;
}

/* Forks n ranks; each joins a group (timeout s) and runs fn. Returns the
 * number of ranks that failed (non-zero exit, signal, or over `limit` s). */
static inline int pg_spawn_ex(int n, pg_rank_fn fn, void *arg, double timeout, double limit) {
  timeout *= pg_time_scale();
  limit *= pg_time_scale();
  char path[PATH_MAX];
  crun_test_tmp_path(path, sizeof path, "crun_pgtest_%d_%ld", (int)getpid(), (long)time(NULL));
  unlink(path);
  pid_t pids[64];
  if (n < 1 || n > (int)(sizeof pids / sizeof pids[0])) {
    fprintf(stderr, "pg_spawn_ex: world size %d outside 1..%d\n", n, (int)(sizeof pids / sizeof pids[0]));
    return n < 1 ? 1 : n;
  }
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      crun_store_t *s = NULL;
      EXPECT_OK(crun_store_file_new(path, &s));
      crun_pg_opts_t o = {.store = s, .rank = r, .world_size = n, .timeout = timeout, .name = "t"};
      crun_pg_t *pg = NULL;
      EXPECT_OK(crun_pg_new(&o, &pg));
      fn(pg, arg);
      crun_pg_release(pg);
      crun_store_release(s);
      _exit(0);
    }
  }
  int failed = pg_reap(n, pids, limit);
  unlink(path);
  return failed;
}

static inline void pg_spawn(int n, pg_rank_fn fn, void *arg) {
  EXPECT_EQ_INT(pg_spawn_ex(n, fn, arg, 30.0, 60.0), 0);
}

#endif
