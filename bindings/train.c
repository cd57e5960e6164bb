/* train.c — Lua bindings of crun/train.h (nn kernels, optimizer updates) and
 * the fsync / getpid helpers that crun.save uses (its raw tensor bytes come
 * from the tensor bindings: core.tensor_bytes, core.tensor_from_bytes).
 * Every function lives on the crun.core table; lua/crun/{nn,optim,
 * serialize}.lua wrap them; the sampler index math, crun.Reducer (DDP
 * gradient buckets), the ZeRO partition and the FSDP flat layout serve
 * lua/crun/{data,ddp,zero,fsdp}.lua. Outputs are tensors the caller allocated. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <stdint.h>
#include <stdlib.h>
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
  if (crun_act_parse(crun_l_checkstring(L, idx), &a) < 0)
    crun_l_argerror(L, idx, crun_last_error());
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

/* nn_cross_entropy_rows(x, labels, losses, grad|nil) -> correct (reduction "none", host) */
static int l_cross_entropy_rows(lua_State *L) {
  int64_t correct;
  CRUN_L_CHECK(L, crun_nn_cross_entropy_rows(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                             crun_l_check_tensor(L, 3), &correct, opt_tensor(L, 4)));
  lua_pushinteger(L, (lua_Integer)correct);
  return 1;
}

/* nn_mse(x, t, grad|nil) -> loss */
static int l_mse(lua_State *L) {
  double loss;
  CRUN_L_CHECK(L, crun_nn_mse(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2), &loss,
                              opt_tensor(L, 3)));
  lua_pushnumber(L, loss);
  return 1;
}

/* nn_nll(x, labels, grad|nil) -> loss (ClassNLLCriterion: -mean x[i, label_i]) */
static int l_nll(lua_State *L) {
  double loss = 0;
  CRUN_L_CHECK(L, crun_nn_nll(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2), &loss, opt_tensor(L, 3)));
  lua_pushnumber(L, loss);
  return 1;
}

/* nn_dropout_forward(x, y, mask, p, state) -> next state */
static int l_dropout_forward(lua_State *L) {
  uint64_t state = (uint64_t)crun_l_checkinteger(L, 5);
  CRUN_L_CHECK(L, crun_nn_dropout_forward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                          crun_l_check_tensor(L, 3), crun_l_checknumber(L, 4), &state));
  lua_pushinteger(L, (lua_Integer)state);
  return 1;
}

/* nn_mul(a, b, y): y = a * b element-wise */
static int l_mul(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_mul(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                              crun_l_check_tensor(L, 3)));
  return 0;
}

/* Reads {stride_h=, stride_w=, pad_h=, pad_w=, dil_h=, dil_w=} at idx. */
static crun_conv2d_geom_t check_conv_geom(lua_State *L, int idx) {
  crun_l_checktype(L, idx, LUA_TTABLE);
  return (crun_conv2d_geom_t){
      .stride_h = crun_l_optfield_integer(L, idx, "stride_h", 1), .stride_w = crun_l_optfield_integer(L, idx, "stride_w", 1),
      .pad_h = crun_l_optfield_integer(L, idx, "pad_h", 0), .pad_w = crun_l_optfield_integer(L, idx, "pad_w", 0),
      .dil_h = crun_l_optfield_integer(L, idx, "dil_h", 1), .dil_w = crun_l_optfield_integer(L, idx, "dil_w", 1)};
}

/* Reads {kh=, kw=, stride_h=, stride_w=, pad_h=, pad_w=} at idx. */
static crun_pool2d_geom_t check_pool_geom(lua_State *L, int idx) {
  crun_l_checktype(L, idx, LUA_TTABLE);
  return (crun_pool2d_geom_t){
      .kh = crun_l_optfield_integer(L, idx, "kh", 1), .kw = crun_l_optfield_integer(L, idx, "kw", 1),
      .stride_h = crun_l_optfield_integer(L, idx, "stride_h", 1), .stride_w = crun_l_optfield_integer(L, idx, "stride_w", 1),
      .pad_h = crun_l_optfield_integer(L, idx, "pad_h", 0), .pad_w = crun_l_optfield_integer(L, idx, "pad_w", 0)};
}

/* nn_conv2d_out_size(h, w, kh, kw, geom) -> oh, ow */
static int l_conv2d_out_size(lua_State *L) {
  crun_conv2d_geom_t g = check_conv_geom(L, 5);
  int64_t oh, ow;
  CRUN_L_CHECK(L, crun_nn_conv2d_out_size(crun_l_checkinteger(L, 1), crun_l_checkinteger(L, 2),
                                          crun_l_checkinteger(L, 3), crun_l_checkinteger(L, 4), &g, &oh, &ow));
  lua_pushinteger(L, (lua_Integer)oh);
  lua_pushinteger(L, (lua_Integer)ow);
  return 2;
}

/* nn_conv2d_forward(x, w, b|nil, y, geom) */
static int l_conv2d_forward(lua_State *L) {
  crun_conv2d_geom_t g = check_conv_geom(L, 5);
  CRUN_L_CHECK(L, crun_nn_conv2d_forward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2), opt_tensor(L, 3),
                                         crun_l_check_tensor(L, 4), &g));
  return 0;
}

/* nn_conv2d_backward(x, w, gy, gx|nil, gw|nil, gb|nil, geom) */
static int l_conv2d_backward(lua_State *L) {
  crun_conv2d_geom_t g = check_conv_geom(L, 7);
  CRUN_L_CHECK(L, crun_nn_conv2d_backward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                          crun_l_check_tensor(L, 3), opt_tensor(L, 4), opt_tensor(L, 5),
                                          opt_tensor(L, 6), &g));
  return 0;
}

