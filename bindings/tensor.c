/* tensor.c — Lua bindings for the tensor part of crun.h: the userdata
 * "crun.Tensor" (a box holding one reference), the seeded "crun.Generator",
 * factories in core.tensor, and the methods. Dims and indices are 1-based on
 * the Lua side (Torch7 style); negative dims count from the end. */
#include "crun_lua.h"

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TENSOR_MT "crun.Tensor"
#define GEN_MT "crun.Generator"
#define DEFAULT_GEN_KEY "crun.tensor.default_generator"

/* ------------------------------------------------------------ boxes */

/* The userdata: one reference to a tensor, and how many pending async
 * operations use it (a pinned tensor cannot be closed). */
typedef struct {
  crun_tensor_t *t;
  int pins;
} tbox;

crun_tensor_t *crun_l_check_tensor(lua_State *L, int idx) {
  tbox *box = crun_l_checkudata(L, idx, TENSOR_MT);
  if (!box->t) crun_l_argerror(L, idx, "tensor is closed");
  return box->t;
}

crun_tensor_t *crun_l_test_tensor(lua_State *L, int idx) {
  static _Atomic int slot = -1;
  tbox *box = crun_l_testudata_cached(L, idx, TENSOR_MT, &slot);
  if (!box) box = luaL_testudata(L, idx, TENSOR_MT); /* a state whose metatable is not the cached one */
  return box ? box->t : NULL;
}

/* The box crun_l_tensor_or_null last recognised by its metatable: a loop
 * that all-reduces one tensor finds it again with one comparison instead of
 * the metatable's (lua_getmetatable, lua_topointer, the pop: ~150
 * instructions of a ~1,800-instruction 2-rank 8-byte dist.all_reduce). The
 * box's __gc forgets it before Lua frees the memory, so a later userdata at
 * the same address is never taken for it (the debug library, which can
 * strip a metatable's __gc, voids this as it voids every metatable check). */
static _Atomic(tbox *) last_box;

crun_tensor_t *crun_l_tensor_or_null(lua_State *L, int idx) {
  tbox *box = lua_touserdata(L, idx);
  if (!box || box != atomic_load_explicit(&last_box, memory_order_relaxed) || lua_type(L, idx) != LUA_TUSERDATA) {
    static _Atomic int slot = -1;
    if (!(box = crun_l_testudata_cached(L, idx, TENSOR_MT, &slot))) return NULL;
    atomic_store_explicit(&last_box, box, memory_order_relaxed);
  }
  return box->t;
}

/* Lua's collector sees a tensor as its 16-byte box, not the storage behind
 * it, and paces itself by what Lua allocates: a loop that makes 1 MiB
 * temporaries held hundreds of them before a cycle ran (jobs/train.lua at
 * hidden 512, 4 ranks: a rank's memory grew 8 MiB with every evaluation
 * pass, to twice what it uses). So every tensor handed to Lua counts its
 * bytes as allocation debt: each MiB of it is passed to the collector as an
 * incremental step of that size (LUA_GCSTEP), which paces the cycles as if
 * Lua had allocated the storage. CRUN_GC_TENSORS=0 turns it off. */
static _Thread_local size_t gc_debt;
static int gc_tensors = -1;

static void count_tensor_bytes(lua_State *L, const crun_tensor_t *t) {
  if (gc_tensors < 0) gc_tensors = crun_env_int("CRUN_GC_TENSORS", 1) != 0;
  if (!gc_tensors) return;
  gc_debt += crun_tensor_nbytes(t);
  if (gc_debt < ((size_t)1 << 20)) return;
  size_t kb = gc_debt >> 10;
  gc_debt = 0;
  lua_gc(L, LUA_GCSTEP, kb > INT_MAX ? INT_MAX : (int)kb);
}

void crun_l_push_tensor(lua_State *L, crun_tensor_t *t) {
  tbox *box = lua_newuserdatauv(L, sizeof *box, 0);
  box->t = t;
  box->pins = 0;
  crun_tensor_retain(t);
  luaL_setmetatable(L, TENSOR_MT);
  count_tensor_bytes(L, t);
}

int crun_l_tensor_pin(lua_State *L, int idx, int delta) {
  tbox *box = luaL_testudata(L, idx, TENSOR_MT);
  if (!box || !box->t) return 0;
  box->pins += delta;
  return 1;
}

/* Returns the tensor at idx, or NULL when the value there is not a tensor. */
static crun_tensor_t *test_tensor(lua_State *L, int idx) {
  tbox *box = luaL_testudata(L, idx, TENSOR_MT);
  if (box && !box->t) crun_l_argerror(L, idx, "tensor is closed");
  return box ? box->t : NULL;
}

/* Pushes a tensor the caller owns (dropping the caller's reference), or
 * raises the failure of the call that was to create it. */
static int push_owned(lua_State *L, int rc, crun_tensor_t **t) {
  if (rc < 0) crun_l_fail(L, rc);
  crun_l_push_tensor(L, *t);
  crun_tensor_release(*t);
  return 1;
}

/* ------------------------------------------------------------ argument helpers */

/* Reads a dtype name at idx (default when none/nil). */
static crun_dtype_t opt_dtype(lua_State *L, int idx, crun_dtype_t def) {
  if (lua_isnoneornil(L, idx)) return def;
  crun_dtype_t dt;
  if (crun_dtype_parse(crun_l_checkstring(L, idx), &dt) < 0)
    crun_l_argerror(L, idx, lua_pushfstring(L, "unknown dtype '%s'", lua_tostring(L, idx)));
  return dt;
}

/* Reads a shape given as a table {2, 3} at idx or as integers idx, idx+1, ...;
 * returns the index of the first argument after the shape. */
static int read_shape(lua_State *L, int idx, int64_t *shape, int *ndim) {
  int n = 0;
  if (lua_istable(L, idx)) {
    n = (int)luaL_len(L, idx);
    if (n > CRUN_MAX_DIMS) crun_l_argerror(L, idx, "too many dims (at most 8)");
    for (int i = 0; i < n; i++) {
      lua_geti(L, idx, i + 1);
      int ok;
      lua_Integer v = lua_tointegerx(L, -1, &ok);
      if (!ok || v < 0)
        crun_l_argerror(L, idx, lua_pushfstring(L, "shape entry %d must be an integer >= 0", i + 1));
      shape[i] = v;
      lua_pop(L, 1);
    }
    *ndim = n;
    return idx + 1;
  }
  while (lua_type(L, idx + n) == LUA_TNUMBER) {
    if (n == CRUN_MAX_DIMS) crun_l_argerror(L, idx + n, "too many dims (at most 8)");
    lua_Integer v = crun_l_checkinteger(L, idx + n);
    if (v < 0) crun_l_argerror(L, idx + n, "size must be >= 0");
    shape[n++] = v;
  }
  *ndim = n;
  return idx + n;
}

/* Reads a 1-based (or negative, from the end) dim at arg; returns it 0-based. */
static int check_dim(lua_State *L, int arg, const crun_tensor_t *t) {
  lua_Integer d = crun_l_checkinteger(L, arg);
  int nd = crun_tensor_ndim(t);
  if (d < 0) d += nd + 1;
  if (d < 1 || d > nd)
    crun_l_argerror(L, arg, lua_pushfstring(L, "dim %I out of range for a %d-d tensor",
                                          crun_l_checkinteger(L, arg), nd));
  return (int)d - 1;
}

/* Reads a 1-based index at arg for a dim of the given size; returns 0-based. */
static int64_t check_index(lua_State *L, int arg, lua_Integer i, int64_t size) {
  if (i < 1 || i > size)
    crun_l_argerror(L, arg, lua_pushfstring(L, "index %I out of range (size %I)", i, (lua_Integer)size));
  return i - 1;
}

static void push_elem_at(lua_State *L, const crun_tensor_t *t, const int64_t *idx) {
  if (crun_tensor_dtype(t) == CRUN_BOOL) { /* true / false, as torch's tolist() */
    int64_t v;
    CRUN_L_CHECK(L, crun_tensor_get_int64(t, idx, &v));
    lua_pushboolean(L, v != 0);
  } else if (crun_dtype_is_integer(crun_tensor_dtype(t))) {
    int64_t v;
    CRUN_L_CHECK(L, crun_tensor_get_int64(t, idx, &v));
    lua_pushinteger(L, v);
  } else {
    double v;
    CRUN_L_CHECK(L, crun_tensor_get_double(t, idx, &v));
    lua_pushnumber(L, v);
  }
}

/* crun_dtype_int_range as Lua integers (lua_Integer is int64_t here). */
static void int_dtype_range(crun_dtype_t dt, lua_Integer *lo, lua_Integer *hi) {
  int64_t l, h;
  crun_dtype_int_range(dt, &l, &h);
  *lo = (lua_Integer)l, *hi = (lua_Integer)h;
}

/* A Lua number stored into an integer tensor (tensor.new, full, fill_,
 * t[i] = v) must fit its dtype once truncated toward zero, as torch requires
 * of a Python scalar ("value cannot be converted to type int8_t without
 * overflow"): EINVAL on argument `arg` instead of a wrapped or saturated
 * element. Conversions between tensors wrap from integers, as torch's do;
 * from floats, nan or a value out of range is refused (crun_tensor_copy). */
static void check_fits(lua_State *L, int arg, crun_dtype_t dt, int varg) {
  if (!crun_dtype_is_integer(dt) || lua_type(L, varg) != LUA_TNUMBER) return;
  lua_Integer lo, hi;
  int_dtype_range(dt, &lo, &hi);
  int fits;
  if (lua_isinteger(L, varg)) {
    lua_Integer v = lua_tointeger(L, varg);
    fits = v >= lo && v <= hi;
  } else { /* 2^63 is the first double past INT64_MAX; NaN fits nothing */
    double v = trunc(lua_tonumber(L, varg));
    fits = v >= (double)lo && (dt == CRUN_INT64 ? v < 9223372036854775808.0 : v <= (double)hi);
  }
  if (!fits)
    crun_l_argerror(L, arg, lua_pushfstring(L, "value %s does not fit %s [%I, %I]", lua_tostring(L, varg),
                                            crun_dtype_name(dt), lo, hi));
}

