/* store.c — Lua bindings for the store part of crun.h: the crun.Store
 * userdata (any store kind) and crun.StoreServer (a standalone TCP server).
 * Failures raise errors that start with the status name and, when the RANK
 * variable is set, end with the rank. */
#include "crun_lua.h"

#include <limits.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STORE_MT "crun.Store"
#define SERVER_MT "crun.StoreServer"

typedef struct {
  crun_store_t *s;
  const char *kind;
} l_store_t;

typedef struct {
  crun_store_server_t *srv;
} l_server_t;

/* Raises the last store error, adding the rank when RANK is set. */
static int store_fail(lua_State *L, int rc) {
  const char *rank = getenv("RANK");
  if (rank && *rank) {
    const char *msg = crun_last_error();
    const char *name = crun_err_name(rc);
    size_t nl = strlen(name);
    if (strncmp(msg, name, nl) == 0 && msg[nl] == ':') msg += nl + 2;
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", msg);
    crun_error(rc, "%s (rank %s)", copy, rank);
  }
  return crun_l_fail(L, rc);
}

#define STORE_CHECK(L, call)                      \
  do {                                            \
    int rc_ = (call);                             \
    if (rc_ < 0) store_fail((L), rc_);            \
  } while (0)

crun_store_t *crun_l_check_store(lua_State *L, int idx) {
  l_store_t *u = crun_l_checkudata(L, idx, STORE_MT);
  if (!u->s) {
    crun_error(CRUN_ECLOSED, "the %s store is closed", u->kind);
    crun_l_fail(L, CRUN_ECLOSED);
  }
  return u->s;
}

/* Wraps a store (taking over its reference) in a new crun.Store userdata. */
static int push_store(lua_State *L, crun_store_t *s, const char *kind) {
  l_store_t *u = lua_newuserdatauv(L, sizeof *u, 1);
  u->s = s;
  u->kind = kind;
  luaL_setmetatable(L, STORE_MT);
  return 1;
}

/* Reads a list of string keys (a table, or one string) at idx into a new
 * array kept alive by the stack; returns the count. */
static size_t check_keys(lua_State *L, int idx, const char ***out) {
  if (lua_gettop(L) < idx + 1) lua_settop(L, idx + 1); /* later args keep their index */
  if (lua_type(L, idx) == LUA_TSTRING) {
    const char **ks = lua_newuserdatauv(L, sizeof *ks, 0);
    ks[0] = lua_tostring(L, idx);
    *out = ks;
    return 1;
  }
  crun_l_checktype(L, idx, LUA_TTABLE);
  size_t n = (size_t)luaL_len(L, idx);
  const char **ks = lua_newuserdatauv(L, (n ? n : 1) * sizeof *ks, 0);
  for (size_t i = 0; i < n; i++) {
    if (lua_geti(L, idx, (lua_Integer)i + 1) != LUA_TSTRING)
      crun_l_error(L, "EINVAL: bad argument #%d (key #%d is a %s, string expected)", idx - 1, (int)i + 1,
                 luaL_typename(L, -1));
    ks[i] = lua_tostring(L, -1);
    lua_pop(L, 1); /* the table keeps the string alive */
  }
  *out = ks;
  return n;
}

/* Pushes a returned buffer as a Lua string and frees it. */
static void push_buf(lua_State *L, crun_buf_t *b) {
  lua_pushlstring(L, b->data ? b->data : "", b->len);
  crun_buf_free(b);
}

/* ------------------------------------------------------------ constructors */

/* store_flush_sets(): crun_store_flush_sets (store.h) */
static int l_store_flush_sets(lua_State *L) {
  (void)L;
  crun_store_flush_sets();
  return 0;
}