/* nn_pool2d_out_size(h, w, geom) -> oh, ow */
static int l_pool2d_out_size(lua_State *L) {
  crun_pool2d_geom_t g = check_pool_geom(L, 3);
  int64_t oh, ow;
  CRUN_L_CHECK(L, crun_nn_pool2d_out_size(crun_l_checkinteger(L, 1), crun_l_checkinteger(L, 2), &g, &oh, &ow));
  lua_pushinteger(L, (lua_Integer)oh);
  lua_pushinteger(L, (lua_Integer)ow);
  return 2;
}

/* nn_maxpool2d_forward(x, y, idx, geom) */
static int l_maxpool2d_forward(lua_State *L) {
  crun_pool2d_geom_t g = check_pool_geom(L, 4);
  CRUN_L_CHECK(L, crun_nn_maxpool2d_forward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                            crun_l_check_tensor(L, 3), &g));
  return 0;
}

/* nn_maxpool2d_backward(gy, idx, gx, geom) */
static int l_maxpool2d_backward(lua_State *L) {
  crun_pool2d_geom_t g = check_pool_geom(L, 4);
  CRUN_L_CHECK(L, crun_nn_maxpool2d_backward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                             crun_l_check_tensor(L, 3), &g));
  return 0;
}

/* nn_avgpool2d_forward(x, y, geom, count_include_pad) */
static int l_avgpool2d_forward(lua_State *L) {
  crun_pool2d_geom_t g = check_pool_geom(L, 3);
  CRUN_L_CHECK(L, crun_nn_avgpool2d_forward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2), &g,
                                            lua_toboolean(L, 4)));
  return 0;
}

/* nn_avgpool2d_backward(gy, gx, geom, count_include_pad) */
static int l_avgpool2d_backward(lua_State *L) {
  crun_pool2d_geom_t g = check_pool_geom(L, 3);
  CRUN_L_CHECK(L, crun_nn_avgpool2d_backward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2), &g,
                                             lua_toboolean(L, 4)));
  return 0;
}

/* nn_bn_reduce(a, ma|nil, b|nil, mb|nil, out) */
static int l_bn_reduce(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_bn_reduce(crun_l_check_tensor(L, 1), opt_tensor(L, 2), opt_tensor(L, 3),
                                    opt_tensor(L, 4), crun_l_check_tensor(L, 5)));
  return 0;
}

/* nn_bn_apply(x, mean, invstd, w|nil, b|nil, y) */
static int l_bn_apply(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_bn_apply(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2), crun_l_check_tensor(L, 3),
                                   opt_tensor(L, 4), opt_tensor(L, 5), crun_l_check_tensor(L, 6)));
  return 0;
}

/* nn_bn_backward_input(gy, x, mean, invstd, w|nil, mean_dy|nil, mean_dy_xmu|nil, gx) */
static int l_bn_backward_input(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_bn_backward_input(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                            crun_l_check_tensor(L, 3), crun_l_check_tensor(L, 4),
                                            opt_tensor(L, 5), opt_tensor(L, 6), opt_tensor(L, 7),
                                            crun_l_check_tensor(L, 8)));
  return 0;
}

/* nn_bn_param_grads(sum_dy, sum_dy_xmu, invstd, gw|nil, gb|nil) */
static int l_bn_param_grads(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_bn_param_grads(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                         crun_l_check_tensor(L, 3), opt_tensor(L, 4), opt_tensor(L, 5)));
  return 0;
}

/* nn_layer_norm_forward(x, d, w|nil, b|nil, eps, y, mean, rstd) */
static int l_layer_norm_forward(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_layer_norm_forward(crun_l_check_tensor(L, 1), crun_l_checkinteger(L, 2),
                                             opt_tensor(L, 3), opt_tensor(L, 4), crun_l_checknumber(L, 5),
                                             crun_l_check_tensor(L, 6), crun_l_check_tensor(L, 7),
                                             crun_l_check_tensor(L, 8)));
  return 0;
}

/* nn_layer_norm_backward(gy, x, d, mean, rstd, w|nil, gx|nil, gw|nil, gb|nil) */
static int l_layer_norm_backward(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_layer_norm_backward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                              crun_l_checkinteger(L, 3), crun_l_check_tensor(L, 4),
                                              crun_l_check_tensor(L, 5), opt_tensor(L, 6), opt_tensor(L, 7),
                                              opt_tensor(L, 8), opt_tensor(L, 9)));
  return 0;
}

/* nn_embedding_forward(idx, w, y) */
static int l_embedding_forward(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_embedding_forward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                            crun_l_check_tensor(L, 3)));
  return 0;
}

/* nn_embedding_backward(idx, gy, gw, padding_idx) */
static int l_embedding_backward(lua_State *L) {
  CRUN_L_CHECK(L, crun_nn_embedding_backward(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                             crun_l_check_tensor(L, 3), crun_l_optinteger(L, 4, 0)));
  return 0;
}

/* gunzip_file(path[, max_bytes = 1 GiB]) -> string: the file's data (gzip or plain) through zlib. */
static int l_gunzip_file(lua_State *L) {
  const char *path = crun_l_checkstring(L, 1);
  lua_Integer max = crun_l_optinteger(L, 2, (lua_Integer)1 << 30);
  char *buf = NULL;
  size_t len = 0;
  CRUN_L_CHECK(L, crun_gunzip_file(path, max > 0 ? (size_t)max : 0, &buf, &len));
  lua_pushlstring(L, buf, len);
  free(buf);
  return 1;
}