static void set_elem_at(lua_State *L, int arg, int varg, crun_tensor_t *t, const int64_t *idx) {
  check_fits(L, arg, crun_tensor_dtype(t), varg);
  if (lua_isboolean(L, varg))
    CRUN_L_CHECK(L, crun_tensor_set_int64(t, idx, lua_toboolean(L, varg)));
  else if (lua_isinteger(L, varg) && crun_dtype_is_integer(crun_tensor_dtype(t)))
    CRUN_L_CHECK(L, crun_tensor_set_int64(t, idx, lua_tointeger(L, varg)));
  else
    CRUN_L_CHECK(L, crun_tensor_set_double(t, idx, crun_l_checknumber(L, varg)));
}

/* ------------------------------------------------------------ factories */

/* Where a factory puts its tensor: dtype, device (-1: host), pinned. */
typedef struct {
  crun_dtype_t dt;
  int dev, pin;
} place_t;

/* Reads a factory's trailing arguments at idx: [dtype][, {device =,
 * dtype =, pin_memory =}] (torch's requires_grad / layout are accepted and
 * change nothing). */
static place_t read_place(lua_State *L, int idx, crun_dtype_t def) {
  place_t p = {def, -1, 0};
  if (!lua_istable(L, idx)) p.dt = opt_dtype(L, idx++, def);
  if (lua_isnoneornil(L, idx)) return p;
  crun_l_checktype(L, idx, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
    if (!strcmp(k, "device")) p.dev = crun_l_check_device(L, lua_gettop(L), idx, "tensor");
    else if (!strcmp(k, "dtype")) p.dt = opt_dtype(L, lua_gettop(L), def);
    else if (!strcmp(k, "pin_memory")) p.pin = lua_toboolean(L, -1);
    else if (strcmp(k, "requires_grad") && strcmp(k, "layout"))
      crun_l_argerror(L, idx, lua_pushfstring(L, "unknown option '%s' (accepted: device, dtype, layout, "
                                                "pin_memory, requires_grad)", k));
    lua_pop(L, 1);
  }
  if (p.pin && p.dev >= 0)
    crun_l_argerror(L, idx, lua_pushfstring(L, "pin_memory applies to host tensors, not cuda:%d", p.dev));
  return p;
}

/* Pushes host tensor t (owned) moved where p says, or raises rc. */
static int push_placed(lua_State *L, int rc, crun_tensor_t **t, place_t p) {
  if (rc < 0) crun_l_fail(L, rc);
  crun_tensor_t *r = NULL;
  if (p.dev >= 0) rc = crun_tensor_to_device(*t, p.dev, &r);
  else if (p.pin) rc = crun_tensor_pin_memory(*t, &r);
  else return push_owned(L, 0, t);
  crun_tensor_release(*t);
  return push_owned(L, rc, &r);
}

static int new_filled(lua_State *L, int first, double v) {
  int64_t shape[CRUN_MAX_DIMS];
  int nd, next = read_shape(L, first, shape, &nd);
  place_t p = read_place(L, next, CRUN_FLOAT32);
  crun_tensor_t *t = NULL;
  int rc = crun_tensor_new_on(p.dt, nd, shape, p.dev, &t); /* made on its device */
  if (rc == 0 && v != 0.0) rc = crun_tensor_fill(t, v);
  if (rc < 0) crun_tensor_release(t);
  p.dev = -1; /* already there */
  return push_placed(L, rc, &t, p);
}

/* tensor.zeros(shape[, dtype][, opts]) / tensor.ones(shape[, dtype][, opts]):
 * opts = {device = "cuda:1", dtype =, pin_memory =} */
static int t_zeros(lua_State *L) { return new_filled(L, 1, 0.0); }
static int t_ones(lua_State *L) { return new_filled(L, 1, 1.0); }

/* tensor.empty(shape[, dtype]): elements are unspecified. */
static int t_empty(lua_State *L) {
  int64_t shape[CRUN_MAX_DIMS];
  int nd, next = read_shape(L, 1, shape, &nd);
  place_t p = read_place(L, next, CRUN_FLOAT32);
  crun_tensor_t *t;
  int rc = crun_tensor_empty_on(p.dt, nd, shape, p.dev, &t);
  p.dev = -1;
  return push_placed(L, rc, &t, p);
}

/* tensor.full(shape, value[, dtype]): without a dtype, torch's for the
 * value: int64 for a Lua integer, bool for a boolean, float32 for a float. */
static double check_fill_value(lua_State *L, int idx);
static int fill_value(lua_State *L, int idx, crun_tensor_t *t, double v);

static int t_full(lua_State *L) {
  int64_t shape[CRUN_MAX_DIMS];
  int nd;
  crun_l_checktype(L, 1, LUA_TTABLE);
  read_shape(L, 1, shape, &nd);
  double v = check_fill_value(L, 2);
  crun_dtype_t def = lua_isinteger(L, 2) ? CRUN_INT64 : lua_isboolean(L, 2) ? CRUN_BOOL : CRUN_FLOAT32;
  place_t p = read_place(L, 3, def);
  check_fits(L, 2, p.dt, 2);
  crun_tensor_t *t;
  int rc = crun_tensor_new(p.dt, nd, shape, &t);
  if (rc == 0) fill_value(L, 2, t, v);
  return push_placed(L, rc, &t, p);
}

/* The length of [a, b) by step for integer bounds, counted in integers:
 * doubles round bounds past 2^53 (arange(2^62 + 1, 2^62 + 4) was empty). */
static uint64_t arange_count_int(lua_Integer a, lua_Integer b, lua_Integer step) {
  uint64_t span, ustep;
  if (step > 0) {
    if (b <= a) return 0;
    span = (uint64_t)b - (uint64_t)a, ustep = (uint64_t)step;
  } else {
    if (a <= b) return 0;
    span = (uint64_t)a - (uint64_t)b, ustep = 0 - (uint64_t)step;
  }
  return span / ustep + (span % ustep != 0);
}

/* tensor.arange(n[, dtype]) or arange(a, b[, step][, dtype]): [a, b) by step;
 * int64 when every bound is an integer, else float32 (as in torch). */
static int t_arange(lua_State *L) {
  int nnum = 0;
  while (nnum < 3 && lua_type(L, nnum + 1) == LUA_TNUMBER) nnum++;
  if (nnum == 0) crun_l_argerror(L, 1, "number expected");
  int ints = 1;
  for (int i = 1; i <= nnum; i++) ints &= lua_isinteger(L, i);
  double a = nnum >= 2 ? lua_tonumber(L, 1) : 0, b = lua_tonumber(L, nnum >= 2 ? 2 : 1);
  double step = nnum == 3 ? lua_tonumber(L, 3) : 1;
  if (step == 0 || isnan(step)) crun_l_argerror(L, 3, "step must be non-zero");
  if (isnan(a) || isnan(b)) crun_l_argerror(L, 1, "the bounds must be numbers, not NaN");
  lua_Integer ia = nnum >= 2 ? lua_tointeger(L, 1) : 0, ib = lua_tointeger(L, nnum >= 2 ? 2 : 1);
  lua_Integer istep = nnum == 3 ? lua_tointeger(L, 3) : 1;
  double cnt = ints ? (double)arange_count_int(ia, ib, istep) : ceil((b - a) / step);
  if (cnt > 1e12) crun_l_argerror(L, 1, "range too large");
  int64_t n = cnt > 0 ? (int64_t)cnt : 0;
  crun_tensor_t *t;
  place_t p = read_place(L, nnum + 1, ints ? CRUN_INT64 : CRUN_FLOAT32);
  int rc = crun_tensor_empty(p.dt, 1, &n, &t);
  if (rc < 0) crun_l_fail(L, rc);
  crun_l_push_tensor(L, t); /* owns it while elements are set (they may raise) */
  for (int64_t i = 0; i < n; i++) {
    if (ints) CRUN_L_CHECK(L, crun_tensor_set_int64(t, &i, (int64_t)((uint64_t)ia + (uint64_t)i * (uint64_t)istep)));
    else CRUN_L_CHECK(L, crun_tensor_set_double(t, &i, a + (double)i * step));
  }
  return push_placed(L, 0, &t, p);
}

/* Finds the shape of a nested table by following first entries. */
static void nested_shape(lua_State *L, int idx, int64_t *shape, int *nd) {
  int n = 0;
  lua_pushvalue(L, idx);
  while (lua_istable(L, -1)) {
    if (n == CRUN_MAX_DIMS) crun_l_argerror(L, 1, "nested too deep (at most 8 dims)");
    shape[n++] = (int64_t)luaL_len(L, -1);
    lua_geti(L, -1, 1);
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
  *nd = n;
}

/* Raises EINVAL on argument 1 for a hole: entry `miss` of a table at depth
 * d is nil while entry `set` is not. */
static void hole_error(lua_State *L, int d, lua_Integer miss, lua_Integer set) {
  crun_l_argerror(L, 1, lua_pushfstring(L, "entry %I at depth %d is nil, but entry %I is set (a table with holes)",
                                        miss, d + 1, set));
}

/* Refuses an integer key outside 1..n in the table on the top of the stack
 * (n: its length # at depth d): past a border, as in {1, 2, [4] = 4}, or
 * 0-based; the length alone silently dropped such entries. Other keys
 * (table.pack's n, names) are no positions and stay ignored. */
static void check_positions(lua_State *L, int d, lua_Integer n) {
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    lua_pop(L, 1);
    if (!lua_isinteger(L, -1)) continue;
    lua_Integer k = lua_tointeger(L, -1);
    if (k < 1)
      crun_l_argerror(L, 1, lua_pushfstring(L, "index %I at depth %d: a tensor is read from a sequence "
                                            "starting at index 1", k, d + 1));
    if (k > n) hole_error(L, d, n + 1, k);
  }
}

/* Fills t from the nested table on the top of the stack at depth d, at the
 * position idx[0..d) (idx[d..] are written here). */