/* store.tcp{host=, port=, is_master=, world_size=, timeout=, connect_timeout=, token=, async_set=} */
static int l_store_tcp(lua_State *L) {
  crun_l_checktype(L, 1, LUA_TTABLE);
  crun_store_tcp_opts_t o = {0};
  o.host = crun_l_optfield_string(L, 1, "host", "127.0.0.1");
  o.port = (int)crun_l_optfield_range(L, 1, "port", -1, -1, 65535, "store.tcp");
  o.is_master = crun_l_optfield_boolean(L, 1, "is_master", 0);
  o.world_size = (int)crun_l_optfield_range(L, 1, "world_size", 0, 0, INT_MAX, "store.tcp");
  o.timeout = crun_l_optfield_number(L, 1, "timeout", 0);
  o.connect_timeout = crun_l_optfield_number(L, 1, "connect_timeout", 0);
  o.token = crun_l_optfield_string(L, 1, "token", NULL); /* nil: CRUN_TOKEN; "": none */
  int async = crun_l_optfield_boolean(L, 1, "async_set", -1); /* -1: not given */
  o.async_set = async < 0 ? 0 : async ? 1 : -1; /* 0: the default (on unless CRUN_STORE_ASYNC_SET=0) */
  if (o.port < 0) return crun_l_error(L, "EINVAL: bad argument #1 to 'tcp' (field 'port' is required)");
  /* NaN or inf reached the client's deadline arithmetic and came back as
   * "ETIMEDOUT: the store server sent no greeting" at once */
  if (o.timeout != o.timeout || o.timeout > 1e9)
    return crun_l_error(L, "EINVAL: bad argument #1 to 'tcp' (field 'timeout' is %f, not a number of seconds up to 1e9)", o.timeout);
  if (o.connect_timeout != o.connect_timeout || o.connect_timeout > 1e9)
    return crun_l_error(L, "EINVAL: bad argument #1 to 'tcp' (field 'connect_timeout' is %f, not a number of seconds up to 1e9)",
                        o.connect_timeout);
  crun_store_t *s;
  STORE_CHECK(L, crun_store_tcp_new(&o, &s));
  return push_store(L, s, "tcp");
}

/* store.file(path[, world_size]) (lua/crun/store.lua checks the options) */
static int l_store_file(lua_State *L) {
  crun_store_t *s;
  crun_store_file_opts_t o = {0};
  o.world_size = (int)crun_l_check_range(L, crun_l_optinteger(L, 2, 0), 0, INT_MAX, "store.file", "world_size");
  STORE_CHECK(L, crun_store_file_open(crun_l_checkstring(L, 1), &o, &s));
  return push_store(L, s, "file");
}

/* store.hash() */
static int l_store_hash(lua_State *L) {
  crun_store_t *s;
  STORE_CHECK(L, crun_store_hash_new(&s));
  return push_store(L, s, "hash");
}

/* store.prefix(prefix, inner) */
static int l_store_prefix(lua_State *L) {
  const char *prefix = crun_l_checkstring(L, 1);
  crun_store_t *inner = crun_l_check_store(L, 2), *s;
  STORE_CHECK(L, crun_store_prefix_new(prefix, inner, &s));
  return push_store(L, s, "prefix");
}

/* ------------------------------------------------------------ methods */

/* s:<op>(key, value) for the store calls taking a key and a value. */
static int key_value_op(lua_State *L,
                        int (*op)(crun_store_t *, const char *, const void *, size_t)) {
  crun_store_t *s = crun_l_check_store(L, 1);
  size_t len;
  const char *k = crun_l_checkstring(L, 2), *v = crun_l_checklstring(L, 3, &len);
  STORE_CHECK(L, op(s, k, v, len));
  return 0;
}

/* s:set(key, value) */
static int m_set(lua_State *L) { return key_value_op(L, crun_store_set); }

/* s:get(key) -> value (blocks until set or the store's timeout) */
static int m_get(lua_State *L) {
  crun_store_t *s = crun_l_check_store(L, 1);
  crun_buf_t b;
  STORE_CHECK(L, crun_store_get(s, crun_l_checkstring(L, 2), &b));
  push_buf(L, &b);
  return 1;
}

/* s:add(key, n) -> new integer value */
static int m_add(lua_State *L) {
  crun_store_t *s = crun_l_check_store(L, 1);
  int64_t v;
  STORE_CHECK(L, crun_store_add(s, crun_l_checkstring(L, 2), crun_l_checkinteger(L, 3), &v));
  lua_pushinteger(L, (lua_Integer)v);
  return 1;
}

