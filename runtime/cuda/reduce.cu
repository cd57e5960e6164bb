/* reduce.cu — reductions along a dim (or over everything), softmax, and the
 * losses that hand a scalar back to the host (cross entropy, NLL, MSE).
 * A slice with inner == 1 is folded by one block: each thread folds every
 * 256th element in order and the block combines the partial accumulators
 * (crun__k_red_combine keeps max / min positions exact; sums are re-associated,
 * which moves float results by rounding only). Slices with inner > 1 are
 * folded by one thread each, in order. */
#include "cuda/kernels/nn.h"
#include "cuda/kernels/reduce.h"
#include "cuda/launch_cuda.cuh"

/* One block per slice row o (grid-stride over rows): inner == 1. */
__global__ void k_reduce_rows(int op, int dt, const void *a, int64_t outer, int64_t n, void *values, int vdt,
                              int64_t *indices, int64_t base) {
  __shared__ crun__kacc_t part[CRUN_K_THREADS];
  for (int64_t o = blockIdx.x; o < outer; o += gridDim.x) {
    crun__kacc_t acc = crun__k_red_init(op);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) crun__k_red_fold(op, dt, &acc, a, o * n + k, k);
    part[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
      if (threadIdx.x < w) crun__k_red_combine(op, dt, &part[threadIdx.x], &part[threadIdx.x + w]);
      __syncthreads();
    }
    if (threadIdx.x == 0) crun__k_red_store(op, dt, &part[0], n, values, vdt, indices, o, base);
    __syncthreads();
  }
}

/* One thread per output (o, j): inner > 1. */
__global__ void k_reduce_cols(int op, int dt, const void *a, int64_t outer, int64_t n, int64_t inner,
                              void *values, int vdt, int64_t *indices, int64_t base) {
  CRUN_K_FOR(t, outer * inner) {
    int64_t o = t / inner, j = t % inner;
    crun__kacc_t acc = crun__k_red_init(op);
    for (int64_t k = 0; k < n; k++) crun__k_red_fold(op, dt, &acc, a, (o * n + k) * inner + j, k);
    crun__k_red_store(op, dt, &acc, n, values, vdt, indices, t, base);
  }
}

/* Enqueues the reduction (no checks). */
static int reduce_launch(crun_dimred_t op, crun_dtype_t dt, const void *a, int64_t outer, int64_t n,
                         int64_t inner, void *values, crun_dtype_t vdt, int64_t *indices, int64_t base,
                         cudaStream_t s) {
  if (inner == 1) {
    unsigned blocks = (unsigned)(outer < 65535 ? (outer < 1 ? 1 : outer) : 65535);
    k_reduce_rows<<<blocks, CRUN_K_THREADS, 0, s>>>((int)op, (int)dt, a, outer, n, values, (int)vdt, indices, base);
  } else {
    k_reduce_cols<<<crun__k_blocks(outer * inner), CRUN_K_THREADS, 0, s>>>((int)op, (int)dt, a, outer, n, inner,
                                                                         values, (int)vdt, indices, base);
  }
  return crun__k_launched("reduce");
}

extern "C" int crun__cuda_reduce_dim(crun_dimred_t op, crun_dtype_t dt, const void *a, int64_t outer, int64_t n,
                                     int64_t inner, void *values, crun_dtype_t vdt, int64_t *indices, int64_t base,
                                     void *stream) {
  int64_t total = 0;
  if ((unsigned)op >= CRUN_DIMRED_COUNT) return crun_error(CRUN_EINVAL, "bad reduction %d", (int)op);
  int64_t all = 0;
  CRUN_CHECK(crun__lc_slices("reduce", outer, n, inner, &all));
  total = outer * inner; /* <= all, or n == 0 */
  if (n == 0 && crun__mul_i64(outer, inner, &total))
    return crun_error(CRUN_EINVAL, "reduce: bad sizes %lld x 0 x %lld", (long long)outer, (long long)inner);
  CRUN_K_CHECK_N("reduce", total, values);
  if (total == 0) return 0;
  return reduce_launch(op, dt, a, outer, n, inner, values, vdt, indices, base, CRUN_K_STREAM(stream));
}

__global__ void k_softmax(int dt, const void *a, void *out, int64_t outer, int64_t n, int64_t inner, int use_log) {
  CRUN_K_FOR(t, outer * inner) crun__k_softmax_slice(dt, a, out, (t / inner) * n * inner + t % inner, n, inner, use_log);
}

extern "C" int crun__cuda_softmax(crun_dtype_t dt, const void *a, void *out, int64_t outer, int64_t n,
                                  int64_t inner, int use_log, void *stream) {
  CRUN_CHECK(crun__lc_float(use_log ? "log_softmax" : "softmax", dt));
  int64_t total = 0;
  CRUN_CHECK(crun__lc_slices("softmax", outer, n, inner, &total));
  CRUN_K_CHECK_N("softmax", total, a, out);
  if (total == 0) return 0;
  k_softmax<<<crun__k_blocks(outer * inner), CRUN_K_THREADS, 0, CRUN_K_STREAM(stream)>>>((int)dt, a, out, outer, n,
                                                                                       inner, use_log);
  return crun__k_launched("softmax");
}

