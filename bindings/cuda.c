/* cuda.c — Lua bindings for crun/cuda.h: core.cuda (devices, memory
 * figures), the userdata "crun.cuda.Stream" and "crun.cuda.Event", and the
 * device functions of tensors (core.tensor.empty_on / zeros_on / to_device
 * / device_of / pin_memory / is_pinned). lua/crun/cuda.lua and tensor.lua
 * build the torch-shaped API on these. Devices are 0-based as in torch;
 * -1 is the host. */
#include "crun_lua.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_MT "crun.cuda.Stream"
#define EVENT_MT "crun.cuda.Event"

typedef struct { crun_cuda_stream_t *s; } sbox;
typedef struct { crun_cuda_event_t *e; } ebox;

/* Reads an optional device index at arg (nil or -1: the current device). */
static int opt_device(lua_State *L, int arg) {
  if (lua_isnoneornil(L, arg)) return -1;
  return (int)crun_l_check_range(L, crun_l_checkinteger(L, arg), -1, INT_MAX, "cuda", "device");
}

/* Resolves -1 to the current device (raising when there is no device). */
static int device_or_current(lua_State *L, int arg) {
  int dev = opt_device(L, arg);
  if (dev < 0) CRUN_L_CHECK(L, crun_cuda_current_device(&dev));
  return dev;
}

/* ------------------------------------------------------------ devices */

int crun_l_check_device(lua_State *L, int idx, int arg, const char *fname) {
  if (lua_isinteger(L, idx)) {
    lua_Integer d = lua_tointeger(L, idx);
    if (d >= -1 && d <= INT_MAX) return (int)d;
  } else if (lua_type(L, idx) == LUA_TSTRING) {
    const char *s = lua_tostring(L, idx);
    if (!strcmp(s, "cpu")) return -1;
    if (!strcmp(s, "cuda")) {
      int dev;
      CRUN_L_CHECK(L, crun_cuda_current_device(&dev));
      return dev;
    }
    char *end;
    if (!strncmp(s, "cuda:", 5) && s[5] >= '0' && s[5] <= '9') {
      long d = strtol(s + 5, &end, 10);
      if (!*end && d <= INT_MAX) return (int)d;
    }
  }
  return crun_l_argerror(L, arg, lua_pushfstring(L, "%s: unknown device '%s' (expected \"cpu\", \"cuda\", "
                                                   "\"cuda:N\" or an integer)", fname, luaL_tolstring(L, idx, NULL)));
}

/* cuda.is_available() -> boolean; cuda.unavailable_reason() -> text or nil */
static int c_is_available(lua_State *L) {
  lua_pushboolean(L, crun_cuda_is_available());
  return 1;
}

static int c_unavailable_reason(lua_State *L) {
  int n;
  if (crun_cuda_device_count(&n) == 0) return 0;
  lua_pushstring(L, crun_last_error());
  return 1;
}

/* cuda.device_count() -> n (0 when there is no device or no CUDA, as torch) */
static int c_device_count(lua_State *L) {
  int n = 0;
  if (crun_cuda_device_count(&n) < 0) n = 0;
  lua_pushinteger(L, n);
  return 1;
}

static int c_set_device(lua_State *L) {
  CRUN_L_CHECK(L, crun_cuda_set_device((int)crun_l_check_range(L, crun_l_checkinteger(L, 1), 0, INT_MAX,
                                                                "cuda.set_device", "device")));
  return 0;
}

static int c_current_device(lua_State *L) {
  int dev;
  CRUN_L_CHECK(L, crun_cuda_current_device(&dev));
  lua_pushinteger(L, dev);
  return 1;
}

static int c_synchronize(lua_State *L) {
  CRUN_L_CHECK(L, crun_cuda_synchronize(opt_device(L, 1)));
  return 0;
}

/* cuda.memory([dev]) -> allocated, reserved, peak (bytes) */
static int c_memory(lua_State *L) {
  crun_cuda_memory_t m;
  CRUN_L_CHECK(L, crun_cuda_memory(device_or_current(L, 1), &m));
  lua_pushinteger(L, (lua_Integer)m.allocated);
  lua_pushinteger(L, (lua_Integer)m.reserved);
  lua_pushinteger(L, (lua_Integer)m.peak);
  return 3;
}

static int c_reset_peak(lua_State *L) {
  CRUN_L_CHECK(L, crun_cuda_reset_peak(device_or_current(L, 1)));
  return 0;
}