/* s:compare_set(key, expected, desired) -> value now stored */
static int m_compare_set(lua_State *L) {
  crun_store_t *s = crun_l_check_store(L, 1);
  size_t el, dl;
  const char *k = crun_l_checkstring(L, 2);
  const char *e = crun_l_checklstring(L, 3, &el), *d = crun_l_checklstring(L, 4, &dl);
  crun_buf_t b;
  STORE_CHECK(L, crun_store_compare_set(s, k, e, el, d, dl, &b));
  push_buf(L, &b);
  return 1;
}

/* s:wait(keys[, timeout]) */
static int m_wait(lua_State *L) {
  crun_store_t *s = crun_l_check_store(L, 1);
  double timeout = crun_l_optnumber(L, 3, 0);
  if (!lua_isnoneornil(L, 3) && timeout <= 0)
    return crun_l_argerror(L, 3, "timeout must be > 0 seconds");
  lua_settop(L, 3);
  const char **ks;
  size_t n = check_keys(L, 2, &ks);
  STORE_CHECK(L, crun_store_wait(s, ks, n, timeout));
  return 0;
}

/* s:check(keys) -> boolean */
static int m_check(lua_State *L) {
  crun_store_t *s = crun_l_check_store(L, 1);
  const char **ks;
  size_t n = check_keys(L, 2, &ks);
  int all;
  STORE_CHECK(L, crun_store_check(s, ks, n, &all));
  lua_pushboolean(L, all);
  return 1;
}

/* s:delete_key(key) -> boolean (whether it existed) */
static int m_delete_key(lua_State *L) {
  crun_store_t *s = crun_l_check_store(L, 1);
  int existed;
  STORE_CHECK(L, crun_store_delete_key(s, crun_l_checkstring(L, 2), &existed));
  lua_pushboolean(L, existed);
  return 1;
}

/* s:num_keys() -> integer */
static int m_num_keys(lua_State *L) {
  crun_store_t *s = crun_l_check_store(L, 1);
  int64_t n;
  STORE_CHECK(L, crun_store_num_keys(s, &n));
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

/* s:append(key, value) */
static int m_append(lua_State *L) { return key_value_op(L, crun_store_append); }

/* s:multi_get(keys) -> {values} */
static int m_multi_get(lua_State *L) {
  crun_store_t *s = crun_l_check_store(L, 1);
  const char **ks;
  size_t n = check_keys(L, 2, &ks);
  crun_buf_t *outs = lua_newuserdatauv(L, (n ? n : 1) * sizeof *outs, 0);
  STORE_CHECK(L, crun_store_multi_get(s, ks, n, outs));
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    push_buf(L, &outs[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return 1;
}

/* s:multi_set(keys, values) */
static int m_multi_set(lua_State *L) {
  crun_store_t *s = crun_l_check_store(L, 1);
  const char **ks;
  size_t n = check_keys(L, 2, &ks);
  crun_l_checktype(L, 3, LUA_TTABLE);
  if ((size_t)luaL_len(L, 3) != n)
    return crun_l_error(L, "EINVAL: bad argument #3 to 'multi_set' (%d values for %d keys)",
                      (int)luaL_len(L, 3), (int)n);
  const void **vs = lua_newuserdatauv(L, (n ? n : 1) * sizeof *vs, 0);
  size_t *ls = lua_newuserdatauv(L, (n ? n : 1) * sizeof *ls, 0);
  for (size_t i = 0; i < n; i++) {
    lua_geti(L, 3, (lua_Integer)i + 1);
    if (!lua_isstring(L, -1))
      return crun_l_error(L, "EINVAL: bad argument #3 to 'multi_set' (value #%d is a %s, string expected)",
                        (int)i + 1, luaL_typename(L, -1));
    vs[i] = lua_tolstring(L, -1, &ls[i]); /* a number becomes a string kept on the stack */
  }
  STORE_CHECK(L, crun_store_multi_set(s, ks, n, vs, ls));
  return 0;
}

/* s:queue_push(key, value) */
static int m_queue_push(lua_State *L) { return key_value_op(L, crun_store_queue_push); }

/* Raises "EINVAL: fname: unknown option 'x' (accepted: ...)" for a key of
 * the options table at idx that is not in `accepted` (as crun.opts does). */
static void check_opt_names(lua_State *L, int idx, const char *fname, const char *const *accepted,
                            const char *list) {
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    int ok = 0;
    for (const char *const *a = accepted; *a && !ok; a++)
      ok = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), *a) == 0;
    if (!ok) {
      crun_error(CRUN_EINVAL, "%s: unknown option '%s' (accepted: %s)", fname, luaL_tolstring(L, -1, NULL), list);
      crun_l_fail(L, CRUN_EINVAL);
    }
  }
}