/* optim_sgd(p, g, buf|nil, {lr=, momentum=, dampening=, weight_decay=, nesterov=, maximize=}, first) */
static int l_sgd(lua_State *L) {
  crun_l_checktype(L, 4, LUA_TTABLE);
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
  crun_l_checktype(L, 7, LUA_TTABLE);
  crun_adam_opts_t o = {
      .lr = crun_l_optfield_number(L, 7, "lr", 1e-3), .beta1 = crun_l_optfield_number(L, 7, "beta1", 0.9),
      .beta2 = crun_l_optfield_number(L, 7, "beta2", 0.999), .eps = crun_l_optfield_number(L, 7, "eps", 1e-8),
      .weight_decay = crun_l_optfield_number(L, 7, "weight_decay", 0),
      .decoupled = crun_l_optfield_boolean(L, 7, "decoupled", 0),
      .amsgrad = crun_l_optfield_boolean(L, 7, "amsgrad", 0),
      .maximize = crun_l_optfield_boolean(L, 7, "maximize", 0)};
  CRUN_L_CHECK(L, crun_optim_adam_update(crun_l_check_tensor(L, 1), crun_l_check_tensor(L, 2),
                                         crun_l_check_tensor(L, 3), crun_l_check_tensor(L, 4),
                                         opt_tensor(L, 5), crun_l_checkinteger(L, 6), &o));
  return 0;
}

/* fsync_path(path): flushes a written file to disk; raises EIO on failure. */
static int l_fsync_path(lua_State *L) {
  const char *path = crun_l_checkstring(L, 1);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return crun_l_error(L, "EIO: fsync %s: %s", path, strerror(e));
  }
  close(fd);
  return 0;
}

/* save_file(path, bytes): writes bytes to path atomically for crun.save.
 * Refuses a path that exists and is not a regular file (a symbolic link, a
 * device such as /dev/null, a fifo, a directory): EINVAL naming it. Writes a
 * temp file next to it, opened O_CREAT|O_EXCL|O_NOFOLLOW (never an existing
 * file or a planted link), fsyncs it, renames it over path, fsyncs the
 * directory (best effort). Raises EINVAL, EACCES or EIO naming the path. */
static int save_fail(lua_State *L, const char *what, const char *path, int e) {
  const char *st = (e == EACCES || e == EPERM || e == EROFS) ? "EACCES" : "EIO";
  return crun_l_error(L, "%s: crun.save: %s %s: %s", st, what, path, strerror(e));
}

static const char *file_kind(mode_t m) {
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a fifo";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

static int check_target(lua_State *L, const char *path) {
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISREG(st.st_mode))
      return crun_l_error(L, "EINVAL: crun.save: %s is %s, not a regular file; refusing to "
                        "replace it", path, file_kind(st.st_mode));
  } else if (errno != ENOENT) {
    return save_fail(L, "cannot check", path, errno);
  }
  return 0;
}

/* named_fifo(path): true when path leads to a fifo in a file system (made
 * by mkfifo), not to an anonymous pipe (/dev/stdin, a shell's <(...)):
 * opening the first blocks until some process opens it for writing, which
 * may be never (a neighbour's fifo planted where a checkpoint is looked
 * for). crun.load and crun.serialize.exists refuse it. */
#define PIPEFS_MAGIC_ 0x50495045
static int l_named_fifo(lua_State *L) {
  const char *path = crun_l_checkstring(L, 1);
  struct stat st;
  struct statfs fs;
  lua_pushboolean(L, stat(path, &st) == 0 && S_ISFIFO(st.st_mode) &&
                         !(statfs(path, &fs) == 0 && fs.f_type == PIPEFS_MAGIC_));
  return 1;
}

static int l_save_file(lua_State *L) {
  const char *path = crun_l_checkstring(L, 1);
  size_t len;
  const char *bytes = crun_l_checklstring(L, 2, &len);
  check_target(L, path);
  char tmp[4096];
  int fd = -1;
  for (int i = 0; i < 100 && fd < 0; i++) {
    if (i == 0) snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    else snprintf(tmp, sizeof tmp, "%s.tmp.%d.%d", path, (int)getpid(), i);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) return save_fail(L, "cannot create", tmp, errno);
  }
  if (fd < 0) return save_fail(L, "cannot create", tmp, EEXIST);
  for (size_t off = 0; off < len;) {
    ssize_t n = write(fd, bytes + off, len - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      close(fd);
      unlink(tmp);
      return save_fail(L, "writing", tmp, e);
    }
    off += (size_t)n;
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    int e = errno;
    unlink(tmp);
    return save_fail(L, "writing", tmp, e);
  }
  struct stat st; /* again, just before the rename */
  if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    unlink(tmp);
    return check_target(L, path);
  }
  if (rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return save_fail(L, "cannot rename the temp file to", path, e);
  }
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == dir) dir[1] = 0;
  else if (slash) *slash = 0;
  else snprintf(dir, sizeof dir, ".");
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) { /* makes the rename durable; some file systems refuse */
    if (fsync(dfd) != 0) {}
    close(dfd);
  }
  return 0;
}

/* blas_threads([n]) -> threads BLAS now uses; n <= 0 or none: cores / LOCAL_WORLD_SIZE */
static int l_blas_threads(lua_State *L) {
  lua_pushinteger(L, crun_blas_set_threads((int)crun_l_optinteger(L, 1, 0)));
  return 1;
}

/* getpid() -> this process's id */
static int l_getpid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getpid());
  return 1;
}

/* ---------------------------------------------------------------- sampler */

/* sampler_indices(size, num_replicas, rank, shuffle, seed, drop_last,
 * drop_padding, epoch[, start]) -> list of 1-based indices, num_samples,
 * total_size (crun/train.h; start: global positions already consumed) */
