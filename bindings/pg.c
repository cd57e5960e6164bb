/* pg.c — Lua bindings for crun/pg.h: crun.ProcessGroup (every collective on
 * crun.Tensor arguments, plus byte-string collectives for the object ones in
 * lua/crun/dist.lua) and crun.Work (async handles that keep their tensors
 * alive until the work finished). Ranks are 0-based, as in torch. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crun_lua.h"

#define PG_MT "crun.ProcessGroup"
#define WORK_MT "crun.Work"

typedef struct {
  crun_pg_t *pg;
  int rank, size, global; /* kept for the error of a call on it once destroyed */
} l_pg;
/* A Work: the handle, and whether the tensors it uses are still pinned.
 * User value 1: every value the operation uses (tensors of argument lists
 * included, so dropping or editing a list cannot free a buffer in flight);
 * user value 2: torch's result() list. */
typedef struct {
  crun_work_t *w;
  int pinned;
} l_work;

/* How a message names group rank r whose global rank is g, as the runtime's
 * do: "rank G" (dist.get_rank(), crun-lua's "[rank G]"), then " (group rank
 * r)" when r is not G (a sub-group), so that one text reads one way. WHO(pg,
 * r) is a "%s" argument that lives until the end of the full expression. */
typedef struct {
  char s[48];
} who_t;
static who_t who_of(int g, int r) {
  who_t w;
  if (g < 0 || g == r) snprintf(w.s, sizeof w.s, "rank %d", r);
  else snprintf(w.s, sizeof w.s, "rank %d (group rank %d)", g, r);
  return w;
}
#define WHO(pg, r) (who_of(crun_pg_global_rank((pg), (r)), (r)).s)

/* Returns the live group of the userdata at idx (raises on a destroyed one). */
/* u's group; raises ECLOSED once it was destroyed. */
static crun_pg_t *live_pg(lua_State *L, const l_pg *u) {
  if (!u->pg) {
    lua_Debug ar;
    const char *call = lua_getstack(L, 0, &ar) && lua_getinfo(L, "n", &ar) ? ar.name : NULL;
    crun_error(CRUN_ECLOSED, "%s %s%s%s a process group (%d rank%s) that was destroyed before "
               "(destroy_process_group or pg:destroy())", who_of(u->global, u->rank).s, call ? "called " : "used", call ? call : "",
               call ? "() on" : "", u->size, u->size == 1 ? "" : "s");
    crun_l_fail(L, CRUN_ECLOSED);
  }
  return u->pg;
}

static crun_pg_t *check_pg(lua_State *L, int idx) { return live_pg(L, crun_l_checkudata(L, idx, PG_MT)); }

crun_pg_t *crun_l_check_pg(lua_State *L, int idx) { return check_pg(L, idx); }

static void push_pg(lua_State *L, crun_pg_t *pg) {
  l_pg *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->pg = pg;
  u->rank = crun_pg_rank(pg), u->size = crun_pg_size(pg), u->global = crun_pg_global_rank(pg, u->rank);
  luaL_setmetatable(L, PG_MT);
}

/* Returns a contiguous tensor argument. */
static crun_tensor_t *check_tensor(lua_State *L, int idx, const char *fname) {
  crun_tensor_t *t = crun_l_check_tensor(L, idx);
  if (!crun_tensor_is_contiguous(t))
    crun_l_error(L, "EINVAL: bad argument #%d to '%s' (tensor must be contiguous; call :contiguous())", idx - 1, fname);
  return t;
}

/* Reads a rank argument (integer, 0-based) of group pg: 0..size-1, else EINVAL. */
static int check_rank_arg(lua_State *L, int idx, crun_pg_t *pg, const char *fname, const char *what) {
  return (int)crun_l_check_range(L, crun_l_checkinteger(L, idx), 0, crun_pg_size(pg) - 1, fname, what);
}

/* "cuda" for a tensor on a device (device index dev >= 0), else "cpu". */
static const char *place(int dev) { return dev >= 0 ? "cuda" : "cpu"; }

/* The type name of the value at idx as lauxlib's errors give it: its
 * metatable's __name (crun.Tensor, ...) or its basic type. Pushes it. */
static const char *type_of(lua_State *L, int idx) {
  if (luaL_getmetafield(L, idx, "__name") == LUA_TSTRING) return lua_tostring(L, -1);
  return lua_pushstring(L, luaL_typename(L, idx));
}

static int refuse_top(lua_State *L, crun_pg_t *pg, const char *call, int root, int cuda);

/* The reduce op (at idx) of reducing method fname was wrong on this rank,
 * with the fault pushed (no status): refuses the call for the group, as a
 * list fault is (refuse_top), so that the peers fail it naming this rank
 * rather than meeting its next call. Every reducing method has its group at
 * slot 1 and its (output) tensor at slot 2, reduce its root at slot 3; the
 * _tensor forms run as the collective without the suffix. */
static int op_refuse(lua_State *L, const char *fname) {
  crun_pg_t *pg = check_pg(L, 1);
  crun_tensor_t *t = crun_l_test_tensor(L, 2);
  char call[32];
  size_t k = strlen(fname);
  if (k > 7 && strcmp(fname + k - 7, "_tensor") == 0) k -= 7;
  snprintf(call, sizeof call, "%.*s", (int)k, fname);
  int root = strcmp(fname, "reduce") == 0 ? (int)lua_tointeger(L, 3) : -1;
  return refuse_top(L, pg, call, root, t && crun_tensor_device(t) >= 0);
}

/* Reads the reduce op at idx of method fname: a name ("sum", "SUM",
 * dist.ReduceOp.SUM); default sum. Anything else is refused (op_refuse). */
static crun_reduce_op_t check_op(lua_State *L, int idx, const char *fname) {
  if (lua_isnoneornil(L, idx)) return CRUN_OP_SUM;
  crun_reduce_op_t op;
  const char *name = lua_tostring(L, idx);
  if (!name) {
    lua_pushfstring(L, "bad argument #%d to '%s' (reduce op name expected, got %s)", idx - 1, fname, type_of(L, idx));
    return op_refuse(L, fname);
  }
  if (strncmp(name, "premul_sum:", 11) == 0) return CRUN_OP_PREMUL_SUM;
  if (crun_reduce_op_parse(name, &op) < 0) {
    lua_pushfstring(L, "bad argument #%d to '%s' (unknown reduce op '%s'; use sum, product, min, max, avg, band, bor "
                    "or bxor)", idx - 1, fname, name);
    return op_refuse(L, fname);
  }
  return op;
}

/* The factor of "premul_sum:<factor>" (dist.make_premul_sum) at idx, for
 * an op check_op read as premul_sum; none or a NaN one is refused (op_refuse). */
static double premul_arg(lua_State *L, int idx, crun_reduce_op_t op, const char *fname) {
  if (op != CRUN_OP_PREMUL_SUM) return 1.0;
  const char *s = lua_tostring(L, idx), *c = s ? strchr(s, ':') : NULL;
  char *end = NULL;
  double f = c ? strtod(c + 1, &end) : 0;
  if (!c || end == c + 1 || *end != '\0')
    return lua_pushliteral(L, "premul_sum needs a factor: use dist.make_premul_sum(factor)"), op_refuse(L, fname);
  if (f != f)
    return lua_pushliteral(L, "premul_sum: the factor is NaN (dist.make_premul_sum refuses it too)"), op_refuse(L, fname);
  return f;
}

/* Pushes the fault of method fname's options on this rank: "fname on rank
 * R: <fmt>", R the global rank of the group at slot 1 (as torch numbers
 * ranks in messages; every method has its group there), then its group rank
 * on a sub-group (who_of). Returns 1. */
static int opts_fault(lua_State *L, const char *fname, const char *fmt, ...) {
  const l_pg *u = luaL_testudata(L, 1, PG_MT);
  va_list ap;
  va_start(ap, fmt);
  lua_pushfstring(L, "%s on %s: ", fname, !u ? "rank -1" : who_of(u->global, u->rank).s);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 2);
  return 1;
}

/* Reads method fname's options at idx {timeout=, tag=, async_op=} into o
 * and *async, each field once; 1 with the fault pushed (no status) when
 * they are not a table, a timeout is no number, a tag no int or an
 * async_op no boolean (torch's is a bool, and Lua's truth of 0 or "" is not
 * Python's); 0 otherwise. */