static int c_empty_cache(lua_State *L) {
  CRUN_L_CHECK(L, crun_cuda_empty_cache(device_or_current(L, 1)));
  return 0;
}

/* ------------------------------------------------------------ streams */

static int s_wait_event(lua_State *L);
static int s_record_event(lua_State *L);
static int s_wait_stream(lua_State *L);

static crun_cuda_stream_t *check_stream(lua_State *L, int arg) {
  sbox *b = crun_l_checkudata(L, arg, STREAM_MT);
  if (!b->s) crun_l_argerror(L, arg, "stream is closed");
  return b->s;
}

static crun_cuda_stream_t *opt_stream(lua_State *L, int arg) {
  return lua_isnoneornil(L, arg) ? NULL : check_stream(L, arg);
}

/* Pushes a Stream userdata holding one reference of s (retained here). */
static void push_stream(lua_State *L, crun_cuda_stream_t *s) {
  sbox *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->s = s;
  crun_cuda_stream_retain(s);
  luaL_setmetatable(L, STREAM_MT);
}

/* cuda.Stream([dev]) -> a new non-blocking stream */
static int c_stream_new(lua_State *L) {
  crun_cuda_stream_t *s;
  CRUN_L_CHECK(L, crun_cuda_stream_create(opt_device(L, 1), &s));
  push_stream(L, s);
  crun_cuda_stream_release(s);
  return 1;
}

static int c_current_stream(lua_State *L) {
  crun_cuda_stream_t *s;
  CRUN_L_CHECK(L, crun_cuda_current_stream(opt_device(L, 1), &s));
  push_stream(L, s);
  return 1;
}

static int c_default_stream(lua_State *L) {
  crun_cuda_stream_t *s;
  CRUN_L_CHECK(L, crun_cuda_default_stream(opt_device(L, 1), &s));
  push_stream(L, s);
  return 1;
}

static int c_set_stream(lua_State *L) {
  CRUN_L_CHECK(L, crun_cuda_set_stream(check_stream(L, 1)));
  return 0;
}

static int s_query(lua_State *L) {
  int r = crun_cuda_stream_query(check_stream(L, 1));
  CRUN_L_CHECK(L, r);
  lua_pushboolean(L, r);
  return 1;
}

static int s_synchronize(lua_State *L) {
  CRUN_L_CHECK(L, crun_cuda_stream_synchronize(check_stream(L, 1)));
  return 0;
}

static int s_device(lua_State *L) {
  lua_pushinteger(L, crun_cuda_stream_device(check_stream(L, 1)));
  return 1;
}

/* s:handle() -> light userdata of the cudaStream_t (for C extensions) */
static int s_handle(lua_State *L) {
  lua_pushlightuserdata(L, crun_cuda_stream_handle(check_stream(L, 1)));
  return 1;
}

static int s_eq(lua_State *L) {
  sbox *a = luaL_testudata(L, 1, STREAM_MT), *b = luaL_testudata(L, 2, STREAM_MT);
  lua_pushboolean(L, a && b && a->s == b->s);
  return 1;
}

static int s_gc(lua_State *L) {
  sbox *b = crun_l_checkudata(L, 1, STREAM_MT);
  crun_cuda_stream_release(b->s);
  b->s = NULL;
  return 0;
}

static int s_tostring(lua_State *L) {
  sbox *b = crun_l_checkudata(L, 1, STREAM_MT);
  if (!b->s) lua_pushstring(L, "crun.cuda.Stream (closed)");
  else lua_pushfstring(L, "crun.cuda.Stream(device=cuda:%d, handle=%p)", crun_cuda_stream_device(b->s),
                       crun_cuda_stream_handle(b->s));
  return 1;
}

/* ------------------------------------------------------------ events */

static crun_cuda_event_t *check_event(lua_State *L, int arg) {
  ebox *b = crun_l_checkudata(L, arg, EVENT_MT);
  if (!b->e) crun_l_argerror(L, arg, "event is closed");
  return b->e;
}

/* s:wait_event(e): s waits (on the device) for the work e recorded. */
static int s_wait_event(lua_State *L) {
  CRUN_L_CHECK(L, crun_cuda_event_wait(check_event(L, 2), check_stream(L, 1)));
  return 0;
}

