/* crun_lua.h — shared helpers of the Lua C module crun.core.
 * One binding file per area (store.c, tensor.c, pg.c, ...) mirrors one part
 * of crun.h; each exports crun_l_open_<area>() which adds its functions to the
 * module table on the top of the stack. */
#ifndef CRUN_LUA_H
#define CRUN_LUA_H

#include <lauxlib.h>
#include <lua.h>

#include "crun.h"

/* Raises a Lua error carrying crun_last_error() (or the status name when no
 * detail was recorded) for a failed call. Never returns. */
int crun_l_fail(lua_State *L, int status);

/* Raises the formatted message (lua_pushfstring's formats: %s %d %I %f %p
 * %c %%) as it is, without the caller's position, so a message that starts
 * with its status name ("EINVAL: ...") still does for pcall users. Never
 * returns. */
int crun_l_error(lua_State *L, const char *fmt, ...);

/* luaL_argerror with the status first: raises "EINVAL: bad argument #arg to
 * 'f' (msg)" (or "EINVAL: calling 'f' on bad self (msg)" for a method's
 * self), without a position prefix. Never returns. */
int crun_l_argerror(lua_State *L, int arg, const char *msg);

/* Registry key of the table {C function = method name} of crun.Tensor's
 * methods: a method that a Lua wrapper calls through a local (not as
 * t:name) is still named, and its self not counted, in argument errors. */
#define CRUN_L_METHOD_NAMES "crun.method_names"

/* lauxlib's argument checks with the status first (check.c): each raises
 * "EINVAL: bad argument #n to 'f' (T expected, got U)" like crun_l_argerror.
 * Every binding uses these instead of luaL_check* / luaL_opt*. */
int crun_l_typeerror(lua_State *L, int arg, const char *tname);
lua_Integer crun_l_checkinteger(lua_State *L, int arg);
lua_Integer crun_l_optinteger(lua_State *L, int arg, lua_Integer def);
lua_Number crun_l_checknumber(lua_State *L, int arg);
lua_Number crun_l_optnumber(lua_State *L, int arg, lua_Number def);
const char *crun_l_checklstring(lua_State *L, int arg, size_t *len);
const char *crun_l_optlstring(lua_State *L, int arg, const char *def, size_t *len);
#define crun_l_checkstring(L, arg) crun_l_checklstring((L), (arg), NULL)
#define crun_l_optstring(L, arg, def) crun_l_optlstring((L), (arg), (def), NULL)
void crun_l_checktype(lua_State *L, int arg, int t);
void *crun_l_checkudata(lua_State *L, int arg, const char *tname);
/* Lets crun_l_checkudata(L, arg, tname) recognise the metatable at idx by
 * its address; tname must be the same pointer the checks pass. */
void crun_l_cache_metatable(lua_State *L, int idx, const char *tname);
/* The userdata at arg when its metatable is tname's cached one, else NULL
 * (no error, no registry lookup): a fast path's test, which leaves anything
 * else to the checked path. *slot remembers where tname sits in the cache
 * (a static of the caller's, -1 at first). */
void *crun_l_testudata_cached(lua_State *L, int arg, const char *tname, _Atomic int *slot);
int crun_l_checkoption(lua_State *L, int arg, const char *def, const char *const names[]);
#define crun_l_argcheck(L, cond, arg, msg) ((void)((cond) || crun_l_argerror((L), (arg), (msg))))

/* Calls crun_l_fail when status < 0; returns status otherwise. */
#define CRUN_L_CHECK(L, call)                           \
  do {                                                  \
    int crun__l_rc = (call);                            \
    if (crun__l_rc < 0) crun_l_fail((L), crun__l_rc);   \
  } while (0)

/* Whether f is a binding that inserts a hidden self before the caller's
 * arguments (pg.c's dist.all_reduce fast path): its argument errors count
 * as a method's. */
int crun_l_hidden_self(lua_CFunction f);

/* Sets the functions of `fns` into a new metatable named `name` (with
 * __index pointing at itself) and leaves nothing on the stack. */