static int read_opts(lua_State *L, int idx, const char *fname, crun_coll_opts_t *o, int *async) {
  if (!lua_istable(L, idx))
    return lua_pushfstring(L, "bad argument #%d to '%s' (table expected, got %s)", idx - 1, fname, type_of(L, idx)), 1;
  int ty = lua_getfield(L, idx, "timeout");
  if (ty != LUA_TNIL && !lua_isnumber(L, -1)) {
    lua_pop(L, 1);
    return opts_fault(L, fname, "bad field 'timeout' (number expected, got %s)", lua_typename(L, ty));
  }
  o->timeout = ty == LUA_TNIL ? 0 : lua_tonumber(L, -1);
  ty = lua_getfield(L, idx, "tag");
  int isint = 0;
  lua_Integer v = lua_tointegerx(L, -1, &isint);
  lua_pop(L, 2);
  if (ty != LUA_TNIL && !isint)
    return opts_fault(L, fname, "bad field 'tag' (integer expected, got %s)", lua_typename(L, ty));
  if (ty != LUA_TNIL && (v < INT_MIN || v > INT_MAX))
    return opts_fault(L, fname, "tag %I is out of range (%d..%d)", (LUA_INTEGER)v, INT_MIN, INT_MAX);
  o->tag = ty == LUA_TNIL ? 0 : (int)v;
  ty = lua_getfield(L, idx, "async_op");
  *async = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (ty != LUA_TNIL && ty != LUA_TBOOLEAN)
    return opts_fault(L, fname, "bad field 'async_op' (boolean expected, got %s)", lua_typename(L, ty));
  return 0;
}

/* Reads {timeout=, tag=, async_op=} at idx; returns async_op. A fault of
 * collective fname's options (read_opts) is refused for its group pg, as
 * the peers' may be right (fname's "_into_tensor", "_tensor", "_bytes" or
 * "_single" suffix dropped: the call the peers run, which crun_pg_refuse
 * must know, or it refuses nothing); pg NULL (send, recv): raised on this
 * rank alone. */
static int check_opts(lua_State *L, int idx, crun_coll_opts_t *o, const char *fname, crun_pg_t *pg) {
  memset(o, 0, sizeof *o);
  if (lua_isnoneornil(L, idx)) return 0;
  int async = 0;
  if (!read_opts(L, idx, fname, o, &async)) return async;
  if (!pg) return crun_l_error(L, "EINVAL: %s", lua_tostring(L, -1));
  char call[32];
  size_t k = strlen(fname);
  if (k > 12 && strcmp(fname + k - 12, "_into_tensor") == 0) k -= 12;
  else if (k > 7 && strcmp(fname + k - 7, "_tensor") == 0) k -= 7;
  else if (k > 6 && strcmp(fname + k - 6, "_bytes") == 0) k -= 6;
  else if (k > 7 && strcmp(fname + k - 7, "_single") == 0) k -= 7;
  snprintf(call, sizeof call, "%.*s", (int)k, fname);
  crun_tensor_t *t = crun_l_test_tensor(L, 2);
  return refuse_top(L, pg, call, -1, t && crun_tensor_device(t) >= 0);
}

/* The open, contiguous tensor at idx: argument arg of fname, or entry `entry`
 * (1-based) of its list when entry > 0. Else NULL with the fault pushed
 * ("bad argument #arg to 'fname' (...)", no status): the caller refuses the
 * call for the group before it raises it. */
static crun_tensor_t *tensor_fault(lua_State *L, int idx, int arg, int entry, const char *fname) {
  crun_tensor_t *t = crun_l_test_tensor(L, idx);
  if (t && crun_tensor_is_contiguous(t)) return t;
  const char *what = entry ? lua_pushfstring(L, "tensor %d", entry) : "tensor";
  if (!t && !luaL_testudata(L, idx, "crun.Tensor"))
    lua_pushfstring(L, "bad argument #%d to '%s' (%s%scrun.Tensor expected, got %s)", arg, fname,
                    entry ? lua_pushfstring(L, "entry %d", entry) : "", entry ? ": " : "", type_of(L, idx));
  else if (!t)
    lua_pushfstring(L, "bad argument #%d to '%s' (%s is closed)", arg, fname, what);
  else
    lua_pushfstring(L, "bad argument #%d to '%s' (%s must be contiguous; call :contiguous())", arg, fname, what);
  return NULL;
}

/* Whether the value at idx (argument idx - 1 of method fname) is not a list
 * of n entries: 1 with the fault pushed (no status), else 0. */
static int list_len_fault(lua_State *L, int idx, int n, const char *fname) {
  if (!lua_istable(L, idx))
    return lua_pushfstring(L, "bad argument #%d to '%s' (table expected, got %s)", idx - 1, fname, type_of(L, idx)), 1;
  if ((int)luaL_len(L, idx) != n)
    return lua_pushfstring(L, "bad argument #%d to '%s' (list of %d tensors expected, got %d)", idx - 1, fname, n,
                           (int)luaL_len(L, idx)), 1;
  return 0;
}

/* Checks that the value at idx (argument idx - 1 of method fname) is a list
 * of n open contiguous tensors, each on the device of `like`, of its dtype
 * and size, and fills ptrs[0..n-1] with their data. Returns 0, or 1 with the
 * fault pushed (no status), raising nothing. */
static int list_fault(lua_State *L, int idx, int n, crun_tensor_t *like, const char *fname, void **ptrs) {
  int arg = idx - 1;
  if (list_len_fault(L, idx, n, fname)) return 1;
  for (int i = 0; i < n; i++) {
    lua_geti(L, idx, i + 1);
    crun_tensor_t *t = tensor_fault(L, lua_gettop(L), arg, i + 1, fname);
    if (!t) return 1;
    if (crun_tensor_device(t) != crun_tensor_device(like))
      return lua_pushfstring(L, "bad argument #%d to '%s' (tensor %d is on %s, the other argument on %s)", arg, fname,
                             i + 1, place(crun_tensor_device(t)),
                             place(crun_tensor_device(like))), 1;
    if (crun_tensor_dtype(t) != crun_tensor_dtype(like) || crun_tensor_numel(t) != crun_tensor_numel(like))
      return lua_pushfstring(L, "bad argument #%d to '%s' (tensor %d is %s[%d], expected %s[%d] like the other "
                             "argument)", arg, fname, i + 1, crun_dtype_name(crun_tensor_dtype(t)),
                             (int)crun_tensor_numel(t), crun_dtype_name(crun_tensor_dtype(like)),
                             (int)crun_tensor_numel(like)), 1;
    ptrs[i] = crun_tensor_data(t);
    lua_pop(L, 1);
  }
  return 0;
}

/* This rank's own check of its arguments to collective `call` of pg failed
 * with the text at the top of the stack (no status): refuses the call for the
 * group (crun_pg_refuse: every peer fails this call naming this rank and the
 * text, rather than waiting for it and meeting its next call as an
 * EMISMATCH), then raises "EINVAL: text" (with "every rank refused ...: the group
 * goes on" when every rank refused it: crun_pg_refuse). root: the call's root, or -1;
 * cuda: the call's tensors are on a device (a group of backend "auto" runs
 * it on its device backend, which must carry the refusal). */
static int refuse_top(lua_State *L, crun_pg_t *pg, const char *call, int root, int cuda) {
  const char *text = lua_tostring(L, -1);
  crun_coll_opts_t o = {.cuda = cuda};
  crun_pg_refuse(pg, call, root, &o, CRUN_EINVAL, text);
  return crun_l_error(L, "%s", crun_last_error()); /* the text, and whether the group goes on */
}

/* The tensor argument at idx of collective fname (tensor_fault), refused for
 * the group when it is not one (not a tensor, closed, strided): the peers'
 * may be, and they would pair their call with this rank's next one. */
static crun_tensor_t *refusing_tensor(lua_State *L, crun_pg_t *pg, int idx, const char *fname) {
  crun_tensor_t *t = tensor_fault(L, idx, idx - 1, 0, fname);
  if (t) return t;
  t = crun_l_test_tensor(L, idx);
  return refuse_top(L, pg, fname, -1, t && crun_tensor_device(t) >= 0), NULL;
}

/* Appends the value at idx to the holder table at the top of the stack
 * (pinning it when it is a tensor); a table's elements are appended too. */
static void hold_value(lua_State *L, int idx) {
  int holder = lua_gettop(L);
  if (lua_istable(L, idx)) {
    lua_Integer n = luaL_len(L, idx);
    for (lua_Integer i = 1; i <= n; i++) {
      lua_geti(L, idx, i);
      crun_l_tensor_pin(L, -1, 1);
      lua_rawseti(L, holder, luaL_len(L, holder) + 1);
    }
  }
  crun_l_tensor_pin(L, idx, 1);
  lua_pushvalue(L, idx);
  lua_rawseti(L, holder, luaL_len(L, holder) + 1);
}

