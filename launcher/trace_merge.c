/* trace_merge.c — crun-lua's side of the timeline and the flight recorder
 * (runtime/include/crun/trace.h): the workers' environment, asking every
 * worker for its flight recorder (SIGUSR1) and printing the analysis, and
 * merging the ranks' timeline files into one Chrome/Perfetto trace. The
 * merging and the analysis are lua/crun/observe.lua, run in a Lua state of
 * the launcher's own. */
#include "launcher.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int g_reported;     /* an analysis named the dump directory */
static char g_default_dir[PATH_MAX]; /* the dump directory crun-lua chose, if it did */

#define OBS_DUMP_WAIT_S 10.0 /* at most this long the launcher waits for the workers' dumps (a loaded machine) */

static void obs_say(const char *text) {
  for (const char *p = text; *p;) {
    size_t n = strcspn(p, "\n");
    char line[1100];
    int k = snprintf(line, sizeof line, "crun-lua: %.*s\n", (int)(n < 1024 ? n : 1024), p);
    crun__write_all(2, line, (size_t)k);
    p += n + (p[n] == '\n');
  }
}

void crun__obs_launcher_setup(const char *timeline) {
  crun_trace_configure(0); /* the launcher records nothing itself */
  if (!timeline) return;
  char abs[PATH_MAX];
  if (timeline[0] != '/' && getcwd(abs, sizeof abs)) {
    size_t n = strlen(abs);
    snprintf(abs + n, sizeof abs - n, "/%s", timeline);
  } else {
    snprintf(abs, sizeof abs, "%s", timeline);
  }
  setenv("CRUN_TIMELINE", abs, 1);
}

void crun__obs_attempt_env(const char *log_dir, int attempt) {
  char dir[PATH_MAX];
  if (log_dir) snprintf(dir, sizeof dir, "%s/attempt_%d", log_dir, attempt);
  else if (getenv("CRUN_FLIGHT_DIR")) return; /* the user's choice */
  else {
    /* made here, 0700 and with a random suffix (mkdtemp): at a name known in
     * advance (crun-flight-<pid>) another user could create the directory
     * first with a symlink flight_rank0.txt.tmp -> any file of ours, and
     * rank 0's dump would overwrite that file */
    if (!g_default_dir[0]) {
      const char *tmp = getenv("TMPDIR");
      snprintf(dir, sizeof dir, "%s/crun-flight-%d-XXXXXX", tmp && *tmp ? tmp : "/tmp", (int)getpid());
      if (!mkdtemp(dir)) {
        obs_say("cannot create a directory for the flight recorder's dumps (set CRUN_FLIGHT_DIR or --log-dir)");
        return;
      }
      snprintf(g_default_dir, sizeof g_default_dir, "%s", dir);
    }
    snprintf(dir, sizeof dir, "%s", g_default_dir);
  }
  setenv("CRUN_FLIGHT_DIR", dir, 1);
}

void crun__obs_worker_init(void) {
  crun_trace_configure(1);
  if (crun_flight_arm() < 0) fprintf(stderr, "crun-lua: %s\n", crun_last_error());
}

/* The monotonic time in the header of rank r's dump, or 0 when there is none. */
static uint64_t dump_time(const char *dir, int r) {
  char path[PATH_MAX], line[256];
  snprintf(path, sizeof path, "%s/flight_rank%d.txt", dir, r);
  FILE *f = fopen(path, "r");
  unsigned long long t = 0;
  while (f && fgets(line, sizeof line, f))
    if (line[0] == 'R' && sscanf(line, "R\t%*d\t%*d\t%llu", &t) == 1) break;
  if (f) fclose(f);
  return (uint64_t)t;
}