void crun_l_newclass(lua_State *L, const char *name, const luaL_Reg *methods);

/* Reads an optional numeric field of the table at `idx`; `def` when absent. */
double crun_l_optfield_number(lua_State *L, int idx, const char *field, double def);
lua_Integer crun_l_optfield_integer(lua_State *L, int idx, const char *field, lua_Integer def);
int crun_l_optfield_boolean(lua_State *L, int idx, const char *field, int def);
const char *crun_l_optfield_string(lua_State *L, int idx, const char *field, const char *def);

/* Returns v when lo <= v <= hi, else raises "EINVAL: fname: what v is out of
 * range (lo..hi)" (no silent narrowing of ranks, roots, tags or ports). */
lua_Integer crun_l_check_range(lua_State *L, lua_Integer v, lua_Integer lo, lua_Integer hi,
                               const char *fname, const char *what);

/* crun_l_optfield_integer checked with crun_l_check_range (what = field). */
lua_Integer crun_l_optfield_range(lua_State *L, int idx, const char *field, lua_Integer def, lua_Integer lo,
                                  lua_Integer hi, const char *fname);

/* Returns the tensor of the "crun.Tensor" userdata at idx (raises a
 * bad-argument error when it is not one or is closed); no reference taken. */
crun_tensor_t *crun_l_check_tensor(lua_State *L, int idx);

/* The tensor at idx when it is an open crun.Tensor, else NULL (raises
 * nothing: a check that must do something before it raises, such as refuse
 * a collective for its group, names the problem itself). */
crun_tensor_t *crun_l_test_tensor(lua_State *L, int idx);

/* The open tensor at idx, recognised by its metatable's address alone, or
 * NULL (raises nothing: the caller takes its checked path, which names the
 * problem). With crun__tensor_host_span: the one-call check of the hot path. */
crun_tensor_t *crun_l_tensor_or_null(lua_State *L, int idx);

/* Pushes a new "crun.Tensor" userdata for t; it takes its own reference
 * (crun_tensor_retain), so the caller still owns and releases its own. */
void crun_l_push_tensor(lua_State *L, crun_tensor_t *t);

/* Adds delta to the pending-operation count of the tensor at idx (a tensor
 * with a count above 0 cannot be closed); returns 0 when the value there is
 * not an open tensor. */
int crun_l_tensor_pin(lua_State *L, int idx, int delta);

/* Returns the store of the crun.Store userdata at idx (bindings/store.c);
 * raises a bad-argument error for other values and ECLOSED for a closed one.
 * The pointer stays valid while the userdata lives (retain it to keep it). */
crun_store_t *crun_l_check_store(lua_State *L, int idx);

/* Returns the live group of the crun.ProcessGroup at idx (raises ECLOSED on
 * a destroyed one). Defined in pg.c. */
crun_pg_t *crun_l_check_pg(lua_State *L, int idx);

/* The areas; each adds its entries to the table at the top of the stack. */
/* Reads a device at idx: "cpu" or -1 (the host: -1), "cuda" (the current
 * device), "cuda:N" or an integer N >= 0; raises "EINVAL: bad argument #arg"
 * for anything else and the ENOTSUP of crun.cuda for "cuda" without a
 * device. (arg differs from idx for a field of an options table.) */
int crun_l_check_device(lua_State *L, int idx, int arg, const char *fname);

void crun_l_open_core(lua_State *L);
void crun_l_open_metrics(lua_State *L);
void crun_l_open_store(lua_State *L);
void crun_l_open_cuda(lua_State *L); /* needs the tensor table: after open_tensor */
void crun_l_open_tensor(lua_State *L);
void crun_l_open_pg(lua_State *L);
void crun_l_open_train(lua_State *L);
void crun_l_open_trace(lua_State *L);

/* Opens the whole module (the table of crun.core) and returns 1. */
int luaopen_crun_core(lua_State *L);

#endif /* CRUN_LUA_H */
