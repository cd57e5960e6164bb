/* dispatch.h — the device side of the tensor, nn and optim entry points
 * (internal to runtime/). Each public kernel keeps its CPU path as it was
 * and adds one branch: when an operand lives on a device (storage device
 * >= 0) it validates as before and then calls the function here, which runs
 * the launchers of launch.h on the device's current stream. All operands
 * must be on that one device; otherwise EINVAL names both places. */
#ifndef CRUN_CUDA_DISPATCH_H
#define CRUN_CUDA_DISPATCH_H

#include "crun.h"

/* Non-zero when t (nullable) lives on a device. */
#define CRUN__ON_DEV(t) __builtin_expect((t) != NULL && crun_tensor_device(t) >= 0, 0)

/* Fails with EINVAL unless every non-NULL tensor of the list is on the
 * device of the first; names the op and the devices. */
int crun__dev_same(const char *what, int n, const crun_tensor_t *const *ts);

/* tensor ops, called after the CPU path's own validation */
int crun__dev_fill(crun_tensor_t *t, double v);
int crun__dev_copy(crun_tensor_t *dst, crun_tensor_t *src); /* same device, any dtypes */
int crun__dev_binop(crun_binop_t op, crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t *out);
int crun__dev_binop_scalar(crun_binop_t op, crun_tensor_t *a, double s, int reverse, crun_tensor_t *out);
int crun__dev_unop(crun_unop_t op, crun_tensor_t *a, crun_tensor_t *out);
int crun__dev_clamp(crun_tensor_t *a, double lo, double hi, crun_tensor_t *out);
/* a reduced as [outer, n, inner] into values of shape[0..nd) (the geometry
 * crun_tensor_reduce_dim derives from dim and keepdim). */
int crun__dev_reduce_dim(crun_dimred_t op, crun_tensor_t *a, int64_t outer, int64_t n, int64_t inner, int nd,
                         const int64_t *shape, int64_t base, crun_dtype_t vdt, crun_tensor_t **values,
                         crun_tensor_t **indices);
int crun__dev_softmax(crun_tensor_t *a, int dim, int use_log, crun_tensor_t **out);
int crun__dev_gemm(int ta, int tb, double alpha, crun_tensor_t *A, crun_tensor_t *B, double beta,
                   crun_tensor_t *C);

/* nn and optim (contiguous operands, checked by the caller) */
int crun__dev_linear_forward(const crun_tensor_t *x, const crun_tensor_t *w, const crun_tensor_t *b,
                             crun_tensor_t *y);
int crun__dev_linear_backward(const crun_tensor_t *x, const crun_tensor_t *w, const crun_tensor_t *gy,
                              crun_tensor_t *gx, crun_tensor_t *gw, crun_tensor_t *gb);
int crun__dev_act_forward(crun_act_t act, const crun_tensor_t *x, crun_tensor_t *y);
int crun__dev_act_backward(crun_act_t act, const crun_tensor_t *y, const crun_tensor_t *gy, crun_tensor_t *gx);
int crun__dev_log_softmax_forward(const crun_tensor_t *x, crun_tensor_t *y);
int crun__dev_log_softmax_backward(const crun_tensor_t *y, const crun_tensor_t *gy, crun_tensor_t *gx);
int crun__dev_dropout(const crun_tensor_t *x, crun_tensor_t *y, crun_tensor_t *mask, double p, uint64_t *state);
int crun__dev_mul(const crun_tensor_t *a, const crun_tensor_t *b, crun_tensor_t *y);
int crun__dev_cross_entropy(const crun_tensor_t *x, const crun_tensor_t *labels, double scale, double *loss,
                            int64_t *correct, crun_tensor_t *grad);
int crun__dev_nll(const crun_tensor_t *x, const crun_tensor_t *labels, double scale, double *loss,
                  crun_tensor_t *grad);
int crun__dev_mse(const crun_tensor_t *x, const crun_tensor_t *t, double *loss, crun_tensor_t *grad);
int crun__dev_sgd(crun_tensor_t *p, const crun_tensor_t *g, crun_tensor_t *buf, const crun_sgd_opts_t *o,
                  int first);
int crun__dev_adam(crun_tensor_t *p, const crun_tensor_t *g, crun_tensor_t *m, crun_tensor_t *v,
                   crun_tensor_t *vmax, int64_t step, const crun_adam_opts_t *o);

#endif
