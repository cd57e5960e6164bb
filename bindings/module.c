/* module.c — luaopen_crun_core and the helpers shared by every binding file. */
#include "crun_lua.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>

int crun_l_fail(lua_State *L, int status) {
  const char *msg = crun_last_error();
  if (!msg || !*msg) msg = crun_strerror(status);
  /* The detail already starts with the status name; keep it the first word. */
  if (strncmp(msg, crun_err_name(status), strlen(crun_err_name(status))) == 0)
    lua_pushstring(L, msg);
  else
    lua_pushfstring(L, "%s: %s", crun_err_name(status), msg);
  return lua_error(L);
}

int crun_l_error(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  return lua_error(L);
}

/* Pushes "mod.field" when the function on the top of the stack is a field of
 * a loaded module (package.loaded), as lauxlib names functions called
 * without a name; pops the function and returns the name or NULL. */
static const char *global_func_name(lua_State *L) {
  int top = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_pushnil(L);
  while (lua_next(L, -2)) { /* module name at -2, module at -1 */
    if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TTABLE) {
      lua_pushnil(L);
      while (lua_next(L, -2)) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_rawequal(L, -1, top)) {
          const char *name = lua_pushfstring(L, "%s.%s", lua_tostring(L, -4), lua_tostring(L, -2));
          lua_replace(L, top); /* keeps the name alive in the function's slot */
          lua_settop(L, top);
          return name;
        }
        lua_pop(L, 1);
      }
    }
    lua_pop(L, 1);
  }
  lua_settop(L, top - 1);
  return NULL;
}

/* The method name recorded for the function on the top of the stack
 * (CRUN_L_METHOD_NAMES), or NULL; the stack is left as it was. */