/* Pushes torch's result() list for the output argument at idx (0: none):
 * the tensors of a list, or {tensor}. */
static void push_result(lua_State *L, int idx) {
  lua_newtable(L);
  if (idx == 0 || lua_isnoneornil(L, idx)) return;
  if (!lua_istable(L, idx)) {
    lua_pushvalue(L, idx);
    lua_rawseti(L, -2, 1);
    return;
  }
  lua_Integer n = luaL_len(L, idx);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_geti(L, idx, i);
    lua_rawseti(L, -2, i);
  }
}

/* Finishes a collective call: raises on failure; when async pushes a Work
 * that holds (and pins) every value in stack slots first..last until the
 * operation completed; `out` is the output argument's slot (0: none). */
static int finish(lua_State *L, int rc, crun_work_t *w, int async, int first, int last, int out) {
  if (rc < 0) return crun_l_fail(L, rc);
  if (!async) return 0;
  l_work *u = lua_newuserdatauv(L, sizeof *u, 2);
  u->w = w;
  u->pinned = 1;
  luaL_setmetatable(L, WORK_MT);
  lua_newtable(L);
  for (int i = first; i <= last; i++) hold_value(L, i);
  lua_setiuservalue(L, -2, 1);
  push_result(L, out);
  lua_setiuservalue(L, -2, 2);
  return 1;
}

