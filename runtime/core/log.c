/* log.c — CRUN_DEBUG=WARN|INFO|TRACE, CRUN_DEBUG_SUBSYS=STORE,PG,...,
 * CRUN_DEBUG_FILE=path (%r in the path becomes the rank, %p the pid). */
#include "crun.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *subsys_names[CRUN_SUB_COUNT] = {
#define CRUN_X_SUBNAME(name) #name,
    CRUN_SUBSYS_MAP(CRUN_X_SUBNAME)
#undef CRUN_X_SUBNAME
};

static const char *level_names[] = {"NONE", "WARN", "INFO", "TRACE"};

static struct {
  pthread_once_t once;
  pthread_mutex_t mu;
  int level;
  unsigned subsys_mask;
  FILE *out;
  int rank;
} g = {PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, CRUN_LOG_WARN, ~0u, NULL, -1};

/* Whether this process names a bad CRUN_DEBUG* value on stderr: once per
 * process (crun_log_init parses again), and not in a worker crun-lua started
 * (CRUN_LAUNCHER), whose launcher already said it. */
static int should_warn(int *warned) {
  return !(*warned)++ && !getenv("CRUN_LAUNCHER");
}

/* Parses a level name; WARN, named on stderr, when unknown. */
static int parse_level(const char *s) {
  static int warned;
  if (!s || !*s) return CRUN_LOG_WARN;
  for (int i = 0; i <= CRUN_LOG_TRACE; i++)
    if (strcasecmp(s, level_names[i]) == 0) return i;
  if (strcasecmp(s, "VERSION") == 0) return CRUN_LOG_WARN;
  if (should_warn(&warned))
    fprintf(stderr, "crun: EINVAL: CRUN_DEBUG=%s: expected NONE, WARN, INFO or TRACE; logging at WARN\n", s);
  return CRUN_LOG_WARN;
}

/* Names an unknown subsystem of CRUN_DEBUG_SUBSYS=s on stderr. */
static void warn_subsys(const char *s, const char *tok) {
  static int warned;
  if (!should_warn(&warned)) return;
  char known[128] = "";
  for (int i = 0; i < CRUN_SUB_COUNT; i++)
    snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", subsys_names[i]);
  fprintf(stderr, "crun: EINVAL: CRUN_DEBUG_SUBSYS=%s: unknown subsystem '%s' (known: %s; ALL, or ^ to exclude)\n",
          s, tok, known);
}

/* Parses "STORE,PG" (or "^NET" to exclude) into a bit mask. */
static unsigned parse_subsys(const char *s) {
  if (!s || !*s || strcasecmp(s, "ALL") == 0) return ~0u;
  int negate = s[0] == '^';
  unsigned mask = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s + negate);
  for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int i = 0; i < CRUN_SUB_COUNT; i++)
      if (strcasecmp(tok, subsys_names[i]) == 0) mask |= 1u << i, found = 1;
    if (!found) warn_subsys(s, tok);
  }
  return negate ? ~mask : mask;
}

/* Opens CRUN_DEBUG_FILE, expanding %r (rank) and %p (pid). */
static FILE *open_log_file(const char *pattern) {
  char path[512];
  size_t o = 0;
  for (const char *p = pattern; *p && o < sizeof path - 24; p++) {
    if (p[0] == '%' && p[1] == 'p') { o += snprintf(path + o, sizeof path - o, "%d", (int)getpid()); p++; }
    else if (p[0] == '%' && p[1] == 'r') { o += snprintf(path + o, sizeof path - o, "%d", g.rank); p++; }
    else path[o++] = *p;
  }
  path[o] = 0;
  /* appends, but never through a symbolic link (O_NOFOLLOW) nor into a
   * fifo or a device (O_NONBLOCK keeps a fifo from blocking the open) */
  const char *why = NULL;
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
  struct stat st;
  if (fd < 0) why = errno == ELOOP ? "it is a symbolic link (not followed)" : strerror(errno);
  else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) why = "it is not a regular file";
  FILE *f = NULL;
  if (!why) {
    fcntl(fd, F_SETFL, O_APPEND);
    f = fdopen(fd, "a");
    if (!f) why = strerror(errno);
  }
  if (why) {
    static int warned; /* crun_log_init opens it again: say it once */
    if (fd >= 0) close(fd);
    if (!warned++) fprintf(stderr, "crun: EINVAL: CRUN_DEBUG_FILE=%s: cannot log to %s: %s; logging to "
            "stderr instead\n", pattern, path, why);
    return stderr;
  }
  setvbuf(f, NULL, _IOLBF, 0);
  return f;
}

static void init_once(void) {
  const char *rank = getenv("RANK");
  if (rank && g.rank < 0) g.rank = atoi(rank);
  const char *lvl = getenv("CRUN_DEBUG");
  g.level = lvl ? parse_level(lvl) : CRUN_LOG_WARN;
  g.subsys_mask = parse_subsys(getenv("CRUN_DEBUG_SUBSYS"));
  const char *file = getenv("CRUN_DEBUG_FILE");
  if (g.out && g.out != stderr) fclose(g.out); /* crun_log_init opens it again */
  g.out = (file && *file) ? open_log_file(file) : stderr;
}

void crun_log_init(void) {
  pthread_once(&g.once, init_once);
  pthread_mutex_lock(&g.mu);
  init_once();
  pthread_mutex_unlock(&g.mu);
}

void crun_log_set_rank(int rank) { g.rank = rank; }

int crun_log_enabled(crun_log_level_t level, crun_subsys_t sub) {
  pthread_once(&g.once, init_once);
  return (int)level <= g.level && (g.subsys_mask & (1u << sub));
}

void crun_log(crun_log_level_t level, crun_subsys_t sub, const char *fmt, ...) {
  char line[2048];
  int n;
  pthread_once(&g.once, init_once);
  if (g.rank >= 0)
    n = snprintf(line, sizeof line, "crun[%d] %s %s: ", g.rank, level_names[level], subsys_names[sub]);
  else
    n = snprintf(line, sizeof line, "crun[pid %d] %s %s: ", (int)getpid(), level_names[level], subsys_names[sub]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&g.mu);
  fprintf(g.out, "%s\n", line);
  fflush(g.out);
  pthread_mutex_unlock(&g.mu);
}
