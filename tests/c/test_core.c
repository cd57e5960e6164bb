/* test_core.c — status table, last error, clocks, env parsing, logging. */
#include "harness.h"

#include <pthread.h>
#include <unistd.h>

TEST(status_names) {
  EXPECT(strcmp(crun_err_name(CRUN_ETIMEDOUT), "ETIMEDOUT") == 0);
  EXPECT(strcmp(crun_strerror(CRUN_OK), "success") == 0);
  EXPECT(strcmp(crun_err_name(-9999), "EUNKNOWN") == 0);
  EXPECT(strcmp(crun_strerror(CRUN_EMISMATCH), "collective mismatch between ranks") == 0);
}

TEST(last_error_is_prefixed_with_name) {
  EXPECT_EQ_INT(crun_error(CRUN_EINVAL, "bad rank %d", 7), CRUN_EINVAL);
  EXPECT(strcmp(crun_last_error(), "EINVAL: bad rank 7") == 0);
}

static void *other_thread(void *arg) {
  (void)arg;
  return (void *)(strcmp(crun_last_error(), "") == 0 ? (void *)1 : NULL);
}

TEST(last_error_is_thread_local) {
  pthread_t th;
  void *res;
  crun_error(CRUN_EIO, "x");
  pthread_create(&th, NULL, other_thread, NULL);
  pthread_join(th, &res);
  EXPECT(res == (void *)1);
}

TEST(clock_is_monotonic) {
  double a = crun_clock();
  usleep(2000);
  double b = crun_clock();
  EXPECT(b - a >= 0.0015);
}

TEST(env_parsing) {
  setenv("CRUN_T_INT", "42", 1);
  setenv("CRUN_T_BAD", "4x", 1);
  EXPECT_EQ_INT(crun_env_int("CRUN_T_INT", 1), 42);
  EXPECT_EQ_INT(crun_env_int("CRUN_T_BAD", 1), 1);
  EXPECT_EQ_INT(crun_env_int("CRUN_T_UNSET", 5), 5);
}

TEST(log_levels_and_file) {
  char path[PATH_MAX];
  crun_test_tmp_path(path, sizeof path, "crun_logXXXXXX");
  int fd = mkstemp(path);
  close(fd);
  setenv("CRUN_DEBUG", "INFO", 1);
  setenv("CRUN_DEBUG_SUBSYS", "STORE", 1);
  setenv("CRUN_DEBUG_FILE", path, 1);
  crun_log_init();
  crun_log_set_rank(3);
  EXPECT(crun_log_enabled(CRUN_LOG_INFO, CRUN_SUB_STORE));
  EXPECT(!crun_log_enabled(CRUN_LOG_TRACE, CRUN_SUB_STORE));
  EXPECT(!crun_log_enabled(CRUN_LOG_INFO, CRUN_SUB_PG));
  CRUN_LOG(INFO, STORE, "hello %d", 5);
  CRUN_LOG(INFO, PG, "hidden");
  FILE *f = fopen(path, "r");
  char line[256] = {0};
  EXPECT(fgets(line, sizeof line, f) != NULL);
  fclose(f);
  unlink(path);
  EXPECT(strcmp(line, "crun[3] INFO STORE: hello 5\n") == 0);
}

#define CRUN_TESTS(X) X(status_names) X(last_error_is_prefixed_with_name) \
  X(last_error_is_thread_local) X(clock_is_monotonic) X(env_parsing) X(log_levels_and_file)
CRUN_TEST_MAIN()
