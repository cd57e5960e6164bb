/* test_pg_example.c — runs build/examples/allreduce (examples/c/allreduce.c)
 * as 3 ranks over a TCP store hosted by rank 0, the way a user would. */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static void run_example(int n) {
  const char *dir = getenv("CRUN_BUILD_DIR");
  char bin[1024], port[16];
  snprintf(bin, sizeof bin, "%s/examples/allreduce", dir ? dir : ".");
  EXPECT(access(bin, X_OK) == 0);
  snprintf(port, sizeof port, "%d", 20000 + (int)(getpid() % 20000));
  pid_t pids[8];
  for (int r = 0; r < n; r++) {
    if ((pids[r] = fork()) == 0) {
      char rs[16], ns[16];
      snprintf(rs, sizeof rs, "%d", r);
      snprintf(ns, sizeof ns, "%d", n);
      setenv("RANK", rs, 1);
      setenv("WORLD_SIZE", ns, 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port, 1);
      unsetenv("CRUN_LAUNCHER");
      execl(bin, bin, (char *)NULL);
      _exit(127);
    }
  }
  double end = crun_clock() + 60;
  int ok = 0, left = n;
  while (left > 0 && crun_clock() < end) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) { left--; ok += WIFEXITED(st) && WEXITSTATUS(st) == 0; continue; }
    usleep(10000);
  }
  for (int r = 0; left > 0 && r < n; r++) kill(pids[r], SIGKILL);
  while (left > 0 && waitpid(-1, NULL, 0) > 0) left--;
  EXPECT_EQ_INT(ok, n);
}

TEST(example_allreduce_3_ranks) { run_example(3); }
TEST(example_allreduce_1_rank) { run_example(1); }

#define CRUN_TESTS(X) X(example_allreduce_3_ranks) X(example_allreduce_1_rank)
CRUN_TEST_MAIN()