static int l_sampler_indices(lua_State *L) {
  crun_sampler_t s;
  lua_Integer R = crun_l_checkinteger(L, 2), rank = crun_l_checkinteger(L, 3);
  if (R < 1 || R > INT32_MAX) return crun_l_argerror(L, 2, "num_replicas out of range");
  if (rank < INT32_MIN || rank > INT32_MAX) return crun_l_argerror(L, 3, "rank out of range");
  CRUN_L_CHECK(L, crun_sampler_init(&s, crun_l_checkinteger(L, 1), (int)R, (int)rank, lua_toboolean(L, 4),
                                    (uint64_t)crun_l_checkinteger(L, 5), lua_toboolean(L, 6)));
  s.drop_padding = lua_toboolean(L, 7);
  CRUN_L_CHECK(L, crun_sampler_resume(&s, crun_l_optinteger(L, 9, 0)));
  int64_t n = crun_sampler_len(&s), got = 0;
  if (n > INT_MAX) /* a Lua list holds at most INT_MAX entries (lua_createtable) */
    return crun_l_error(L, "EINVAL: sampler_indices: %I indices for one rank do not fit a Lua list", (lua_Integer)n);
  int64_t *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
  if (!out) return crun_l_error(L, "ENOMEM: sampler_indices: %I indices", (lua_Integer)n);
  int rc = crun_sampler_indices(&s, crun_l_checkinteger(L, 8), out, &got);
  if (rc < 0) {
    free(out);
    return crun_l_fail(L, rc);
  }
  lua_createtable(L, (int)got, 0);
  for (int64_t k = 0; k < got; k++) {
    lua_pushinteger(L, (lua_Integer)out[k] + 1);
    lua_rawseti(L, -2, (lua_Integer)k + 1);
  }
  free(out);
  lua_pushinteger(L, (lua_Integer)s.num_samples);
  lua_pushinteger(L, (lua_Integer)s.total_size);
  return 3;
}

/* sampler_len(size, num_replicas, rank, drop_last, drop_padding[, start]) ->
 * len, num_samples, total_size */
static int l_sampler_len(lua_State *L) {
  crun_sampler_t s;
  lua_Integer R = crun_l_checkinteger(L, 2), rank = crun_l_checkinteger(L, 3);
  if (R < 1 || R > INT32_MAX) return crun_l_argerror(L, 2, "num_replicas out of range");
  if (rank < INT32_MIN || rank > INT32_MAX) return crun_l_argerror(L, 3, "rank out of range");
  CRUN_L_CHECK(L, crun_sampler_init(&s, crun_l_checkinteger(L, 1), (int)R, (int)rank, 0, 0, lua_toboolean(L, 4)));
  s.drop_padding = lua_toboolean(L, 5);
  CRUN_L_CHECK(L, crun_sampler_resume(&s, crun_l_optinteger(L, 6, 0)));
  lua_pushinteger(L, (lua_Integer)crun_sampler_len(&s));
  lua_pushinteger(L, (lua_Integer)s.num_samples);
  lua_pushinteger(L, (lua_Integer)s.total_size);
  return 3;
}

/* permutation(n, seed) -> list of 0..n-1 in the sampler's shuffled order */
static int l_permutation(lua_State *L) {
  lua_Integer n = crun_l_checkinteger(L, 1);
  if (n < 0) return crun_l_error(L, "EINVAL: permutation: length %I is negative", (lua_Integer)n);
  if (n > INT_MAX) return crun_l_error(L, "EINVAL: permutation: length %I does not fit a Lua list", (lua_Integer)n);
  int64_t *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
  if (!p) return crun_l_error(L, "ENOMEM: permutation of %I", (lua_Integer)n);
  crun_permutation(n, (uint64_t)crun_l_checkinteger(L, 2), p);
  lua_createtable(L, (int)n, 0);
  for (lua_Integer k = 0; k < n; k++) {
    lua_pushinteger(L, (lua_Integer)p[k]);
    lua_rawseti(L, -2, k + 1);
  }
  free(p);
  return 1;
}

/* ---------------------------------------------------------------- zero */

/* Reads list argument idx of n integers (each in [lo, hi]) into a userdata
 * array left on the stack (freed by the GC). */
static int64_t *check_int_list(lua_State *L, int idx, lua_Integer n, lua_Integer lo, lua_Integer hi) {
  int64_t *v = lua_newuserdatauv(L, sizeof *v * (size_t)(n > 0 ? n : 1), 0);
  for (lua_Integer k = 1; k <= n; k++) {
    lua_geti(L, idx, k);
    int isnum;
    lua_Integer x = lua_tointegerx(L, -1, &isnum);
    if (!isnum || x < lo || x > hi) crun_l_argerror(L, idx, lua_pushfstring(L, "entry %d out of range", (int)k));
    v[k - 1] = (int64_t)x;
    lua_pop(L, 1);
  }
  return v;
}

/* Pushes a Lua list of the n values v[0..n-1] (+ add). */
static void push_list(lua_State *L, const int64_t *v, size_t n, int64_t add) {
  lua_createtable(L, (int)n, 0);
  for (size_t k = 0; k < n; k++) {
    lua_pushinteger(L, (lua_Integer)(v[k] + add));
    lua_rawseti(L, -2, (lua_Integer)k + 1);
  }
}

/* zero_partition({numel...}, world, {key...}|nil, nkeys) -> owners (0-based
 * ranks), offsets (element offsets in the owner's buffer of that key),
 * rank_numel (per rank), bucket_numel (rank r, key k at r * nkeys + k + 1) */
