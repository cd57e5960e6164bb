/* check.c — the argument checks of every binding, lauxlib's luaL_check* with
 * the status first: a bad argument raises "EINVAL: bad argument #n to 'f'
 * (integer expected, got string)" without a position prefix, so every error
 * of crun.core starts with its status name (crun_l_argerror, module.c). */
#include "crun_lua.h"

#include <string.h>

/* The type name lauxlib reports for the value at arg: its metatable's
 * __name when it has one (e.g. crun.Tensor), else the basic type. */
static const char *type_name(lua_State *L, int arg) {
  if (luaL_getmetafield(L, arg, "__name") == LUA_TSTRING) return lua_tostring(L, -1);
  if (lua_type(L, arg) == LUA_TLIGHTUSERDATA) return "light userdata";
  return luaL_typename(L, arg);
}

int crun_l_typeerror(lua_State *L, int arg, const char *tname) {
  const char *got = type_name(L, arg);
  return crun_l_argerror(L, arg, lua_pushfstring(L, "%s expected, got %s", tname, got));
}

lua_Integer crun_l_checkinteger(lua_State *L, int arg) {
  int ok;
  lua_Integer v = lua_tointegerx(L, arg, &ok);
  if (!ok) {
    if (lua_isnumber(L, arg)) crun_l_argerror(L, arg, "number has no integer representation");
    crun_l_typeerror(L, arg, "number");
  }
  return v;
}

lua_Integer crun_l_optinteger(lua_State *L, int arg, lua_Integer def) {
  return lua_isnoneornil(L, arg) ? def : crun_l_checkinteger(L, arg);
}

lua_Number crun_l_checknumber(lua_State *L, int arg) {
  int ok;
  lua_Number v = lua_tonumberx(L, arg, &ok);
  if (!ok) crun_l_typeerror(L, arg, "number");
  return v;
}

lua_Number crun_l_optnumber(lua_State *L, int arg, lua_Number def) {
  return lua_isnoneornil(L, arg) ? def : crun_l_checknumber(L, arg);
}

const char *crun_l_checklstring(lua_State *L, int arg, size_t *len) {
  const char *s = lua_tolstring(L, arg, len);
  if (!s) crun_l_typeerror(L, arg, "string");
  return s;
}

const char *crun_l_optlstring(lua_State *L, int arg, const char *def, size_t *len) {
  if (!lua_isnoneornil(L, arg)) return crun_l_checklstring(L, arg, len);
  if (len) *len = def ? strlen(def) : 0;
  return def;
}

void crun_l_checktype(lua_State *L, int arg, int t) {
  if (lua_type(L, arg) != t) crun_l_typeerror(L, arg, lua_typename(L, t));
}

void *crun_l_checkudata(lua_State *L, int arg, const char *tname) {
  void *p = luaL_testudata(L, arg, tname);
  if (!p) crun_l_typeerror(L, arg, tname);
  return p;
}

int crun_l_checkoption(lua_State *L, int arg, const char *def, const char *const names[]) {
  const char *name = def && lua_isnoneornil(L, arg) ? def : crun_l_checklstring(L, arg, NULL);
  for (int i = 0; names[i]; i++)
    if (strcmp(names[i], name) == 0) return i;
  return crun_l_argerror(L, arg, lua_pushfstring(L, "invalid option '%s'", name));
}