static void nested_fill(lua_State *L, crun_tensor_t *t, int d, int64_t *idx) {
  int nd = crun_tensor_ndim(t);
  const int64_t *shape = crun_tensor_shape(t);
  lua_Integer n = luaL_len(L, -1);
  check_positions(L, d, n); /* first: {3, nil, 5} may have length 1 */
  if (n != shape[d])
    crun_l_argerror(L, 1, lua_pushfstring(L, "ragged nested table: an entry at depth %d has %I entries, "
                                        "expected %I", d + 1, n, (lua_Integer)shape[d]));
  for (int64_t i = 0; i < shape[d]; i++) {
    idx[d] = i;
    int type = lua_geti(L, -1, i + 1);
    if (type == LUA_TNIL) hole_error(L, d, (lua_Integer)i + 1, (lua_Integer)shape[d]); /* t[#t] is set */
    if (d + 1 < nd) {
      if (type != LUA_TTABLE)
        crun_l_argerror(L, 1, lua_pushfstring(L, "ragged nested table: entry %I at depth %d is a %s, table expected",
                                            (lua_Integer)i + 1, d + 1, luaL_typename(L, -1)));
      nested_fill(L, t, d + 1, idx);
    } else {
      if (type != LUA_TNUMBER && type != LUA_TBOOLEAN)
        crun_l_argerror(L, 1, lua_pushfstring(L, "element %I at depth %d is a %s, number expected",
                                            (lua_Integer)i + 1, d + 1, luaL_typename(L, -1)));
      set_elem_at(L, 1, lua_gettop(L), t, idx);
    }
    lua_pop(L, 1);
  }
}

/* tensor.new(nested_table[, dtype]) */
static int t_new(lua_State *L) {
  crun_l_checktype(L, 1, LUA_TTABLE);
  int64_t shape[CRUN_MAX_DIMS], idx[CRUN_MAX_DIMS];
  int nd;
  nested_shape(L, 1, shape, &nd);
  crun_tensor_t *t;
  place_t p = read_place(L, 2, CRUN_FLOAT32);
  int rc = crun_tensor_new(p.dt, nd, shape, &t);
  if (rc < 0) crun_l_fail(L, rc);
  crun_l_push_tensor(L, t);
  crun_tensor_release(t); /* the box owns it now: an error below (a ragged or
                             non-numeric table) frees it; released only after
                             the fill, every such error leaked the tensor */
  lua_pushvalue(L, 1);
  if (nd > 0) nested_fill(L, t, 0, idx); /* ({[2] = 7} has length 0: checked too) */
  lua_pop(L, 1);
  if (p.dev < 0 && !p.pin) return 1;
  crun_tensor_retain(t); /* push_placed drops this reference, the box keeps its own */
  return push_placed(L, 0, &t, p);
}

/* tensor.from_bytes(dtype, shape, bytes): row-major little-endian elements. */
static int t_from_bytes(lua_State *L) {
  crun_dtype_t dt = opt_dtype(L, 1, CRUN_FLOAT32);
  int64_t shape[CRUN_MAX_DIMS];
  int nd;
  crun_l_checktype(L, 2, LUA_TTABLE);
  read_shape(L, 2, shape, &nd);
  size_t len;
  const char *s = crun_l_checklstring(L, 3, &len);
  crun_tensor_t *t;
  return push_owned(L, crun_tensor_from_data(dt, nd, shape, s, len, &t), &t);
}

/* ------------------------------------------------------------ generators */

static crun_generator_t *check_gen(lua_State *L, int idx) { return crun_l_checkudata(L, idx, GEN_MT); }

static uint64_t check_seed(lua_State *L, int idx) {
  if (lua_isinteger(L, idx)) return (uint64_t)lua_tointeger(L, idx);
  double d = crun_l_checknumber(L, idx);
  if (d != floor(d)) crun_l_argerror(L, idx, "seed must be an integer");
  /* (int64_t) of 1e300 or inf is undefined (INT64_MIN on x86: every such seed the same) */
  if (!(d >= -0x1p63 && d < 0x1p63)) crun_l_argerror(L, idx, "seed out of the range of a 64-bit integer");
  return (uint64_t)(int64_t)d;
}

/* tensor.Generator(seed): a seeded generator object. */
static int t_generator(lua_State *L) {
  uint64_t seed = lua_isnoneornil(L, 1) ? 0 : check_seed(L, 1);
  crun_generator_t *g = lua_newuserdatauv(L, sizeof *g, 0);
  crun_generator_seed(g, seed);
  luaL_setmetatable(L, GEN_MT);
  return 1;
}

static int g_manual_seed(lua_State *L) {
  crun_generator_seed(check_gen(L, 1), check_seed(L, 2));
  lua_settop(L, 1);
  return 1;
}
static int g_uniform(lua_State *L) {
  crun_generator_t *g = check_gen(L, 1);
  double lo = crun_l_optnumber(L, 2, 0), hi = crun_l_optnumber(L, 3, 1);
  lua_pushnumber(L, lo + (hi - lo) * crun_generator_uniform(g));
  return 1;
}
static int g_normal(lua_State *L) {
  crun_generator_t *g = check_gen(L, 1);
  lua_pushnumber(L, crun_l_optnumber(L, 2, 0) + crun_l_optnumber(L, 3, 1) * crun_generator_normal(g));
  return 1;
}
/* g:random(n) -> integer in [1, n] (like math.random(n)); no n: a raw 63-bit integer. */
static int g_random(lua_State *L) {
  crun_generator_t *g = check_gen(L, 1);
  uint64_t r = crun_generator_next(g);
  if (lua_isnoneornil(L, 2)) {
    lua_pushinteger(L, (lua_Integer)(r >> 1));
    return 1;
  }
  lua_Integer n = crun_l_checkinteger(L, 2);
  crun_l_argcheck(L, n >= 1, 2, "n must be >= 1");
  lua_pushinteger(L, (lua_Integer)((r >> 1) % (uint64_t)n) + 1);
  return 1;
}

static crun_generator_t *default_gen(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, DEFAULT_GEN_KEY);
  crun_generator_t *g = lua_touserdata(L, -1);
  lua_pop(L, 1); /* the registry keeps it alive */
  return g;
}

/* tensor.manual_seed(seed): reseeds the default generator. */
static int t_manual_seed(lua_State *L) {
  crun_generator_seed(default_gen(L), check_seed(L, 1));
  return 0;
}

/* Shared by rand/randn: shape, then a dtype string or {seed=, dtype=, generator=}. */
static int random_tensor(lua_State *L, int normal) {
  int64_t shape[CRUN_MAX_DIMS];
  int nd, next = read_shape(L, 1, shape, &nd);
  crun_dtype_t dt = CRUN_FLOAT32;
  crun_generator_t local, *g = default_gen(L);
  if (lua_istable(L, next)) {
    dt = opt_dtype(L, (lua_getfield(L, next, "dtype"), lua_gettop(L)), CRUN_FLOAT32);
    if (lua_getfield(L, next, "generator") != LUA_TNIL) g = check_gen(L, lua_gettop(L));
    if (lua_getfield(L, next, "seed") != LUA_TNIL) {
      crun_generator_seed(&local, check_seed(L, lua_gettop(L)));
      g = &local;
    }
  } else {
    dt = opt_dtype(L, next, CRUN_FLOAT32);
  }
  crun_tensor_t *t;
  int rc = crun_tensor_empty(dt, nd, shape, &t);
  if (rc == 0) {
    rc = normal ? crun_tensor_normal_(t, g, 0, 1) : crun_tensor_uniform_(t, g, 0, 1);
    if (rc < 0) crun_tensor_release(t);
  }
  return push_owned(L, rc, &t);
}

static int t_rand(lua_State *L) { return random_tensor(L, 0); }

/* tensor.randint(lo, hi, shape[, opts]): uniform integers in [lo, hi), int64
 * unless opts/dtype says otherwise; opts as for rand. */
static int t_randint(lua_State *L) {
  lua_Integer lo = crun_l_checkinteger(L, 1), hi = crun_l_checkinteger(L, 2);
  crun_l_argcheck(L, lo < hi, 2, "empty range (hi must be > lo)");
  int64_t shape[CRUN_MAX_DIMS];
  int nd;
  crun_l_checktype(L, 3, LUA_TTABLE);
  read_shape(L, 3, shape, &nd);
  crun_dtype_t dt = CRUN_INT64;
  crun_generator_t local, *g = default_gen(L);
  if (lua_istable(L, 4)) {
    dt = opt_dtype(L, (lua_getfield(L, 4, "dtype"), lua_gettop(L)), CRUN_INT64);
    if (lua_getfield(L, 4, "generator") != LUA_TNIL) g = check_gen(L, lua_gettop(L));
    if (lua_getfield(L, 4, "seed") != LUA_TNIL) {
      crun_generator_seed(&local, check_seed(L, lua_gettop(L)));
      g = &local;
    }
  } else {
    dt = opt_dtype(L, 4, CRUN_INT64);
  }
  if (crun_dtype_is_integer(dt)) { /* as torch: no draw wraps to a value outside [lo, hi) */
    lua_Integer dlo, dhi;
    int_dtype_range(dt, &dlo, &dhi);
    if (lo < dlo || hi - 1 > dhi)
      crun_l_argerror(L, 2, lua_pushfstring(L, "range [%I, %I) does not fit %s [%I, %I]", lo, hi,
                                            crun_dtype_name(dt), dlo, dhi));
  }
  crun_tensor_t *t;
  CRUN_L_CHECK(L, crun_tensor_empty(dt, nd, shape, &t));
  crun_l_push_tensor(L, t);
  crun_tensor_release(t);
  uint64_t span = (uint64_t)hi - (uint64_t)lo;
  for (int64_t i = 0, n = crun_tensor_numel(t); i < n; i++) {
    int64_t v = (int64_t)((uint64_t)lo + crun_generator_next(g) % span);
    if (crun_dtype_is_integer(dt)) crun_elem_set_int64(dt, crun_tensor_data(t), i, v);
    else crun_elem_set_double(dt, crun_tensor_data(t), i, (double)v);
  }
  return 1;
}
static int t_randn(lua_State *L) { return random_tensor(L, 1); }

/* t:uniform_([lo, hi][, gen]) / t:normal_([mean, std][, gen]): in place,
 * the two parameters defaulting to 0 and 1. */
static int random_fill(lua_State *L,
                       int (*fill)(crun_tensor_t *, crun_generator_t *, double, double)) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1);
  crun_generator_t *g = lua_isnoneornil(L, 4) ? default_gen(L) : check_gen(L, 4);
  CRUN_L_CHECK(L, fill(t, g, crun_l_optnumber(L, 2, 0), crun_l_optnumber(L, 3, 1)));
  lua_settop(L, 1);
  return 1;
}
static int m_uniform_(lua_State *L) { return random_fill(L, crun_tensor_uniform_); }
static int m_normal_(lua_State *L) { return random_fill(L, crun_tensor_normal_); }