static int l_zero_partition(lua_State *L) {
  lua_settop(L, 4); /* check_int_list pushes its arrays: an absent 3 must stay nil */
  crun_l_checktype(L, 1, LUA_TTABLE);
  lua_Integer n = (lua_Integer)luaL_len(L, 1);
  lua_Integer world = crun_l_check_range(L, crun_l_checkinteger(L, 2), 1, 1 << 20, "zero_partition", "world size");
  lua_Integer nkeys = crun_l_check_range(L, crun_l_optinteger(L, 4, 1), 1, 64, "zero_partition", "key count");
  if (n > INT32_MAX / 2) return crun_l_argerror(L, 1, "too many parameters");
  int64_t *numel = check_int_list(L, 1, n, 0, INT64_MAX);
  int64_t *key64 = NULL;
  if (!lua_isnoneornil(L, 3)) {
    crun_l_checktype(L, 3, LUA_TTABLE);
    if ((lua_Integer)luaL_len(L, 3) != n) return crun_l_argerror(L, 3, "one key per parameter expected");
    key64 = check_int_list(L, 3, n, 0, nkeys - 1);
  }
  size_t cnt = (size_t)(n > 0 ? n : 1);
  int *owner = lua_newuserdatauv(L, sizeof(int) * cnt * 2, 0); /* owners, then keys */
  int *key = owner + cnt;
  for (lua_Integer i = 0; i < n; i++) key[i] = key64 ? (int)key64[i] : 0;
  int64_t *offset = lua_newuserdatauv(L, sizeof(int64_t) * cnt, 0);
  int64_t *rank_numel = lua_newuserdatauv(L, sizeof(int64_t) * (size_t)world, 0);
  int64_t *bucket = lua_newuserdatauv(L, sizeof(int64_t) * (size_t)world * (size_t)nkeys, 0);
  CRUN_L_CHECK(L, crun_zero_assign(numel, (int)n, (int)world, owner, rank_numel));
  CRUN_L_CHECK(L, crun_zero_offsets(numel, owner, key, (int)n, (int)world, (int)nkeys, offset, bucket));
  lua_createtable(L, (int)n, 0);
  for (lua_Integer i = 0; i < n; i++) {
    lua_pushinteger(L, owner[i]);
    lua_rawseti(L, -2, i + 1);
  }
  push_list(L, offset, (size_t)n, 0);
  push_list(L, rank_numel, (size_t)world, 0);
  push_list(L, bucket, (size_t)world * (size_t)nkeys, 0);
  return 4;
}

/* ---------------------------------------------------------------- fsdp */

/* fsdp_layout({numel...}, world, no_shard) -> offsets (0-based element
 * offsets in the flat buffer), numel, padded, shard_numel */
static int l_fsdp_layout(lua_State *L) {
  lua_settop(L, 3); /* check_int_list pushes its array: an absent no_shard must stay nil */
  crun_l_checktype(L, 1, LUA_TTABLE);
  lua_Integer n = (lua_Integer)luaL_len(L, 1);
  lua_Integer world = crun_l_check_range(L, crun_l_checkinteger(L, 2), 1, INT32_MAX, "fsdp_layout", "world size");
  if (n > INT32_MAX / 2) return crun_l_argerror(L, 1, "too many parameters");
  int64_t *numel = check_int_list(L, 1, n, 0, INT64_MAX);
  int64_t *offset = lua_newuserdatauv(L, sizeof *offset * (size_t)(n > 0 ? n : 1), 0);
  crun_fsdp_layout_t l;
  CRUN_L_CHECK(L, crun_fsdp_layout(numel, (int)n, (int)world, lua_toboolean(L, 3), offset, &l));
  push_list(L, offset, (size_t)n, 0);
  lua_pushinteger(L, (lua_Integer)l.numel);
  lua_pushinteger(L, (lua_Integer)l.padded);
  lua_pushinteger(L, (lua_Integer)l.shard_numel);
  return 4;
}

/* fsdp_shard_range(numel, world, rank) -> first (0-based), count, per, start
 * (rank's shard offset in the padded buffer) */
static int l_fsdp_shard_range(lua_State *L) {
  lua_Integer numel = crun_l_checkinteger(L, 1);
  lua_Integer world = crun_l_check_range(L, crun_l_checkinteger(L, 2), 1, INT32_MAX, "fsdp_shard_range", "world size");
  lua_Integer rank = crun_l_check_range(L, crun_l_checkinteger(L, 3), 0, world - 1, "fsdp_shard_range", "rank");
  crun_fsdp_range_t r;
  CRUN_L_CHECK(L, crun_fsdp_shard_range((int64_t)numel, (int)world, (int)rank, &r));
  lua_pushinteger(L, (lua_Integer)r.first);
  lua_pushinteger(L, (lua_Integer)r.count);
  lua_pushinteger(L, (lua_Integer)r.per);
  lua_pushinteger(L, (lua_Integer)r.start);
  return 4;
}

/* fsdp_view(flat, offset, {shape...}) -> a tensor of that shape over
 * flat's elements from offset (0-based) */
static int l_fsdp_view(lua_State *L) {
  crun_tensor_t *flat = crun_l_check_tensor(L, 1), *v = NULL;
  lua_Integer off = crun_l_checkinteger(L, 2);
  crun_l_checktype(L, 3, LUA_TTABLE);
  lua_Integer nd = (lua_Integer)luaL_len(L, 3);
  if (nd > CRUN_MAX_DIMS) return crun_l_argerror(L, 3, "too many dims");
  int64_t *shape = check_int_list(L, 3, nd, 0, INT64_MAX);
  CRUN_L_CHECK(L, crun_fsdp_view(flat, (int64_t)off, (int)nd, shape, &v));
  crun_l_push_tensor(L, v);
  crun_tensor_release(v);
  return 1;
}

/* Reads the tensor list at idx (n entries) into a userdata array left on
 * the stack; the tensors stay referenced by the list. */
static crun_tensor_t **check_tensor_list(lua_State *L, int idx, lua_Integer n) {
  crun_tensor_t **t = lua_newuserdatauv(L, sizeof *t * (size_t)(n > 0 ? n : 1), 0);
  for (lua_Integer k = 1; k <= n; k++) {
    lua_geti(L, idx, k);
    t[k - 1] = crun_l_check_tensor(L, -1);
    lua_pop(L, 1);
  }
  return t;
}

