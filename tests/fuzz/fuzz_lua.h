/* fuzz_lua.h — one Lua state per fuzz target process, with lua/crun from
 * the source tree on package.path and crun.core (the bindings, compiled
 * into the target) preloaded, for targets whose parser is Lua code.
 *
 * The Lua interpreter is the system's (not instrumented), so a line hook
 * feeds libFuzzer coverage of the Lua code itself: each executed
 * (previous line, line) pair of a chunk bumps a counter in libFuzzer's
 * extra-counters section, as its own instrumentation does for C edges. */
#ifndef CRUN_FUZZ_LUA_H
#define CRUN_FUZZ_LUA_H

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "crun_lua.h"
#include "fuzz.h"

__attribute__((section("__libfuzzer_extra_counters"))) static uint8_t fuzz_lua_cov[1 << 16];
static uintptr_t fuzz_lua_prev;

/* Line hook: counts the edge from the previous line run to this one. */
static void fuzz_lua_line(lua_State *L, lua_Debug *ar) {
  (void)L;
  uintptr_t here = (uintptr_t)ar->currentline * 2654435761u; /* lines of all files share the map */
  uint8_t *c = &fuzz_lua_cov[(here ^ (fuzz_lua_prev >> 1)) & 0xffff];
  if (*c < 255) (*c)++;
  fuzz_lua_prev = here;
}

/* Returns the process's state with require(module) stored in the registry
 * under "fuzz.module"; aborts when the module does not load. */
static inline lua_State *fuzz_lua_state(const char *module) {
  static lua_State *L;
  if (L) return L;
  L = luaL_newstate();
  if (!L) abort();
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  lua_pushstring(L, CRUN_FUZZ_LUA_DIR "/?.lua;" CRUN_FUZZ_LUA_DIR "/?/init.lua");
  lua_setfield(L, -2, "path");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_crun_core);
  lua_setfield(L, -2, "crun.core");
  lua_pop(L, 2);
  lua_getglobal(L, "require");
  lua_pushstring(L, module);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) FUZZ_FAIL("require '%s': %s", module, lua_tostring(L, -1));
  lua_setfield(L, LUA_REGISTRYINDEX, "fuzz.module");
  lua_sethook(L, fuzz_lua_line, LUA_MASKLINE, 0);
  return L;
}

/* Pushes module.fn. */
static inline void fuzz_lua_fn(lua_State *L, const char *fn) {
  lua_getfield(L, LUA_REGISTRYINDEX, "fuzz.module");
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
}

/* Ends a run: collects its garbage, so that each run frees what it
 * allocated (libFuzzer then skips its leak scan, and a real leak of the C
 * code still shows). */
static inline void fuzz_lua_step(lua_State *L) {
  static int every = -1, n;
  if (every < 0) every = getenv("FUZZ_LUA_GC") ? atoi(getenv("FUZZ_LUA_GC")) : 1;
  lua_settop(L, 0);
  if (every <= 1 || ++n % every == 0) lua_gc(L, LUA_GCCOLLECT);
  fuzz_lua_prev = 0;
}

#endif
