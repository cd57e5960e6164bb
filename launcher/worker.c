/* worker.c — one rank: its environment and the Lua state that runs the script.
 *
 * Used in a forked child of the launcher, and in-process when mpirun or srun
 * already made this process one rank of a job. */
#include "launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "crun_lua.h"

/* Sets name to the decimal value. */
static void setenv_int(const char *name, long value) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", value);
  setenv(name, buf, 1);
}

void crun__worker_setenv(const crun__opts_t *o, const crun__placement_t *p) {
  setenv_int("RANK", p->rank);
  setenv_int("LOCAL_RANK", p->local_rank);
  setenv_int("WORLD_SIZE", p->world_size);
  setenv_int("LOCAL_WORLD_SIZE", p->local_world_size);
  setenv_int("GROUP_RANK", p->group_rank);
  setenv_int("CRUN_RESTART_COUNT", p->restart_count);
  setenv("MASTER_ADDR", p->master_addr, 1);
  setenv_int("MASTER_PORT", p->master_port);
  int roles = p->role_world_size > 0; /* 0: in-process under mpirun/srun, one role */
  setenv_int("GROUP_WORLD_SIZE", p->group_world_size > 0 ? p->group_world_size : 1);
  setenv_int("ROLE_RANK", roles ? p->role_rank : p->rank);
  setenv_int("ROLE_WORLD_SIZE", roles ? p->role_world_size : p->world_size);
  setenv("ROLE_NAME", o->role ? o->role : "default", 1);
  setenv_int("TORCHELASTIC_RESTART_COUNT", p->restart_count);
  setenv_int("TORCHELASTIC_MAX_RESTARTS", o->max_restarts);
  setenv("TORCHELASTIC_RUN_ID", o->run_id ? o->run_id : "none", 1);
  char prefix[CRUN_LAUNCH_RUN_ID_MAX + 32];
  if (o->c10d) { /* the endpoint's store may serve other run ids: keep to ours */
    snprintf(prefix, sizeof prefix, "crun/job/%s/%d", o->run_id, p->round); /* a fresh one each round */
    setenv("CRUN_STORE_PREFIX", prefix, 1);
  } else if (p->restart_count > 0) {
    /* a restart starts from fresh keys: the failed attempt's ranks that
     * reached init_process_group before the failure had counted their
     * group's incarnation up, and the restarted ranks would not agree on it */
    snprintf(prefix, sizeof prefix, "crun/restart/%d", p->restart_count);
    setenv("CRUN_STORE_PREFIX", prefix, 1);
  }
  const char *omp = getenv("OMP_NUM_THREADS");
  if ((!omp || !*omp) && p->local_world_size > 1) { /* keep the user's value; torchrun: only for -n > 1 */
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("CRUN_OMP_DEFAULTED", "1", 1); /* crun_blas_set_threads: not the user's choice */
  }
  if (o->backend) setenv("CRUN_BACKEND", o->backend, 1);
  setenv("CRUN_LAUNCHER", "1", 1); /* the launcher serves the store: ranks must not */
  crun_log_set_rank(p->rank);
  crun_log_init();
}

/* The lua dir holding crun/init.lua: the build tree's for the build tree's
 * crun-lua; for an installed one, <bindir>/../share/lua/5.4 (a prefix, a
 * DESTDIR, a .deb or a luarocks tree); then the build tree's, then the
 * configured install dir. */
static const char *lua_dir(void) {
  static char dir[PATH_MAX];
  struct stat st;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    if (strcmp(exe, CRUN_BUILD_BIN_DIR) == 0 && stat(CRUN_LUA_BUILD_DIR "/crun/init.lua", &st) == 0)
      return CRUN_LUA_BUILD_DIR;
    char init[PATH_MAX + 64];
    if (snprintf(dir, sizeof dir, "%s/../share/lua/5.4", exe) < (int)sizeof dir &&
        snprintf(init, sizeof init, "%s/crun/init.lua", dir) < (int)sizeof init && stat(init, &st) == 0)
      return dir;
  }
  if (stat(CRUN_LUA_BUILD_DIR "/crun/init.lua", &st) == 0) return CRUN_LUA_BUILD_DIR;
  return CRUN_LUA_INSTALL_LDIR;
}

lua_State *crun__lua_state_new(void) {
  lua_State *L = luaL_newstate();
  if (!L) return NULL;
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_crun_core);
  lua_setfield(L, -2, "crun.core");
  lua_pop(L, 1);
  const char *dir = lua_dir();
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir, lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
  return L;
}