/* Unpins the tensors of the Work at idx once its operation completed. */
static void unpin_if_done(lua_State *L, int idx) {
  l_work *u = crun_l_checkudata(L, idx, WORK_MT);
  if (!u->pinned || !u->w || !crun_work_is_completed(u->w)) return;
  u->pinned = 0;
  lua_getiuservalue(L, idx, 1);
  lua_Integer n = luaL_len(L, -1);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_geti(L, -1, i);
    crun_l_tensor_pin(L, -1, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  lua_pushnil(L);
  lua_setiuservalue(L, idx, 1);
}

#define WORK_ARG(async) ((async) ? &w : NULL)

/* pg:all_reduce(t[, op][, opts]) on pg, the checked group at slot 1 */
static int all_reduce_on(lua_State *L, crun_pg_t *pg) {
  crun_tensor_t *t = refusing_tensor(L, pg, 2, "all_reduce");
  crun_reduce_op_t op = check_op(L, 3, "all_reduce");
  crun_coll_opts_t o;
  int async = check_opts(L, 4, &o, "all_reduce", pg);
  o.cuda = crun_tensor_device(t) >= 0;
  o.premul_factor = premul_arg(L, 3, op, "all_reduce");
  crun_work_t *w = NULL;
  int rc = crun_pg_all_reduce(pg, crun_tensor_data(t), (size_t)crun_tensor_numel(t), crun_tensor_dtype(t), op, &o, WORK_ARG(async));
  return finish(L, rc, w, async, 2, 2, 2);
}

static int l_all_reduce(lua_State *L) { return all_reduce_on(L, check_pg(L, 1)); }

/* dist.all_reduce(t[, op][, opts]) as a C closure over (the Lua
 * dist.all_reduce, the default group or nil): the common call, on the
 * default group with no options, goes straight to all_reduce_on with the
 * group inserted as self; any other call goes to the Lua function. This saves
 * a Lua call frame per operation (~500 instructions of a ~3,000-instruction
 * 2-rank 8-byte all_reduce). dist.lua sets the group when it makes or
 * destroys the default group (core.fast_all_reduce_group), so a call looks
 * up neither state.pg (a table lookup by string, ~120 instructions) nor the
 * group's metatable. crun_l_argerror counts the inserted self as a method's
 * (crun_l_hidden_self), so errors name the user's argument numbers.
 * The commonest call of all, dist.all_reduce(t) of an open contiguous CPU
 * tensor on that group (a sum, blocking), skips the rest of the argument
 * reading too: no stack rotation, op or options parse, and the tensor is
 * recognised by its cached metatable alone; anything else (another op, a
 * table of options, a CUDA or strided tensor, a closed one, not a tensor)
 * takes the checked path, which names what is wrong. */
static int l_dist_all_reduce(lua_State *L) {
  int n = lua_gettop(L);
  l_pg *u;
  if (n <= 2 && (n < 2 || !lua_istable(L, 2)) && (u = lua_touserdata(L, lua_upvalueindex(2)))) {
    crun_tensor_t *t;
    void *data;
    size_t count;
    crun_dtype_t dt;
    if (u->pg && (n < 2 || lua_isnil(L, 2)) && (t = crun_l_tensor_or_null(L, 1)) &&
        crun_tensor_host_span(t, &data, &count, &dt)) {
      int rc = crun_pg_all_reduce(u->pg, data, count, dt, CRUN_OP_SUM, NULL, NULL);
      return rc < 0 ? crun_l_fail(L, rc) : 0;
    }
    lua_pushvalue(L, lua_upvalueindex(2));
    lua_insert(L, 1);
    return all_reduce_on(L, live_pg(L, u));
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, n, LUA_MULTRET);
  return lua_gettop(L);
}

int crun_l_hidden_self(lua_CFunction f) { return f == l_dist_all_reduce; }

/* core.fast_all_reduce(slow) -> the closure above, with no group yet */
static int l_fast_all_reduce(lua_State *L) {
  crun_l_checktype(L, 1, LUA_TFUNCTION);
  lua_settop(L, 1);
  lua_pushnil(L);
  lua_pushcclosure(L, l_dist_all_reduce, 2);
  return 1;
}

/* core.fast_all_reduce_group(closure, group or nil): the default group the
 * closure serves from now on */
static int l_fast_all_reduce_group(lua_State *L) {
  if (lua_tocfunction(L, 1) != l_dist_all_reduce)
    return crun_l_argerror(L, 1, "expected the closure of core.fast_all_reduce");
  if (!lua_isnil(L, 2)) check_pg(L, 2);
  lua_settop(L, 2);
  lua_setupvalue(L, 1, 2);
  return 0;
}

/* The root (src or dst, a group rank) at idx of rooted collective fname,
 * whose tensor is at slot 2: as check_rank_arg, but a fault, which only this
 * rank sees, is refused for the group (refuse_top), so that every rank fails
 * the call naming this rank and the fault rather than the peers waiting for
 * it and meeting its next call as an EMISMATCH. */
static int refusing_root_arg(lua_State *L, int idx, crun_pg_t *pg, const char *fname, const char *what) {
  int ok;
  lua_Integer v = lua_tointegerx(L, idx, &ok);
  if (ok && v >= 0 && v < crun_pg_size(pg)) return (int)v;
  who_t me = who_of(crun_pg_global_rank(pg, crun_pg_rank(pg)), crun_pg_rank(pg));
  if (ok)
    lua_pushfstring(L, "%s on %s: %s %I is out of range (0..%d)", fname, me.s, what, (LUAI_UACINT)v,
                    crun_pg_size(pg) - 1);
  else if (lua_type(L, idx) == LUA_TNUMBER)
    lua_pushfstring(L, "%s on %s: %s %f is not an integer", fname, me.s, what, (LUAI_UACNUMBER)lua_tonumber(L, idx));
  else
    lua_pushfstring(L, "%s on %s: %s must be an integer rank, got %s", fname, me.s, what, type_of(L, idx));
  return refuse_top(L, pg, fname, -1, crun_tensor_device(crun_l_check_tensor(L, 2)) >= 0);
}

/* pg:broadcast(t, src[, opts]) */
static int l_broadcast(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  crun_tensor_t *t = refusing_tensor(L, pg, 2, "broadcast");
  int src = refusing_root_arg(L, 3, pg, "broadcast", "src");
  crun_coll_opts_t o;
  int async = check_opts(L, 4, &o, "broadcast", pg);
  o.cuda = crun_tensor_device(t) >= 0;
  crun_work_t *w = NULL;
  int rc = crun_pg_broadcast(pg, crun_tensor_data(t), (size_t)crun_tensor_numel(t), crun_tensor_dtype(t), src, &o, WORK_ARG(async));
  return finish(L, rc, w, async, 2, 2, 2);
}

/* pg:reduce(t, dst[, op][, opts]) */
static int l_reduce(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  crun_tensor_t *t = refusing_tensor(L, pg, 2, "reduce");
  int dst = refusing_root_arg(L, 3, pg, "reduce", "dst");
  crun_reduce_op_t op = check_op(L, 4, "reduce");
  crun_coll_opts_t o;
  int async = check_opts(L, 5, &o, "reduce", pg);
  o.cuda = crun_tensor_device(t) >= 0;
  o.premul_factor = premul_arg(L, 4, op, "reduce");
  crun_work_t *w = NULL;
  int rc = crun_pg_reduce(pg, crun_tensor_data(t), (size_t)crun_tensor_numel(t), crun_tensor_dtype(t), op, dst, &o, WORK_ARG(async));
  return finish(L, rc, w, async, 2, 2, 2);
}

/* pg:all_gather(list_out, t[, opts]). A fault of the arguments that only
 * this rank sees is refused for the group (refuse_top). */
static int l_all_gather(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  crun_tensor_t *t = refusing_tensor(L, pg, 3, "all_gather");
  int n = crun_pg_size(pg);
  void **outs = lua_newuserdatauv(L, sizeof(void *) * (size_t)n, 0);
  if (list_fault(L, 2, n, t, "all_gather", outs)) refuse_top(L, pg, "all_gather", -1, crun_tensor_device(t) >= 0);
  crun_coll_opts_t o;
  int async = check_opts(L, 4, &o, "all_gather", pg);
  o.cuda = crun_tensor_device(t) >= 0;
  crun_work_t *w = NULL;
  int rc = crun_pg_all_gather(pg, outs, crun_tensor_data(t), (size_t)crun_tensor_numel(t), crun_tensor_dtype(t), &o, WORK_ARG(async));
  return finish(L, rc, w, async, 2, 3, 2);
}

/* The root's list (argument 3) of a gather/scatter, which only the root
 * checks: a fault is refused for the call (the peers learn why). */
static void check_root_list(lua_State *L, crun_pg_t *pg, int root, int n, const char *fname, void **ptrs) {
  crun_tensor_t *t = crun_l_check_tensor(L, 2);
  if (list_fault(L, 3, n, t, fname, ptrs)) refuse_top(L, pg, fname, root, crun_tensor_device(t) >= 0);
}

/* A rank other than the root must give no list (argument 3) to fname, or
 * an empty one (torch: "must NOT be specified on non-destination ranks"):
 * one that does is refused for the call, so that every rank fails it. */
static void check_no_list(lua_State *L, crun_pg_t *pg, int root, const char *fname, const char *list,
                          const char *role) {
  if (lua_isnoneornil(L, 3)) return;
  if (lua_type(L, 3) == LUA_TTABLE) {
    lua_pushnil(L);
    if (!lua_next(L, 3)) return; /* {}: torch's falsy [] */
    lua_pop(L, 2);
  }
  lua_pushfstring(L, "%s on %s: %s must not be given on a rank that is not the %s (%s), as in "
                  "torch.distributed (pass nil)", fname, WHO(pg, crun_pg_rank(pg)), list, role, WHO(pg, root));
  refuse_top(L, pg, fname, root, crun_tensor_device(crun_l_check_tensor(L, 2)) >= 0);
}

/* pg:refuse(call, message[, root[, cuda]]): this rank's own check of its
 * arguments to collective `call` ("all_to_all", "gather", ...) failed with
 * message ("EINVAL: ..."): fails the group so that every peer fails that
 * call naming this rank and message (crun_pg_refuse), then raises message
 * (with "every rank refused ...: the group goes on" when every rank did).
 * cuda: the call was on CUDA tensors (a group of backend "auto" runs it on
 * its device backend). */
static int l_refuse(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  const char *call = luaL_checkstring(L, 2), *msg = luaL_checkstring(L, 3);
  int root = (int)luaL_optinteger(L, 4, -1), status = CRUN_EINVAL;
  crun_coll_opts_t o = {.cuda = lua_toboolean(L, 5)};
  for (int rc = -1; strcmp(crun_err_name(rc), "EUNKNOWN") != 0; rc--) {
    size_t k = strlen(crun_err_name(rc));
    if (strncmp(msg, crun_err_name(rc), k) == 0 && strncmp(msg + k, ": ", 2) == 0) status = rc, msg += k + 2;
  }
  crun_pg_refuse(pg, call, root, &o, status, msg);
  lua_pushstring(L, crun_last_error()); /* msg, and whether the group goes on */
  return lua_error(L);
}

/* pg:gather(t, list_or_nil, dst[, opts]); the list is needed on dst only. */
static int l_gather(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  crun_tensor_t *t = refusing_tensor(L, pg, 2, "gather");
  int dst = refusing_root_arg(L, 4, pg, "gather", "dst"), n = crun_pg_size(pg);
  void **outs = lua_newuserdatauv(L, sizeof(void *) * (size_t)n, 0);
  if (dst == crun_pg_rank(pg)) check_root_list(L, pg, dst, n, "gather", outs);
  else check_no_list(L, pg, dst, "gather", "gather_list", "destination");
  crun_coll_opts_t o;
  int async = check_opts(L, 5, &o, "gather", pg);
  o.cuda = crun_tensor_device(t) >= 0;
  crun_work_t *w = NULL;
  int rc = crun_pg_gather(pg, crun_tensor_data(t), outs, (size_t)crun_tensor_numel(t), crun_tensor_dtype(t), dst, &o, WORK_ARG(async));
  return finish(L, rc, w, async, 2, 3, 3);
}

/* pg:scatter(t, list_or_nil, src[, opts]); the list is needed on src only. */
static int l_scatter(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  crun_tensor_t *t = refusing_tensor(L, pg, 2, "scatter");
  int src = refusing_root_arg(L, 4, pg, "scatter", "src"), n = crun_pg_size(pg);
  void **ins = lua_newuserdatauv(L, sizeof(void *) * (size_t)n, 0);
  if (src == crun_pg_rank(pg)) check_root_list(L, pg, src, n, "scatter", ins);
  else check_no_list(L, pg, src, "scatter", "scatter_list", "source");
  crun_coll_opts_t o;
  int async = check_opts(L, 5, &o, "scatter", pg);
  o.cuda = crun_tensor_device(t) >= 0;
  crun_work_t *w = NULL;
  int rc = crun_pg_scatter(pg, crun_tensor_data(t), (const void *const *)ins, (size_t)crun_tensor_numel(t),
                           crun_tensor_dtype(t), src, &o, WORK_ARG(async));
  return finish(L, rc, w, async, 2, 3, 2);
}

/* pg:reduce_scatter(out, list_in[, op][, opts]); argument faults are refused
 * for the group, as all_gather's. */
static int l_reduce_scatter(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  crun_tensor_t *t = refusing_tensor(L, pg, 2, "reduce_scatter");
  int n = crun_pg_size(pg);
  void **ins = lua_newuserdatauv(L, sizeof(void *) * (size_t)n, 0);
  if (list_fault(L, 3, n, t, "reduce_scatter", ins)) refuse_top(L, pg, "reduce_scatter", -1, crun_tensor_device(t) >= 0);
  crun_reduce_op_t op = check_op(L, 4, "reduce_scatter");
  crun_coll_opts_t o;
  int async = check_opts(L, 5, &o, "reduce_scatter", pg);
  o.cuda = crun_tensor_device(t) >= 0;
  o.premul_factor = premul_arg(L, 4, op, "reduce_scatter");
  crun_work_t *w = NULL;
  int rc = crun_pg_reduce_scatter(pg, crun_tensor_data(t), (const void *const *)ins, (size_t)crun_tensor_numel(t),
                                  crun_tensor_dtype(t), op, &o, WORK_ARG(async));
  return finish(L, rc, w, async, 2, 3, 2);
}

/* Fills ptrs/counts from the list at idx (argument idx - 1 of fname) of n
 * open contiguous tensors of one dtype (*dt) and device (*dev), any sizes.
 * Returns 0, or 1 with the fault pushed (no status), raising nothing. */
static int any_list_fault(lua_State *L, int idx, int n, const char *fname, void **ptrs, size_t *counts, int *dev,
                          crun_dtype_t *dt) {
  int arg = idx - 1;
  if (list_len_fault(L, idx, n, fname)) return 1;
  for (int i = 0; i < n; i++) {
    lua_geti(L, idx, i + 1);
    crun_tensor_t *t = tensor_fault(L, lua_gettop(L), arg, i + 1, fname);
    if (!t) return 1;
    if (i > 0 && crun_tensor_dtype(t) != *dt)
      return lua_pushfstring(L, "bad argument #%d to '%s' (tensor %d is %s, tensor 1 is %s)", arg, fname, i + 1,
                             crun_dtype_name(crun_tensor_dtype(t)), crun_dtype_name(*dt)), 1;
    if (i > 0 && crun_tensor_device(t) != *dev)
      return lua_pushfstring(L, "bad argument #%d to '%s' (tensor %d is on %s, tensor 1 on %s)", arg, fname, i + 1,
                             place(crun_tensor_device(t)), place(*dev)), 1;
    *dev = crun_tensor_device(t);
    *dt = crun_tensor_dtype(t);
    ptrs[i] = crun_tensor_data(t);
    counts[i] = (size_t)crun_tensor_numel(t);
    lua_pop(L, 1);
  }
  return 0;
}

/* Whether outputs (on device dvo, of dtype dto) and inputs (dvi, dti) of an
 * all_to_all agree; else 1 with the fault pushed (no status). */
static int a2a_pair_fault(lua_State *L, int n, int dvo, int dvi, crun_dtype_t dto, crun_dtype_t dti) {
  if (n > 0 && (dvo >= 0) != (dvi >= 0))
    return lua_pushfstring(L, "bad argument #1 to 'all_to_all' (outputs are on %s, inputs on %s)",
                           place(dvo), place(dvi)), 1;
  if (dto != dti)
    return lua_pushfstring(L, "bad argument #1 to 'all_to_all' (outputs are %s, inputs %s)", crun_dtype_name(dto),
                           crun_dtype_name(dti)), 1;
  return 0;
}

/* pg:all_to_all(outs, ins[, opts]): ins[j] goes to rank j-1, outs[j] comes
 * from it; argument faults are refused for the group, as all_gather's. */
static int l_all_to_all(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  int n = crun_pg_size(pg);
  void **p = lua_newuserdatauv(L, (sizeof(void *) + sizeof(size_t)) * 2 * (size_t)n, 0);
  size_t *cnt = (size_t *)(p + 2 * n);
  int dvo = -1, dvi = -1;
  crun_dtype_t dto = CRUN_FLOAT32, dti = CRUN_FLOAT32;
  if (any_list_fault(L, 2, n, "all_to_all", p, cnt, &dvo, &dto) ||
      any_list_fault(L, 3, n, "all_to_all", p + n, cnt + n, &dvi, &dti) || a2a_pair_fault(L, n, dvo, dvi, dto, dti))
    refuse_top(L, pg, "all_to_all", -1, dvo >= 0 || dvi >= 0);
  crun_coll_opts_t o;
  int async = check_opts(L, 4, &o, "all_to_all", pg);
  o.cuda = dvo >= 0;
  crun_work_t *w = NULL;
  int rc = crun_pg_all_to_all(pg, p, cnt, (const void *const *)(p + n), cnt + n, dto, &o, WORK_ARG(async));
  return finish(L, rc, w, async, 2, 3, 2);
}

/* all_to_all_single's fault text on this rank (global rank, as torch
 * numbers ranks in messages): pushes "all_to_all_single on rank R: <fmt>". */
static int single_fault(lua_State *L, crun_pg_t *pg, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lua_pushfstring(L, "all_to_all_single on %s: ", WHO(pg, crun_pg_rank(pg)));
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 2);
  return 1;
}