/* ------------------------------------------------------------ shape queries */

static int m_numel(lua_State *L) {
  lua_pushinteger(L, crun_tensor_numel(crun_l_check_tensor(L, 1)));
  return 1;
}

static int m_dim(lua_State *L) {
  lua_pushinteger(L, crun_tensor_ndim(crun_l_check_tensor(L, 1)));
  return 1;
}

/* Pushes the per-dim array `get`(t) as a table, or its entry for dim arg 2. */
static int push_per_dim(lua_State *L, const int64_t *(*get)(const crun_tensor_t *)) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1);
  const int64_t *v = get(t);
  if (!lua_isnoneornil(L, 2)) {
    lua_pushinteger(L, v[check_dim(L, 2, t)]);
    return 1;
  }
  lua_createtable(L, crun_tensor_ndim(t), 0);
  for (int d = 0; d < crun_tensor_ndim(t); d++) {
    lua_pushinteger(L, v[d]);
    lua_rawseti(L, -2, d + 1);
  }
  return 1;
}

/* t:size() -> {d1, d2, ...}; t:size(d) -> one dim. */
static int m_size(lua_State *L) { return push_per_dim(L, crun_tensor_shape); }

/* t:stride() -> table of element strides; t:stride(d) -> one. */
static int m_stride(lua_State *L) { return push_per_dim(L, crun_tensor_strides); }

static int m_dtype(lua_State *L) {
  lua_pushstring(L, crun_dtype_name(crun_tensor_dtype(crun_l_check_tensor(L, 1))));
  return 1;
}

static int m_is_contiguous(lua_State *L) {
  lua_pushboolean(L, crun_tensor_is_contiguous(crun_l_check_tensor(L, 1)));
  return 1;
}

/* t:data_ptr() -> light userdata of the first element (for C extensions). */
static int m_data_ptr(lua_State *L) {
  lua_pushlightuserdata(L, crun_tensor_data(crun_l_check_tensor(L, 1)));
  return 1;
}

/* ------------------------------------------------------------ conversions */

/* Pushes the nested table of t's elements at depth d. */
static void push_table(lua_State *L, const crun_tensor_t *t, int d, int64_t *idx) {
  int nd = crun_tensor_ndim(t);
  if (nd == 0) {
    push_elem_at(L, t, idx);
    return;
  }
  int64_t n = crun_tensor_shape(t)[d];
  lua_createtable(L, (int)n, 0);
  for (int64_t i = 0; i < n; i++) {
    idx[d] = i;
    if (d + 1 < nd) push_table(L, t, d + 1, idx);
    else push_elem_at(L, t, idx);
    lua_rawseti(L, -2, i + 1);
  }
}

/* t:totable() -> nested Lua table (a number for a 0-d tensor). */
static int m_totable(lua_State *L) {
  int64_t idx[CRUN_MAX_DIMS] = {0};
  push_table(L, crun_l_check_tensor(L, 1), 0, idx);
  return 1;
}

/* t:item() -> the value of a one-element tensor. */
static int m_item(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1);
  if (crun_tensor_numel(t) != 1)
    crun_l_argerror(L, 1, lua_pushfstring(L, "item() needs one element, tensor has %I",
                                        (lua_Integer)crun_tensor_numel(t)));
  int64_t idx[CRUN_MAX_DIMS] = {0};
  push_elem_at(L, t, idx);
  return 1;
}

/* t:bytes() -> the elements as a row-major little-endian string. */
static int m_bytes(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1), *c;
  CRUN_L_CHECK(L, crun_tensor_contiguous(t, &c));
  lua_pushlstring(L, crun_tensor_data(c), crun_tensor_nbytes(c));
  crun_tensor_release(c);
  return 1;
}

static int m_clone(lua_State *L) {
  crun_tensor_t *c;
  return push_owned(L, crun_tensor_clone(crun_l_check_tensor(L, 1), &c), &c);
}

static int m_contiguous(lua_State *L) {
  crun_tensor_t *c;
  return push_owned(L, crun_tensor_contiguous(crun_l_check_tensor(L, 1), &c), &c);
}

/* t:to(dtype): a converted copy (t itself when the dtype is the same). */
static int m_to(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1), *c;
  crun_l_checkstring(L, 2);
  crun_dtype_t dt = opt_dtype(L, 2, CRUN_FLOAT32);
  if (dt == crun_tensor_dtype(t)) {
    lua_settop(L, 1);
    return 1;
  }
  return push_owned(L, crun_tensor_to(t, dt, &c), &c);
}

/* t:copy(src): element-wise copy with dtype conversion; shapes must match. */
static int m_copy(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1), *s = crun_l_check_tensor(L, 2);
  CRUN_L_CHECK(L, crun_tensor_copy(t, s));
  lua_settop(L, 1);
  return 1;
}

/* A fill value: a number, or a boolean (true = 1, as torch's fill_(True)). */
static double check_fill_value(lua_State *L, int idx) {
  if (lua_type(L, idx) == LUA_TBOOLEAN) return lua_toboolean(L, idx) ? 1.0 : 0.0;
  return crun_l_checknumber(L, idx);
}

/* Fills t with the value at idx (v as a double): an integer into an integer
 * tensor exactly, as a double rounds past 2^53 (full(s, 2^53 + 1, 'int64')). */
static int fill_value(lua_State *L, int idx, crun_tensor_t *t, double v) {
  if (lua_isinteger(L, idx) && crun_dtype_is_integer(crun_tensor_dtype(t)))
    return crun_tensor_fill_int64(t, lua_tointeger(L, idx));
  return crun_tensor_fill(t, v);
}

static int m_fill(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1);
  double v = check_fill_value(L, 2);
  check_fits(L, 2, crun_tensor_dtype(t), 2);
  CRUN_L_CHECK(L, fill_value(L, 2, t, v));
  lua_settop(L, 1);
  return 1;
}

static int m_zero(lua_State *L) {
  CRUN_L_CHECK(L, crun_tensor_fill(crun_l_check_tensor(L, 1), 0));
  lua_settop(L, 1);
  return 1;
}

static int m_equal(lua_State *L) {
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *b = crun_l_check_tensor(L, 2);
  lua_pushboolean(L, crun_tensor_equal(a, b));
  return 1;
}

/* t:allclose(o[, rtol=1e-5[, atol=1e-8]]) */
static int m_allclose(lua_State *L) {
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *b = crun_l_check_tensor(L, 2);
  lua_pushboolean(L, crun_tensor_allclose(a, b, crun_l_optnumber(L, 3, 1e-5), crun_l_optnumber(L, 4, 1e-8)));
  return 1;
}

/* ------------------------------------------------------------ views */

/* t:narrow(dim, start, len): 1-based start. */
static int m_narrow(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1), *v;
  int d = check_dim(L, 2, t);
  lua_Integer start = crun_l_checkinteger(L, 3), len = crun_l_checkinteger(L, 4);
  int64_t size = crun_tensor_shape(t)[d];
  if (start < 1 || start > size + 1)
    crun_l_argerror(L, 3, lua_pushfstring(L, "start %I out of range for dim %d of size %I", start, d + 1, (lua_Integer)size));
  if (len < 0 || len > size - (start - 1)) /* start <= size + 1: no overflow */
    crun_l_argerror(L, 4, lua_pushfstring(L, "length %I from %I exceeds dim %d of size %I", len, start, d + 1, (lua_Integer)size));
  return push_owned(L, crun_tensor_narrow(t, d, start - 1, len, &v), &v);
}

/* t:select(dim, i): 1-based i; drops the dim. */
static int m_select(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1), *v;
  int d = check_dim(L, 2, t);
  int64_t i = check_index(L, 3, crun_l_checkinteger(L, 3), crun_tensor_shape(t)[d]);
  return push_owned(L, crun_tensor_select(t, d, i, &v), &v);
}

/* Reads a view shape (table or varargs, -1 allowed once) starting at arg 2. */
static int read_view_shape(lua_State *L, int64_t *shape) {
  int n = 0;
  if (lua_istable(L, 2)) {
    n = (int)luaL_len(L, 2);
    crun_l_argcheck(L, n <= CRUN_MAX_DIMS, 2, "too many dims");
    for (int i = 0; i < n; i++) {
      lua_geti(L, 2, i + 1);
      int ok;
      shape[i] = lua_tointegerx(L, -1, &ok);
      if (!ok) crun_l_argerror(L, 2, "shape entries must be integers");
      lua_pop(L, 1);
    }
    return n;
  }
  for (; !lua_isnone(L, 2 + n); n++) {
    crun_l_argcheck(L, n < CRUN_MAX_DIMS, 2 + n, "too many dims");
    shape[n] = crun_l_checkinteger(L, 2 + n);
  }
  return n;
}

/* t:<op>(shape...) for the view-making calls that take a new shape. */
static int shaped_view(lua_State *L,
                       int (*op)(crun_tensor_t *, int, const int64_t *, crun_tensor_t **)) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1), *v;
  int64_t shape[CRUN_MAX_DIMS];
  int n = read_view_shape(L, shape);
  return push_owned(L, op(t, n, shape, &v), &v);
}

/* t:view(shape...) — contiguous tensors only; one size may be -1. */
static int m_view(lua_State *L) { return shaped_view(L, crun_tensor_view); }

/* t:reshape(shape...) — a view when contiguous, else a reshaped copy. */
static int m_reshape(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1), *c, *v;
  int64_t shape[CRUN_MAX_DIMS];
  int n = read_view_shape(L, shape);
  CRUN_L_CHECK(L, crun_tensor_contiguous(t, &c));
  int rc = crun_tensor_view(c, n, shape, &v);
  crun_tensor_release(c);
  return push_owned(L, rc, &v);
}

/* t:transpose(d1, d2); t:t() for 2-d. */
static int m_transpose(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1), *v;
  int a = check_dim(L, 2, t), b = check_dim(L, 3, t);
  return push_owned(L, crun_tensor_transpose(t, a, b, &v), &v);
}

static int m_t(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1), *v;
  if (crun_tensor_ndim(t) != 2)
    crun_l_argerror(L, 1, lua_pushfstring(L, "t() expects a 2-d tensor, got %d-d", crun_tensor_ndim(t)));
  return push_owned(L, crun_tensor_transpose(t, 0, 1, &v), &v);
}