/* Whether pid runs (not gone, not a zombie waiting to be reaped). */
static int running_pid(pid_t pid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* "pid (comm) S ..." */
  return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

/* Calls require("crun.observe")[fn] with the values pushed by push(L, arg);
 * returns its text (malloc'ed), or NULL with the error printed: a Lua error,
 * or fn's `nil, message` answer. */
static char *observe_call(const char *fn, void (*push)(lua_State *, const void *), const void *arg, int nargs) {
  lua_State *L = crun__lua_state_new();
  if (!L) return NULL;
  char *out = NULL;
  lua_pushcfunction(L, crun__lua_msghandler);
  lua_getglobal(L, "require");
  lua_pushstring(L, "crun.observe");
  if (lua_pcall(L, 1, 1, 1) == LUA_OK) {
    lua_getfield(L, -1, fn);
    push(L, arg);
    if (lua_pcall(L, nargs, 2, 1) == LUA_OK && lua_toboolean(L, -2)) {
      const char *s = lua_tostring(L, -2);
      out = strdup(s ? s : "");
    }
  }
  if (!out) obs_say(lua_tostring(L, -1) ? lua_tostring(L, -1) : "crun.observe failed");
  lua_close(L);
  return out;
}

typedef struct {
  const char *dir;
  const int *ranks;
  int n;
  uint64_t since;
  int quiet;
} analyze_args_t;

static void push_analyze(lua_State *L, const void *p) {
  const analyze_args_t *a = p;
  lua_pushstring(L, a->dir);
  lua_createtable(L, a->n, 0);
  for (int i = 0; i < a->n; i++) {
    lua_pushinteger(L, a->ranks[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_pushinteger(L, (lua_Integer)a->since);
  lua_pushboolean(L, a->quiet);
}

void crun__obs_dump_all(const pid_t *pids, const int *ranks, const int *running, int n, uint64_t since,
                        const char *why) {
  if (crun_env_int("CRUN_FLIGHT_RECORDER", 2000) <= 0) return;
  const char *dir = getenv("CRUN_FLIGHT_DIR");
  if (!dir) return;
  uint64_t asked = crun_clock_ns();
  if (!since) since = asked;
  int waiting = 0;
  for (int i = 0; i < n; i++)
    if (running[i] && pids[i] > 0 && kill(pids[i], SIGUSR1) == 0) waiting++;
  double end = crun_clock() + OBS_DUMP_WAIT_S, again = crun_clock() + 0.25;
  while (waiting > 0 && crun_clock() < end) {
    /* a worker still starting drops the signal (it ignores SIGUSR1 until
     * its recorder is armed): ask those not done again every 250 ms */
    int resend = crun_clock() >= again;
    if (resend) again = crun_clock() + 0.25;
    waiting = 0;
    for (int i = 0; i < n; i++) /* a rank that dumped since (its own failure) is not waited for */
      if (running[i] && running_pid(pids[i]) && dump_time(dir, ranks[i]) < since) {
        waiting++;
        if (resend) kill(pids[i], SIGUSR1);
      }
    if (waiting) nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
  }
  analyze_args_t a = {dir, ranks, n, since, strcmp(why, "SIGUSR1") != 0};
  char *text = observe_call("analyze", push_analyze, &a, 4);
  if (text && *text) { /* after a failure, nothing when no rank ran an operation */
    char head[256];
    snprintf(head, sizeof head, "%s: asked every worker for its flight recorder", why);
    obs_say(head);
    obs_say(text);
    g_reported = 1;
  }
  free(text);
}

typedef struct {
  const char *path;
  int world;          /* ranks 0..world-1, or with ranks: */
  const int *ranks;   /* these n ranks */
  int n;
} merge_args_t;

static void push_merge(lua_State *L, const void *p) {
  const merge_args_t *a = p;
  lua_pushstring(L, a->path);
  if (!a->ranks) {
    lua_pushinteger(L, a->world);
    return;
  }
  lua_createtable(L, a->n, 0);
  for (int i = 0; i < a->n; i++) {
    lua_pushinteger(L, a->ranks[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

/* The ranks r of every "<base>.rank<r>" file in path's directory, sorted
 * (malloc'ed into *out); returns how many, or -1 when out of memory. */
static int found_ranks(const char *path, int **out) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  const char *base = slash ? slash + 1 : path;
  if (!slash) strcpy(dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  size_t blen = strlen(base);
  int n = 0, cap = 0, *ranks = NULL;
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
    const char *p = e->d_name;
    if (strncmp(p, base, blen) != 0 || strncmp(p + blen, ".rank", 5) != 0) continue;
    char *end;
    errno = 0;
    long r = strtol(p + blen + 5, &end, 10);
    if (errno || *end || end == p + blen + 5 || r < 0 || r > INT_MAX || !(p[blen + 5] >= '0' && p[blen + 5] <= '9')) continue;
    if (n == cap) {
      int *more = realloc(ranks, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *ranks);
      if (!more) { free(ranks); closedir(d); return -1; }
      ranks = more;
    }
    ranks[n++] = (int)r;
  }
  if (d) closedir(d);
  for (int i = 1; i < n; i++) /* insertion sort: rank order in the trace and the summary */
    for (int j = i; j > 0 && ranks[j - 1] > ranks[j]; j--) { int t = ranks[j]; ranks[j] = ranks[j - 1]; ranks[j - 1] = t; }
  *out = ranks;
  return n;
}

int crun__obs_dump_name(const char *name) {
  if (strncmp(name, "flight_rank", 11) != 0) return 0;
  const char *p = name + 11, *digits = p;
  while (*p >= '0' && *p <= '9') p++;
  if (p == digits) return 0;
  return strcmp(p, ".txt") == 0 ? 1 : strcmp(p, ".txt.tmp") == 0 ? 2 : 0;
}

/* Removes the dumps in the directory crun-lua chose and the directory: one
 * readdir, not a try per possible rank. */
void crun__obs_cleanup(void) {
  if (g_reported || !g_default_dir[0]) return;
  DIR *d = opendir(g_default_dir);
  if (!d) return;
  char path[PATH_MAX + 300];
  for (struct dirent *e; (e = readdir(d)) != NULL;) { /* only what the recorder writes there */
    if (!crun__obs_dump_name(e->d_name)) continue;
    snprintf(path, sizeof path, "%s/%s", g_default_dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(g_default_dir); /* fails, and stays, when something else is in it */
}

int crun__obs_merge_shared(const char *path, int world) {
  if (!path || !*path) return 0;
  char file[PATH_MAX + 32];
  /* one node at a time (flock, released when a holder dies): the first
   * takes every part, a later one finds none instead of half of them */
  snprintf(file, sizeof file, "%s.lock", path);
  int lock = open(file, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  while (lock >= 0 && flock(lock, LOCK_EX) < 0 && errno == EINTR) {}
  int rc = -1;
  for (int r = 0; r < world && rc < 0; r++) {
    snprintf(file, sizeof file, "%s.rank%d", path, r);
    if (access(file, F_OK) == 0) rc = crun__obs_merge(path, world);
  }
  if (rc < 0) {
    char line[PATH_MAX + 128];
    snprintf(line, sizeof line, "timeline: no part left at %s.rank<r> (another node merged them)", path);
    obs_say(line);
    rc = 0;
  }
  snprintf(file, sizeof file, "%s.lock", path);
  if (lock >= 0) {
    unlink(file);
    close(lock);
  }
  return rc;
}

int crun__obs_merge(const char *path, int world) {
  if (!path || !*path) return 0;
  merge_args_t a = {path, world, NULL, 0};
  int *found = NULL;
  if (world < 0 && (a.n = found_ranks(path, &found)) < 0) {
    obs_say("ENOMEM: merging the timeline: out of memory");
    return 1;
  }
  a.ranks = world < 0 ? found : NULL;
  char *text = observe_call("merge", push_merge, &a, 2);
  if (text) obs_say(text);
  int ok = text != NULL;
  free(text);
  free(found);
  return ok ? 0 : 1;
}
