/* train.c — Lua bindings for nn hot loops, optimizers, sampler and DDP (to be filled in). */
#include "crun_lua.h"

void crun_l_open_train(lua_State *L) { (void)L; }
