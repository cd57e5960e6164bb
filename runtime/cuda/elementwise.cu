/* elementwise.cu — fill, strided copy/cast, binary (broadcast), unary and
 * clamp kernels: grid-stride loops over the bodies of kernels/elementwise.h. */
#include "cuda/kernels/elementwise.h"
#include "cuda/launch_cuda.cuh"

template <typename E>
__global__ void k_fill(E *dst, int64_t n, E v) {
  CRUN_K_FOR(i, n) dst[i] = v;
}

__global__ void k_copy(int ddt, void *dst, crun__kgeo_t dg, int sdt, const void *src, crun__kgeo_t sg, int64_t n) {
  CRUN_K_FOR(i, n) crun__k_cast(ddt, dst, crun__k_offset(&dg, i), sdt, src, crun__k_offset(&sg, i));
}

#define K_BINARY(tn, T)                                                                                   \
  __global__ void k_binary_##tn(int op, void *out, const T *a, crun__kgeo_t ga, const T *b, crun__kgeo_t gb, \
                                int rev, int64_t n) {                                                     \
    CRUN_K_FOR(i, n) crun__k_binary_##tn(op, out, a, &ga, b, &gb, i, rev);                               \
  }                                                                                                       \
  __global__ void k_binary_scalar_##tn(int op, void *out, const T *a, T s, int rev, int64_t n) {          \
    crun__kgeo_t ga = {1, {n}, {1}}, gb = {1, {n}, {0}};                                                  \
    CRUN_K_FOR(i, n) crun__k_binary_##tn(op, out, a, &ga, &s, &gb, i, rev);                              \
  }
K_BINARY(f32, float)
K_BINARY(f64, double)
K_BINARY(i32, int32_t)
K_BINARY(i64, int64_t)
K_BINARY(u8, uint8_t)
K_BINARY(i8, int8_t)
K_BINARY(i16, int16_t)

template <typename T>
__global__ void k_unary(int op, T *out, const T *a, int64_t n);
template <>
__global__ void k_unary<float>(int op, float *out, const float *a, int64_t n) {
  CRUN_K_FOR(i, n) out[i] = crun__k_unary_f32(op, a[i]);
}
template <>
__global__ void k_unary<double>(int op, double *out, const double *a, int64_t n) {
  CRUN_K_FOR(i, n) out[i] = crun__k_unary_f64(op, a[i]);
}

__global__ void k_clamp_f32(float *out, const float *a, int64_t n, float lo, float hi) {
  CRUN_K_FOR(i, n) out[i] = crun__k_clamp_f32(a[i], lo, hi);
}
__global__ void k_clamp_f64(double *out, const double *a, int64_t n, double lo, double hi) {
  CRUN_K_FOR(i, n) out[i] = crun__k_clamp_f64(a[i], lo, hi);
}

extern "C" int crun__cuda_fill(crun_dtype_t dt, void *dst, int64_t n, double v, void *stream) {
  CRUN_K_CHECK_N("fill", n, dst);
  if ((unsigned)dt >= CRUN_DTYPE_COUNT) return crun_error(CRUN_EINVAL, "fill: bad dtype %d", (int)dt);
  if (n == 0) return 0;
  alignas(8) unsigned char one[8];
  crun__k_set_f64((int)dt, one, 0, v);
  cudaStream_t s = CRUN_K_STREAM(stream);
  switch (crun_dtype_size(dt)) {
    case 1: k_fill<uint8_t><<<crun__k_blocks(n), CRUN_K_THREADS, 0, s>>>((uint8_t *)dst, n, *(uint8_t *)one); break;
    case 2: k_fill<uint16_t><<<crun__k_blocks(n), CRUN_K_THREADS, 0, s>>>((uint16_t *)dst, n, *(uint16_t *)one); break;
    case 4: k_fill<uint32_t><<<crun__k_blocks(n), CRUN_K_THREADS, 0, s>>>((uint32_t *)dst, n, *(uint32_t *)one); break;
    default: k_fill<uint64_t><<<crun__k_blocks(n), CRUN_K_THREADS, 0, s>>>((uint64_t *)dst, n, *(uint64_t *)one); break;
  }
  return crun__k_launched("fill");
}

extern "C" int crun__cuda_copy(crun_dtype_t ddt, void *dst, const crun__kgeo_t *dg, crun_dtype_t sdt,
                               const void *src, const crun__kgeo_t *sg, void *stream) {
  int64_t n = 0, ns = 0;
  CRUN_CHECK(crun__lc_geo("copy", dg, &n));
  CRUN_CHECK(crun__lc_geo("copy", sg, &ns));
  if (n != ns || dg->ndim != sg->ndim) return crun_error(CRUN_EINVAL, "copy: geometries differ in shape");
  CRUN_K_CHECK_N("copy", n, dst, src);
  if (n == 0) return 0;
  k_copy<<<crun__k_blocks(n), CRUN_K_THREADS, 0, CRUN_K_STREAM(stream)>>>((int)ddt, dst, *dg, (int)sdt, src, *sg, n);
  return crun__k_launched("copy");
}

