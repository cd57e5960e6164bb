/* crun/train.h — the hot loops of crun.nn and crun.optim: fused layer
 * kernels (Linear through BLAS, activations, log-softmax, losses, dropout)
 * and optimizer updates with torch's update rules.
 *
 * Every kernel takes float32 or float64 tensors that are contiguous and share
 * one dtype (index tensors: int32 or int64, 1-based class labels); outputs
 * are caller-allocated with the right shape. A mismatch fails with
 * CRUN_EINVAL naming the argument and both shapes/dtypes. None blocks. */
#ifndef CRUN_TRAIN_H
#define CRUN_TRAIN_H

#include <stdint.h>

#include "crun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = x W^T (+ b): x [N, in], W [out, in], b [out] or NULL, y [N, out]. */
int crun_nn_linear_forward(const crun_tensor_t *x, const crun_tensor_t *w,
                           const crun_tensor_t *b, crun_tensor_t *y);

/* Backward of y = x W^T + b for grad gy [N, out]: gx = gy W (overwritten;
 * skipped when NULL), gw += gy^T x and gb += sum over rows of gy (both
 * accumulate, as Torch7's accGradParameters; gb may be NULL). */
int crun_nn_linear_backward(const crun_tensor_t *x, const crun_tensor_t *w,
                            const crun_tensor_t *gy, crun_tensor_t *gx,
                            crun_tensor_t *gw, crun_tensor_t *gb);

/* Sets how many threads BLAS (OpenBLAS) may use in this process; n <= 0
 * picks online cores / LOCAL_WORLD_SIZE (at least 1), so that ranks sharing
 * a host do not oversubscribe it, unless OPENBLAS_NUM_THREADS or
 * OMP_NUM_THREADS is set. Returns the number now in use. */
int crun_blas_set_threads(int n);

typedef enum { CRUN_ACT_RELU, CRUN_ACT_TANH, CRUN_ACT_SIGMOID } crun_act_t;

/* Parses "relu", "tanh", "sigmoid"; CRUN_EINVAL otherwise. */
int crun_act_parse(const char *name, crun_act_t *out);

/* y = act(x) element-wise; y may be x (in place). */
int crun_nn_act_forward(crun_act_t act, const crun_tensor_t *x, crun_tensor_t *y);

/* gx = gy * act'(x), computed from the forward output y; gx may be gy. */
int crun_nn_act_backward(crun_act_t act, const crun_tensor_t *y,
                         const crun_tensor_t *gy, crun_tensor_t *gx);

/* Row-wise log-softmax of x [N, C] into y (numerically stable); y may be x. */
int crun_nn_log_softmax_forward(const crun_tensor_t *x, crun_tensor_t *y);

/* gx = gy - exp(y) * rowsum(gy) for y = log_softmax(x); gx may be gy. */
int crun_nn_log_softmax_backward(const crun_tensor_t *y, const crun_tensor_t *gy,
                                 crun_tensor_t *gx);

/* Cross entropy of logits [N, C] against 1-based labels [N] (int32/int64):
 * *loss = mean over rows of -log softmax(x)[label] (sum when `sum` != 0),
 * *correct = rows whose argmax equals the label; grad (NULL to skip) gets
 * d loss / d logits. A label outside 1..C fails with CRUN_ERANGE. */
int crun_nn_cross_entropy(const crun_tensor_t *x, const crun_tensor_t *labels, int sum,
                          double *loss, int64_t *correct, crun_tensor_t *grad);

/* Mean squared error: *loss = mean((x - t)^2); grad (NULL to skip) gets
 * 2 (x - t) / numel. */
int crun_nn_mse(const crun_tensor_t *x, const crun_tensor_t *t, double *loss,
                crun_tensor_t *grad);

/* Inverted dropout: mask[i] = 0 with probability p else 1 / (1 - p), drawn
 * from the splitmix64 stream *state (advanced); y = x * mask. 0 <= p < 1. */
int crun_nn_dropout_forward(const crun_tensor_t *x, crun_tensor_t *y, crun_tensor_t *mask,
                            double p, uint64_t *state);

/* y = a * b element-wise (same numel); y may alias a or b. */
int crun_nn_mul(const crun_tensor_t *a, const crun_tensor_t *b, crun_tensor_t *y);

/* torch.optim.SGD for one parameter: d = g + wd p; with momentum, buf = d on
 * the first step (first != 0) else buf = momentum buf + (1 - dampening) d, and
 * d = nesterov ? d + momentum buf : buf; then p -= lr d. buf may be NULL
 * when momentum == 0. */
typedef struct {
  double lr, momentum, dampening, weight_decay;
  int nesterov, maximize;
} crun_sgd_opts_t;
int crun_optim_sgd_update(crun_tensor_t *p, const crun_tensor_t *g, crun_tensor_t *buf,
                          const crun_sgd_opts_t *o, int first);

/* torch.optim.Adam / AdamW for one parameter at 1-based step `step`:
 * Adam adds wd p to the gradient, AdamW (decoupled != 0) multiplies p by
 * (1 - lr wd); m, v are the moment buffers, vmax the amsgrad buffer (NULL
 * unless amsgrad). */
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  int decoupled, amsgrad, maximize;
} crun_adam_opts_t;
int crun_optim_adam_update(crun_tensor_t *p, const crun_tensor_t *g, crun_tensor_t *m,
                           crun_tensor_t *v, crun_tensor_t *vmax, int64_t step,
                           const crun_adam_opts_t *o);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_TRAIN_H */