/* fsdp_flatten / fsdp_unflatten(flat, {params...}, {offsets...}): copies
 * each parameter into (out of) flat at its 0-based offset */
static int flat_copy(lua_State *L, int (*fn)(crun_tensor_t *, crun_tensor_t *const *, const int64_t *, int)) {
  crun_tensor_t *flat = crun_l_check_tensor(L, 1);
  crun_l_checktype(L, 2, LUA_TTABLE);
  crun_l_checktype(L, 3, LUA_TTABLE);
  lua_Integer n = (lua_Integer)luaL_len(L, 2);
  if (n > INT32_MAX / 2) return crun_l_argerror(L, 2, "too many parameters");
  if ((lua_Integer)luaL_len(L, 3) != n) return crun_l_argerror(L, 3, "one offset per parameter expected");
  crun_tensor_t **p = check_tensor_list(L, 2, n);
  int64_t *off = check_int_list(L, 3, n, 0, INT64_MAX);
  CRUN_L_CHECK(L, fn(flat, p, off, (int)n));
  return 0;
}

static int l_fsdp_flatten(lua_State *L) { return flat_copy(L, crun_fsdp_flatten); }
static int l_fsdp_unflatten(lua_State *L) { return flat_copy(L, crun_fsdp_unflatten); }

#define SCHED_MT "crun.FSDPSched"

static crun_fsdp_sched_t *check_sched(lua_State *L, int idx) {
  crun_fsdp_sched_t **u = crun_l_checkudata(L, idx, SCHED_MT);
  if (!*u) {
    crun_error(CRUN_ECLOSED, "the FSDP schedule was closed");
    crun_l_fail(L, CRUN_ECLOSED);
  }
  return *u;
}

/* 1-based unit argument -> 0-based (the range is the C call's to check). */
static int check_unit_arg(lua_State *L, int idx) {
  lua_Integer k = crun_l_checkinteger(L, idx);
  if (k < 1 || k > INT32_MAX) return crun_l_argerror(L, idx, "unit index out of range");
  return (int)(k - 1);
}

/* fsdp_sched_new(nunits, "FULL_SHARD"|"SHARD_GRAD_OP"|"NO_SHARD",
 * forward_prefetch, backward_prefetch) -> crun.FSDPSched */
static int l_fsdp_sched_new(lua_State *L) {
  static const char *const names[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", NULL};
  lua_Integer n = crun_l_check_range(L, crun_l_checkinteger(L, 1), 0, INT32_MAX, "fsdp_sched_new", "unit count");
  int strategy = crun_l_checkoption(L, 2, NULL, names);
  crun_fsdp_sched_t **u = lua_newuserdatauv(L, sizeof *u, 0);
  *u = NULL;
  luaL_setmetatable(L, SCHED_MT);
  CRUN_L_CHECK(L, crun_fsdp_sched_new((int)n, (crun_fsdp_strategy_t)strategy, lua_toboolean(L, 3),
                                      lua_toboolean(L, 4), u));
  return 1;
}

/* Pushes a step as launch, wait (booleans), prefetch (1-based unit or nil). */
static int push_step(lua_State *L, const crun_fsdp_step_t *st) {
  lua_pushboolean(L, st->launch);
  lua_pushboolean(L, st->wait);
  if (st->prefetch < 0) lua_pushnil(L);
  else lua_pushinteger(L, st->prefetch + 1);
  return 3;
}

/* s:pre_forward(k, first) -> launch, wait, prefetch|nil */
static int m_sched_pre_forward(lua_State *L) {
  crun_fsdp_step_t st;
  CRUN_L_CHECK(L, crun_fsdp_sched_pre_forward(check_sched(L, 1), check_unit_arg(L, 2), lua_toboolean(L, 3), &st));
  return push_step(L, &st);
}

/* s:pre_backward(k) -> launch, wait, prefetch|nil */
static int m_sched_pre_backward(lua_State *L) {
  crun_fsdp_step_t st;
  CRUN_L_CHECK(L, crun_fsdp_sched_pre_backward(check_sched(L, 1), check_unit_arg(L, 2), &st));
  return push_step(L, &st);
}

/* s:post_forward(k) / s:post_backward(k) -> free unit k's full buffers now? */
static int m_sched_post_forward(lua_State *L) {
  int rc = crun_fsdp_sched_post_forward(check_sched(L, 1), check_unit_arg(L, 2));
  CRUN_L_CHECK(L, rc);
  lua_pushboolean(L, rc);
  return 1;
}

static int m_sched_post_backward(lua_State *L) {
  int rc = crun_fsdp_sched_post_backward(check_sched(L, 1), check_unit_arg(L, 2));
  CRUN_L_CHECK(L, rc);
  lua_pushboolean(L, rc);
  return 1;
}

/* s:end_backward() -> how many unused prefetches were dropped */
static int m_sched_end_backward(lua_State *L) {
  int rc = crun_fsdp_sched_end_backward(check_sched(L, 1));
  CRUN_L_CHECK(L, rc);
  lua_pushinteger(L, rc);
  return 1;
}

/* s:state(k) -> "sharded" | "gathering" | "gathered" */
static int m_sched_state(lua_State *L) {
  static const char *const names[] = {"sharded", "gathering", "gathered"};
  int rc = crun_fsdp_sched_state(check_sched(L, 1), check_unit_arg(L, 2));
  CRUN_L_CHECK(L, rc);
  lua_pushstring(L, names[rc]);
  return 1;
}

/* __gc / __close / s:close() */
static int m_sched_close(lua_State *L) {
  crun_fsdp_sched_t **u = crun_l_checkudata(L, 1, SCHED_MT);
  crun_fsdp_sched_free(*u);
  *u = NULL;
  return 0;
}

static void open_fsdp_sched(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"pre_forward", m_sched_pre_forward}, {"post_forward", m_sched_post_forward},
      {"pre_backward", m_sched_pre_backward}, {"post_backward", m_sched_post_backward},
      {"end_backward", m_sched_end_backward}, {"state", m_sched_state},
      {"close", m_sched_close}, {"__gc", m_sched_close}, {"__close", m_sched_close}, {NULL, NULL}};
  crun_l_newclass(L, SCHED_MT, methods);
}