/* t:expand(shape...): broadcast size-1 dims (read-only view). */
static int m_expand(lua_State *L) { return shaped_view(L, crun_tensor_expand); }

static int m_is_same_storage(lua_State *L) {
  lua_pushboolean(L, crun_tensor_same_storage(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2)));
  return 1;
}

/* ------------------------------------------------------------ metamethods */

/* Reads a table index {i, j, ...} (1-based, one per dim) into idx. */
static void table_index(lua_State *L, int arg, const crun_tensor_t *t, int64_t *idx) {
  int nd = crun_tensor_ndim(t);
  if (luaL_len(L, arg) != nd)
    crun_l_argerror(L, arg, lua_pushfstring(L, "index has %I entries, tensor has %d dims", luaL_len(L, arg), nd));
  for (int d = 0; d < nd; d++) {
    lua_geti(L, arg, d + 1);
    int ok;
    lua_Integer i = lua_tointegerx(L, -1, &ok);
    if (!ok) crun_l_argerror(L, arg, "index entries must be integers");
    lua_pop(L, 1);
    if (i < 1 || i > crun_tensor_shape(t)[d])
      crun_l_argerror(L, arg, lua_pushfstring(L, "index %I out of range for dim %d of size %I", i, d + 1,
                                            (lua_Integer)crun_tensor_shape(t)[d]));
    idx[d] = i - 1;
  }
}

/* Checks a 1-based index into dim 1; returns it 0-based. */
static int64_t row_index(lua_State *L, const crun_tensor_t *t, lua_Integer i) {
  if (crun_tensor_ndim(t) == 0) crun_l_argerror(L, 2, "cannot index a 0-d tensor (use item())");
  int64_t size = crun_tensor_shape(t)[0];
  if (i < 1 || i > size)
    crun_l_argerror(L, 2, lua_pushfstring(L, "index %I out of range for dim 1 of size %I", i, (lua_Integer)size));
  return i - 1;
}

/* t[k] or t[k] = v (nargs 2 or 3 on the stack) with a tensor k: handed to
 * the Lua handler that crun.tensor sets as the metatable's field `name`
 * (mask indexing); its results are returned. */
static int by_tensor_key(lua_State *L, const char *name, int nargs) {
  if (luaL_getmetafield(L, 1, name) == LUA_TNIL)
    return crun_l_argerror(L, 2, "indexing by a tensor needs crun.tensor (require \"crun.tensor\")");
  lua_insert(L, 1);
  lua_call(L, nargs, 1);
  return 1;
}

/* t[k]: methods by name; t[i] a number (1-d) or a view of row i; t[{i,j}]
 * an element; t[mask] crun.tensor's mask selection. */
static int m_index(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1);
  if (lua_type(L, 2) == LUA_TSTRING) {
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(1));
    return 1;
  }
  if (test_tensor(L, 2)) return by_tensor_key(L, "__crun_index_tensor", 2);
  int isint;
  lua_Integer key = lua_tointegerx(L, 2, &isint); /* 2 and 2.0 alike */
  if (isint) {
    int64_t i = row_index(L, t, key);
    if (crun_tensor_ndim(t) == 1) {
      push_elem_at(L, t, &i);
      return 1;
    }
    crun_tensor_t *v;
    return push_owned(L, crun_tensor_select(t, 0, i, &v), &v);
  }
  if (lua_istable(L, 2)) {
    int64_t idx[CRUN_MAX_DIMS];
    table_index(L, 2, t, idx);
    push_elem_at(L, t, idx);
    return 1;
  }
  return crun_l_argerror(L, 2, lua_pushfstring(L, "integer index expected, got %s", luaL_typename(L, 2)));
}

/* t[i] = v: sets an element (1-d) or fills / copies row i; t[{i,j}] = v;
 * t[mask] = v crun.tensor's masked assignment. */
static int m_newindex(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1);
  if (test_tensor(L, 2)) {
    lua_settop(L, 3);
    by_tensor_key(L, "__crun_newindex_tensor", 3);
    return 0;
  }
  if (lua_istable(L, 2)) {
    int64_t idx[CRUN_MAX_DIMS];
    table_index(L, 2, t, idx);
    set_elem_at(L, 3, 3, t, idx);
    return 0;
  }
  int isint;
  lua_Integer key = lua_tointegerx(L, 2, &isint);
  if (!isint || lua_type(L, 2) != LUA_TNUMBER)
    return crun_l_argerror(L, 2, lua_pushfstring(L, "integer index expected, got %s", luaL_typename(L, 2)));
  int64_t i = row_index(L, t, key);
  if (crun_tensor_ndim(t) == 1) {
    set_elem_at(L, 3, 3, t, &i);
    return 0;
  }
  crun_tensor_t *row, *src = test_tensor(L, 3);
  if (!src) check_fits(L, 3, crun_tensor_dtype(t), 3);
  CRUN_L_CHECK(L, crun_tensor_select(t, 0, i, &row));
  int rc = src ? crun_tensor_copy(row, src)
               : (lua_type(L, 3) == LUA_TNUMBER ? crun_tensor_fill(row, lua_tonumber(L, 3))
                                                : crun_error(CRUN_EINVAL, "row assignment needs a number or a tensor, got %s",
                                                             luaL_typename(L, 3)));
  crun_tensor_release(row);
  if (rc < 0) crun_l_fail(L, rc);
  return 0;
}

static int m_len(lua_State *L) {
  crun_tensor_t *t = crun_l_check_tensor(L, 1);
  if (crun_tensor_ndim(t) == 0) crun_l_argerror(L, 1, "len() of a 0-d tensor");
  lua_pushinteger(L, crun_tensor_shape(t)[0]);
  return 1;
}

/* __gc: drops the reference (a pending async operation holds the box, so a
 * collected box is never in use). */
static int m_gc(lua_State *L) {
  tbox *box = crun_l_checkudata(L, 1, TENSOR_MT), *last = box;
  atomic_compare_exchange_strong(&last_box, &last, NULL); /* crun_l_tensor_or_null's */
  crun_tensor_release(box->t);
  box->t = NULL;
  return 0;
}

/* t:close() / __close: as __gc, but a tensor that a pending async operation
 * reads or writes raises ESTATE instead (wait on its work first). */
static int m_close(lua_State *L) {
  tbox *box = crun_l_checkudata(L, 1, TENSOR_MT);
  if (box->pins > 0) {
    crun_error(CRUN_ESTATE, "tensor close: the tensor is in use by %d pending async operation%s; "
               "wait on its work first", box->pins, box->pins == 1 ? "" : "s");
    return crun_l_fail(L, CRUN_ESTATE);
  }
  return m_gc(L);
}

/* Fallback __tostring (lua/crun/tensor.lua installs the pretty printer). */
static int m_tostring(lua_State *L) {
  tbox *box = crun_l_checkudata(L, 1, TENSOR_MT);
  if (!box->t) {
    lua_pushstring(L, "crun.Tensor (closed)");
    return 1;
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "crun.Tensor %s of size ", crun_dtype_name(crun_tensor_dtype(box->t)));
  luaL_addvalue(&b);
  for (int d = 0; d < crun_tensor_ndim(box->t); d++) {
    lua_pushfstring(L, d ? "x%I" : "%I", (lua_Integer)crun_tensor_shape(box->t)[d]);
    luaL_addvalue(&b);
  }
  luaL_pushresult(&b);
  return 1;
}

/* core.is_tensor(v) */
static int t_is_tensor(lua_State *L) {
  lua_pushboolean(L, luaL_testudata(L, 1, TENSOR_MT) != NULL);
  return 1;
}

/* ------------------------------------------------------------ math */

/* A 0-d int64 tensor holding the Lua integer at idx, when t is int64 and a
 * double cannot hold the integer (past 2^53): the scalar kernels take a
 * double, so t + (2^53 + 1) added 2^53 and t - maxinteger was ERANGE. NULL
 * when the scalar path is exact. */
static crun_tensor_t *exact_int64_scalar(lua_State *L, int idx, const crun_tensor_t *t) {
  if (crun_tensor_dtype(t) != CRUN_INT64 || !lua_isinteger(L, idx)) return NULL;
  lua_Integer v = lua_tointeger(L, idx);
  if (v >= -((lua_Integer)1 << 53) && v <= ((lua_Integer)1 << 53)) return NULL;
  crun_tensor_t *s;
  CRUN_L_CHECK(L, crun_tensor_new(CRUN_INT64, 0, NULL, &s));
  crun_tensor_fill_int64(s, v);
  return s;
}

/* 0 for bool, 1 for the integers, 2 for the floats: torch's kinds. */
static int dtype_kind(crun_dtype_t dt) { return dt == CRUN_BOOL ? 0 : crun_dtype_is_integer(dt) ? 1 : 2; }

/* torch.promote_types: the wider of a kind, the higher kind across kinds;
 * uint8 with int8 is int16, float16 with bfloat16 float32. */
static crun_dtype_t promote_types(crun_dtype_t a, crun_dtype_t b) {
  if (a == b) return a;
  if (dtype_kind(a) != dtype_kind(b)) return dtype_kind(a) > dtype_kind(b) ? a : b;
  if (dtype_kind(a) == 1) {
    int ua = a == CRUN_UINT8, ub = b == CRUN_UINT8;
    size_t sa = crun_dtype_size(a), sb = crun_dtype_size(b);
    if ((ua || ub) && sa == sb) return CRUN_INT16; /* uint8 with int8 */
    if (ua || ub) return ua ? b : a;              /* uint8 with a wider signed one */
    return sa > sb ? a : b;
  }
  size_t sa = crun_dtype_size(a), sb = crun_dtype_size(b);
  if (sa == sb) return CRUN_FLOAT32; /* float16 with bfloat16 */
  return sa > sb ? a : b;
}

/* torch.result_type of two tensors: a 0-d one beside a tensor with dims
 * counts only when of a higher kind. */
static crun_dtype_t result_type(const crun_tensor_t *a, const crun_tensor_t *b) {
  crun_dtype_t da = crun_tensor_dtype(a), db = crun_tensor_dtype(b);
  int za = crun_tensor_ndim(a) == 0, zb = crun_tensor_ndim(b) == 0;
  if (za == zb) return promote_types(da, db);
  crun_dtype_t dd = za ? db : da, dz = za ? da : db;
  return dtype_kind(dz) > dtype_kind(dd) ? promote_types(dd, dz) : dd;
}

