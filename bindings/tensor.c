/* tensor.c — Lua bindings for the tensor part of crun.h (to be filled in). */
#include "crun_lua.h"

void crun_l_open_tensor(lua_State *L) { (void)L; }
