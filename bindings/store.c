/* store.c — Lua bindings for the store part of crun.h (to be filled in). */
#include "crun_lua.h"

void crun_l_open_store(lua_State *L) { (void)L; }
