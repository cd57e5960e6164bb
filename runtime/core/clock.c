/* clock.c — monotonic clocks and environment parsing. */
#include "crun.h"
#include "core/clock_int.h"

#include <errno.h>
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

long crun_env_int(const char *name, long def) {
  const char *s = getenv(name);
  if (!s || !*s) return def;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  return (errno || *end) ? def : v;
}

double crun_env_double(const char *name, double def) {
  const char *s = getenv(name);
  if (!s || !*s) return def;
  char *end;
  double v = strtod(s, &end);
  return *end ? def : v;
}