/* s:record_event([e]) -> e (a new event without timing when none given) */
static int s_record_event(lua_State *L) {
  crun_cuda_stream_t *s = check_stream(L, 1);
  if (lua_isnoneornil(L, 2)) {
    ebox *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->e = NULL;
    luaL_setmetatable(L, EVENT_MT);
    CRUN_L_CHECK(L, crun_cuda_event_create(crun_cuda_stream_device(s), 0, &b->e));
  } else {
    check_event(L, 2);
    lua_settop(L, 2);
  }
  CRUN_L_CHECK(L, crun_cuda_event_record(check_event(L, -1), s));
  return 1;
}

/* s:wait_stream(other): s waits for the work queued on `other` so far. */
static int s_wait_stream(lua_State *L) {
  crun_cuda_stream_t *s = check_stream(L, 1), *o = check_stream(L, 2);
  crun_cuda_event_t *e;
  CRUN_L_CHECK(L, crun_cuda_event_create(crun_cuda_stream_device(o), 0, &e));
  int rc = crun_cuda_event_record(e, o);
  if (rc == 0) rc = crun_cuda_event_wait(e, s);
  crun_cuda_event_release(e);
  CRUN_L_CHECK(L, rc);
  return 0;
}

/* cuda.Event(timing, [dev]) */
static int c_event_new(lua_State *L) {
  int timing = lua_toboolean(L, 1);
  ebox *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->e = NULL;
  luaL_setmetatable(L, EVENT_MT);
  CRUN_L_CHECK(L, crun_cuda_event_create(opt_device(L, 2), timing, &b->e));
  return 1;
}

static int e_record(lua_State *L) {
  CRUN_L_CHECK(L, crun_cuda_event_record(check_event(L, 1), opt_stream(L, 2)));
  lua_settop(L, 1);
  return 1;
}

static int e_wait(lua_State *L) {
  CRUN_L_CHECK(L, crun_cuda_event_wait(check_event(L, 1), opt_stream(L, 2)));
  return 0;
}

static int e_query(lua_State *L) {
  int r = crun_cuda_event_query(check_event(L, 1));
  CRUN_L_CHECK(L, r);
  lua_pushboolean(L, r);
  return 1;
}

static int e_synchronize(lua_State *L) {
  CRUN_L_CHECK(L, crun_cuda_event_synchronize(check_event(L, 1)));
  return 0;
}

static int e_elapsed_time(lua_State *L) {
  double ms;
  CRUN_L_CHECK(L, crun_cuda_event_elapsed_ms(check_event(L, 1), check_event(L, 2), &ms));
  lua_pushnumber(L, ms);
  return 1;
}

static int e_gc(lua_State *L) {
  ebox *b = crun_l_checkudata(L, 1, EVENT_MT);
  crun_cuda_event_release(b->e);
  b->e = NULL;
  return 0;
}

/* ------------------------------------------------------------ tensors */

/* core.tensor.device_of(t) -> -1 (host) or the device index */
static int t_device_of(lua_State *L) {
  lua_pushinteger(L, crun_tensor_device(crun_l_check_tensor(L, 1)));
  return 1;
}

static int t_is_pinned(lua_State *L) {
  lua_pushboolean(L, crun_tensor_is_pinned(crun_l_check_tensor(L, 1)));
  return 1;
}

static int push_new(lua_State *L, int rc, crun_tensor_t *t) {
  if (rc < 0) crun_l_fail(L, rc);
  crun_l_push_tensor(L, t);
  crun_tensor_release(t);
  return 1;
}

static int t_pin_memory(lua_State *L) {
  crun_tensor_t *r = NULL;
  if (crun_tensor_is_pinned(crun_l_check_tensor(L, 1))) { /* t itself, as torch */
    lua_settop(L, 1);
    return 1;
  }
  int rc = crun_tensor_pin_memory(crun_l_check_tensor(L, 1), &r);
  return push_new(L, rc, r);
}

/* core.tensor.to_device(t, dev) -> t itself or a copy on dev (-1: host) */
static int t_to_device(lua_State *L) {
  crun_tensor_t *r = NULL;
  int dev = (int)crun_l_check_range(L, crun_l_checkinteger(L, 2), -1, INT_MAX, "to", "device");
  if (crun_tensor_device(crun_l_check_tensor(L, 1)) == dev) { /* t itself, as torch */
    lua_settop(L, 1);
    return 1;
  }
  int rc = crun_tensor_to_device(crun_l_check_tensor(L, 1), dev, &r);
  return push_new(L, rc, r);
}