/* ---------------------------------------------------------------- losses */

/* Scratch of a loss: per-row (or per-element) doubles and counts, the
 * first bad row, and the two sums copied back. */
typedef struct {
  double *val;
  int64_t *ok, *bad;
  double *sum;
  int64_t *cnt;
} scratch_t;

static int scratch_get(scratch_t *sc, int64_t n, cudaStream_t s) {
  size_t bytes = (size_t)n * (sizeof(double) + sizeof(int64_t)) + 4 * sizeof(int64_t);
  char *p = NULL;
  CRUN_CHECK(crun__k_cuda_ok(cudaMallocAsync((void **)&p, bytes, s), "loss: cudaMallocAsync"));
  sc->val = (double *)p;
  sc->ok = (int64_t *)(p + (size_t)n * sizeof(double));
  sc->bad = sc->ok + n;
  sc->sum = (double *)(sc->bad + 1);
  sc->cnt = sc->bad + 2;
  return 0;
}

__global__ void k_set_i64(int64_t *p, int64_t v) { *p = v; }

#define K_LOSS(tn, T)                                                                                     \
  __global__ void k_ce_##tn(const T *x, int lt, const void *labels, int64_t rows, int64_t c, double scale,  \
                            T *grad, double *val, int64_t *ok, int64_t *bad) {                             \
    CRUN_K_FOR(r, rows) {                                                                                 \
      int64_t l = crun__k_label(lt, labels, r, c), am = -1;                                               \
      if (l < 0) {                                                                                        \
        atomicMin((unsigned long long *)bad, (unsigned long long)r);                                      \
        val[r] = 0;                                                                                       \
        ok[r] = 0;                                                                                        \
        continue;                                                                                         \
      }                                                                                                   \
      val[r] = crun__k_ce_row_##tn(x, r, c, l, grad, scale, &am);                                         \
      ok[r] = am == l;                                                                                    \
    }                                                                                                     \
  }                                                                                                       \
  __global__ void k_nll_##tn(const T *x, int lt, const void *labels, int64_t rows, int64_t c, double scale, \
                             T *grad, double *val, int64_t *bad) {                                         \
    CRUN_K_FOR(r, rows) {                                                                                 \
      int64_t l = crun__k_label(lt, labels, r, c);                                                        \
      if (l < 0) {                                                                                        \
        atomicMin((unsigned long long *)bad, (unsigned long long)r);                                      \
        val[r] = 0;                                                                                       \
        continue;                                                                                         \
      }                                                                                                   \
      val[r] = crun__k_nll_row_##tn(x, r, c, l, grad, scale);                                             \
    }                                                                                                     \
  }                                                                                                       \
  __global__ void k_mse_##tn(const T *x, const T *t, T *grad, int64_t n, double k, double *val) {         \
    CRUN_K_FOR(i, n) val[i] = crun__k_mse_##tn(x, t, grad, i, k);                                         \
  }
K_LOSS(f32, float)
K_LOSS(f64, double)

/* Sums val (and ok when cnt) on the device, copies the sums and the first
 * bad row back and waits for the stream. */
static int finish(scratch_t *sc, int64_t n, int with_cnt, double *sum, int64_t *cnt, int64_t *bad, cudaStream_t s) {
  int rc = reduce_launch(CRUN_DIMRED_SUM, CRUN_FLOAT64, sc->val, 1, n, 1, sc->sum, CRUN_FLOAT64, NULL, 0, s);
  if (rc == 0 && with_cnt)
    rc = reduce_launch(CRUN_DIMRED_SUM, CRUN_INT64, sc->ok, 1, n, 1, sc->cnt, CRUN_INT64, NULL, 0, s);
  int64_t host[3] = {0, 0, 0};
  if (rc == 0)
    rc = crun__k_cuda_ok(cudaMemcpyAsync(host, sc->bad, 3 * sizeof(int64_t), cudaMemcpyDeviceToHost, s),
                         "loss: cudaMemcpyAsync");
  cudaFreeAsync(sc->val, s);
  if (rc == 0) rc = crun__k_cuda_ok(cudaStreamSynchronize(s), "loss: cudaStreamSynchronize");
  if (rc < 0) return rc;
  *bad = host[0];
  memcpy(sum, &host[1], sizeof *sum);
  if (cnt) *cnt = host[2];
  return 0;
}

/* The error for bad row `row`: reads its label back. */
static int bad_label(const char *fn, crun_dtype_t lt, const void *labels, int64_t row, int64_t c) {
  int64_t l = 0;
  int32_t l32 = 0;
  cudaError_t e = lt == CRUN_INT64
                      ? cudaMemcpy(&l, (const int64_t *)labels + row, sizeof l, cudaMemcpyDeviceToHost)
                      : cudaMemcpy(&l32, (const int32_t *)labels + row, sizeof l32, cudaMemcpyDeviceToHost);
  CRUN_CHECK(crun__k_cuda_ok(e, "loss: reading a label back"));
  return crun__lc_bad_label(fn, lt == CRUN_INT64 ? l : l32, row, c);
}