/* *out = t converted to dt (the caller releases it), or NULL when t has dt. */
static int converted(crun_tensor_t *t, crun_dtype_t dt, crun_tensor_t **out) {
  *out = NULL;
  return crun_tensor_dtype(t) == dt ? 0 : crun_tensor_to(t, dt, out);
}

/* An integer or bool tensor t meeting a Lua float, or divided: float32. */
static int float_promoted(crun_tensor_t *t, crun_tensor_t **out) {
  *out = NULL;
  return dtype_kind(crun_tensor_dtype(t)) == 2 ? 0 : converted(t, CRUN_FLOAT32, out);
}

/* A bool tensor meeting a Lua integer computes in int64, as torch's (m * 3
 * counts 3 per true; m:eq(2) is all false). */
static int int_promoted(crun_tensor_t *t, crun_tensor_t **out) {
  *out = NULL;
  return crun_tensor_dtype(t) == CRUN_BOOL ? crun_tensor_to(t, CRUN_INT64, out) : 0;
}

/* Promotes the operands of a new (not in-place) op as torch does: two
 * tensors meet in their result_type; an integer or bool tensor meeting a
 * Lua float (2.0, 0.5, n / 2) and the operands of true division compute in
 * float, a bool tensor meeting a Lua integer in int64. *pa / *pb are the
 * copies made (or NULL). */
static int promote_operands(lua_State *L, int div, crun_tensor_t *a, crun_tensor_t *b,
                            crun_tensor_t **pa, crun_tensor_t **pb) {
  int rc = 0;
  *pa = *pb = NULL;
  if (a && b) {
    crun_dtype_t dt = result_type(a, b);
    if (div && dtype_kind(dt) != 2) dt = CRUN_FLOAT32;
    rc = converted(a, dt, pa);
    if (rc == 0) rc = converted(b, dt, pb);
  } else if (a && !b && lua_isnoneornil(L, 3) && lua_type(L, 2) == LUA_TNUMBER) {
    rc = div || !lua_isinteger(L, 2) ? float_promoted(a, pa) : int_promoted(a, pa);
  } else if (!a) {
    rc = div || !lua_isinteger(L, 1) ? float_promoted(b, pb) : int_promoted(b, pb);
  }
  return rc;
}

/* Binary op on (tensor|number, tensor|number), new result or in place. The
 * op is the closure's upvalue 1, in-place flag upvalue 2. t:add(x, alpha)
 * and t:sub(x, alpha) scale a tensor x by alpha first (torch's alpha). */
static int m_binop(lua_State *L) {
  crun_binop_t op = (crun_binop_t)lua_tointeger(L, lua_upvalueindex(1));
  int inplace = lua_toboolean(L, lua_upvalueindex(2));
  crun_tensor_t *a = test_tensor(L, 1), *b = test_tensor(L, 2), *r = NULL, *scaled = NULL;
  int rc;
  if (!a && !b) return crun_l_argerror(L, 1, "tensor expected");
  if (!a && inplace) return crun_l_argerror(L, 1, "tensor expected");
  if (!a) crun_l_checknumber(L, 1); /* raise before anything is allocated */
  if (b && !lua_isnoneornil(L, 3) && (op == CRUN_BIN_ADD || op == CRUN_BIN_SUB)) {
    CRUN_L_CHECK(L, crun_tensor_binop_scalar(CRUN_BIN_MUL, b, crun_l_checknumber(L, 3), 0, &scaled));
    b = scaled;
  }
  /* In place into another dtype (a tensor operand of another dtype, a
   * comparison, or a true division of integers): computed as a new result,
   * then cast into `into`, as torch's; where torch refuses the cast (a float
   * into an integer or bool tensor, an integer into bool) it is EINVAL. */
  crun_tensor_t *into = NULL, *pa = NULL, *pb = NULL;
  if (inplace && ((b && crun_tensor_dtype(b) != crun_tensor_dtype(a)) ||
                  (op >= CRUN_BIN_EQ && crun_tensor_dtype(a) != CRUN_BOOL) ||
                  (op == CRUN_BIN_DIV && dtype_kind(crun_tensor_dtype(a)) != 2))) {
    into = a;
    inplace = 0;
  }
  /* (a Lua float meeting an int tensor in place otherwise keeps the old
   * rule: ENOTSUP when not integral) */
  if (!inplace && (rc = promote_operands(L, op == CRUN_BIN_DIV, a, b, &pa, &pb)) < 0) {
    crun_tensor_release(pa);
    crun_tensor_release(pb);
    crun_tensor_release(scaled);
    crun_l_fail(L, rc);
  }
  if (pa) a = pa;
  if (pb) b = pb;
  if (into && op < CRUN_BIN_EQ && dtype_kind(crun_tensor_dtype(a)) > dtype_kind(crun_tensor_dtype(into))) {
    const char *from = crun_dtype_name(crun_tensor_dtype(a)); /* (static names: valid past the releases) */
    crun_tensor_release(pa);
    crun_tensor_release(pb);
    crun_tensor_release(scaled);
    return crun_l_error(L, "EINVAL: %s_: result type %s can't be cast to %s (the tensor written in place)",
                        crun_binop_name(op), from, crun_dtype_name(crun_tensor_dtype(into)));
  }
  crun_tensor_t *exact = !a ? exact_int64_scalar(L, 1, b)
                       : !b && lua_isnoneornil(L, 3) ? exact_int64_scalar(L, 2, a) : NULL;
  if (exact) {
    if (!a) rc = crun_tensor_binop(op, exact, b, &r);
    else rc = inplace ? crun_tensor_binop_out(op, a, exact, a) : crun_tensor_binop(op, a, exact, &r);
    crun_tensor_release(exact);
  } else if (a && b) {
    rc = inplace ? crun_tensor_binop_out(op, a, b, a) : crun_tensor_binop(op, a, b, &r);
  } else if (a) {
    double s = crun_l_checknumber(L, 2);
    if (!lua_isnoneornil(L, 3) && (op == CRUN_BIN_ADD || op == CRUN_BIN_SUB)) s *= crun_l_checknumber(L, 3);
    rc = inplace ? crun_tensor_binop_scalar_out(op, a, s, 0, a) : crun_tensor_binop_scalar(op, a, s, 0, &r);
  } else {
    rc = crun_tensor_binop_scalar(op, b, crun_l_checknumber(L, 1), 1, &r);
  }
  crun_tensor_release(scaled);
  crun_tensor_release(pa);
  crun_tensor_release(pb);
  if (into) {
    if (rc == 0) rc = crun_tensor_copy(into, r);
    crun_tensor_release(r);
  }
  if (rc < 0) crun_l_fail(L, rc);
  if (inplace || into) {
    lua_settop(L, 1);
    return 1;
  }
  return push_owned(L, 0, &r);
}

/* *out = a 0-d tensor of dt holding the Lua number at idx; CRUN_ERANGE when
 * an integer does not fit dt. */
static int scalar_tensor(lua_State *L, int idx, crun_dtype_t dt, crun_tensor_t **out) {
  CRUN_CHECK(crun_tensor_new(dt, 0, NULL, out));
  int rc;
  if (lua_isinteger(L, idx) && crun_dtype_is_integer(dt)) {
    int64_t v = (int64_t)lua_tointeger(L, idx), got, at[1] = {0};
    rc = crun_tensor_fill_int64(*out, v);
    if (rc == 0 && (rc = crun_tensor_get_int64(*out, at, &got)) == 0 && got != v)
      rc = crun_error(CRUN_ERANGE, "scalar %lld out of range for %s", (long long)v, crun_dtype_name(dt));
  } else {
    rc = crun_tensor_fill(*out, lua_tonumber(L, idx));
  }
  if (rc < 0) crun_tensor_release(*out);
  return rc;
}

/* floor_divide / remainder / fmod (upvalue 1) on (tensor|number,
 * tensor|number), promoted as the arithmetic ops; also // and %. */
static int m_divmod(lua_State *L) {
  crun_divmod_t op = (crun_divmod_t)lua_tointeger(L, lua_upvalueindex(1));
  crun_tensor_t *a = test_tensor(L, 1), *b = test_tensor(L, 2), *pa = NULL, *pb = NULL, *s = NULL, *r = NULL;
  if (!a && !b) return crun_l_argerror(L, 1, "tensor expected");
  if (!a) crun_l_checknumber(L, 1); /* raise before anything is allocated */
  if (!b) crun_l_checknumber(L, 2);
  lua_settop(L, 2);
  int rc = promote_operands(L, 0, a, b, &pa, &pb);
  if (pa) a = pa;
  if (pb) b = pb;
  if (rc == 0 && !a) rc = scalar_tensor(L, 1, crun_tensor_dtype(b), &s), a = s;
  if (rc == 0 && !b) rc = scalar_tensor(L, 2, crun_tensor_dtype(a), &s), b = s;
  if (rc == 0) rc = crun_tensor_divmod(op, a, b, &r);
  crun_tensor_release(pa);
  crun_tensor_release(pb);
  crun_tensor_release(s);
  return push_owned(L, rc, &r);
}

/* Unary op (upvalue 1), in place when upvalue 2 is true. */
static int m_unop(lua_State *L) {
  crun_unop_t op = (crun_unop_t)lua_tointeger(L, lua_upvalueindex(1));
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *r;
  if (lua_toboolean(L, lua_upvalueindex(2))) {
    CRUN_L_CHECK(L, crun_tensor_unop_out(op, a, a));
    lua_settop(L, 1);
    return 1;
  }
  return push_owned(L, crun_tensor_unop(op, a, &r), &r);
}

/* t:clamp(lo, hi) / t:clamp_(lo, hi); nil leaves that side open. */
static int clamp_common(lua_State *L, int inplace) {
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *r;
  double lo = crun_l_optnumber(L, 2, -HUGE_VAL), hi = crun_l_optnumber(L, 3, HUGE_VAL);
  if (inplace) {
    CRUN_L_CHECK(L, crun_tensor_clamp_out(a, lo, hi, a));
    lua_settop(L, 1);
    return 1;
  }
  return push_owned(L, crun_tensor_clamp(a, lo, hi, &r), &r);
}
static int m_clamp(lua_State *L) { return clamp_common(L, 0); }
static int m_clamp_(lua_State *L) { return clamp_common(L, 1); }

/* Pushes the one element of t (a reduction's result); a device tensor is
 * copied to the host first (that waits for it). */
