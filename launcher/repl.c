/* repl.c — the interactive mode of crun-lua (-i): the front end.
 *
 * The launcher process becomes the front end. It serves the store (the node
 * agent), forks a supervisor process that runs the workers as a normal
 * launch does (with o->repl set, so each worker enters repl_worker.c's loop
 * after its script), and runs lua/crun/repl.lua's front() in a Lua state of
 * its own. The supervisor gets its own process group, so the terminal's
 * Ctrl-C reaches only the front end, which forwards it to the ranks running
 * a chunk. The helpers given to Lua (table h) read lines (readline on a
 * terminal: line editing, history in $CRUN_HISTORY or ~/.crun_history),
 * report signals, and check whether ranks and the supervisor are alive. */
#include "launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "crun_lua.h"

#ifdef CRUN_HAVE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

#define EXIT_USAGE 2
#define QUIT_WAIT_SECONDS 10.0  /* workers get this long to end after Ctrl-D */
#define TERM_WAIT_SECONDS 30.0  /* then the supervisor this long after SIGTERM */

static volatile sig_atomic_t g_int;   /* SIGINT seen, not yet reported */
static volatile sig_atomic_t g_term;  /* SIGTERM or SIGHUP seen */
static int g_sigpipe[2] = {-1, -1};   /* self-pipe: wakes poll() on a signal */
static pid_t g_sup = -1;              /* the supervisor process */
static int g_sup_code = -1;           /* its exit code once reaped */
static int g_tty;                     /* stdin is a terminal */
static char g_hist[4096];             /* history file, "" for none */

/* ---------------------------------------------------------------- signals */

static void on_signal(int sig) {
  int saved = errno;
  if (sig == SIGINT) g_int = 1;
  else g_term = sig;
  if (g_sigpipe[1] >= 0 && write(g_sigpipe[1], "x", 1) < 0) {} /* full pipe: already awake */
  errno = saved;
}

