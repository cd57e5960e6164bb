/* train.c — Lua bindings of crun/train.h (nn kernels, optimizer updates) and
 * the fsync / getpid helpers that crun.save uses (its raw tensor bytes come
 * from the tensor bindings: core.tensor_bytes, core.tensor_from_bytes).
 * Every function lives on the crun.core table; lua/crun/{nn,optim,
 * serialize}.lua wrap them. Outputs are tensors the caller allocated. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "crun/train.h"
#include "crun_lua.h"

/* Returns the tensor at idx, or NULL when that argument is nil/none. */
static crun_tensor_t *opt_tensor(lua_State *L, int idx) {
  return lua_isnoneornil(L, idx) ? NULL : crun_l_check_tensor(L, idx);
}

static crun_act_t check_act(lua_State *L, int idx) {
  crun_act_t a;
  if (crun_act_parse(luaL_checkstring(L, idx), &a) < 0)
    luaL_argerror(L, idx, crun_last_error());
  return a;
}

/* nn_linear_forward(x, W, b|nil, y) */
static int l_linear_forward(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_linear_forward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                         opt_tensor(L, 3), crun_l_check_tensor(L, 4)));
  return 0;
}

/* nn_linear_backward(x, W, gy, gx|nil, gW|nil, gb|nil) */
static int l_linear_backward(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_linear_backward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                          crun_l_check_tensor(L, 3), opt_tensor(L, 4),
                                          opt_tensor(L, 5), opt_tensor(L, 6)));
  return 0;
}

/* nn_act_forward(name, x, y) */
static int l_act_forward(lua_State *L) {
  crun_act_t a = check_act(L, 1);
  CRUN_L_CHECK(L, crun_nn_act_forward(a, crun_l_check_tensor(L, 2), crun_l_check_tensor(L, 3)));
  return 0;
}

/* nn_act_backward(name, y, gy, gx) */
static int l_act_backward(lua_State *L) {
  crun_act_t a = check_act(L, 1);
  CRUN_L_CHECK(L, crun_nn_act_backward(a, crun_l_check_tensor(L, 2), crun_l_check_tensor(L, 3),
                                       crun_l_check_tensor(L, 4)));
  return 0;
}

/* nn_log_softmax_forward(x, y) */
static int l_lsm_forward(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_log_softmax_forward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2)));
  return 0;
}

/* nn_log_softmax_backward(y, gy, gx) */
static int l_lsm_backward(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_log_softmax_backward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                               crun_l_check_tensor(L, 3)));
  return 0;
}

/* nn_cross_entropy(x, labels, grad|nil, sum) -> loss, correct */
static int l_cross_entropy(lua_State *L) {
  double loss;
  int64_t correct;
  CRUN_L_CHECK(L, crun_nn_cross_entropy(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                        lua_toboolean(L, 4), &loss, &correct, opt_tensor(L, 3)));
  lua_pushnumber(L, loss);
  lua_pushinteger(L, (lua_Integer)correct);
  return 2;
}

/* nn_mse(x, t, grad|nil) -> loss */
static int l_mse(lua_State *L) {
  double loss;
  CRUN_L_CHECK(L, crun_nn_mse(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2), &loss,
                              opt_tensor(L, 3)));
  lua_pushnumber(L, loss);
  return 1;
}

/* nn_dropout_forward(x, y, mask, p, state) -> next state */
static int l_dropout_forward(lua_State *L) {
  uint64_t state = (uint64_t)luaL_checkinteger(L, 5);
  CRUN_L_CHECK(L, crun_nn_dropout_forward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                          crun_l_check_tensor(L, 3), luaL_checknumber(L, 4), &state));
  lua_pushinteger(L, (lua_Integer)state);
  return 1;
}

/* nn_mul(a, b, y): y = a * b element-wise */
static int l_mul(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_mul(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                              crun_l_check_tensor(L, 3)));
  return 0;
}

/* optim_sgd(p, g, buf|nil, {lr=, momentum=, dampening=, weight_decay=, nesterov=, maximize=}, first) */
static int l_sgd(lua_State *L) {
  luaL_checktype(L, 4, LUA_TTABLE);
  crun_sgd_opts_t o = {
      .lr = crun_l_optfield_number(L, 4, "lr", 0), .momentum = crun_l_optfield_number(L, 4, "momentum", 0),
      .dampening = crun_l_optfield_number(L, 4, "dampening", 0),
      .weight_decay = crun_l_optfield_number(L, 4, "weight_decay", 0),
      .nesterov = crun_l_optfield_boolean(L, 4, "nesterov", 0),
      .maximize = crun_l_optfield_boolean(L, 4, "maximize", 0)};
  CRUN_L_CHECK(L, crun_optim_sgd_update(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                        opt_tensor(L, 3), &o, lua_toboolean(L, 5)));
  return 0;
}

/* optim_adam(p, g, m, v, vmax|nil, step, {lr=, beta1=, beta2=, eps=, weight_decay=, decoupled=, amsgrad=, maximize=}) */
static int l_adam(lua_State *L) {
  luaL_checktype(L, 7, LUA_TTABLE);
  crun_adam_opts_t o = {
      .lr = crun_l_optfield_number(L, 7, "lr", 1e-3), .beta1 = crun_l_optfield_number(L, 7, "beta1", 0.9),
      .beta2 = crun_l_optfield_number(L, 7, "beta2", 0.999), .eps = crun_l_optfield_number(L, 7, "eps", 1e-8),
      .weight_decay = crun_l_optfield_number(L, 7, "weight_decay", 0),
      .decoupled = crun_l_optfield_boolean(L, 7, "decoupled", 0),
      .amsgrad = crun_l_optfield_boolean(L, 7, "amsgrad", 0),
      .maximize = crun_l_optfield_boolean(L, 7, "maximize", 0)};
  CRUN_L_CHECK(L, crun_optim_adam_update(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                         crun_l_check_tensor(L, 3), crun_l_check_tensor(L, 4),
                                         opt_tensor(L, 5), luaL_checkinteger(L, 6), &o));
  return 0;
}

/* fsync_path(path): flushes a written file to disk; raises EIO on failure. */
static int l_fsync_path(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return luaL_error(L, "EIO: fsync %s: %s", path, strerror(e));
  }
  close(fd);
  return 0;
}

/* blas_threads([n]) -> threads BLAS now uses; n <= 0 or none: cores / LOCAL_WORLD_SIZE */
static int l_blas_threads(lua_State *L) {
  lua_pushinteger(L, crun_blas_set_threads((int)luaL_optinteger(L, 1, 0)));
  return 1;
}

/* getpid() -> this process's id */
static int l_getpid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getpid());
  return 1;
}

void crun_l_open_train(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"nn_linear_forward", l_linear_forward}, {"nn_linear_backward", l_linear_backward},
      {"nn_act_forward", l_act_forward}, {"nn_act_backward", l_act_backward},
      {"nn_log_softmax_forward", l_lsm_forward}, {"nn_log_softmax_backward", l_lsm_backward},
      {"nn_cross_entropy", l_cross_entropy}, {"nn_mse", l_mse},
      {"nn_dropout_forward", l_dropout_forward}, {"nn_mul", l_mul},
      {"optim_sgd", l_sgd}, {"optim_adam", l_adam},
      {"fsync_path", l_fsync_path}, {"getpid", l_getpid}, {"blas_threads", l_blas_threads}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
