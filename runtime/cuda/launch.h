/* launch.h — the device math of crun: one launcher per kernel family,
 * running the per-element bodies of runtime/cuda/kernels/ over device
 * buffers (internal to libcrunrt).
 *
 * Two implementations exist and exactly one is linked: runtime/cuda/ (.cu files,
 * CUDA kernels and cuBLAS, the real build) and tests/gpu_double/launch_host.c
 * (the same bodies in host loops and OpenBLAS, the double build). Pointers are
 * device pointers of the current device; `stream` is a cudaStream_t (NULL:
 * the default stream). Launchers only enqueue work and return at once,
 * except those that hand a scalar back to the host (cross entropy, MSE, NLL),
 * which wait for their stream. Each validates its arguments and returns 0 or
 * a negative crun status with crun_last_error() set ("EINVAL: ...");
 * a failed launch is CRUN_EIO naming the kernel and the CUDA error. Sizes
 * are element counts; n == 0 launches nothing. */
#ifndef CRUN_CUDA_LAUNCH_H
#define CRUN_CUDA_LAUNCH_H

#include <stdint.h>

#include "crun.h"
#include "crun/train.h"
#include "cuda/kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets n elements of dtype dt at dst to v (converted as crun_tensor_fill). */
int crun__cuda_fill(crun_dtype_t dt, void *dst, int64_t n, double v, void *stream);

/* dst[walk(dg)] = src[walk(sg)] over the shape of dg (sg has the same shape;
 * a stride 0 repeats: broadcasting), converting sdt to ddt with the CPU
 * copy's rules. Covers contiguous(), clone, expand-to-copy and :to(dtype). */
int crun__cuda_copy(crun_dtype_t ddt, void *dst, const crun__kgeo_t *dg, crun_dtype_t sdt,
                    const void *src, const crun__kgeo_t *sg, void *stream);

/* out (contiguous, ga's shape; uint8 for comparisons) = a op b, a and b read
 * through ga / gb (same shape, broadcast strides). reverse: out = b op a. */
int crun__cuda_binary(crun_binop_t op, crun_dtype_t dt, void *out, const void *a,
                      const crun__kgeo_t *ga, const void *b, const crun__kgeo_t *gb, int reverse,
                      void *stream);

/* out = a op s (reverse: s op a) for contiguous a, n elements; s is first
 * converted to dt on the host (integers need integral s in range). */
int crun__cuda_binary_scalar(crun_binop_t op, crun_dtype_t dt, void *out, const void *a, int64_t n,
                             double s, int reverse, void *stream);

/* out = op(a) / clamp(a, lo, hi), n contiguous float32/float64 elements. */
int crun__cuda_unary(crun_unop_t op, crun_dtype_t dt, void *out, const void *a, int64_t n, void *stream);
int crun__cuda_clamp(crun_dtype_t dt, void *out, const void *a, int64_t n, double lo, double hi,
                     void *stream);

/* Reduces contiguous a = [outer, n, inner] over n: values[o, j] (dtype vdt,
 * the CPU's value dtype: int64 for integer sums / products) and, for max /
 * min, indices[o, j] = position + base (int64, nullable). */
int crun__cuda_reduce_dim(crun_dimred_t op, crun_dtype_t dt, const void *a, int64_t outer, int64_t n,
                          int64_t inner, void *values, crun_dtype_t vdt, int64_t *indices,
                          int64_t base, void *stream);

/* softmax / log-softmax of contiguous a = [outer, n, inner] over n, in
 * double (crun_tensor_softmax). */
int crun__cuda_softmax(crun_dtype_t dt, const void *a, void *out, int64_t outer, int64_t n,
                       int64_t inner, int use_log, void *stream);

/* The nn layers (crun_nn_*): contiguous float32/float64 buffers. */
int crun__cuda_act_forward(crun_act_t act, crun_dtype_t dt, const void *x, void *y, int64_t n, void *stream);
int crun__cuda_act_backward(crun_act_t act, crun_dtype_t dt, const void *y, const void *gy, void *gx,
                            int64_t n, void *stream);
int crun__cuda_log_softmax_forward(crun_dtype_t dt, const void *x, void *y, int64_t rows, int64_t c,
                                   void *stream);
int crun__cuda_log_softmax_backward(crun_dtype_t dt, const void *y, const void *gy, void *gx,
                                    int64_t rows, int64_t c, void *stream);
/* gb[j] += sum over rows of gy[n, out] (Linear's bias gradient, in order). */
int crun__cuda_bias_grad(crun_dtype_t dt, void *gb, const void *gy, int64_t n, int64_t out, void *stream);
int crun__cuda_mul(crun_dtype_t dt, const void *a, const void *b, void *y, int64_t n, void *stream);

/* Dropout: mask[i] = 0 with probability p else 1/(1-p) and y = x * mask, the
 * draw of element i being Philox4x32-10 at counter (i, offset), key seed. */
int crun__cuda_dropout(crun_dtype_t dt, const void *x, void *y, void *mask, int64_t n, double p,
                       uint64_t seed, uint64_t offset, void *stream);

/* Losses; they wait for `stream` and return host scalars. Labels (lt int64
 * or int32, 1-based) out of 1..c fail with CRUN_ERANGE naming the row.
 * cross entropy: *loss = scale * sum of row losses, *correct = rows whose
 * argmax is the label; grad (nullable) = scale * (softmax - onehot). */
int crun__cuda_cross_entropy(crun_dtype_t dt, const void *x, crun_dtype_t lt, const void *labels,
                             int64_t rows, int64_t c, double scale, void *grad, double *loss,
                             int64_t *correct, void *stream);
/* nll: *loss = scale * sum of -x[r, label_r]; grad (nullable) = -scale one-hot. */
int crun__cuda_nll(crun_dtype_t dt, const void *x, crun_dtype_t lt, const void *labels, int64_t rows,
                   int64_t c, double scale, void *grad, double *loss, void *stream);
/* mse: *loss = mean (x - t)^2; grad (nullable) = 2 (x - t) / n. */
int crun__cuda_mse(crun_dtype_t dt, const void *x, const void *t, int64_t n, void *grad, double *loss,
                   void *stream);

/* Optimizer steps over n elements (crun_optim_sgd_update / adam_update). */
int crun__cuda_sgd(crun_dtype_t dt, void *p, const void *g, void *buf, int64_t n,
                   const crun_sgd_opts_t *o, int first, void *stream);
int crun__cuda_adam(crun_dtype_t dt, void *p, const void *g, void *m, void *v, void *vmax, int64_t n,
                    int64_t step, const crun_adam_opts_t *o, void *stream);

/* Row-major C[m, n] = alpha op(A) op(B) + beta C (cblas_?gemm's meaning):
 * float32 (cublasSgemm), float64 (cublasDgemm), float16 / bfloat16
 * (cublasGemmEx, float32 accumulation, CUBLAS_COMPUTE_32F). */
int crun__cuda_gemm(crun_dtype_t dt, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                    const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C,
                    int64_t ldc, void *stream);

/* Frees the cuBLAS handles (at exit; safe to call twice). */
void crun__cuda_math_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif
