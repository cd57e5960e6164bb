/* repl_worker.c — the worker side of the interactive mode (-i).
 *
 * worker.c calls crun__repl_worker_begin() before the user script and
 * crun__repl_worker_loop() after it; both hand over to lua/crun/repl.lua
 * (worker_begin, worker_loop). What Lua cannot do is here: Ctrl-C. The front
 * end sends SIGINT to the ranks running a chunk; while a chunk runs (armed),
 * the handler sets a Lua hook that raises "interrupted!" at the next Lua
 * instruction, as lua.c does. Outside a chunk SIGINT is ignored. */
#include "launcher.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>

static lua_State *volatile g_chunk_L;    /* the state running a chunk */
static volatile sig_atomic_t g_armed;    /* a chunk is running */
static int g_state_ref = LUA_NOREF;      /* worker_begin's result */

/* The hook set by the signal handler: clears itself and raises. */
static void stop_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted!");
}

/* SIGINT: only while a chunk runs (lua_sethook is signal safe). */
static void on_sigint(int sig) {
  (void)sig;
  lua_State *L = g_chunk_L;
  if (g_armed && L) lua_sethook(L, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

#if defined(__SANITIZE_THREAD__)
/* ThreadSanitizer runs an asynchronous signal's handler only when the thread
 * next enters a libc function it intercepts: a chunk that only computes
 * (while true do x = x + 1 end) would never see SIGINT, and the chunk
 * timeout could not interrupt it. While a chunk runs with no hook of its
 * own, this count hook enters one (sigpending) every POLL_COUNT
 * instructions; TSan runs the deferred on_sigint there. */
#define POLL_COUNT 10000
static void poll_hook(lua_State *L, lua_Debug *ar) {
  (void)L;
  (void)ar;
  sigset_t pend;
  sigpending(&pend);
}
#endif

/* h.run(fn, msgh) -> ok, ... : calls fn() under msgh with Ctrl-C armed; the
 * hook is cleared (the chunk's own hook restored) before anything else runs. */
static int l_run(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  lua_Hook old = lua_gethook(L);
  int mask = lua_gethookmask(L), count = lua_gethookcount(L);
  lua_pushvalue(L, 1); /* msgh stays at 2, the function goes to 3 */
  g_chunk_L = L;
#if defined(__SANITIZE_THREAD__)
  if (!old) lua_sethook(L, poll_hook, LUA_MASKCOUNT, POLL_COUNT);
#endif
  g_armed = 1;
  int rc = lua_pcall(L, 0, LUA_MULTRET, 2);
  g_armed = 0;
  lua_sethook(L, old, mask, count);
  g_chunk_L = NULL;
  lua_pushboolean(L, rc == LUA_OK);
  lua_insert(L, 3);
  return lua_gettop(L) - 2;
}

/* Calls require("crun.repl")[fn] with nargs arguments below it on the stack
 * (a protected call); leaves one result or the error message. */
static int call_repl(lua_State *L, const char *fn, int nargs) {
  lua_getglobal(L, "require");
  lua_pushstring(L, "crun.repl");
  int rc = lua_pcall(L, 1, 1, 0);
  if (rc != LUA_OK) {
    lua_insert(L, -1 - nargs);
    lua_pop(L, nargs);
    return rc;
  }
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  lua_insert(L, -1 - nargs);
  return lua_pcall(L, nargs, 1, 0);
}

int crun__repl_worker_begin(lua_State *L) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, (lua_Integer)getpid());
  lua_setfield(L, -2, "pid");
  lua_pushcfunction(L, l_run);
  lua_setfield(L, -2, "run");
  int rc = call_repl(L, "worker_begin", 1);
  if (rc != LUA_OK) return rc;
  g_state_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return LUA_OK;
}

int crun__repl_worker_loop(lua_State *L, int script_rc) {
  if (g_state_ref == LUA_NOREF) return script_rc; /* begin failed: its message is on top */
  int nargs = 1;
  lua_rawgeti(L, LUA_REGISTRYINDEX, g_state_ref);
  if (script_rc != LUA_OK) {
    lua_pushvalue(L, -2); /* the script's error message */
    nargs = 2;
  }
  int rc = call_repl(L, "worker_loop", nargs);
  if (rc == LUA_OK) lua_pop(L, 1);
  return rc;
}
