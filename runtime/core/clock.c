/* clock.c — monotonic clocks and environment parsing. */
#include "crun.h"
#include "core/clock_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>

uint64_t crun_clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double crun_clock(void) { return (double)crun_clock_ns() * 1e-9; }

double crun__clock_coarse(void) {
  struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
  if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) == 0) return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
#endif
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A variable that is set but does not parse is named on stderr, once per
 * process and variable, and the default is used: a typo (CRUN_SHM_CHUNK=64k)
 * must not pass without a word. */
static void env_bad(const char *name, const char *s, const char *what, const char *def) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static char seen[32][48];
  static int nseen;
  pthread_mutex_lock(&mu);
  int first = 1;
  for (int i = 0; i < nseen && first; i++) first = strcmp(seen[i], name) != 0;
  if (first && nseen < 32) snprintf(seen[nseen++], sizeof seen[0], "%s", name);
  pthread_mutex_unlock(&mu);
  if (first) fprintf(stderr, "crun: EINVAL: %s=%s is not %s; the default %s is used\n", name, s, what, def);
}

long crun_env_int(const char *name, long def) {
  const char *s = getenv(name);
  if (!s || !*s) return def;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!errno && !*end) return v;
  char d[32];
  snprintf(d, sizeof d, "%ld", def);
  env_bad(name, s, errno ? "an integer in range" : "an integer", d);
  return def;
}

double crun_env_double(const char *name, double def) {
  const char *s = getenv(name);
  if (!s || !*s) return def;
  char *end;
  double v = strtod(s, &end);
  if (!*end) return v;
  char d[32];
  snprintf(d, sizeof d, "%g", def);
  env_bad(name, s, "a number", d);
  return def;
}