/* Reads the shape table at 1 and the dtype name at 2. */
static void shape_dtype(lua_State *L, int64_t *shape, int *nd, crun_dtype_t *dt) {
  crun_l_checktype(L, 1, LUA_TTABLE);
  int n = (int)luaL_len(L, 1);
  if (n > CRUN_MAX_DIMS) crun_l_argerror(L, 1, "too many dims (at most 8)");
  for (int i = 0; i < n; i++) {
    lua_geti(L, 1, i + 1);
    int ok;
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok || v < 0) crun_l_argerror(L, 1, lua_pushfstring(L, "shape entry %d must be an integer >= 0", i + 1));
    shape[i] = v;
    lua_pop(L, 1);
  }
  *nd = n;
  if (crun_dtype_parse(crun_l_checkstring(L, 2), dt) < 0)
    crun_l_argerror(L, 2, lua_pushfstring(L, "unknown dtype '%s'", lua_tostring(L, 2)));
}

/* core.tensor.empty_on(shape, dtype, dev) / zeros_on(shape, dtype, dev) */
static int make_on(lua_State *L, int zero) {
  int64_t shape[CRUN_MAX_DIMS];
  int nd;
  crun_dtype_t dt;
  shape_dtype(L, shape, &nd, &dt);
  int dev = (int)crun_l_check_range(L, crun_l_checkinteger(L, 3), -1, INT_MAX, "tensor", "device");
  crun_tensor_t *t = NULL;
  int rc = zero ? crun_tensor_new_on(dt, nd, shape, dev, &t) : crun_tensor_empty_on(dt, nd, shape, dev, &t);
  return push_new(L, rc, t);
}
static int t_empty_on(lua_State *L) { return make_on(L, 0); }
static int t_zeros_on(lua_State *L) { return make_on(L, 1); }

/* ------------------------------------------------------------ registration */

void crun_l_open_cuda(lua_State *L) {
  static const luaL_Reg smethods[] = {{"query", s_query}, {"synchronize", s_synchronize},
                                      {"device", s_device}, {"handle", s_handle},
                                      {"wait_event", s_wait_event}, {"record_event", s_record_event},
                                      {"wait_stream", s_wait_stream}, {NULL, NULL}};
  static const luaL_Reg emethods[] = {{"record", e_record}, {"wait", e_wait}, {"query", e_query},
                                      {"synchronize", e_synchronize}, {"elapsed_time", e_elapsed_time},
                                      {NULL, NULL}};
  crun_l_newclass(L, STREAM_MT, smethods);
  luaL_getmetatable(L, STREAM_MT);
  static const luaL_Reg smeta[] = {{"__gc", s_gc}, {"__eq", s_eq}, {"__tostring", s_tostring}, {NULL, NULL}};
  luaL_setfuncs(L, smeta, 0);
  lua_pop(L, 1);
  crun_l_newclass(L, EVENT_MT, emethods);
  luaL_getmetatable(L, EVENT_MT);
  lua_pushcfunction(L, e_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);

  static const luaL_Reg fns[] = {
      {"is_available", c_is_available}, {"unavailable_reason", c_unavailable_reason},
      {"device_count", c_device_count}, {"set_device", c_set_device},
      {"current_device", c_current_device}, {"synchronize", c_synchronize}, {"memory", c_memory},
      {"reset_peak", c_reset_peak}, {"empty_cache", c_empty_cache}, {"Stream", c_stream_new},
      {"current_stream", c_current_stream}, {"default_stream", c_default_stream},
      {"set_stream", c_set_stream}, {"Event", c_event_new}, {NULL, NULL}};
  lua_newtable(L);
  luaL_setfuncs(L, fns, 0);
  lua_pushboolean(L, CRUN_HAVE_CUDA);
  lua_setfield(L, -2, "built");
  lua_setfield(L, -2, "cuda");

  static const luaL_Reg tfns[] = {{"device_of", t_device_of}, {"is_pinned", t_is_pinned},
                                  {"pin_memory", t_pin_memory}, {"to_device", t_to_device},
                                  {"empty_on", t_empty_on}, {"zeros_on", t_zeros_on}, {NULL, NULL}};
  lua_getfield(L, -1, "tensor");
  luaL_setfuncs(L, tfns, 0);
  lua_pop(L, 1);
}