/* Launches the binary kernel of dtype dt. */
static int binary_launch(crun_binop_t op, crun_dtype_t dt, void *out, const void *a, const crun__kgeo_t *ga,
                         const void *b, const crun__kgeo_t *gb, int rev, int64_t n, cudaStream_t s) {
  unsigned nb = crun__k_blocks(n);
#define BL(tn, T) k_binary_##tn<<<nb, CRUN_K_THREADS, 0, s>>>((int)op, out, (const T *)a, *ga, (const T *)b, *gb, rev, n); break
  switch (dt) {
    case CRUN_FLOAT32: BL(f32, float);
    case CRUN_FLOAT64: BL(f64, double);
    case CRUN_INT32: BL(i32, int32_t);
    case CRUN_INT64: BL(i64, int64_t);
    case CRUN_UINT8: BL(u8, uint8_t);
    case CRUN_INT8: BL(i8, int8_t);
    default: BL(i16, int16_t);
  }
#undef BL
  return crun__k_launched(crun_binop_name(op));
}

extern "C" int crun__cuda_binary(crun_binop_t op, crun_dtype_t dt, void *out, const void *a,
                                 const crun__kgeo_t *ga, const void *b, const crun__kgeo_t *gb, int reverse,
                                 void *stream) {
  int64_t n = 0, nb = 0;
  CRUN_CHECK(crun__lc_binop(op, dt));
  CRUN_CHECK(crun__lc_geo("binary", ga, &n));
  CRUN_CHECK(crun__lc_geo("binary", gb, &nb));
  if (n != nb || ga->ndim != gb->ndim) return crun_error(CRUN_EINVAL, "binary: geometries differ in shape");
  CRUN_K_CHECK_N(crun_binop_name(op), n, out, a, b);
  if (n == 0) return 0;
  return binary_launch(op, dt, out, a, ga, b, gb, reverse, n, CRUN_K_STREAM(stream));
}

/* The scalar is converted on the host and travels as a kernel argument. */
extern "C" int crun__cuda_binary_scalar(crun_binop_t op, crun_dtype_t dt, void *out, const void *a, int64_t n,
                                        double s, int reverse, void *stream) {
  CRUN_CHECK(crun__lc_binop(op, dt));
  CRUN_K_CHECK_N(crun_binop_name(op), n, out, a);
  alignas(8) unsigned char one[8];
  CRUN_CHECK(crun__lc_scalar(crun_binop_name(op), dt, s, one));
  if (n == 0) return 0;
  cudaStream_t st = CRUN_K_STREAM(stream);
  unsigned nb = crun__k_blocks(n);
#define BS(tn, T)                                                                                        \
  do {                                                                                                   \
    T v;                                                                                                 \
    memcpy(&v, one, sizeof v);                                                                           \
    k_binary_scalar_##tn<<<nb, CRUN_K_THREADS, 0, st>>>((int)op, out, (const T *)a, v, reverse, n);      \
  } while (0);                                                                                           \
  break
  switch (dt) {
    case CRUN_FLOAT32: BS(f32, float);
    case CRUN_FLOAT64: BS(f64, double);
    case CRUN_INT32: BS(i32, int32_t);
    case CRUN_INT64: BS(i64, int64_t);
    case CRUN_UINT8: BS(u8, uint8_t);
    case CRUN_INT8: BS(i8, int8_t);
    default: BS(i16, int16_t);
  }
#undef BS
  return crun__k_launched(crun_binop_name(op));
}

extern "C" int crun__cuda_unary(crun_unop_t op, crun_dtype_t dt, void *out, const void *a, int64_t n,
                                void *stream) {
  if ((unsigned)op >= CRUN_UNOP_COUNT) return crun_error(CRUN_EINVAL, "bad unary op %d", (int)op);
  CRUN_CHECK(crun__lc_float(crun_unop_name(op), dt));
  CRUN_K_CHECK_N(crun_unop_name(op), n, out, a);
  if (n == 0) return 0;
  cudaStream_t s = CRUN_K_STREAM(stream);
  if (dt == CRUN_FLOAT32) k_unary<float><<<crun__k_blocks(n), CRUN_K_THREADS, 0, s>>>((int)op, (float *)out, (const float *)a, n);
  else k_unary<double><<<crun__k_blocks(n), CRUN_K_THREADS, 0, s>>>((int)op, (double *)out, (const double *)a, n);
  return crun__k_launched(crun_unop_name(op));
}

extern "C" int crun__cuda_clamp(crun_dtype_t dt, void *out, const void *a, int64_t n, double lo, double hi,
                                void *stream) {
  if (lo > hi) return crun_error(CRUN_EINVAL, "clamp: min %g > max %g", lo, hi);
  CRUN_CHECK(crun__lc_float("clamp", dt));
  CRUN_K_CHECK_N("clamp", n, out, a);
  if (n == 0) return 0;
  cudaStream_t s = CRUN_K_STREAM(stream);
  if (dt == CRUN_FLOAT32) k_clamp_f32<<<crun__k_blocks(n), CRUN_K_THREADS, 0, s>>>((float *)out, (const float *)a, n, (float)lo, (float)hi);
  else k_clamp_f64<<<crun__k_blocks(n), CRUN_K_THREADS, 0, s>>>((double *)out, (const double *)a, n, lo, hi);
  return crun__k_launched("clamp");
}