/* The global `arg`: arg[0] the script, arg[1..] its arguments, negative
 * indices the launcher and its options (as lua.c does). Pushes the script
 * arguments too and returns how many, for the chunk's `...`. */
static int setup_arg(lua_State *L, const crun__opts_t *o) {
  int nargs = o->argc - o->script_index - 1;
  lua_createtable(L, nargs, o->script_index + 1);
  for (int i = 0; i < o->argc; i++) {
    lua_pushstring(L, i == o->script_index ? o->script : o->argv[i]); /* -m: the module's file */
    lua_rawseti(L, -2, i - o->script_index);
  }
  lua_setglobal(L, "arg");
  luaL_checkstack(L, nargs, "too many script arguments");
  for (int i = 1; i <= nargs; i++) lua_pushstring(L, o->argv[o->script_index + i]);
  return nargs;
}

int crun__lua_msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* The script's bytes, read once by crun__script_check before any worker is
 * forked: every worker and every restart loads these same bytes, so a script
 * given as a pipe or /dev/stdin is not consumed by the first reader. */
static char *g_script;
static size_t g_script_len;
static size_t g_script_skip; /* a UTF-8 BOM and a "#!" first line (its \n kept) */

/* The largest script read: a file or stream longer than this (/dev/zero, a
 * data file given by mistake) is refused once this much was read. */
#define SCRIPT_MAX ((size_t)256 << 20)

/* Reads the whole of path into g_script. Returns 0 or CRUN_EINVAL. */
static int script_read(const char *path) {
  if (g_script) return 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return crun_error(CRUN_EINVAL, "cannot open %s: %s", path, strerror(errno));
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) { close(fd); return crun_error(CRUN_EINVAL, "cannot read %s: out of memory", path); }
    if (len == cap) {
      if (cap >= SCRIPT_MAX) {
        free(buf);
        close(fd);
        return crun_error(CRUN_EINVAL, "%s is longer than %zu MiB: not a script", path, SCRIPT_MAX >> 20);
      }
      char *nb = realloc(buf, cap *= 2);
      if (!nb) free(buf);
      buf = nb;
      continue;
    }
    ssize_t n = read(fd, buf + len, cap - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      free(buf);
      close(fd);
      return crun_error(CRUN_EINVAL, "cannot read %s: %s", path, strerror(e));
    }
    if (n == 0) break;
    len += (size_t)n;
  }
  close(fd);
  size_t skip = 0;
  if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0) skip = 3;
  if (skip < len && buf[skip] == '#') /* as luaL_loadfile: the line goes, its \n stays */
    while (skip < len && buf[skip] != '\n') skip++;
  g_script = buf;
  g_script_len = len;
  g_script_skip = skip;
  return 0;
}

/* The Lua state crun__script_check leaves: libraries open, package.path
 * set and the script compiled, kept in the registry under &g_chunk_key. The
 * launcher never runs it; every worker it forks runs its own copy-on-write
 * copy, so N workers (and every restart) do not each open the libraries,
 * resolve their symbols and compile the script. NULL before the check. */
static lua_State *g_prepared;
static const char g_chunk_key = 0;

/* Loads the script's bytes as a chunk named after its path. */
static int script_load(lua_State *L, const char *path) {
  lua_pushfstring(L, "@%s", path);
  int rc = luaL_loadbufferx(L, g_script + g_script_skip, g_script_len - g_script_skip,
                            lua_tostring(L, -1), NULL);
  lua_remove(L, -2); /* the chunk name */
  return rc;
}

/* Pushes the script compiled by crun__script_check, if this state holds
 * it, and takes it out of the registry; returns whether it did. */
static int prepared_chunk(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &g_chunk_key) != LUA_TFUNCTION) {
    lua_pop(L, 1);
    return 0;
  }
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &g_chunk_key);
  return 1;
}

/* Loads the script (or takes it compiled) and calls it under the traceback handler. */
static int run_script(lua_State *L, const crun__opts_t *o) {
  lua_pushcfunction(L, crun__lua_msghandler);
  int base = lua_gettop(L);
  if (prepared_chunk(L)) return lua_pcall(L, setup_arg(L, o), 0, base);
  if (!g_script && script_read(o->script) < 0) {
    lua_pushstring(L, crun_last_error() + strlen("EINVAL: "));
    return LUA_ERRFILE;
  }
  if (script_load(L, o->script) != LUA_OK) return LUA_ERRSYNTAX;
  int nargs = setup_arg(L, o);
  return lua_pcall(L, nargs, 0, base);
}

/* The program that execvp would run for prog (PATH searched when it has no
 * '/') into path; 0, or CRUN_EINVAL naming what is wrong. */
