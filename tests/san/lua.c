/* lua.c — a minimal lua5.4 interpreter for sanitizer builds (CRUN_SANITIZE).
 * The system lua5.4 is not instrumented, so it cannot load the instrumented
 * crun.core without preloading the sanitizer runtime, and that preload then
 * reaches every program the specs start (ThreadSanitizer crashes sh and bash
 * at start-up). Built with the sanitizer and put first in the tests' PATH as
 * `lua5.4`, this one needs no preload. It runs `lua5.4 [-e code]... [script
 * [args]]` as the real one does: `arg` with the script at 0, errors with a
 * traceback on stderr and exit status 1. */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <string.h>

/* Message handler: the error with a traceback. */
static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* Calls the chunk on the stack with nargs arguments under the handler;
 * prints the error and returns 0 when it fails. */
static int run(lua_State *L, int nargs, const char *progname) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, 0, base);
  lua_remove(L, base);
  if (rc == LUA_OK) return 1;
  fprintf(stderr, "%s: %s\n", progname, lua_tostring(L, -1));
  lua_pop(L, 1);
  return 0;
}

/* Sets the global `arg`: argv[script] at 0, what precedes it negative. */
static void set_arg(lua_State *L, char **argv, int argc, int script) {
  lua_createtable(L, argc - script, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

int main(int argc, char **argv) {
  lua_State *L = luaL_newstate();
  if (!L) { fprintf(stderr, "%s: cannot create a Lua state\n", argv[0]); return 1; }
  luaL_openlibs(L);
  /* C modules stay mapped until the process exits: closing the state (here,
   * or os.exit(code, true) as busted does) would dlclose them through the
   * __gc of the registry's _CLIBS table, and LeakSanitizer, which runs at
   * exit, would then report what a module's statics still hold (crun.core's
   * flight-recorder ring) as leaked and name its frames by a neighbouring
   * library's offsets ("libasan.so.8.0.0+0x3fc544"). */
  if (lua_getfield(L, LUA_REGISTRYINDEX, "_CLIBS") == LUA_TTABLE) {
    lua_pushnil(L);
    lua_setmetatable(L, -2);
  }
  lua_pop(L, 1);
  int i = 1, ok = 1;
  for (; ok && i < argc && argv[i][0] == '-' && argv[i][1] != '\0'; i++) {
    if (!strcmp(argv[i], "--")) { i++; break; }
    if (strcmp(argv[i], "-e") || i + 1 >= argc) {
      fprintf(stderr, "%s: unsupported option '%s' (this interpreter takes -e code only)\n", argv[0], argv[i]);
      ok = 0;
      break;
    }
    i++;
    ok = luaL_loadbuffer(L, argv[i], strlen(argv[i]), "=(command line)") == LUA_OK
             ? run(L, 0, argv[0]) : (fprintf(stderr, "%s: %s\n", argv[0], lua_tostring(L, -1)), 0);
  }
  if (ok && i < argc) {
    set_arg(L, argv, argc, i);
    const char *path = strcmp(argv[i], "-") ? argv[i] : NULL;
    if (luaL_loadfile(L, path) != LUA_OK) {
      fprintf(stderr, "%s: %s\n", argv[0], lua_tostring(L, -1));
      ok = 0;
    } else {
      for (int k = i + 1; k < argc; k++) lua_pushstring(L, argv[k]);
      ok = run(L, argc - i - 1, argv[0]);
    }
  }
  lua_close(L);
  return ok ? 0 : 1;
}