/* The split sizes at sidx for a dim 1 of `rows` rows (nil or {}: equal
 * blocks, as torch's None or []) into sizes[0..n-1]. Returns 0, or 1 with
 * the fault pushed (single_fault), raising nothing. */
static int split_sizes(lua_State *L, crun_pg_t *pg, int sidx, int n, lua_Integer rows, const char *what,
                       lua_Integer *sizes) {
  int equal = lua_isnoneornil(L, sidx);
  if (!equal && lua_istable(L, sidx)) {
    lua_pushnil(L);
    equal = !lua_next(L, sidx);
    if (!equal) lua_pop(L, 2);
  }
  if (equal && rows % n != 0)
    return single_fault(L, pg, "dim 1 of the %s tensor (%I) is not divisible by the group size %d; pass split sizes",
                        what, rows, n);
  for (int i = 0; equal && i < n; i++) sizes[i] = rows / n;
  if (equal) return 0;
  if (!lua_istable(L, sidx) || luaL_len(L, sidx) != n)
    return single_fault(L, pg, "%s split sizes must be a list of %d integers (one per rank), got %s", what, n,
                        lua_istable(L, sidx) ? lua_pushfstring(L, "%I", luaL_len(L, sidx)) : luaL_typename(L, sidx));
  lua_Integer total = 0; /* never wraps: a sum right only modulo 2^64 would address far past the tensor */
  for (int i = 0; i < n; i++) {
    lua_geti(L, sidx, i + 1);
    sizes[i] = lua_tointeger(L, -1);
    if (!lua_isinteger(L, -1) || sizes[i] < 0)
      return single_fault(L, pg, "%s split size %d is %s", what, i + 1, luaL_tolstring(L, -1, NULL));
    lua_pop(L, 1);
    if (sizes[i] > LUA_MAXINTEGER - total)
      return single_fault(L, pg, "%s split sizes add up to more than %I, dim 1 of the %s tensor is %I", what,
                          (lua_Integer)LUA_MAXINTEGER, what, rows);
    total += sizes[i];
  }
  if (total != rows)
    return single_fault(L, pg, "%s split sizes add up to %I, dim 1 of the %s tensor is %I", what, (lua_Integer)total,
                        what, rows);
  return 0;
}

/* The blocks of dim 1 of the tensor at idx (all_to_all_single's `what`
 * tensor, split by the sizes at sidx) as n pointers and element counts, no
 * view made. Returns the tensor, or NULL with the fault pushed. */
static crun_tensor_t *split_dim1(lua_State *L, crun_pg_t *pg, int idx, int sidx, const char *what, void **ptrs,
                                 size_t *counts) {
  int n = crun_pg_size(pg);
  crun_tensor_t *t = crun_l_test_tensor(L, idx);
  if (!t && luaL_testudata(L, idx, "crun.Tensor")) return single_fault(L, pg, "the %s tensor is closed", what), NULL;
  if (!t) return single_fault(L, pg, "the %s tensor must be a crun.Tensor, got %s", what, luaL_typename(L, idx)), NULL;
  if (!crun_tensor_is_contiguous(t)) return single_fault(L, pg, "the %s tensor must be contiguous", what), NULL;
  lua_Integer rows = crun_tensor_ndim(t) == 0 ? 1 : crun_tensor_shape(t)[0];
  lua_Integer *sizes = lua_newuserdatauv(L, sizeof(lua_Integer) * (size_t)n, 0);
  if (split_sizes(L, pg, sidx, n, rows, what, sizes)) return NULL;
  size_t per_row = rows ? (size_t)crun_tensor_numel(t) / (size_t)rows : 0, es = crun_dtype_size(crun_tensor_dtype(t));
  char *at = crun_tensor_data(t);
  for (int i = 0; i < n; i++) {
    ptrs[i] = at;
    counts[i] = (size_t)sizes[i] * per_row;
    at += counts[i] * es;
  }
  lua_pop(L, 1);
  return t;
}

/* pg:all_to_all_single(output, input, out_splits, in_splits[, opts]):
 * dist.all_to_all_single's exchange on blocks of dim 1 of two contiguous
 * tensors, given to the runtime as pointers (no Lua view per block). A fault
 * of this rank's arguments (tensors, split sizes, dtypes, devices) is refused
 * for the group: every rank fails the call naming this rank and the fault. */
static int l_all_to_all_single(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  int n = crun_pg_size(pg);
  void **p = lua_newuserdatauv(L, (sizeof(void *) + sizeof(size_t)) * 2 * (size_t)n, 0);
  size_t *cnt = (size_t *)(p + 2 * n);
  crun_tensor_t *out = split_dim1(L, pg, 2, 4, "output", p, cnt), *in = NULL;
  if (out) in = split_dim1(L, pg, 3, 5, "input", p + n, cnt + n);
  if (in && crun_tensor_dtype(out) != crun_tensor_dtype(in))
    single_fault(L, pg, "the output tensor is %s, the input %s", crun_dtype_name(crun_tensor_dtype(out)),
                 crun_dtype_name(crun_tensor_dtype(in))), in = NULL;
  if (!in || a2a_pair_fault(L, n, crun_tensor_device(out), crun_tensor_device(in), crun_tensor_dtype(out),
                            crun_tensor_dtype(in)))
    refuse_top(L, pg, "all_to_all", -1, (out && crun_tensor_device(out) >= 0) || (in && crun_tensor_device(in) >= 0));
  crun_coll_opts_t o;
  int async = check_opts(L, 6, &o, "all_to_all_single", pg);
  o.cuda = crun_tensor_device(out) >= 0;
  crun_work_t *w = NULL;
  int rc = crun_pg_all_to_all(pg, p, cnt, (const void *const *)(p + n), cnt + n, crun_tensor_dtype(out), &o,
                              WORK_ARG(async));
  return finish(L, rc, w, async, 2, 3, 2);
}