static void push_scalar_of(lua_State *L, crun_tensor_t *t) {
  int64_t idx[CRUN_MAX_DIMS] = {0};
  crun_tensor_t *h = NULL;
  if (crun_tensor_device(t) >= 0) {
    CRUN_L_CHECK(L, crun_tensor_to_device(t, CRUN_DEVICE_CPU, &h));
    t = h;
  }
  push_elem_at(L, t, idx);
  crun_tensor_release(h);
}

/* Reads a reduction's dim at arg as check_dim, except that a 0-d tensor
 * takes dim 1 or -1 (torch's 0 or -1): then -1, the reduction over all. */
static int check_reduce_dim(lua_State *L, int arg, const crun_tensor_t *t) {
  if (crun_tensor_ndim(t) == 0 && lua_isinteger(L, arg)) {
    lua_Integer d = lua_tointeger(L, arg);
    if (d == 1 || d == -1) return -1;
  }
  return check_dim(L, arg, t);
}

/* Reduction (upvalue 1): t:sum() -> number; t:sum(dim[, keepdim]) -> tensor;
 * t:sum(nil, true) -> a tensor with every size 1 (torch's dim=None,
 * keepdim=True); max/min with a dim also return the 1-based positions. */
static int m_reduce(lua_State *L) {
  crun_dimred_t op = (crun_dimred_t)lua_tointeger(L, lua_upvalueindex(1));
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *v = NULL, *ix = NULL;
  int all = lua_isnoneornil(L, 2), dim = all ? -1 : check_reduce_dim(L, 2, a), keep = lua_toboolean(L, 3);
  int with_idx = !all && (op == CRUN_DIMRED_MAX || op == CRUN_DIMRED_MIN);
  CRUN_L_CHECK(L, crun_tensor_reduce_dim(op, a, dim, keep, 1, &v, with_idx ? &ix : NULL));
  if (all && !keep) {
    push_scalar_of(L, v);
    crun_tensor_release(v);
    return 1;
  }
  push_owned(L, 0, &v);
  if (!with_idx) return 1;
  push_owned(L, 0, &ix);
  return 2;
}

/* t:cumsum(dim) / t:cumprod(dim) (upvalue 1: the op): running sums or
 * products along dim, torch's; a 0-d tensor takes dim 1 or -1. */
static int m_cumulate(lua_State *L) {
  crun_dimred_t op = (crun_dimred_t)lua_tointeger(L, lua_upvalueindex(1));
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *r;
  if (lua_isnoneornil(L, 2)) return crun_l_argerror(L, 2, "dim expected (torch's cumsum / cumprod need one)");
  return push_owned(L, crun_tensor_cumulate(op, a, check_reduce_dim(L, 2, a), &r), &r);
}

/* t:sort([dim[, descending]]) -> values, 1-based positions: along dim (the
 * last by default), nan the largest, equal values in their order. */
static int m_sort(lua_State *L) {
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *v = NULL, *ix = NULL;
  int dim = lua_isnoneornil(L, 2) ? crun_tensor_ndim(a) - 1 : check_reduce_dim(L, 2, a);
  CRUN_L_CHECK(L, crun_tensor_sort(a, dim, lua_toboolean(L, 3), 1, &v, &ix));
  push_owned(L, 0, &v);
  return 1 + push_owned(L, 0, &ix);
}

/* t:argmax([dim[, keepdim]]) / t:argmin: 1-based positions (a number with no
 * dim; with no dim and keepdim, a tensor with every size 1, as torch's). */
static int arg_common(lua_State *L, crun_dimred_t op) {
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *v = NULL, *ix = NULL;
  int all = lua_isnoneornil(L, 2), dim = all ? -1 : check_reduce_dim(L, 2, a), keep = lua_toboolean(L, 3);
  if ((dim < 0 ? crun_tensor_numel(a) : crun_tensor_shape(a)[dim]) == 0) /* (reduce_dim would name max / min) */
    return crun_l_error(L, "EINVAL: %s over an empty dim (no identity)", op == CRUN_DIMRED_MAX ? "argmax" : "argmin");
  CRUN_L_CHECK(L, crun_tensor_reduce_dim(op, a, dim, keep, 1, &v, &ix));
  crun_tensor_release(v);
  if (all && !keep) {
    push_scalar_of(L, ix);
    crun_tensor_release(ix);
    return 1;
  }
  return push_owned(L, 0, &ix);
}
static int m_argmax(lua_State *L) { return arg_common(L, CRUN_DIMRED_MAX); }
static int m_argmin(lua_State *L) { return arg_common(L, CRUN_DIMRED_MIN); }

/* t:matmul(o) (also T.matmul(a, b)); 1-d x 1-d gives a number. */
static int m_matmul(lua_State *L) {
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *b = crun_l_check_tensor(L, 2), *r;
  CRUN_L_CHECK(L, crun_tensor_matmul(a, b, &r));
  if (crun_tensor_ndim(r) == 0) {
    push_scalar_of(L, r);
    crun_tensor_release(r);
    return 1;
  }
  return push_owned(L, 0, &r);
}

/* t:mm(o): 2-d x 2-d only. */
static int m_mm(lua_State *L) {
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *b = crun_l_check_tensor(L, 2);
  if (crun_tensor_ndim(a) != 2 || crun_tensor_ndim(b) != 2)
    return crun_l_argerror(L, crun_tensor_ndim(a) != 2 ? 1 : 2, "mm expects 2-d tensors");
  return m_matmul(L);
}

/* t:addmm_(A, B[, beta=1[, alpha=1]]): t = beta t + alpha A B, in place. */
static int m_addmm_(lua_State *L) {
  crun_tensor_t *c = crun_l_check_tensor(L, 1), *a = crun_l_check_tensor(L, 2), *b = crun_l_check_tensor(L, 3);
  CRUN_L_CHECK(L, crun_tensor_gemm(0, 0, crun_l_optnumber(L, 5, 1), a, b, crun_l_optnumber(L, 4, 1), c));
  lua_settop(L, 1);
  return 1;
}

/* T.addmm(M, A, B[, beta[, alpha]]): beta M + alpha A B, M broadcast. */
static int t_addmm(lua_State *L) {
  crun_tensor_t *m = crun_l_check_tensor(L, 1), *a = crun_l_check_tensor(L, 2), *b = crun_l_check_tensor(L, 3);
  crun_tensor_t *o, *e;
  double beta = crun_l_optnumber(L, 4, 1), alpha = crun_l_optnumber(L, 5, 1);
  if (crun_tensor_ndim(a) != 2 || crun_tensor_ndim(b) != 2) return crun_l_argerror(L, 2, "addmm expects 2-d A and B");
  int64_t shape[2] = {crun_tensor_shape(a)[0], crun_tensor_shape(b)[1]};
  CRUN_L_CHECK(L, crun_tensor_empty(crun_tensor_dtype(a), 2, shape, &o));
  crun_l_push_tensor(L, o);
  crun_tensor_release(o); /* owned by the userdata from here */
  CRUN_L_CHECK(L, crun_tensor_expand(m, 2, shape, &e));
  int rc = crun_tensor_copy(o, e);
  crun_tensor_release(e);
  CRUN_L_CHECK(L, rc);
  CRUN_L_CHECK(L, crun_tensor_gemm(0, 0, alpha, a, b, beta, o));
  return 1;
}

/* T.linear(x, W[, b]): x W^T + b. */
static int t_linear(lua_State *L) {
  crun_tensor_t *x = crun_l_check_tensor(L, 1), *w = crun_l_check_tensor(L, 2), *r;
  crun_tensor_t *b = lua_isnoneornil(L, 3) ? NULL : crun_l_check_tensor(L, 3);
  return push_owned(L, crun_tensor_linear(x, w, b, &r), &r);
}

/* T.linear_backward(x, W, gy) -> gx = gy W, gW = gy^T x, gb = sum of gy rows. */
static int t_linear_backward(lua_State *L) {
  crun_tensor_t *x = crun_l_check_tensor(L, 1), *w = crun_l_check_tensor(L, 2), *gy = crun_l_check_tensor(L, 3);
  if (crun_tensor_ndim(x) != 2 || crun_tensor_ndim(gy) != 2)
    return crun_l_argerror(L, crun_tensor_ndim(x) != 2 ? 1 : 3, "linear_backward expects 2-d x and gy");
  crun_tensor_t *gx, *gw, *gb;
  crun_dtype_t dt = crun_tensor_dtype(x);
  CRUN_L_CHECK(L, crun_tensor_new(dt, 2, crun_tensor_shape(x), &gx));
  push_owned(L, 0, &gx);
  CRUN_L_CHECK(L, crun_tensor_new(dt, 2, crun_tensor_shape(w), &gw));
  push_owned(L, 0, &gw);
  CRUN_L_CHECK(L, crun_tensor_gemm(0, 0, 1, gy, w, 0, crun_l_check_tensor(L, -2)));
  CRUN_L_CHECK(L, crun_tensor_gemm(1, 0, 1, gy, x, 0, crun_l_check_tensor(L, -1)));
  return 2 + push_owned(L, crun_tensor_reduce_dim(CRUN_DIMRED_SUM, gy, 0, 0, 0, &gb, NULL), &gb);
}

/* Reads an index argument: an int tensor, or a Lua list turned into int64. */
static crun_tensor_t *index_arg(lua_State *L, int arg, crun_tensor_t **owned) {
  *owned = NULL;
  if (!lua_istable(L, arg)) return crun_l_check_tensor(L, arg);
  int64_t n = (int64_t)luaL_len(L, arg);
  CRUN_L_CHECK(L, crun_tensor_empty(CRUN_INT64, 1, &n, owned));
  for (int64_t i = 0; i < n; i++) {
    lua_geti(L, arg, i + 1);
    int ok;
    ((int64_t *)crun_tensor_data(*owned))[i] = lua_tointegerx(L, -1, &ok);
    lua_pop(L, 1);
    if (!ok) {
      crun_tensor_release(*owned);
      crun_l_argerror(L, arg, "index list entries must be integers");
    }
  }
  return *owned;
}

/* t:index_select(dim, index): 1-based index values. */
static int m_index_select(lua_State *L) {
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *owned, *r;
  int dim = check_dim(L, 2, a);
  crun_tensor_t *ix = index_arg(L, 3, &owned);
  int rc = crun_tensor_index_select(a, dim, ix, 1, &r);
  crun_tensor_release(owned);
  return push_owned(L, rc, &r);
}

