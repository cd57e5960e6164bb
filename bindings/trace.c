/* trace.c — Lua side of crun/trace.h: the timeline's spans and clock
 * alignment, the flight recorder's dump, and per-group statistics. */
#include "crun_lua.h"

#include <limits.h>
#include <string.h>

/* core.trace_enabled() -> boolean */
static int l_trace_enabled(lua_State *L) {
  lua_pushboolean(L, crun_trace_enabled());
  return 1;
}

/* core.trace_now() -> integer nanoseconds (the timeline's clock) */
static int l_trace_now(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)crun_clock_ns());
  return 1;
}

/* core.trace_span(name, cat, t0_ns, t1_ns): records a finished span. */
static int l_trace_span(lua_State *L) {
  const char *name = crun_l_checkstring(L, 1);
  const char *cat = crun_l_optstring(L, 2, "span");
  lua_Integer t0 = crun_l_checkinteger(L, 3), t1 = crun_l_checkinteger(L, 4);
  /* cat must outlive the event: keep a static copy of the few names used */
  static const char *known[] = {"span", "forward", "backward", "optim", "ddp", "user", NULL};
  const char *c = "user";
  for (int i = 0; known[i]; i++)
    if (strcmp(known[i], cat) == 0) c = known[i];
  crun_trace_span(name, c, (uint64_t)t0, (uint64_t)t1);
  return 0;
}

/* core.trace_instant(name): records an instant event now. */
static int l_trace_instant(lua_State *L) {
  crun_trace_instant(crun_l_checkstring(L, 1), "user", crun_clock_ns());
  return 0;
}

/* core.trace_align(store, tag, rank, size[, timeout]) */
static int l_trace_align(lua_State *L) {
  crun_store_t *st = crun_l_check_store(L, 1);
  const char *tag = crun_l_checkstring(L, 2);
  int rank = (int)crun_l_check_range(L, crun_l_checkinteger(L, 3), 0, INT_MAX, "trace_align", "rank");
  int size = (int)crun_l_check_range(L, crun_l_checkinteger(L, 4), 1, INT_MAX, "trace_align", "size");
  CRUN_L_CHECK(L, crun_trace_align(st, tag, rank, size, crun_l_optnumber(L, 5, 60)));
  return 0;
}

/* core.trace_start(path | nil): nil stops the timeline and drops its events */
static int l_trace_start(lua_State *L) {
  CRUN_L_CHECK(L, crun_trace_start(lua_isnoneornil(L, 1) ? NULL : crun_l_checkstring(L, 1)));
  return 0;
}

/* core.trace_mode([mode]) -> previous mode (bit 1 flight recorder, bit 2 timeline) */
static int l_trace_mode(lua_State *L) {
  int mode = lua_isnoneornil(L, 1) ? -1 : (int)crun_l_check_range(L, crun_l_checkinteger(L, 1), 0, 3, "trace_mode", "mode");
  lua_pushinteger(L, crun_trace_mode(mode));
  return 1;
}

/* core.trace_flush() */
static int l_trace_flush(lua_State *L) {
  CRUN_L_CHECK(L, crun_trace_flush());
  return 0;
}

/* core.flight_dump([reason]) -> path of the dump */
static int l_flight_dump(lua_State *L) {
  char path[4096];
  CRUN_L_CHECK(L, crun_flight_dump(crun_l_optstring(L, 1, "request"), path, sizeof path));
  lua_pushstring(L, path);
  return 1;
}

/* core.flight_arm() */
static int l_flight_arm(lua_State *L) {
  CRUN_L_CHECK(L, crun_flight_arm());
  return 0;
}

/* core.pg_stats(pg[, reset]) -> {all_reduce = {ops=, bytes=, time=, wait=}, ...}
 * (only the ops that ran at least once) */
static int l_pg_stats(lua_State *L) {
  crun_pg_t *pg = crun_l_check_pg(L, 1);
  crun_pg_stat_t s[CRUN_PG_STAT_OPS];
  CRUN_L_CHECK(L, crun_pg_stats(pg, s, lua_toboolean(L, 2)));
  lua_newtable(L);
  for (int i = 0; i < CRUN_PG_STAT_OPS; i++) {
    if (!s[i].ops) continue;
    lua_createtable(L, 0, 4);
    lua_pushinteger(L, (lua_Integer)s[i].ops);
    lua_setfield(L, -2, "ops");
    lua_pushinteger(L, (lua_Integer)s[i].bytes);
    lua_setfield(L, -2, "bytes");
    lua_pushnumber(L, s[i].time_s);
    lua_setfield(L, -2, "time");
    lua_pushnumber(L, s[i].wait_s);
    lua_setfield(L, -2, "wait");
    lua_setfield(L, -2, crun_pg_stat_name(i));
  }
  return 1;
}

void crun_l_open_trace(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"trace_enabled", l_trace_enabled}, {"trace_now", l_trace_now}, {"trace_span", l_trace_span},
      {"trace_instant", l_trace_instant}, {"trace_align", l_trace_align}, {"trace_flush", l_trace_flush},
      {"trace_start", l_trace_start}, {"trace_mode", l_trace_mode},
      {"flight_dump", l_flight_dump}, {"flight_arm", l_flight_arm}, {"pg_stats", l_pg_stats}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