/* The tensor at idx, `what` tensor of fname: open, or NULL with the fault
 * pushed ("fname: the what tensor ...", no status), raising nothing. */
static crun_tensor_t *whole_tensor(lua_State *L, int idx, const char *fname, const char *what) {
  crun_tensor_t *t = crun_l_test_tensor(L, idx);
  if (t) return t;
  if (luaL_testudata(L, idx, "crun.Tensor")) return lua_pushfstring(L, "%s: the %s tensor is closed", fname, what), NULL;
  lua_pushfstring(L, "%s: the %s tensor must be a crun.Tensor, got %s", fname, what, luaL_typename(L, idx));
  return NULL;
}

/* The tensor `big` at bidx as n equal consecutive blocks, each the size of
 * the tensor `one` at oidx (all_gather_into_tensor's output and input,
 * reduce_scatter_tensor's input and output: what names them), into ptrs
 * (no view made); *onep gets one. Returns 0, or 1 with the fault pushed (no
 * status; *cuda set when a tensor is on a device), raising nothing. */
static int blocks_fault(lua_State *L, crun_pg_t *pg, const char *fname, int bidx, int oidx, const char *const what[2],
                        void **ptrs, crun_tensor_t **onep, int *cuda) {
  int n = crun_pg_size(pg);
  crun_tensor_t *one = whole_tensor(L, oidx, fname, what[1]), *big = one ? whole_tensor(L, bidx, fname, what[0]) : NULL;
  if (!big) return 1;
  *cuda = crun_tensor_device(one) >= 0 || crun_tensor_device(big) >= 0;
  int64_t per = crun_tensor_numel(one);
  if (!crun_tensor_is_contiguous(big)) return lua_pushfstring(L, "%s: the %s tensor must be contiguous", fname, what[0]), 1;
  if (crun_tensor_numel(big) != n * per)
    return lua_pushfstring(L, "%s: the %s tensor has %I elements, expected %I (world size %d x %I)", fname, what[0],
                           (lua_Integer)crun_tensor_numel(big), (lua_Integer)(n * per), n, (lua_Integer)per), 1;
  if (!crun_tensor_is_contiguous(one)) return lua_pushfstring(L, "%s: the %s tensor must be contiguous", fname, what[1]), 1;
  if (crun_tensor_dtype(big) != crun_tensor_dtype(one))
    return lua_pushfstring(L, "%s: the %s tensor is %s, the %s %s", fname, what[0], crun_dtype_name(crun_tensor_dtype(big)),
                           what[1], crun_dtype_name(crun_tensor_dtype(one))), 1;
  if (crun_tensor_device(big) != crun_tensor_device(one))
    return lua_pushfstring(L, "%s: the %s tensor is on %s, the %s on %s", fname, what[0],
                           place(crun_tensor_device(big)), what[1],
                           place(crun_tensor_device(one))), 1;
  size_t bytes = (size_t)per * crun_dtype_size(crun_tensor_dtype(one));
  for (int i = 0; i < n; i++) ptrs[i] = (char *)crun_tensor_data(big) + (size_t)i * bytes;
  *onep = one;
  return 0;
}

/* pg:all_gather_into_tensor(out, t[, opts]): dist.all_gather_into_tensor's
 * all_gather into n consecutive blocks of out, given to the runtime as
 * pointers (no Lua view per block). A fault of this rank's arguments is
 * refused for the group (call "all_gather"). Work result: {out}. */
static int l_all_gather_into_tensor(lua_State *L) {
  static const char *const what[2] = {"output", "input"};
  crun_pg_t *pg = check_pg(L, 1);
  void **outs = lua_newuserdatauv(L, sizeof(void *) * (size_t)crun_pg_size(pg), 0);
  crun_tensor_t *t = NULL;
  int cuda = 0;
  if (blocks_fault(L, pg, "all_gather_into_tensor", 2, 3, what, outs, &t, &cuda)) refuse_top(L, pg, "all_gather", -1, cuda);
  crun_coll_opts_t o;
  int async = check_opts(L, 4, &o, "all_gather_into_tensor", pg);
  o.cuda = cuda;
  crun_work_t *w = NULL;
  int rc = crun_pg_all_gather(pg, outs, crun_tensor_data(t), (size_t)crun_tensor_numel(t), crun_tensor_dtype(t), &o,
                              WORK_ARG(async));
  return finish(L, rc, w, async, 2, 3, 2);
}

/* pg:reduce_scatter_tensor(out, input[, op][, opts]): dist.reduce_scatter_tensor's
 * reduce_scatter of n consecutive blocks of input, as all_gather_into_tensor's
 * (refused as call "reduce_scatter"). Work result: {out}. */
static int l_reduce_scatter_tensor(lua_State *L) {
  static const char *const what[2] = {"input", "output"};
  crun_pg_t *pg = check_pg(L, 1);
  void **ins = lua_newuserdatauv(L, sizeof(void *) * (size_t)crun_pg_size(pg), 0);
  crun_tensor_t *t = NULL;
  int cuda = 0;
  if (blocks_fault(L, pg, "reduce_scatter_tensor", 3, 2, what, ins, &t, &cuda)) refuse_top(L, pg, "reduce_scatter", -1, cuda);
  crun_reduce_op_t op = check_op(L, 4, "reduce_scatter_tensor");
  crun_coll_opts_t o;
  int async = check_opts(L, 5, &o, "reduce_scatter_tensor", pg);
  o.cuda = cuda;
  o.premul_factor = premul_arg(L, 4, op, "reduce_scatter_tensor");
  crun_work_t *w = NULL;
  int rc = crun_pg_reduce_scatter(pg, crun_tensor_data(t), (const void *const *)ins, (size_t)crun_tensor_numel(t),
                                  crun_tensor_dtype(t), op, &o, WORK_ARG(async));
  return finish(L, rc, w, async, 2, 3, 2);
}

/* pg:barrier([opts]) */
static int l_barrier(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  crun_coll_opts_t o;
  int async = check_opts(L, 2, &o, "barrier", pg);
  crun_work_t *w = NULL;
  int rc = crun_pg_barrier(pg, &o, WORK_ARG(async)); /* sets w: read it after the call */
  return finish(L, rc, w, async, 1, 1, 0);
}

/* pg:send(t, dst[, opts{tag=, async_op=}]) */
static int l_send(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  crun_tensor_t *t = check_tensor(L, 2, "send");
  int dst = check_rank_arg(L, 3, pg, "send", "dst");
  crun_coll_opts_t o;
  int async = check_opts(L, 4, &o, "send", NULL);
  o.cuda = crun_tensor_device(t) >= 0;
  crun_work_t *w = NULL;
  int rc = crun_pg_send(pg, crun_tensor_data(t), (size_t)crun_tensor_numel(t), crun_tensor_dtype(t), dst, &o, WORK_ARG(async));
  return finish(L, rc, w, async, 2, 2, 2);
}

/* pg:recv(t[, src][, opts]) -> sender rank (blocking) or Work (async) */
static int l_recv(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  crun_tensor_t *t = check_tensor(L, 2, "recv");
  int src = lua_isnoneornil(L, 3) ? CRUN_ANY_SOURCE : check_rank_arg(L, 3, pg, "recv", "src");
  crun_coll_opts_t o;
  int async = check_opts(L, 4, &o, "recv", NULL), got = -1;
  o.cuda = crun_tensor_device(t) >= 0;
  crun_work_t *w = NULL;
  int rc = crun_pg_recv(pg, crun_tensor_data(t), (size_t)crun_tensor_numel(t), crun_tensor_dtype(t), src, &o,
                        &got, WORK_ARG(async));
  if (async) return finish(L, rc, w, 1, 2, 2, 2);
  if (rc < 0) return crun_l_fail(L, rc);
  lua_pushinteger(L, got);
  return 1;
}

/* The byte collectives below work on host buffers; a group that only moves
 * CUDA memory (backend nccl) gets them staged through the current device,
 * as torch's object collectives do. */
static int on_device_only(crun_pg_t *pg) { return strcmp(crun_pg_backend(pg), "nccl") == 0; }