static const char *recorded_method_name(lua_State *L) {
  const char *name = NULL;
  if (lua_getfield(L, LUA_REGISTRYINDEX, CRUN_L_METHOD_NAMES) == LUA_TTABLE) {
    lua_pushvalue(L, -2);
    if (lua_rawget(L, -2) == LUA_TSTRING) name = lua_tostring(L, -1); /* (the table keeps it alive) */
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return name;
}

/* Whether a call named so came through a local, an upvalue or no name (a
 * Lua wrapper's call of the binding), not as a method, field or global. */
static int called_unnamed(const lua_Debug *ar) {
  static const char *named[] = {"method", "field", "global", "metamethod"};
  for (size_t i = 0; ar->namewhat && i < sizeof named / sizeof *named; i++)
    if (strcmp(ar->namewhat, named[i]) == 0) return 0;
  return 1;
}

int crun_l_argerror(lua_State *L, int arg, const char *msg) {
  lua_Debug ar;
  const char *name = "?";
  if (lua_getstack(L, 0, &ar)) {
    lua_getinfo(L, "nf", &ar);
    int hidden_self = lua_iscfunction(L, -1) && crun_l_hidden_self(lua_tocfunction(L, -1));
    const char *method = called_unnamed(&ar) ? recorded_method_name(L) : NULL;
    if (method) ar.name = method, ar.namewhat = "method";
    if (ar.name) {
      name = ar.name;
      lua_pop(L, 1);
    } else {
      const char *g = global_func_name(L);
      if (g) name = g;
    }
    if (hidden_self || (ar.namewhat && strcmp(ar.namewhat, "method") == 0)) {
      arg--; /* self is not counted, as luaL_argerror does */
      if (arg == 0) return crun_l_error(L, "EINVAL: calling '%s' on bad self (%s)", name, msg);
    }
  }
  return crun_l_error(L, "EINVAL: bad argument #%d to '%s' (%s)", arg, name, msg);
}

void crun_l_newclass(lua_State *L, const char *name, const luaL_Reg *methods) {
  luaL_newmetatable(L, name);
  crun_l_cache_metatable(L, -1, name);
  luaL_setfuncs(L, methods, 0);
  if (lua_getfield(L, -1, "__index") == LUA_TNIL) {
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    lua_setfield(L, -2, "__index");
  } else {
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

double crun_l_optfield_number(lua_State *L, int idx, const char *field, double def) {
  double v = def;
  if (lua_getfield(L, idx, field) != LUA_TNIL) {
    if (!lua_isnumber(L, -1)) crun_l_error(L, "EINVAL: bad field '%s' (number expected, got %s)", field, luaL_typename(L, -1));
    v = lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

lua_Integer crun_l_optfield_integer(lua_State *L, int idx, const char *field, lua_Integer def) {
  lua_Integer v = def;
  if (lua_getfield(L, idx, field) != LUA_TNIL) {
    int ok;
    v = lua_tointegerx(L, -1, &ok);
    if (!ok) crun_l_error(L, "EINVAL: bad field '%s' (integer expected, got %s)", field, luaL_typename(L, -1));
  }
  lua_pop(L, 1);
  return v;
}

int crun_l_optfield_boolean(lua_State *L, int idx, const char *field, int def) {
  int v = def;
  if (lua_getfield(L, idx, field) != LUA_TNIL) v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

const char *crun_l_optfield_string(lua_State *L, int idx, const char *field, const char *def) {
  const char *v = def;
  if (lua_getfield(L, idx, field) != LUA_TNIL) {
    if (!lua_isstring(L, -1)) crun_l_error(L, "EINVAL: bad field '%s' (string expected, got %s)", field, luaL_typename(L, -1));
    v = lua_tostring(L, -1); /* stays alive: the table holds the string */
  }
  lua_pop(L, 1);
  return v;
}

lua_Integer crun_l_check_range(lua_State *L, lua_Integer v, lua_Integer lo, lua_Integer hi,
                               const char *fname, const char *what) {
  if (v < lo || v > hi) {
    crun_error(CRUN_EINVAL, "%s: %s %lld is out of range (%lld..%lld)", fname, what, (long long)v,
               (long long)lo, (long long)hi);
    crun_l_fail(L, CRUN_EINVAL);
  }
  return v;
}

lua_Integer crun_l_optfield_range(lua_State *L, int idx, const char *field, lua_Integer def, lua_Integer lo,
                                  lua_Integer hi, const char *fname) {
  return crun_l_check_range(L, crun_l_optfield_integer(L, idx, field, def), lo, hi, fname, field);
}

/* core.clock() -> monotonic seconds. */
static int l_clock(lua_State *L) {
  lua_pushnumber(L, crun_clock());
  return 1;
}

/* core.strerror(code) -> name, message. */
static int l_strerror(lua_State *L) {
  int code = (int)crun_l_check_range(L, crun_l_checkinteger(L, 1), INT_MIN, INT_MAX, "strerror", "code");
  lua_pushstring(L, crun_err_name(code));
  lua_pushstring(L, crun_strerror(code));
  return 2;
}

/* core.log(level, subsys, msg): logs through the runtime's logger. */
static int l_log(lua_State *L) {
  static const char *levels[] = {"NONE", "WARN", "INFO", "TRACE", NULL};
  int level = crun_l_checkoption(L, 1, "INFO", levels);
  const char *msg = crun_l_checkstring(L, 2);
  if (crun_log_enabled((crun_log_level_t)level, CRUN_SUB_LUA))
    crun_log((crun_log_level_t)level, CRUN_SUB_LUA, "%s", msg);
  return 0;
}

/* core.set_log_rank(rank) */
static int l_set_log_rank(lua_State *L) {
  crun_log_set_rank((int)crun_l_check_range(L, crun_l_checkinteger(L, 1), -1, INT_MAX, "set_log_rank", "rank"));
  return 0;
}

/* core.set_flush_denormal(on) -> whether the CPU supports it (torch's name and meaning) */
static int l_set_flush_denormal(lua_State *L) {
  crun_l_checktype(L, 1, LUA_TBOOLEAN);
  lua_pushboolean(L, crun_set_flush_denormal(lua_toboolean(L, 1)));
  return 1;
}

void crun_l_open_core(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"clock", l_clock}, {"strerror", l_strerror}, {"log", l_log},
      {"set_log_rank", l_set_log_rank}, {"set_flush_denormal", l_set_flush_denormal}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
  lua_pushstring(L, CRUN_VERSION_STRING);
  lua_setfield(L, -2, "version");
  lua_pushboolean(L, CRUN_HAVE_MPI);
  lua_setfield(L, -2, "have_mpi");
  lua_pushboolean(L, CRUN_HAVE_NCCL);
  lua_setfield(L, -2, "have_nccl");
}

int luaopen_crun_core(lua_State *L) {
  lua_newtable(L);
  crun_l_open_core(L);
  crun_l_open_metrics(L);
  crun_l_open_store(L);
  crun_l_open_tensor(L);
  crun_l_open_cuda(L);
  crun_l_open_pg(L);
  crun_l_open_train(L);
  crun_l_open_trace(L);
  return 1;
}