/* s:queue_pop(key[, timeout | {timeout=, block=}]) -> value. Blocks until
 * an item arrives (ETIMEDOUT after timeout seconds, default the store's);
 * block=false raises ENOTFOUND at once when the queue is empty. */
static int m_queue_pop(lua_State *L) {
  static const char *const accepted[] = {"block", "timeout", NULL};
  crun_store_t *s = crun_l_check_store(L, 1);
  const char *key = crun_l_checkstring(L, 2);
  int block = 1;
  double timeout = 0;
  if (lua_istable(L, 3)) {
    check_opt_names(L, 3, "queue_pop", accepted, "block, timeout");
    int bt = lua_getfield(L, 3, "block");
    if (bt != LUA_TNIL && bt != LUA_TBOOLEAN) return crun_l_argerror(L, 3, "field 'block' must be a boolean");
    block = bt == LUA_TNIL || lua_toboolean(L, -1);
    timeout = crun_l_optfield_number(L, 3, "timeout", 0);
    if (lua_getfield(L, 3, "timeout") != LUA_TNIL && timeout <= 0)
      return crun_l_argerror(L, 3, "timeout must be > 0 seconds");
  } else if (!lua_isnoneornil(L, 3)) {
    timeout = crun_l_checknumber(L, 3);
    if (timeout <= 0) return crun_l_argerror(L, 3, "timeout must be > 0 seconds");
  }
  crun_buf_t b;
  STORE_CHECK(L, crun_store_queue_pop(s, key, block, timeout, &b));
  push_buf(L, &b);
  return 1;
}