/* Copies n elements of buf to a new tensor on the current device (*d). */
static int stage_in(const void *buf, size_t n, crun_dtype_t dt, crun_tensor_t **d) {
  int dev = 0;
  int64_t shape = (int64_t)n;
  crun_tensor_t *h = NULL;
  CRUN_CHECK(crun_cuda_current_device(&dev));
  CRUN_CHECK(crun_tensor_from_data(dt, 1, &shape, buf, n * crun_dtype_size(dt), &h));
  int rc = crun_tensor_to_device(h, dev, d);
  crun_tensor_release(h);
  return rc;
}

/* Copies device tensor d back into buf and releases it. */
static int stage_out(crun_tensor_t *d, void *buf, size_t n, crun_dtype_t dt) {
  crun_tensor_t *h = NULL;
  int rc = crun_tensor_to_device(d, -1, &h);
  if (rc == 0 && n) memcpy(buf, crun_tensor_data(h), n * crun_dtype_size(dt));
  if (h) crun_tensor_release(h);
  crun_tensor_release(d);
  return rc;
}

static int bytes_broadcast(crun_pg_t *pg, void *buf, size_t n, crun_dtype_t dt, int src, crun_coll_opts_t *o) {
  if (!on_device_only(pg)) return crun_pg_broadcast(pg, buf, n, dt, src, o, NULL);
  crun_tensor_t *d = NULL;
  CRUN_CHECK(stage_in(buf, n, dt, &d));
  crun_coll_opts_t od = *o;
  od.cuda = 1;
  int rc = crun_pg_broadcast(pg, crun_tensor_data(d), n, dt, src, &od, NULL);
  int rc2 = stage_out(d, buf, n, dt);
  return rc < 0 ? rc : rc2;
}

/* all_gather of n elements per rank into outs[r] (host), staged as above. */
static int bytes_all_gather(crun_pg_t *pg, void **outs, const void *in, size_t n, crun_dtype_t dt, crun_coll_opts_t *o) {
  if (!on_device_only(pg)) return crun_pg_all_gather(pg, outs, in, n, dt, o, NULL);
  int p = crun_pg_size(pg), rc = 0;
  crun_tensor_t *d = NULL, *all = NULL;
  size_t es = crun_dtype_size(dt);
  char *zeros = calloc((size_t)p * n + 1, es);
  if (!zeros) return crun_error(CRUN_ENOMEM, "all_gather_bytes staging");
  rc = stage_in(in, n, dt, &d);
  if (rc == 0) rc = stage_in(zeros, (size_t)p * n, dt, &all);
  void **douts = rc == 0 ? calloc((size_t)p, sizeof *douts) : NULL;
  if (rc == 0 && !douts) rc = crun_error(CRUN_ENOMEM, "all_gather_bytes staging");
  for (int r = 0; rc == 0 && r < p; r++) douts[r] = (char *)crun_tensor_data(all) + (size_t)r * n * es;
  crun_coll_opts_t od = *o;
  od.cuda = 1;
  if (rc == 0) rc = crun_pg_all_gather(pg, douts, crun_tensor_data(d), n, dt, &od, NULL);
  free(douts);
  if (d) crun_tensor_release(d);
  if (all) {
    int rc2 = stage_out(all, zeros, (size_t)p * n, dt);
    if (rc == 0) rc = rc2;
  }
  for (int r = 0; rc == 0 && r < p; r++) memcpy(outs[r], zeros + (size_t)r * n * es, n * es);
  free(zeros);
  return rc;
}

/* The byte collectives first exchange (BYTES_MAGIC, length): a plain int64
 * collective that a rank called instead (the ranks' calls differ) carries
 * no such pair, so it is reported rather than taken for a length. */
#define BYTES_MAGIC INT64_C(0x43524e4f424a3031)

/* Checks the pair that group rank `from` sent (see BYTES_MAGIC). */
static int check_len(crun_pg_t *pg, const int64_t *pair, int from) {
  if (pair[0] == BYTES_MAGIC && pair[1] >= 0) return 0;
  return crun_error(CRUN_EMISMATCH, "object collective on %s: %s did not call one (it sent %lld, %lld where "
                    "an object's size belongs): the ranks' calls differ", WHO(pg, crun_pg_rank(pg)), WHO(pg, from),
                    (long long)pair[0], (long long)pair[1]);
}

/* pg:broadcast_bytes(s_or_nil, src[, opts]) -> root's string on every rank */
static int l_broadcast_bytes(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  int src = check_rank_arg(L, 3, pg, "broadcast_bytes", "src");
  crun_coll_opts_t o;
  check_opts(L, 4, &o, "broadcast_bytes", pg);
  size_t len = 0;
  const char *s = src == crun_pg_rank(pg) ? crun_l_checklstring(L, 2, &len) : NULL;
  int64_t pair[2] = {BYTES_MAGIC, (int64_t)len};
  CRUN_L_CHECK(L, bytes_broadcast(pg, pair, 2, CRUN_INT64, src, &o));
  CRUN_L_CHECK(L, check_len(pg, pair, src));
  int64_t n = pair[1];
  char *buf = lua_newuserdatauv(L, (size_t)n + 1, 0);
  if (s) memcpy(buf, s, len);
  CRUN_L_CHECK(L, bytes_broadcast(pg, buf, (size_t)n, CRUN_UINT8, src, &o));
  lua_pushlstring(L, buf, (size_t)n);
  return 1;
}

