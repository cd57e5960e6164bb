/* fault.c — CRUN_FAULT_ALLOC: allocation failures on purpose, for tests
 * (see fault.h). */
#include "core/fault.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "crun.h"

enum { FAULT_MAX = 8, FAULT_SITE = 48 };

typedef struct {
  char site[FAULT_SITE];
  long nth;      /* 0: every call; else the nth (and later ones when `on`) */
  int on;        /* "n+": every call from the nth */
  long seen;     /* calls counted at this entry */
} fault_t;

_Atomic int crun__fault_state;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static fault_t g_faults[FAULT_MAX];
static int g_nfaults;

/* Parses one entry "site[:n[+]]" of length len into f; returns 0 or -1. */
static int parse_entry(const char *s, size_t len, fault_t *f) {
  const char *colon = memchr(s, ':', len);
  size_t sl = colon ? (size_t)(colon - s) : len;
  memset(f, 0, sizeof *f);
  if (sl == 0 || sl >= FAULT_SITE) return -1;
  memcpy(f->site, s, sl);
  if (!colon) return 0;
  char num[24] = "", *end = NULL;
  size_t nl = len - sl - 1;
  if (nl == 0 || nl >= sizeof num) return -1;
  memcpy(num, colon + 1, nl);
  f->nth = strtol(num, &end, 10);
  f->on = *end == '+';
  return f->nth >= 1 && end[f->on] == 0 ? 0 : -1;
}

/* Parses spec into g_faults (caller holds g_lock); returns 0 or -1. */
static int parse(const char *spec) {
  fault_t f[FAULT_MAX];
  int n = 0;
  for (const char *s = spec; s && *s;) {
    size_t len = strcspn(s, ",");
    if (n == FAULT_MAX || parse_entry(s, len, &f[n++]) < 0) return -1;
    s += len + (s[len] == ',');
  }
  memcpy(g_faults, f, sizeof(fault_t) * (size_t)n);
  g_nfaults = n;
  atomic_store(&crun__fault_state, n ? 2 : 1);
  return 0;
}

static void read_env(void) {
  const char *spec = getenv("CRUN_FAULT_ALLOC");
  pthread_mutex_lock(&g_lock);
  if (parse(spec) < 0) {
    g_nfaults = 0;
    atomic_store(&crun__fault_state, 1);
    CRUN_LOG(WARN, PG, "EINVAL: CRUN_FAULT_ALLOC=%s is not site[:n[+]][,...] (at most %d entries, sites under %d "
             "characters); no fault is armed", spec, FAULT_MAX, FAULT_SITE);
  }
  pthread_mutex_unlock(&g_lock);
}

int crun__fault_arm(const char *spec) {
  pthread_once(&g_once, read_env);
  pthread_mutex_lock(&g_lock);
  int rc = parse(spec);
  pthread_mutex_unlock(&g_lock);
  if (rc == 0) return 0;
  return crun_error(CRUN_EINVAL, "fault spec '%s' is not site[:n[+]][,...]", spec);
}

int crun__fault_hit(const char *site) {
  pthread_once(&g_once, read_env);
  if (atomic_load(&crun__fault_state) != 2) return 0;
  int fire = 0;
  long count = 0;
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g_nfaults; i++) {
    fault_t *f = &g_faults[i];
    if (strcmp(f->site, "*") && strcmp(f->site, site)) continue;
    f->seen++;
    if (!f->nth || f->seen == f->nth || (f->on && f->seen > f->nth)) fire = 1, count = f->seen;
  }
  pthread_mutex_unlock(&g_lock);
  if (fire) CRUN_LOG(INFO, PG, "fault injected: allocation #%ld at %s fails (CRUN_FAULT_ALLOC)", count, site);
  return fire;
}