/* s:queue_len(key) -> integer */
static int m_queue_len(lua_State *L) {
  crun_store_t *s = crun_l_check_store(L, 1);
  int64_t n;
  STORE_CHECK(L, crun_store_queue_len(s, crun_l_checkstring(L, 2), &n));
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

/* s:list_keys() -> sorted array of the plain keys */
static int m_list_keys(lua_State *L) {
  crun_store_t *s = crun_l_check_store(L, 1);
  crun_store_keys_t k;
  STORE_CHECK(L, crun_store_list_keys(s, &k));
  if (k.count > INT_MAX || !lua_checkstack(L, 4)) {
    crun_store_keys_free(&k);
    return luaL_error(L, "ERANGE: list_keys: %d keys at most in a Lua array", INT_MAX);
  }
  lua_createtable(L, (int)k.count, 0);
  for (size_t i = 0; i < k.count; i++) {
    lua_pushstring(L, k.keys[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  crun_store_keys_free(&k);
  return 1;
}

/* s:set_timeout(seconds) */
static int m_set_timeout(lua_State *L) {
  crun_store_t *s = crun_l_check_store(L, 1);
  double t = crun_l_checknumber(L, 2);
  crun_l_argcheck(L, t > 0, 2, "timeout must be > 0 seconds");
  crun_store_set_timeout(s, t);
  return 0;
}

/* s:timeout() -> seconds */
static int m_timeout(lua_State *L) {
  lua_pushnumber(L, crun_store_get_timeout(crun_l_check_store(L, 1)));
  return 1;
}

/* s:port() -> the TCP port (nil for other kinds) */
static int m_port(lua_State *L) {
  int p = crun_store_tcp_port(crun_l_check_store(L, 1));
  if (p < 0) lua_pushnil(L);
  else lua_pushinteger(L, p);
  return 1;
}

/* s:kind() -> "tcp" | "file" | "hash" | "prefix" */
static int m_kind(lua_State *L) {
  l_store_t *u = crun_l_checkudata(L, 1, STORE_MT);
  lua_pushstring(L, u->kind);
  return 1;
}

/* s:close(): drops this handle's reference (idempotent; also __gc/__close). */
static int m_close(lua_State *L) {
  l_store_t *u = crun_l_checkudata(L, 1, STORE_MT);
  if (u->s) crun_store_release(u->s);
  u->s = NULL;
  return 0;
}

static int m_tostring(lua_State *L) {
  l_store_t *u = crun_l_checkudata(L, 1, STORE_MT);
  int p = u->s ? crun_store_tcp_port(u->s) : -1;
  if (!u->s) lua_pushfstring(L, "crun.Store(%s, closed)", u->kind);
  else if (p >= 0) lua_pushfstring(L, "crun.Store(%s, port %d)", u->kind, p);
  else lua_pushfstring(L, "crun.Store(%s)", u->kind);
  return 1;
}

/* ------------------------------------------------------------ server */

/* store_server(host, port[, token]) -> crun.StoreServer; host defaults to loopback
 * (serving other hosts is asked for by naming the address to bind). */
static int l_store_server(lua_State *L) {
  const char *host = crun_l_optstring(L, 1, "127.0.0.1");
  int port = (int)crun_l_check_range(L, crun_l_optinteger(L, 2, 0), 0, 65535, "store.server", "port");
  const char *token = crun_l_optstring(L, 3, NULL); /* nil: CRUN_TOKEN; "": none */
  l_server_t *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->srv = NULL;
  luaL_setmetatable(L, SERVER_MT);
  STORE_CHECK(L, crun_store_server_start_token(host, port, token, &u->srv));
  return 1;
}

static l_server_t *check_server(lua_State *L) {
  l_server_t *u = crun_l_checkudata(L, 1, SERVER_MT);
  if (!u->srv) {
    crun_error(CRUN_ECLOSED, "the store server is stopped");
    crun_l_fail(L, CRUN_ECLOSED);
  }
  return u;
}

static int srv_port(lua_State *L) {
  lua_pushinteger(L, crun_store_server_port(check_server(L)->srv));
  return 1;
}

static int srv_stop(lua_State *L) {
  l_server_t *u = crun_l_checkudata(L, 1, SERVER_MT);
  if (u->srv) crun_store_server_stop(u->srv);
  u->srv = NULL;
  return 0;
}

void crun_l_open_store(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"set", m_set}, {"get", m_get}, {"add", m_add}, {"compare_set", m_compare_set},
      {"wait", m_wait}, {"check", m_check}, {"delete_key", m_delete_key},
      {"num_keys", m_num_keys}, {"append", m_append}, {"multi_get", m_multi_get},
      {"multi_set", m_multi_set}, {"queue_push", m_queue_push}, {"queue_pop", m_queue_pop},
      {"queue_len", m_queue_len}, {"list_keys", m_list_keys},
      {"set_timeout", m_set_timeout}, {"timeout", m_timeout},
      {"port", m_port}, {"kind", m_kind}, {"close", m_close}, {"__gc", m_close},
      {"__close", m_close}, {"__tostring", m_tostring}, {NULL, NULL}};
  static const luaL_Reg srv_methods[] = {
      {"port", srv_port}, {"stop", srv_stop}, {"__gc", srv_stop}, {"__close", srv_stop},
      {NULL, NULL}};
  static const luaL_Reg fns[] = {
      {"store_tcp", l_store_tcp}, {"store_flush_sets", l_store_flush_sets}, {"store_file", l_store_file}, {"store_hash", l_store_hash},
      {"store_prefix", l_store_prefix}, {"store_server", l_store_server}, {NULL, NULL}};
  crun_l_newclass(L, STORE_MT, methods);
  crun_l_newclass(L, SERVER_MT, srv_methods);
  luaL_setfuncs(L, fns, 0);
}
