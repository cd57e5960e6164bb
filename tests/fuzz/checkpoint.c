/* checkpoint.c — fuzzes the checkpoint reader: crun.serialize.loads
 * (lua/crun/serialize.lua, what crun.load runs on a file's bytes) and the C
 * it reaches for tensors (core.tensor_from_bytes -> crun_tensor_from_data),
 * in one Lua state. Contract checks (serialize.lua's): loads either returns
 * a value or raises an error whose text starts with "EPROTO: "; a value it
 * returns saves (dumps) and loads again. */
#include "fuzz_lua.h"

/* Calls serialize.fn(arg) protected; returns the lua_pcall status, result on top. */
static int call1(lua_State *L, const char *fn, int arg) {
  fuzz_lua_fn(L, fn);
  lua_pushvalue(L, arg);
  return lua_pcall(L, 1, 1, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lua_State *L = fuzz_lua_state("crun.serialize");
  lua_pushlstring(L, (const char *)data, size); /* 1 */
  if (call1(L, "loads", 1) != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    if (!msg || strncmp(msg, "EPROTO: ", 8) != 0)
      FUZZ_FAIL("loads raised an error without EPROTO: %s", msg ? msg : "(not a string)");
    fuzz_lua_step(L);
    return 0;
  }
  /* 2: the value */
  if (call1(L, "dumps", 2) != LUA_OK) FUZZ_FAIL("a loaded value does not save: %s", lua_tostring(L, -1));
  if (call1(L, "loads", 3) != LUA_OK) FUZZ_FAIL("a saved value does not load: %s", lua_tostring(L, -1));
  fuzz_lua_step(L);
  return 0;
}