extern "C" int crun__cuda_cross_entropy(crun_dtype_t dt, const void *x, crun_dtype_t lt, const void *labels,
                                        int64_t rows, int64_t c, double scale, void *grad, double *loss,
                                        int64_t *correct, void *stream) {
  static const char *fn = "CrossEntropy";
  CRUN_CHECK(crun__lc_float(fn, dt));
  CRUN_CHECK(crun__lc_label_dtype(fn, lt));
  if (c <= 0) return crun_error(CRUN_EINVAL, "%s: input has 0 classes", fn);
  CRUN_K_CHECK_N(fn, rows, x, labels);
  if (rows == 0) {
    if (loss) *loss = 0;
    if (correct) *correct = 0;
    return 0;
  }
  cudaStream_t s = CRUN_K_STREAM(stream);
  scratch_t sc;
  CRUN_CHECK(scratch_get(&sc, rows, s));
  k_set_i64<<<1, 1, 0, s>>>(sc.bad, rows);
  if (dt == CRUN_FLOAT32)
    k_ce_f32<<<crun__k_blocks(rows), CRUN_K_THREADS, 0, s>>>((const float *)x, (int)lt, labels, rows, c, scale,
                                                            (float *)grad, sc.val, sc.ok, sc.bad);
  else
    k_ce_f64<<<crun__k_blocks(rows), CRUN_K_THREADS, 0, s>>>((const double *)x, (int)lt, labels, rows, c, scale,
                                                            (double *)grad, sc.val, sc.ok, sc.bad);
  int rc = crun__k_launched(fn);
  double sum = 0;
  int64_t cnt = 0, bad = rows;
  if (rc == 0) rc = finish(&sc, rows, 1, &sum, &cnt, &bad, s);
  else cudaFreeAsync(sc.val, s);
  if (rc < 0) return rc;
  if (bad < rows) return bad_label(fn, lt, labels, bad, c);
  if (loss) *loss = sum * scale;
  if (correct) *correct = cnt;
  return 0;
}

extern "C" int crun__cuda_nll(crun_dtype_t dt, const void *x, crun_dtype_t lt, const void *labels, int64_t rows,
                              int64_t c, double scale, void *grad, double *loss, void *stream) {
  static const char *fn = "ClassNLLCriterion";
  CRUN_CHECK(crun__lc_float(fn, dt));
  CRUN_CHECK(crun__lc_label_dtype(fn, lt));
  CRUN_K_CHECK_N(fn, rows, x, labels);
  if (rows == 0) {
    if (loss) *loss = 0;
    return 0;
  }
  cudaStream_t s = CRUN_K_STREAM(stream);
  scratch_t sc;
  CRUN_CHECK(scratch_get(&sc, rows, s));
  k_set_i64<<<1, 1, 0, s>>>(sc.bad, rows);
  if (dt == CRUN_FLOAT32)
    k_nll_f32<<<crun__k_blocks(rows), CRUN_K_THREADS, 0, s>>>((const float *)x, (int)lt, labels, rows, c, scale,
                                                             (float *)grad, sc.val, sc.bad);
  else
    k_nll_f64<<<crun__k_blocks(rows), CRUN_K_THREADS, 0, s>>>((const double *)x, (int)lt, labels, rows, c, scale,
                                                             (double *)grad, sc.val, sc.bad);
  int rc = crun__k_launched(fn);
  double sum = 0;
  int64_t bad = rows;
  if (rc == 0) rc = finish(&sc, rows, 0, &sum, NULL, &bad, s);
  else cudaFreeAsync(sc.val, s);
  if (rc < 0) return rc;
  if (bad < rows) return bad_label(fn, lt, labels, bad, c);
  if (loss) *loss = sum * scale;
  return 0;
}

extern "C" int crun__cuda_mse(crun_dtype_t dt, const void *x, const void *t, int64_t n, void *grad, double *loss,
                              void *stream) {
  CRUN_CHECK(crun__lc_float("MSE", dt));
  CRUN_K_CHECK_N("MSE", n, x, t);
  if (n == 0) {
    if (loss) *loss = 0;
    return 0;
  }
  cudaStream_t s = CRUN_K_STREAM(stream);
  scratch_t sc;
  CRUN_CHECK(scratch_get(&sc, n, s));
  k_set_i64<<<1, 1, 0, s>>>(sc.bad, n);
  double k = 2.0 / (double)n, sum = 0;
  if (dt == CRUN_FLOAT32)
    k_mse_f32<<<crun__k_blocks(n), CRUN_K_THREADS, 0, s>>>((const float *)x, (const float *)t, (float *)grad, n, k, sc.val);
  else
    k_mse_f64<<<crun__k_blocks(n), CRUN_K_THREADS, 0, s>>>((const double *)x, (const double *)t, (double *)grad, n, k,
                                                          sc.val);
  int rc = crun__k_launched("MSE");
  int64_t bad = n;
  if (rc == 0) rc = finish(&sc, n, 0, &sum, NULL, &bad, s);
  else cudaFreeAsync(sc.val, s);
  if (rc < 0) return rc;
  if (loss) *loss = sum / (double)n;
  return 0;
}
