/* check.c — the argument checks of every binding, lauxlib's luaL_check* with
 * the status first: a bad argument raises "EINVAL: bad argument #n to 'f'
 * (integer expected, got string)" without a position prefix, so every error
 * of crun.core starts with its status name (crun_l_argerror, module.c). */
#include "crun_lua.h"

#include <stdatomic.h>
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

/* The metatables crun creates, found by the address of their name (the
 * *_MT constants). luaL_testudata looks the name up in the registry, which
 * costs ~300 instructions per argument (interning the string, a hash lookup):
 * on a small collective's path that was an eighth of the whole call.
 * crun_l_checkudata compares the userdata's metatable with the cached one
 * instead. Only the Lua state that registers first is cached (crun-lua has one
 * per process); another state, or a name not cached, takes lauxlib's lookup.
 * When that state closes, a finalizer empties the cache before the state's
 * tables are freed, so a stale address can never match a new table. */
enum { MT_CACHE = 32 };
static struct {
  const char *_Atomic name;
  const void *_Atomic mt;
} mt_cache[MT_CACHE];
static atomic_int mt_n;
static const void *_Atomic mt_owner; /* the sentinel userdata of the caching state */
static const char MT_SENTINEL[] = "crun.metatable_cache";

static int mt_sentinel_gc(lua_State *L) {
  const void *me = lua_topointer(L, 1);
  if (atomic_load(&mt_owner) == me) {
    atomic_store(&mt_n, 0);
    atomic_store(&mt_owner, NULL);
  }
  return 0;
}

/* Returns 1 when this state owns the cache (claiming it when free). */
static int mt_cache_mine(lua_State *L) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, MT_SENTINEL) == LUA_TUSERDATA) {
    int mine = atomic_load(&mt_owner) == lua_topointer(L, -1);
    lua_pop(L, 1);
    return mine;
  }
  lua_pop(L, 1);
  if (atomic_load(&mt_owner)) return 0;
  lua_newuserdatauv(L, 1, 0);
  lua_newtable(L);
  lua_pushcfunction(L, mt_sentinel_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  const void *me = lua_topointer(L, -1), *none = NULL;
  lua_setfield(L, LUA_REGISTRYINDEX, MT_SENTINEL);
  return atomic_compare_exchange_strong(&mt_owner, &none, me);
}

void crun_l_cache_metatable(lua_State *L, int idx, const char *tname) {
  idx = lua_absindex(L, idx);
  int n = atomic_load(&mt_n);
  if (n >= MT_CACHE || !mt_cache_mine(L)) return;
  atomic_store(&mt_cache[n].name, tname);
  atomic_store(&mt_cache[n].mt, lua_topointer(L, idx));
  atomic_store(&mt_n, n + 1);
}

/* The userdata at arg when its metatable is cache entry i's, else NULL. */
static void *cached_udata(lua_State *L, int arg, int i) {
  if (lua_type(L, arg) != LUA_TUSERDATA || !lua_getmetatable(L, arg)) return NULL;
  int same = lua_topointer(L, -1) == atomic_load_explicit(&mt_cache[i].mt, memory_order_relaxed);
  lua_pop(L, 1);
  return same ? lua_touserdata(L, arg) : NULL;
}

/* The cache entry of tname, or -1. */
static int cache_slot(const char *tname) {
  int n = atomic_load_explicit(&mt_n, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (atomic_load_explicit(&mt_cache[i].name, memory_order_relaxed) == tname) return i;
  return -1;
}

void *crun_l_checkudata(lua_State *L, int arg, const char *tname) {
  int i = cache_slot(tname);
  void *p = i >= 0 ? cached_udata(L, arg, i) : NULL;
  if (p) return p;
  p = luaL_testudata(L, arg, tname);
  if (!p) crun_l_typeerror(L, arg, tname);
  return p;
}

void *crun_l_testudata_cached(lua_State *L, int arg, const char *tname, _Atomic int *slot) {
  int n = atomic_load_explicit(&mt_n, memory_order_acquire);
  int i = atomic_load_explicit(slot, memory_order_relaxed);
  if (i < 0 || i >= n || atomic_load_explicit(&mt_cache[i].name, memory_order_relaxed) != tname) {
    if ((i = cache_slot(tname)) < 0) return NULL;
    atomic_store_explicit(slot, i, memory_order_relaxed);
  }
  return cached_udata(L, arg, i);
}

int crun_l_checkoption(lua_State *L, int arg, const char *def, const char *const names[]) {
  const char *name = def && lua_isnoneornil(L, arg) ? def : crun_l_checklstring(L, arg, NULL);
  for (int i = 0; names[i]; i++)
    if (strcmp(names[i], name) == 0) return i;
  return crun_l_argerror(L, arg, lua_pushfstring(L, "invalid option '%s'", name));
}