static int program_path(const char *prog, char *path, size_t n) {
  struct stat st;
  if (!prog || !*prog) return crun_error(CRUN_EINVAL, "--no-python: no program given");
  if (strchr(prog, '/')) {
    if (stat(prog, &st) != 0) return crun_error(CRUN_EINVAL, "--no-python: %s: %s", prog, strerror(errno));
    if (!S_ISREG(st.st_mode) || access(prog, X_OK) != 0)
      return crun_error(CRUN_EINVAL, "--no-python: %s is not an executable file", prog);
    snprintf(path, n, "%s", prog);
    return 0;
  }
  const char *dirs = getenv("PATH");
  for (const char *d = dirs ? dirs : "/usr/bin:/bin"; d && *d;) {
    const char *end = strchr(d, ':');
    size_t len = end ? (size_t)(end - d) : strlen(d);
    if ((size_t)snprintf(path, n, "%.*s/%s", (int)len, len ? d : ".", prog) < n && stat(path, &st) == 0 &&
        S_ISREG(st.st_mode) && access(path, X_OK) == 0)
      return 0;
    d = end ? end + 1 : NULL;
  }
  return crun_error(CRUN_EINVAL, "--no-python: %s: no executable of that name on PATH", prog);
}

int crun__program_check(const char *prog) {
  char path[4096];
  return program_path(prog, path, sizeof path);
}

/* --no-python: replaces this worker with the program, its arguments after it
 * and the environment the launcher set; returns (127) only when exec fails. */
static int exec_program(const crun__opts_t *o) {
  char path[4096];
  if (program_path(o->script, path, sizeof path) < 0) {
    fprintf(stderr, "crun-lua: %s\n", crun_last_error() + strlen("EINVAL: "));
    return 127;
  }
  fflush(stdout);
  fflush(stderr);
  execv(path, o->argv + o->script_index); /* the program as given, its arguments; main's argv ends in NULL */
  fprintf(stderr, "crun-lua: --no-python: cannot run %s: %s\n", path, strerror(errno));
  return 127;
}

int crun__worker_run(const crun__opts_t *o) {
  if (o->no_python) return exec_program(o);
  lua_State *L = g_prepared ? g_prepared : crun__lua_state_new();
  g_prepared = NULL; /* this process's copy is used (and closed) once */
  if (!L) {
    fprintf(stderr, "crun-lua: cannot create a Lua state (out of memory)\n");
    return 1;
  }
  int rc = o->repl ? crun__repl_worker_begin(L) : LUA_OK;
  if (rc == LUA_OK && o->script) rc = run_script(L, o);
  if (o->repl) rc = crun__repl_worker_loop(L, rc);
  if (rc != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "crun-lua: %s\n", msg ? msg : "(error without a message)");
  }
  lua_close(L);
  fflush(stdout);
  fflush(stderr);
  return rc == LUA_OK ? 0 : 1;
}

int crun__module_find(const char *name, char *path, size_t n) {
  lua_State *L = crun__lua_state_new();
  if (!L) return crun_error(CRUN_EINVAL, "cannot create a Lua state (out of memory)");
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "searchpath");
  lua_pushstring(L, name);
  lua_getfield(L, -3, "path");
  lua_call(L, 2, 2);
  int rc = 0;
  if (lua_isstring(L, -2) && lua_rawlen(L, -2) < n) {
    memcpy(path, lua_tostring(L, -2), lua_rawlen(L, -2) + 1);
  } else {
    const char *why = lua_tostring(L, -1);
    rc = crun_error(CRUN_EINVAL, "module '%s' not found on package.path:\n\t%s", name,
                    why ? why : " (path too long)");
  }
  lua_close(L);
  return rc;
}

int crun__script_check(const char *script) {
  if (script_read(script) < 0) return CRUN_EINVAL;
  lua_State *L = crun__lua_state_new();
  if (!L) return crun_error(CRUN_ENOMEM, "cannot create a Lua state");
  int rc = script_load(L, script);
  if (rc != LUA_OK) {
    crun_error(CRUN_EINVAL, "%s", lua_tostring(L, -1));
    lua_close(L);
    return CRUN_EINVAL;
  }
  lua_rawsetp(L, LUA_REGISTRYINDEX, &g_chunk_key);
  if (g_prepared) lua_close(g_prepared);
  g_prepared = L;
  return 0;
}

/* Reads a non-negative integer variable into *out; 0 when unset, 1 when read,
 * CRUN_EINVAL when set but not a number. */