/* ---------------------------------------------------------------- reducer */

#define REDUCER_MT "crun.Reducer"

static crun_reducer_t *check_reducer(lua_State *L, int idx) {
  crun_reducer_t **u = crun_l_checkudata(L, idx, REDUCER_MT);
  if (!*u) {
    crun_error(CRUN_ECLOSED, "the reducer was closed");
    crun_l_fail(L, CRUN_ECLOSED);
  }
  return *u;
}

/* 1-based gradient index argument -> 0-based. */
static int check_grad_index(lua_State *L, int idx) {
  lua_Integer i = crun_l_checkinteger(L, idx);
  if (i < 1 || i > INT32_MAX) return crun_l_argerror(L, idx, "gradient index out of range");
  return (int)(i - 1);
}

/* reducer_new(pg|nil, {grads...}, {bucket_cap_bytes=, first_bucket_bytes=,
 * gradient_as_bucket_view=, overlap=, external=}) -> crun.Reducer */
/* A byte count option of a table: a number >= 0 (NaN and negatives are
 * EINVAL), at most 2^62 (a larger one, infinity included, means that much). */
static size_t opt_bytes(lua_State *L, int idx, const char *field, double def) {
  double v = crun_l_optfield_number(L, idx, field, def);
  if (!(v >= 0)) crun_l_error(L, "EINVAL: reducer: %s must be a number of bytes >= 0, got %f", field, (lua_Number)v);
  return v > 0x1p62 ? (size_t)1 << 62 : (size_t)v;
}

static int l_reducer_new(lua_State *L) {
  crun_pg_t *pg = lua_isnoneornil(L, 1) ? NULL : crun_l_check_pg(L, 1);
  crun_l_checktype(L, 2, LUA_TTABLE);
  crun_l_checktype(L, 3, LUA_TTABLE);
  lua_Integer n = (lua_Integer)luaL_len(L, 2);
  if (n > INT32_MAX / 2) return crun_l_argerror(L, 2, "too many gradients");
  crun_tensor_t **g = lua_newuserdatauv(L, sizeof *g * (size_t)(n > 0 ? n : 1), 0); /* freed by the GC */
  for (lua_Integer k = 1; k <= n; k++) {
    lua_geti(L, 2, k);
    g[k - 1] = crun_l_check_tensor(L, -1);
    lua_pop(L, 1);
  }
  crun_reducer_opts_t o = {
      .bucket_cap_bytes = opt_bytes(L, 3, "bucket_cap_bytes", 25 << 20),
      .first_bucket_bytes = opt_bytes(L, 3, "first_bucket_bytes", 1 << 20),
      .grad_as_view = crun_l_optfield_boolean(L, 3, "gradient_as_bucket_view", 0),
      .no_overlap = !crun_l_optfield_boolean(L, 3, "overlap", 1),
      .external = crun_l_optfield_boolean(L, 3, "external", 0)};
  if (o.bucket_cap_bytes < 1) o.bucket_cap_bytes = 1;
  if (o.first_bucket_bytes < 1) o.first_bucket_bytes = 1;
  crun_reducer_t **u = lua_newuserdatauv(L, sizeof *u, 0);
  *u = NULL;
  luaL_setmetatable(L, REDUCER_MT);
  CRUN_L_CHECK(L, crun_reducer_new(pg, g, (int)n, &o, u));
  return 1;
}

/* r:mark_ready(i) — gradient i (1-based) is final for this iteration */
static int m_mark_ready(lua_State *L) {
  crun_reducer_t *r = check_reducer(L, 1);
  CRUN_L_CHECK(L, crun_reducer_mark_ready(r, check_grad_index(L, 2)));
  return 0;
}

/* r:finalize([timeout]) */
static int m_finalize(lua_State *L) {
  CRUN_L_CHECK(L, crun_reducer_finalize(check_reducer(L, 1), crun_l_optnumber(L, 2, 0)));
  return 0;
}

/* r:shadow([timeout]) — join: all-reduce zeros in every bucket */
static int m_shadow(lua_State *L) {
  CRUN_L_CHECK(L, crun_reducer_shadow(check_reducer(L, 1), crun_l_optnumber(L, 2, 0)));
  return 0;
}

/* r:reset() — abandons the current iteration */
static int m_reset(lua_State *L) {
  crun_reducer_reset(check_reducer(L, 1));
  return 0;
}

/* r:next_ready() -> 1-based index of the next bucket to reduce (external mode), or nil */
static int m_next_ready(lua_State *L) {
  int b = crun_reducer_next_ready(check_reducer(L, 1));
  if (b < 0) return 0;
  lua_pushinteger(L, b + 1);
  return 1;
}

/* r:mark_rest() — every gradient not marked yet counts as it is */
static int m_mark_rest(lua_State *L) {
  CRUN_L_CHECK(L, crun_reducer_mark_rest(check_reducer(L, 1)));
  return 0;
}

/* r:finish() — external mode: buckets back into the gradients, next iteration */
static int m_finish(lua_State *L) {
  CRUN_L_CHECK(L, crun_reducer_finish(check_reducer(L, 1)));
  return 0;
}

/* r:launched() -> buckets launched so far in this iteration */
static int m_launched(lua_State *L) {
  lua_pushinteger(L, crun_reducer_launched(check_reducer(L, 1)));
  return 1;
}