/* Installs the front end's handlers (no SA_RESTART: reads wake up). */
static int signals_install(void) {
  if (pipe2(g_sigpipe, O_CLOEXEC | O_NONBLOCK) < 0)
    return crun_error(CRUN_ESYS, "pipe: %s", strerror(errno));
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  struct sigaction hup;
  sigaction(SIGHUP, NULL, &hup);
  if (hup.sa_handler != SIG_IGN) sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

static void drain_sigpipe(void) {
  char buf[64];
  while (read(g_sigpipe[0], buf, sizeof buf) > 0) {}
}

/* ---------------------------------------------------------------- supervisor */

/* Reaps the supervisor if it ended; returns its exit code or -1 while it runs. */
static int supervisor_poll(void) {
  if (g_sup_code >= 0 || g_sup < 0) return g_sup_code;
  int st;
  pid_t p = waitpid(g_sup, &st, WNOHANG);
  if (p == g_sup) g_sup_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return g_sup_code;
}

/* Waits up to `seconds` for the supervisor to end; returns its code or -1. */
static int supervisor_wait(double seconds) {
  double until = crun_clock() + seconds;
  while (supervisor_poll() < 0 && crun_clock() < until) usleep(20000);
  return g_sup_code;
}

/* Ends the supervisor: SIGTERM (it stops the workers with its grace period),
 * then SIGKILL if it does not end in time. Returns its exit code. */
static int supervisor_stop(void) {
  if (supervisor_poll() >= 0) return g_sup_code;
  kill(g_sup, SIGTERM);
  if (supervisor_wait(TERM_WAIT_SECONDS) >= 0) return g_sup_code;
  kill(g_sup, SIGKILL);
  while (waitpid(g_sup, NULL, 0) < 0 && errno == EINTR) {}
  g_sup_code = 128 + SIGKILL;
  return g_sup_code;
}

/* Forks the supervisor: its own process group, ends with the front end. */
static int supervisor_start(const crun__opts_t *o, const crun__placement_t *base,
                            crun__agent_t *agent) {
  pid_t parent = getpid();
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return crun_error(CRUN_ESYS, "fork of the supervisor: %s", strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    struct sigaction hup;
    sigaction(SIGHUP, NULL, &hup);
    if (hup.sa_handler != SIG_IGN) signal(SIGHUP, SIG_DFL); /* nohup keeps working */
    crun__signals_block(); /* crun__supervise reads them from a signalfd */
    int dn = open("/dev/null", O_RDONLY);
    if (dn >= 0) { dup2(dn, 0); close(dn); }
    int code = crun__supervise(o, base, agent);
    crun__obs_cleanup(); /* the dump directory this process chose (launch() does the same) */
    _exit(code);
  }
  g_sup = pid;
  return 0;
}

/* ---------------------------------------------------------------- line input */

/* Reads a line from stdin without readline: pushes it, nil at EOF, or
 * false, why on a signal. */
static int read_plain(lua_State *L, const char *prompt) {
  if (*prompt) {
    fputs(prompt, stdout);
    fflush(stdout);
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  int got = 0;
  for (;;) {
    if (g_term) { lua_pushboolean(L, 0); lua_pushstring(L, "terminate"); return 2; }
    if (g_int) { g_int = 0; lua_pushboolean(L, 0); lua_pushstring(L, "interrupt"); return 2; }
    char c;
    ssize_t n = read(0, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got = 1;
    if (c == '\n') break;
    luaL_addchar(&b, c);
  }
  if (!got) { lua_pushnil(L); return 1; }
  luaL_pushresult(&b);
  return 1;
}

#ifdef CRUN_HAVE_READLINE
static char *g_line;
static int g_line_done;

static void on_line(char *line) {
  g_line = line;
  g_line_done = 1;
  rl_callback_handler_remove();
}

/* Abandons the line being edited (Ctrl-C at the prompt). */
static void rl_abandon(void) {
  rl_free_line_state();
  rl_callback_sigcleanup();
  rl_replace_line("", 0);
  rl_point = rl_end = 0;
  rl_callback_handler_remove();
  fputs("\n", stdout);
  fflush(stdout);
}

/* Why reading must stop now ("terminate", "interrupt", "gone"), or NULL. */
static const char *stop_reason(void) {
  if (g_term) return "terminate";
  if (g_int) {
    g_int = 0;
    return "interrupt";
  }
  if (supervisor_poll() >= 0) return "gone";
  return NULL;
}

/* Reads a line with readline's callback interface, polling stdin, the
 * signal pipe and (every 250 ms) the supervisor. */
static int read_rl(lua_State *L, const char *prompt) {
  g_line = NULL;
  g_line_done = 0;
  rl_callback_handler_install(prompt, on_line);
  for (;;) {
    const char *why = stop_reason();
    if (why) {
      rl_abandon();
      lua_pushboolean(L, 0);
      lua_pushstring(L, why);
      return 2;
    }
    struct pollfd p[2] = {{.fd = 0, .events = POLLIN}, {.fd = g_sigpipe[0], .events = POLLIN}};
    int rc = poll(p, 2, 250);
    if (rc < 0 && errno != EINTR) {
      rl_callback_handler_remove();
      return luaL_error(L, "ESYS: poll on the terminal: %s", strerror(errno));
    }
    if (rc > 0 && p[1].revents) drain_sigpipe();
    if (rc > 0 && p[0].revents && !g_int && !g_term) {
      rl_callback_read_char();
      if (g_line_done) break;
    }
  }
  if (!g_line) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushstring(L, g_line);
  free(g_line);
  return 1;
}
#endif

/* h.readline(prompt) -> line | nil (EOF) | false, "interrupt"|"terminate"|"gone" */
static int l_readline(lua_State *L) {
  const char *prompt = luaL_checkstring(L, 1);
#ifdef CRUN_HAVE_READLINE
  if (g_tty) return read_rl(L, prompt);
#endif
  return read_plain(L, prompt);
}

/* h.add_history(text): remembered for the up arrow and in the history file. */
static int l_add_history(lua_State *L) {
  const char *s = luaL_checkstring(L, 1);
#ifdef CRUN_HAVE_READLINE
  if (g_tty && *s) {
    add_history(s);
    if (g_hist[0] && append_history(1, g_hist) != 0) write_history(g_hist);
  }
#else
  (void)s;
#endif
  return 0;
}

/* Picks the history file and loads it (terminal sessions only). */
static void history_open(void) {
#ifdef CRUN_HAVE_READLINE
  if (!g_tty) return;
  const char *env = getenv("CRUN_HISTORY"), *home = getenv("HOME");
  if (env) snprintf(g_hist, sizeof g_hist, "%s", env);
  else if (home && *home) snprintf(g_hist, sizeof g_hist, "%s/.crun_history", home);
  rl_catch_signals = 0;
  rl_readline_name = "crun";
  using_history();
  history_comment_char = '#';    /* "#<time>" lines delimit the entries, so */
  history_write_timestamps = 1;  /* that a multi-line chunk comes back whole */
  history_multiline_entries = 1;
  if (g_hist[0]) read_history(g_hist);
#endif
}

/* Trims the history file to its last 1000 entries. */
static void history_close(void) {
#ifdef CRUN_HAVE_READLINE
  if (g_tty && g_hist[0]) history_truncate_file(g_hist, 1000);
#endif
}

/* ---------------------------------------------------------------- other helpers */

/* h.signals() -> "terminate" | "interrupt" | nil (clears the interrupt) */
static int l_signals(lua_State *L) {
  drain_sigpipe();
  if (g_term) lua_pushstring(L, "terminate");
  else if (g_int) { g_int = 0; lua_pushstring(L, "interrupt"); }
  else lua_pushnil(L);
  return 1;
}

/* h.alive(pid) -> whether the process exists and is not a zombie */
static int l_alive(lua_State *L) {
  lua_Integer pid = luaL_checkinteger(L, 1);
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
  int alive = 0;
  FILE *f = fopen(path, "r");
  if (f) {
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close_paren = strrchr(buf, ')');
    alive = close_paren && close_paren[1] == ' ' && close_paren[2] != 'Z' && close_paren[2] != 'X';
  }
  lua_pushboolean(L, alive);
  return 1;
}

/* h.kill(pid): sends SIGINT (interrupts the chunk a rank runs). */
static int l_kill(lua_State *L) {
  lua_Integer pid = luaL_checkinteger(L, 1);
  if (pid > 1) kill((pid_t)pid, SIGINT);
  return 0;
}

/* h.dump(): SIGUSR1 to the supervisor, which asks every worker for its
 * flight recorder and prints the analysis (trace_merge.c) */
static int l_dump(lua_State *L) {
  lua_pushboolean(L, g_sup > 0 && supervisor_poll() < 0 && kill(g_sup, SIGUSR1) == 0);
  return 1;
}

/* h.supervisor() -> its exit code once it ended, else nil */
static int l_supervisor(lua_State *L) {
  int code = supervisor_poll();
  if (code >= 0) lua_pushinteger(L, code);
  else lua_pushnil(L);
  return 1;
}

/* ---------------------------------------------------------------- Lua state */

/* Runs require("crun.repl").front(h, opts); returns how the session ended
 * ("quit", "gone", "interrupt", "terminate") or "error" after printing it. */
static const char *front_run(lua_State *L, const crun__placement_t *base, const char *host,
                             char *how, size_t n) {
  static const luaL_Reg helpers[] = {
      {"readline", l_readline}, {"add_history", l_add_history}, {"signals", l_signals},
      {"alive", l_alive}, {"kill", l_kill}, {"supervisor", l_supervisor},
      {"dump", l_dump}, {NULL, NULL}};
  lua_pushcfunction(L, crun__lua_msghandler);
  lua_getglobal(L, "require");
  lua_pushstring(L, "crun.repl");
  if (lua_pcall(L, 1, 1, 1) != LUA_OK) goto fail;
  lua_getfield(L, -1, "front");
  luaL_newlib(L, helpers);
  lua_createtable(L, 0, 4);
  lua_pushstring(L, host);
  lua_setfield(L, -2, "host");
  lua_pushinteger(L, base->master_port);
  lua_setfield(L, -2, "port");
  lua_pushinteger(L, base->world_size);
  lua_setfield(L, -2, "world");
  lua_pushboolean(L, g_tty);
  lua_setfield(L, -2, "tty");
  if (lua_pcall(L, 2, 1, 1) != LUA_OK) goto fail;
  snprintf(how, n, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "quit");
  return how;
fail:
  fflush(stdout);
  fprintf(stderr, "crun-lua: the REPL failed: %s\n", lua_tostring(L, -1));
  snprintf(how, n, "error");
  return how;
}

/* ---------------------------------------------------------------- entry */

/* Checks -i's options and the script; returns 0 or an exit code. */
static int check_repl_opts(crun__opts_t *o) {
  if (o->nnodes > 1) {
    fprintf(stderr, "crun-lua: -i runs on one node only (got --nnodes %d)\n"
                    "(see crun-lua --help)\n", o->nnodes);
    return EXIT_USAGE;
  }
  if (o->script && crun__script_check(o->script) < 0) {
    fprintf(stderr, "crun-lua: %s\n", crun_last_error() + strlen("EINVAL: "));
    return 1;
  }
  if (o->master_port < 0) o->master_port = 0; /* a free port: REPLs do not collide */
  if (!o->master_addr) o->master_addr = "127.0.0.1";
  o->max_restarts = 0;
  return 0;
}

/* After the session: lets the workers end, then the supervisor. */
static int finish(const char *how) {
  int code;
  if (!strcmp(how, "quit") && supervisor_wait(QUIT_WAIT_SECONDS) >= 0) code = g_sup_code;
  else if (!strcmp(how, "quit")) {
    fprintf(stderr, "crun-lua: ranks still busy %g s after the end of the session; stopping them\n",
            QUIT_WAIT_SECONDS);
    code = supervisor_stop();
  } else if (!strcmp(how, "gone")) code = supervisor_wait(TERM_WAIT_SECONDS) >= 0 ? g_sup_code : supervisor_stop();
  else code = supervisor_stop();
  if (!strcmp(how, "terminate")) return 128 + (int)g_term;
  if (!strcmp(how, "interrupt")) return 128 + SIGINT;
  if (!strcmp(how, "error")) return code ? code : 1;
  return code;
}

int crun__repl_run(const crun__opts_t *opts) {
  static crun__opts_t o; /* the agent keeps a pointer to it */
  o = *opts;
  int rc = check_repl_opts(&o);
  if (rc) return rc;
  g_tty = isatty(0);
  crun__placement_t base = {0};
  crun__agent_t *agent = NULL;
  sigset_t term, old; /* the agent's threads must not take the signals meant for us */
  sigemptyset(&term);
  sigaddset(&term, SIGINT);
  sigaddset(&term, SIGTERM);
  sigaddset(&term, SIGHUP);
  sigprocmask(SIG_BLOCK, &term, &old);
  if (crun__agent_start(&o, &base, &agent) < 0) {
    fprintf(stderr, "crun-lua: %s\n", crun_last_error());
    return 1;
  }
  if (signals_install() < 0 || supervisor_start(&o, &base, agent) < 0) {
    fprintf(stderr, "crun-lua: %s\n", crun_last_error());
    crun__agent_stop(agent);
    return 1;
  }
  sigprocmask(SIG_SETMASK, &old, NULL);
  lua_State *L = crun__lua_state_new();
  char how[32] = "error";
  if (!L) fprintf(stderr, "crun-lua: cannot create a Lua state (out of memory)\n");
  else {
    history_open();
    front_run(L, &base, o.master_addr, how, sizeof how);
    history_close();
    lua_close(L);
  }
  fflush(stdout);
  int code = finish(how);
  crun__agent_stop(agent);
  return code;
}
