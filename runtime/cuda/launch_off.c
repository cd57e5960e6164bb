/* launch_off.c — the launch API of a build without CUDA (CRUN_HAVE_CUDA=0):
 * no device tensor can exist there, so nothing reaches these; each answers
 * ENOTSUP all the same. The double build has CRUN_HAVE_CUDA=1 and links
 * tests/gpu_double/launch_host.c instead; the real build, runtime/cuda's .cu files. */
#if !CRUN_HAVE_CUDA
#include "cuda/launch.h"

#define OFF(what) crun_error(CRUN_ENOTSUP, "%s: crun was built without CUDA (no device math)", what)

int crun__cuda_fill(crun_dtype_t dt, void *dst, int64_t n, double v, void *stream) { return OFF("fill"); }
int crun__cuda_copy(crun_dtype_t ddt, void *dst, const crun__kgeo_t *dg, crun_dtype_t sdt, const void *src,
                    const crun__kgeo_t *sg, void *stream) { return OFF("copy"); }
int crun__cuda_binary(crun_binop_t op, crun_dtype_t dt, void *out, const void *a, const crun__kgeo_t *ga,
                      const void *b, const crun__kgeo_t *gb, int reverse, void *stream) { return OFF("binary op"); }
int crun__cuda_binary_scalar(crun_binop_t op, crun_dtype_t dt, void *out, const void *a, int64_t n, double s,
                             int reverse, void *stream) { return OFF("binary op"); }
int crun__cuda_unary(crun_unop_t op, crun_dtype_t dt, void *out, const void *a, int64_t n, void *stream) {
  return OFF("unary op");
}
int crun__cuda_clamp(crun_dtype_t dt, void *out, const void *a, int64_t n, double lo, double hi, void *stream) {
  return OFF("clamp");
}
int crun__cuda_reduce_dim(crun_dimred_t op, crun_dtype_t dt, const void *a, int64_t outer, int64_t n, int64_t inner,
                          void *values, crun_dtype_t vdt, int64_t *indices, int64_t base, void *stream) {
  return OFF("reduce");
}
int crun__cuda_softmax(crun_dtype_t dt, const void *a, void *out, int64_t outer, int64_t n, int64_t inner,
                       int use_log, void *stream) { return OFF("softmax"); }
int crun__cuda_act_forward(crun_act_t act, crun_dtype_t dt, const void *x, void *y, int64_t n, void *stream) {
  return OFF("activation");
}
int crun__cuda_act_backward(crun_act_t act, crun_dtype_t dt, const void *y, const void *gy, void *gx, int64_t n,
                            void *stream) { return OFF("activation"); }
int crun__cuda_log_softmax_forward(crun_dtype_t dt, const void *x, void *y, int64_t rows, int64_t c, void *stream) {
  return OFF("LogSoftMax");
}
int crun__cuda_log_softmax_backward(crun_dtype_t dt, const void *y, const void *gy, void *gx, int64_t rows,
                                    int64_t c, void *stream) { return OFF("LogSoftMax"); }
int crun__cuda_bias_grad(crun_dtype_t dt, void *gb, const void *gy, int64_t n, int64_t out, void *stream) {
  return OFF("Linear backward");
}
int crun__cuda_mul(crun_dtype_t dt, const void *a, const void *b, void *y, int64_t n, void *stream) { return OFF("mul"); }
int crun__cuda_dropout(crun_dtype_t dt, const void *x, void *y, void *mask, int64_t n, double p, uint64_t seed,
                       uint64_t offset, void *stream) { return OFF("Dropout"); }
int crun__cuda_cross_entropy(crun_dtype_t dt, const void *x, crun_dtype_t lt, const void *labels, int64_t rows,
                             int64_t c, double scale, void *grad, double *loss, int64_t *correct, void *stream) {
  return OFF("CrossEntropy");
}
int crun__cuda_nll(crun_dtype_t dt, const void *x, crun_dtype_t lt, const void *labels, int64_t rows, int64_t c,
                   double scale, void *grad, double *loss, void *stream) { return OFF("ClassNLLCriterion"); }
int crun__cuda_mse(crun_dtype_t dt, const void *x, const void *t, int64_t n, void *grad, double *loss, void *stream) {
  return OFF("MSE");
}
int crun__cuda_sgd(crun_dtype_t dt, void *p, const void *g, void *buf, int64_t n, const crun_sgd_opts_t *o, int first,
                   void *stream) { return OFF("SGD step"); }
int crun__cuda_adam(crun_dtype_t dt, void *p, const void *g, void *m, void *v, void *vmax, int64_t n, int64_t step,
                    const crun_adam_opts_t *o, void *stream) { return OFF("Adam step"); }
int crun__cuda_gemm(crun_dtype_t dt, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const void *A,
                    int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc, void *stream) {
  return OFF("gemm");
}
void crun__cuda_math_shutdown(void) {}
#else
typedef int crun__cuda_launch_off_c_is_empty_with_cuda;
#endif