static int env_nonneg(const char *name, int *out) {
  const char *s = getenv(name);
  if (!s || !*s) return 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (*end || v < 0 || v > 1 << 24)
    return crun_error(CRUN_EINVAL, "%s='%s' is not a non-negative integer", name, s);
  *out = (int)v;
  return 1;
}

/* Tries one engine's variable names; see crun__engine_detect. */
static int engine_try(const char *rank_var, const char *size_var, const char *lrank_var,
                      const char *lsize_var, crun__placement_t *p) {
  int rank = 0, size = 0, lrank = -1, lsize = -1, rc;
  if ((rc = env_nonneg(rank_var, &rank)) <= 0) return rc;
  if ((rc = env_nonneg(size_var, &size)) <= 0)
    return rc < 0 ? rc : crun_error(CRUN_EINVAL, "%s is set but %s is not", rank_var, size_var);
  if (rank >= size) return crun_error(CRUN_EINVAL, "%s=%d is not below %s=%d", rank_var, rank, size_var, size);
  if (lrank_var && env_nonneg(lrank_var, &lrank) < 0) return CRUN_EINVAL;
  if (lsize_var && env_nonneg(lsize_var, &lsize) < 0) return CRUN_EINVAL;
  if (lrank >= 0 && lsize > 0 && lrank >= lsize)
    return crun_error(CRUN_EINVAL, "%s=%d is not below %s=%d", lrank_var, lrank, lsize_var, lsize);
  p->rank = rank;
  p->world_size = size;
  p->local_rank = lrank >= 0 ? lrank : 0;
  p->local_world_size = lsize > 0 ? lsize : (lrank >= 0 ? size : 1);
  p->group_rank = rank / p->local_world_size; /* node-major placement, as mpirun/srun default */
  return 1;
}

/* The tasks Slurm placed on node `node` from SLURM_TASKS_PER_NODE ("2(x3),1":
 * nodes 0-2 run 2 tasks, node 3 one); -1 when spec is malformed or shorter. */
static int slurm_tasks_on_node(const char *spec, int node) {
  for (const char *s = spec; *s;) {
    char *end;
    long tasks = strtol(s, &end, 10), times = 1;
    if (end == s || tasks < 0 || tasks > 1 << 24) return -1;
    if (*end == '(') { /* "(xK)" */
      if (end[1] != 'x') return -1;
      s = end + 2;
      times = strtol(s, &end, 10);
      if (end == s || *end != ')' || times < 1 || times > 1 << 24) return -1;
      end++;
    }
    if (node < times) return (int)tasks;
    node -= (int)times;
    if (*end != ',' && *end) return -1;
    s = *end ? end + 1 : end;
  }
  return -1;
}

/* Under srun: GROUP_RANK is SLURM_NODEID, GROUP_WORLD_SIZE SLURM_NNODES and
 * LOCAL_WORLD_SIZE this node's count in SLURM_TASKS_PER_NODE (nodes may run
 * different counts: srun -N 2 -n 3 puts 2 and 1); without that variable an
 * even split of SLURM_NTASKS over the nodes. Returns 1, or CRUN_EINVAL when
 * SLURM_LOCALID is not below this node's count. */
static int slurm_place(crun__placement_t *p) {
  int node = 0, nnodes = 0;
  if (env_nonneg("SLURM_NODEID", &node) == 1) p->group_rank = node;
  if (env_nonneg("SLURM_NNODES", &nnodes) != 1 || nnodes < 1) return 1;
  p->group_world_size = nnodes;
  const char *per = getenv("SLURM_TASKS_PER_NODE");
  int here = per && *per ? slurm_tasks_on_node(per, node) : -1;
  if (here > 0) p->local_world_size = here;
  else if (p->world_size % nnodes == 0) p->local_world_size = p->world_size / nnodes;
  if (p->local_rank >= p->local_world_size)
    return crun_error(CRUN_EINVAL, "SLURM_LOCALID=%d is not below node %d's task count %d (SLURM_TASKS_PER_NODE=%s, "
                      "SLURM_NTASKS=%d, SLURM_NNODES=%d)", p->local_rank, node, p->local_world_size, per ? per : "",
                      p->world_size, nnodes);
  return 1;
}

int crun__engine_detect(crun__placement_t *p) {
  int rc = engine_try("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                      "OMPI_COMM_WORLD_LOCAL_SIZE", p);
  if (rc == 0) rc = engine_try("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", p);
  if (rc == 0) rc = engine_try("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL, p);
  if (rc == 1 && getenv("SLURM_PROCID") && !getenv("OMPI_COMM_WORLD_RANK") && !getenv("PMI_RANK"))
    rc = slurm_place(p);
  return rc;
}