/* pg:all_gather_bytes(s[, opts]) -> {s_rank0, s_rank1, ...} */
static int l_all_gather_bytes(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  size_t len;
  const char *s = crun_l_checklstring(L, 2, &len);
  crun_coll_opts_t o;
  check_opts(L, 3, &o, "all_gather_bytes", pg);
  int n = crun_pg_size(pg);
  int64_t *pairs = lua_newuserdatauv(L, (2 * sizeof(int64_t) + sizeof(void *)) * (size_t)n, 0);
  void **outs = (void **)(pairs + 2 * n);
  for (int i = 0; i < n; i++) outs[i] = &pairs[2 * i];
  int64_t mine[2] = {BYTES_MAGIC, (int64_t)len}, mx = 0, *lens = pairs;
  CRUN_L_CHECK(L, bytes_all_gather(pg, outs, mine, 2, CRUN_INT64, &o));
  for (int i = 0; i < n; i++) {
    CRUN_L_CHECK(L, check_len(pg, &pairs[2 * i], i));
    lens[i] = pairs[2 * i + 1]; /* packs the lengths at the front: lens[i] never overtakes pair i */
    mx = lens[i] > mx ? lens[i] : mx;
  }
  char *buf = lua_newuserdatauv(L, (size_t)(mx * (n + 1)) + 1, 0);
  for (int i = 0; i < n; i++) outs[i] = buf + (size_t)mx * (size_t)i;
  char *in = buf + (size_t)mx * (size_t)n;
  memcpy(in, s, len);
  CRUN_L_CHECK(L, bytes_all_gather(pg, outs, in, (size_t)mx, CRUN_UINT8, &o));
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushlstring(L, outs[i], (size_t)lens[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* pg:new_group(ranks[, timeout]) -> sub-group, or nil on ranks not in it */
static int l_new_group(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  crun_l_checktype(L, 2, LUA_TTABLE);
  int n = (int)luaL_len(L, 2);
  int *ranks = lua_newuserdatauv(L, sizeof(int) * (size_t)(n + 1), 0);
  for (int i = 0; i < n; i++) {
    lua_geti(L, 2, i + 1);
    if (!lua_isinteger(L, -1)) crun_l_error(L, "EINVAL: bad argument #1 to 'new_group' (entry %d is not an integer rank)", i + 1);
    ranks[i] = (int)crun_l_check_range(L, lua_tointeger(L, -1), 0, crun_pg_size(pg) - 1, "new_group", "rank");
    lua_pop(L, 1);
  }
  crun_pg_t *g = NULL;
  CRUN_L_CHECK(L, crun_pg_new_group(pg, ranks, n, crun_l_optnumber(L, 3, 0), &g));
  if (!g) lua_pushnil(L);
  else push_pg(L, g);
  return 1;
}

static int l_rank(lua_State *L) { lua_pushinteger(L, crun_pg_rank(check_pg(L, 1))); return 1; }
static int l_size(lua_State *L) { lua_pushinteger(L, crun_pg_size(check_pg(L, 1))); return 1; }
static int l_backend(lua_State *L) { lua_pushstring(L, crun_pg_backend(check_pg(L, 1))); return 1; }
static int l_next_seq(lua_State *L) { lua_pushinteger(L, (lua_Integer)crun_pg_next_seq(check_pg(L, 1))); return 1; }

static int l_global_rank(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  lua_pushinteger(L, crun_pg_global_rank(pg, check_rank_arg(L, 2, pg, "get_global_rank", "group rank")));
  return 1;
}

/* pg:timeout([seconds]) -> the default deadline (sets it first when given). */
static int l_timeout(lua_State *L) {
  crun_pg_t *pg = check_pg(L, 1);
  if (!lua_isnoneornil(L, 2)) crun_pg_set_timeout(pg, crun_l_checknumber(L, 2));
  lua_pushnumber(L, crun_pg_get_timeout(pg));
  return 1;
}

/* pg:destroy(): destroys the group (queued work finishes first; pending
 * p2p work fails with ECLOSED and the connections close, as torch's
 * destroy_process_group aborts it); idempotent. */
static int l_destroy(lua_State *L) {
  l_pg *u = crun_l_checkudata(L, 1, PG_MT);
  if (u->pg) crun_pg_destroy(u->pg);
  u->pg = NULL;
  return 0;
}

/* __gc: drops the group's reference; Work handles still held keep it up. */
static int l_pg_gc(lua_State *L) {
  l_pg *u = crun_l_checkudata(L, 1, PG_MT);
  if (u->pg) crun_pg_release(u->pg);
  u->pg = NULL;
  return 0;
}

static int l_pg_tostring(lua_State *L) {
  l_pg *u = crun_l_checkudata(L, 1, PG_MT);
  if (!u->pg) lua_pushstring(L, "crun.ProcessGroup (destroyed)");
  else lua_pushfstring(L, "crun.ProcessGroup (rank %d of %d, %s)", crun_pg_rank(u->pg), crun_pg_size(u->pg), crun_pg_backend(u->pg));
  return 1;
}

/* ---------------------------------------------------------------- Work */

static crun_work_t *check_work(lua_State *L, int idx) {
  l_work *u = crun_l_checkudata(L, idx, WORK_MT);
  if (!u->w) {
    crun_error(CRUN_ECLOSED, "the work handle was released");
    crun_l_fail(L, CRUN_ECLOSED);
  }
  return u->w;
}

/* w:wait([timeout]) -> true; raises the operation's error. */
static int l_work_wait(lua_State *L) {
  crun_work_t *w = check_work(L, 1);
  int rc = crun_work_wait(w, crun_l_optnumber(L, 2, 0));
  unpin_if_done(L, 1);
  CRUN_L_CHECK(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* w:synchronize([timeout]) -> true: waits on the host until the device
 * finished the work (device work; else as wait); raises its error. */
static int l_work_synchronize(lua_State *L) {
  crun_work_t *w = check_work(L, 1);
  int rc = crun_work_synchronize(w, crun_l_optnumber(L, 2, 0));
  unpin_if_done(L, 1);
  CRUN_L_CHECK(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_work_is_completed(lua_State *L) {
  int done = crun_work_is_completed(check_work(L, 1));
  unpin_if_done(L, 1);
  lua_pushboolean(L, done);
  return 1;
}

/* w:source() (torch's w:source_rank()) -> the sender's rank in the recv's
 * group once the recv finished, else nil */
static int l_work_source(lua_State *L) {
  int s = crun_work_source(check_work(L, 1));
  if (s < 0) lua_pushnil(L);
  else lua_pushinteger(L, s);
  return 1;
}

/* w:result() -> torch's list of output tensors ({} for a barrier); valid
 * once the work completed (they are the caller's own tensors). */
static int l_work_result(lua_State *L) {
  check_work(L, 1);
  lua_getiuservalue(L, 1, 2);
  return 1;
}

/* w:exception() -> nil while pending or after success, else the error text
 * ("ETIMEDOUT: ..."). Never blocks. */
static int l_work_exception(lua_State *L) {
  crun_work_t *w = check_work(L, 1);
  if (!crun_work_is_completed(w)) return 0;
  int rc = crun_work_wait(w, 0); /* completed: returns its status at once */
  unpin_if_done(L, 1);
  if (rc >= 0) return 0;
  const char *msg = crun_last_error();
  if (!msg || !*msg) msg = crun_strerror(rc);
  if (strncmp(msg, crun_err_name(rc), strlen(crun_err_name(rc))) == 0) lua_pushstring(L, msg);
  else lua_pushfstring(L, "%s: %s", crun_err_name(rc), msg);
  return 1;
}

/* w:get_future() -> a crun.Future over this work (lua/crun/future.lua). */
static int l_work_get_future(lua_State *L) {
  check_work(L, 1);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "crun.future");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "new");
  lua_pushvalue(L, 1);
  lua_call(L, 1, 1);
  return 1;
}

/* __gc/__close: waits for unfinished work (its tensors are referenced here) then releases. */
static int l_work_gc(lua_State *L) {
  l_work *u = crun_l_checkudata(L, 1, WORK_MT);
  if (u->w) {
    crun_work_wait(u->w, 0);
    unpin_if_done(L, 1);
    crun_work_release(u->w);
  }
  u->w = NULL;
  return 0;
}

static int l_work_tostring(lua_State *L) {
  l_work *u = crun_l_checkudata(L, 1, WORK_MT);
  if (!u->w) lua_pushstring(L, "crun.Work (released)");
  else lua_pushfstring(L, "crun.Work (%s, %s)", crun_work_describe(u->w), crun_work_is_completed(u->w) ? "completed" : "pending");
  return 1;
}

/* core.pg_new{store=, rank=, world_size=, timeout=, backend=, name=} */
static int l_pg_new(lua_State *L) {
  crun_l_checktype(L, 1, LUA_TTABLE);
  crun_pg_opts_t o = {0};
  lua_getfield(L, 1, "store");
  o.store = crun_l_check_store(L, lua_gettop(L));
  o.rank = (int)crun_l_optfield_range(L, 1, "rank", -1, -1, INT_MAX, "init_process_group");
  o.world_size = (int)crun_l_optfield_range(L, 1, "world_size", -1, -1, INT_MAX, "init_process_group");
  o.timeout = crun_l_optfield_number(L, 1, "timeout", 0);
  o.backend = crun_l_optfield_string(L, 1, "backend", NULL);
  o.name = crun_l_optfield_string(L, 1, "name", NULL);
  crun_pg_t *pg = NULL;
  CRUN_L_CHECK(L, crun_pg_new(&o, &pg));
  push_pg(L, pg);
  return 1;
}

void crun_l_open_pg(lua_State *L) {
  static const luaL_Reg pg_methods[] = {
      {"all_reduce", l_all_reduce}, {"broadcast", l_broadcast}, {"reduce", l_reduce},
      {"all_gather", l_all_gather}, {"gather", l_gather}, {"scatter", l_scatter},
      {"reduce_scatter", l_reduce_scatter}, {"all_to_all", l_all_to_all},
      {"all_to_all_single", l_all_to_all_single}, {"all_gather_into_tensor", l_all_gather_into_tensor},
      {"reduce_scatter_tensor", l_reduce_scatter_tensor}, {"barrier", l_barrier},
      {"send", l_send}, {"recv", l_recv}, {"broadcast_bytes", l_broadcast_bytes},
      {"all_gather_bytes", l_all_gather_bytes}, {"new_group", l_new_group}, {"rank", l_rank},
      {"size", l_size}, {"backend", l_backend}, {"next_seq", l_next_seq}, {"refuse", l_refuse},
      {"global_rank", l_global_rank}, {"timeout", l_timeout}, {"destroy", l_destroy},
      {"__gc", l_pg_gc}, {"__close", l_destroy}, {"__tostring", l_pg_tostring}, {NULL, NULL}};
  static const luaL_Reg work_methods[] = {
      {"wait", l_work_wait}, {"synchronize", l_work_synchronize}, {"is_completed", l_work_is_completed}, {"source", l_work_source},
      {"source_rank", l_work_source},
      {"result", l_work_result}, {"exception", l_work_exception}, {"get_future", l_work_get_future},
      {"__gc", l_work_gc}, {"__close", l_work_gc}, {"__tostring", l_work_tostring}, {NULL, NULL}};
  crun_l_newclass(L, PG_MT, pg_methods);
  crun_l_newclass(L, WORK_MT, work_methods);
  lua_pushcfunction(L, l_pg_new);
  lua_setfield(L, -2, "pg_new");
  lua_pushcfunction(L, l_fast_all_reduce);
  lua_setfield(L, -2, "fast_all_reduce");
  lua_pushcfunction(L, l_fast_all_reduce_group);
  lua_setfield(L, -2, "fast_all_reduce_group");
}