/* r:bucket_view(i) -> tensor shaped like gradient i over its bucket slice */
static int m_bucket_view(lua_State *L) {
  crun_reducer_t *r = check_reducer(L, 1);
  crun_tensor_t *v = NULL;
  CRUN_L_CHECK(L, crun_reducer_bucket_view(r, check_grad_index(L, 2), &v));
  crun_l_push_tensor(L, v);
  crun_tensor_release(v);
  return 1;
}

/* Pushes bucket b as {dtype=, numel=, buffer=, entries={{param=, offset=, numel=}...}}. */
static void push_bucket(lua_State *L, crun_reducer_t *r, int b) {
  crun_tensor_t *buf = crun_reducer_bucket(r, b);
  int count = crun_reducer_bucket_size(r, b);
  lua_createtable(L, 0, 4);
  lua_pushstring(L, crun_dtype_name(crun_tensor_dtype(buf)));
  lua_setfield(L, -2, "dtype");
  lua_pushinteger(L, (lua_Integer)crun_tensor_numel(buf));
  lua_setfield(L, -2, "numel");
  crun_l_push_tensor(L, buf);
  lua_setfield(L, -2, "buffer");
  lua_createtable(L, count, 0);
  for (int k = 0; k < count; k++) {
    int g = 0;
    int64_t off = 0;
    crun_reducer_bucket_entry(r, b, k, &g, &off);
    crun_tensor_t *v = NULL;
    CRUN_L_CHECK(L, crun_reducer_bucket_view(r, g, &v));
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, g + 1);
    lua_setfield(L, -2, "param");
    lua_pushinteger(L, (lua_Integer)off);
    lua_setfield(L, -2, "offset");
    lua_pushinteger(L, (lua_Integer)crun_tensor_numel(v));
    lua_setfield(L, -2, "numel");
    crun_tensor_release(v);
    lua_rawseti(L, -2, k + 1);
  }
  lua_setfield(L, -2, "entries");
}

/* r:buckets() -> list of buckets in launch order (see push_bucket) */
static int m_buckets(lua_State *L) {
  crun_reducer_t *r = check_reducer(L, 1);
  int nb = crun_reducer_num_buckets(r);
  lua_createtable(L, nb, 0);
  for (int b = 0; b < nb; b++) {
    push_bucket(L, r, b);
    lua_rawseti(L, -2, b + 1);
  }
  return 1;
}

/* __gc / __close / r:close(): waits for in-flight work and frees the reducer. */
static int m_close(lua_State *L) {
  crun_reducer_t **u = crun_l_checkudata(L, 1, REDUCER_MT);
  crun_reducer_free(*u);
  *u = NULL;
  return 0;
}

static void open_reducer(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"mark_ready", m_mark_ready}, {"finalize", m_finalize}, {"shadow", m_shadow},
      {"launched", m_launched}, {"reset", m_reset}, {"next_ready", m_next_ready}, {"mark_rest", m_mark_rest},
      {"finish", m_finish}, {"bucket_view", m_bucket_view}, {"buckets", m_buckets},
      {"close", m_close}, {"__gc", m_close}, {"__close", m_close}, {NULL, NULL}};
  crun_l_newclass(L, REDUCER_MT, methods);
}

void crun_l_open_train(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"nn_linear_forward", l_linear_forward}, {"nn_linear_backward", l_linear_backward},
      {"nn_act_forward", l_act_forward}, {"nn_act_backward", l_act_backward},
      {"nn_log_softmax_forward", l_lsm_forward}, {"nn_log_softmax_backward", l_lsm_backward},
      {"nn_cross_entropy", l_cross_entropy}, {"nn_cross_entropy_rows", l_cross_entropy_rows}, {"nn_mse", l_mse}, {"nn_nll", l_nll},
      {"nn_dropout_forward", l_dropout_forward}, {"nn_mul", l_mul},
      {"nn_conv2d_out_size", l_conv2d_out_size}, {"nn_conv2d_forward", l_conv2d_forward},
      {"nn_conv2d_backward", l_conv2d_backward}, {"nn_pool2d_out_size", l_pool2d_out_size},
      {"nn_maxpool2d_forward", l_maxpool2d_forward}, {"nn_maxpool2d_backward", l_maxpool2d_backward},
      {"nn_avgpool2d_forward", l_avgpool2d_forward}, {"nn_avgpool2d_backward", l_avgpool2d_backward},
      {"nn_bn_reduce", l_bn_reduce}, {"nn_bn_apply", l_bn_apply}, {"nn_bn_backward_input", l_bn_backward_input},
      {"nn_bn_param_grads", l_bn_param_grads}, {"nn_layer_norm_forward", l_layer_norm_forward},
      {"nn_layer_norm_backward", l_layer_norm_backward}, {"nn_embedding_forward", l_embedding_forward},
      {"nn_embedding_backward", l_embedding_backward}, {"gunzip_file", l_gunzip_file},
      {"optim_sgd", l_sgd}, {"optim_adam", l_adam},
      {"fsync_path", l_fsync_path}, {"save_file", l_save_file}, {"named_fifo", l_named_fifo}, {"getpid", l_getpid}, {"blas_threads", l_blas_threads},
      {"sampler_indices", l_sampler_indices}, {"sampler_len", l_sampler_len}, {"permutation", l_permutation},
      {"reducer_new", l_reducer_new}, {"zero_partition", l_zero_partition},
      {"fsdp_layout", l_fsdp_layout}, {"fsdp_shard_range", l_fsdp_shard_range}, {"fsdp_view", l_fsdp_view},
      {"fsdp_flatten", l_fsdp_flatten}, {"fsdp_unflatten", l_fsdp_unflatten}, {"fsdp_sched_new", l_fsdp_sched_new},
      {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
  open_reducer(L);
  open_fsdp_sched(L);
}
