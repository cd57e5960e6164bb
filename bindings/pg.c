/* pg.c — Lua bindings for the pg part of crun.h (to be filled in). */
#include "crun_lua.h"

void crun_l_open_pg(lua_State *L) { (void)L; }