/* t:gather(dim, index): 1-based index values (torch.gather). */
static int m_gather(lua_State *L) {
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *r;
  int dim = check_dim(L, 2, a);
  return push_owned(L, crun_tensor_gather(a, dim, crun_l_check_tensor(L, 3), 1, &r), &r);
}

/* t:scatter_add_(dim, index, src): in place, 1-based index values. */
static int m_scatter_add_(lua_State *L) {
  crun_tensor_t *a = crun_l_check_tensor(L, 1);
  int dim = check_dim(L, 2, a);
  CRUN_L_CHECK(L, crun_tensor_scatter_add_(a, dim, crun_l_check_tensor(L, 3), crun_l_check_tensor(L, 4), 1));
  lua_settop(L, 1);
  return 1;
}

static int softmax_common(lua_State *L, int use_log) {
  crun_tensor_t *a = crun_l_check_tensor(L, 1), *r;
  int dim = lua_isnoneornil(L, 2) ? crun_tensor_ndim(a) - 1 : check_dim(L, 2, a);
  if (crun_tensor_ndim(a) == 0) return crun_l_argerror(L, 1, "softmax of a 0-d tensor");
  return push_owned(L, crun_tensor_softmax(a, dim, use_log, &r), &r);
}
static int m_softmax(lua_State *L) { return softmax_common(L, 0); }
static int m_log_softmax(lua_State *L) { return softmax_common(L, 1); }

/* core.tensor._where(cond, a, b): cond ? a : b over three tensors (crun.tensor's
 * T.where turns scalars into tensors and promotes the dtypes first). */
static int t_where(lua_State *L) {
  crun_tensor_t *c = crun_l_check_tensor(L, 1), *a = crun_l_check_tensor(L, 2), *b = crun_l_check_tensor(L, 3), *r;
  return push_owned(L, crun_tensor_where(c, a, b, &r), &r);
}

/* Registers name -> closure(fn, op, inplace) into the table at -1. */
static void set_op(lua_State *L, const char *name, lua_CFunction fn, int op, int inplace) {
  lua_pushinteger(L, op);
  lua_pushboolean(L, inplace);
  lua_pushcclosure(L, fn, 2);
  lua_setfield(L, -2, name);
}

/* Adds the math methods to the methods table on the top of the stack. */
static void tensor_math_methods(lua_State *L) {
  char name[32];
  for (int op = 0; op < CRUN_BINOP_COUNT; op++) {
    set_op(L, crun_binop_name((crun_binop_t)op), m_binop, op, 0);
    snprintf(name, sizeof name, "%s_", crun_binop_name((crun_binop_t)op));
    set_op(L, name, m_binop, op, 1);
  }
  for (int op = 0; op < CRUN_UNOP_COUNT; op++) {
    set_op(L, crun_unop_name((crun_unop_t)op), m_unop, op, 0);
    snprintf(name, sizeof name, "%s_", crun_unop_name((crun_unop_t)op));
    set_op(L, name, m_unop, op, 1);
  }
  static const char *reds[] = {
#define CRUN_X_RN(NAME, name) #name,
      CRUN_DIMRED_MAP(CRUN_X_RN)
#undef CRUN_X_RN
  };
  for (int op = 0; op < CRUN_DIMRED_COUNT; op++) set_op(L, reds[op], m_reduce, op, 0);
  lua_pushcfunction(L, m_sort);
  lua_setfield(L, -2, "sort");
  set_op(L, "cumsum", m_cumulate, CRUN_DIMRED_SUM, 0);
  set_op(L, "cumprod", m_cumulate, CRUN_DIMRED_PROD, 0);
  set_op(L, "floor_divide", m_divmod, CRUN_DIVMOD_FLOOR_DIVIDE, 0);
  set_op(L, "remainder", m_divmod, CRUN_DIVMOD_REMAINDER, 0);
  set_op(L, "fmod", m_divmod, CRUN_DIVMOD_FMOD, 0);
  set_op(L, "_div_trunc", m_divmod, CRUN_DIVMOD_DIV_TRUNC, 0); /* (div's rounding_mode="trunc") */
  static const luaL_Reg fns[] = {
      {"clamp", m_clamp}, {"clamp_", m_clamp_}, {"argmax", m_argmax}, {"argmin", m_argmin},
      {"matmul", m_matmul}, {"mm", m_mm}, {"addmm_", m_addmm_}, {"index_select", m_index_select},
      {"gather", m_gather}, {"scatter_add_", m_scatter_add_}, {"softmax", m_softmax},
      {"log_softmax", m_log_softmax}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}

/* Arithmetic metamethods: + - * / // % ^ and unary minus (element-wise;
 * // and % round toward -inf, as Lua's and torch's). */
static void set_arith_meta(lua_State *L) {
  set_op(L, "__idiv", m_divmod, CRUN_DIVMOD_FLOOR_DIVIDE, 0);
  set_op(L, "__mod", m_divmod, CRUN_DIVMOD_REMAINDER, 0);
  set_op(L, "__add", m_binop, CRUN_BIN_ADD, 0);
  set_op(L, "__sub", m_binop, CRUN_BIN_SUB, 0);
  set_op(L, "__mul", m_binop, CRUN_BIN_MUL, 0);
  set_op(L, "__div", m_binop, CRUN_BIN_DIV, 0);
  set_op(L, "__pow", m_binop, CRUN_BIN_POW, 0);
  set_op(L, "__unm", m_unop, CRUN_UN_NEG, 0);
}

/* ------------------------------------------------------------ registration */

static const luaL_Reg tensor_methods[] = {
    {"numel", m_numel}, {"nElement", m_numel}, {"dim", m_dim}, {"nDimension", m_dim},
    {"size", m_size}, {"stride", m_stride}, {"dtype", m_dtype},
    {"is_contiguous", m_is_contiguous}, {"isContiguous", m_is_contiguous}, {"data_ptr", m_data_ptr},
    {"totable", m_totable}, {"item", m_item}, {"bytes", m_bytes}, {"clone", m_clone},
    {"contiguous", m_contiguous}, {"to", m_to}, {"copy", m_copy}, {"fill", m_fill}, {"fill_", m_fill},
    {"zero", m_zero}, {"zero_", m_zero}, {"equal", m_equal}, {"allclose", m_allclose},
    {"narrow", m_narrow}, {"select", m_select}, {"view", m_view}, {"reshape", m_reshape},
    {"transpose", m_transpose}, {"t", m_t}, {"expand", m_expand},
    {"is_same_storage", m_is_same_storage}, {"uniform_", m_uniform_}, {"normal_", m_normal_},
    {"close", m_close}, {NULL, NULL}};

static const luaL_Reg gen_methods[] = {
    {"manual_seed", g_manual_seed}, {"seed", g_manual_seed}, {"uniform", g_uniform},
    {"normal", g_normal}, {"random", g_random}, {NULL, NULL}};

static const luaL_Reg tensor_fns[] = {
    {"zeros", t_zeros}, {"ones", t_ones}, {"empty", t_empty}, {"full", t_full},
    {"arange", t_arange}, {"new", t_new}, {"from_bytes", t_from_bytes},
    {"rand", t_rand}, {"randn", t_randn}, {"randint", t_randint}, {"Generator", t_generator},
    {"manual_seed", t_manual_seed}, {"is_tensor", t_is_tensor}, {"matmul", m_matmul},
    {"addmm", t_addmm}, {"linear", t_linear}, {"linear_backward", t_linear_backward}, {"_where", t_where},
    {NULL, NULL}};


/* Records each function of the methods table (on the top of the stack)
 * under its name in the registry's CRUN_L_METHOD_NAMES, so that an argument
 * error raised while crun.tensor's Lua wrapper of t:sum calls the binding
 * through a local still reads "bad argument #1 to 'sum'" (crun_l_argerror). */
static void record_method_names(lua_State *L) {
  lua_newtable(L);
  lua_pushnil(L);
  while (lua_next(L, -3)) { /* name at -2, function at -1 */
    if (lua_type(L, -2) == LUA_TSTRING && lua_iscfunction(L, -1)) {
      lua_pushvalue(L, -2);
      lua_rawset(L, -4); /* names[function] = name */
    } else {
      lua_pop(L, 1);
    }
  }
  lua_setfield(L, LUA_REGISTRYINDEX, CRUN_L_METHOD_NAMES);
}

/* Creates the metatable "crun.Tensor": __index dispatches through the methods
 * table (left on the stack for the caller). */
static void open_tensor_class(lua_State *L) {
  luaL_newmetatable(L, TENSOR_MT);
  crun_l_cache_metatable(L, -1, TENSOR_MT);
  lua_newtable(L); /* methods */
  luaL_setfuncs(L, tensor_methods, 0);
  tensor_math_methods(L);
  record_method_names(L);
  lua_pushvalue(L, -1);
  lua_pushcclosure(L, m_index, 1);
  lua_setfield(L, -3, "__index");
  static const luaL_Reg meta[] = {{"__newindex", m_newindex}, {"__len", m_len}, {"__gc", m_gc},
                                  {"__close", m_close}, {"__tostring", m_tostring}, {NULL, NULL}};
  lua_pushvalue(L, -2);
  luaL_setfuncs(L, meta, 0);
  set_arith_meta(L);
  lua_pop(L, 1);
}

void crun_l_open_tensor(lua_State *L) {
  crun_l_newclass(L, GEN_MT, gen_methods);
  lua_newtable(L); /* core.tensor */
  luaL_setfuncs(L, tensor_fns, 0);
  open_tensor_class(L);  /* pushes metatable, methods */
  lua_setfield(L, -3, "methods");
  lua_setfield(L, -2, "metatable");
  crun_generator_t *g = lua_newuserdatauv(L, sizeof *g, 0); /* default, seed 0 */
  crun_generator_seed(g, 0);
  luaL_setmetatable(L, GEN_MT);
  lua_setfield(L, LUA_REGISTRYINDEX, DEFAULT_GEN_KEY);
  lua_setfield(L, -2, "tensor");
  lua_pushcfunction(L, m_bytes);
  lua_setfield(L, -2, "tensor_bytes");
  lua_pushcfunction(L, t_from_bytes);
  lua_setfield(L, -2, "tensor_from_bytes");
}
