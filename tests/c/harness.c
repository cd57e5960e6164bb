/* harness.c — runs each case in a forked child under a deadline and prints
 * one line per case plus "N passed, N failed". */
#include "harness.h"

#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void crun_test_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "  FAIL %s:%d: ", file, line);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
  _exit(1);
}

void crun_test_tmp_path(char *out, size_t cap, const char *fmt, ...) {
  const char *tmp = getenv("TMPDIR");
  int n = snprintf(out, cap, "%s/", tmp && *tmp ? tmp : "/tmp");
  va_list ap;
  va_start(ap, fmt);
  int m = n >= 0 && (size_t)n < cap ? vsnprintf(out + n, cap - (size_t)n, fmt, ap) : -1;
  va_end(ap);
  if (m < 0 || (size_t)n + (size_t)m >= cap)
    crun_test_fail(__FILE__, __LINE__, "EINVAL: a temporary path under TMPDIR=%s does not fit in %zu bytes", tmp, cap);
}

/* Waits for pid up to deadline_s; on expiry kills its whole process group
 * (the case and anything it forked) and reports it. Returns the wait status. */
static int wait_case(pid_t pid, int deadline_s, int *timed_out) {
  int st = 0;
  double end = crun_clock() + deadline_s;
  *timed_out = 0;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) break;
    if (r < 0) return 0;
    if (crun_clock() > end && !*timed_out) {
      *timed_out = 1;
      kill(-pid, SIGKILL);
    }
    usleep(2000);
  }
  kill(-pid, SIGKILL); /* leftovers of a case that returned */
  return st;
}

/* Runs one case in a child (its own process group); returns 1 when it passed. */
static int run_case(const crun_test_case *c, int deadline_s) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    c->fn();
    fflush(stdout);
    _exit(0);
  }
  setpgid(pid, pid);
  int timed_out;
  int st = wait_case(pid, deadline_s, &timed_out);
  if (timed_out) {
    fprintf(stderr, "  %s passed its deadline of %d s (CRUN_TEST_DEADLINE)\n", c->name, deadline_s);
    return 0;
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 1;
  if (WIFSIGNALED(st)) fprintf(stderr, "  %s died by signal %d\n", c->name, WTERMSIG(st));
  return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

/* The flight recorder's dumps of the cases that fail a group on purpose go to
 * a directory of this run (removed at the end when every case passed), not
 * to one per forked case under $TMPDIR. Returns it, or NULL when the user
 * set CRUN_FLIGHT_DIR or none could be made. */
static char *flight_dir(void) {
  static char dir[PATH_MAX];
  if (getenv("CRUN_FLIGHT_DIR")) return NULL;
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/crun-test-flight-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) return NULL;
  setenv("CRUN_FLIGHT_DIR", dir, 1);
  return dir;
}

int crun_test_run(int argc, char **argv, const crun_test_case *cases, size_t n) {
  char *dumps = flight_dir();
  int deadline = (int)crun_env_int("CRUN_TEST_DEADLINE", 120);
  double scale = crun_env_int("CRUN_SAN_TIMEOUT_SCALE", 1); /* a sanitizer build: san_run.sh */
  if (scale > 1 && deadline < INT_MAX / scale) deadline = (int)(deadline * scale);
  int passed = 0, failed = 0;
  signal(SIGPIPE, SIG_IGN);
  for (size_t i = 0; i < n; i++) {
    int wanted = argc < 2;
    for (int a = 1; a < argc; a++) wanted |= strcmp(argv[a], cases[i].name) == 0;
    if (!wanted) continue;
    double t0 = crun_clock();
    int ok = run_case(&cases[i], deadline);
    printf("%s %s (%.3f s)\n", ok ? "ok  " : "FAIL", cases[i].name, crun_clock() - t0);
    ok ? passed++ : failed++;
  }
  printf("%d passed, %d failed\n", passed, failed);
  if (dumps && !failed) nftw(dumps, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  else if (dumps) printf("flight recorder dumps: %s\n", dumps);
  return failed ? 1 : (passed ? 0 : 1);
}
